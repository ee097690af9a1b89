"""Saving a fitted DistributedCNN and loading it back (`dasknn.saving`): no pickle, a fresh process,
no cluster, and the `dasknn predict` command."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pytest

from dasknn.data import load
from dasknn.estimator import DistributedCNN
from tests.conftest import REPO

FIXED = {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9}
QUICK = {"engine": "simulated", "n_workers": 1, "time_budget": None, "eval_size": 64, **FIXED}

TINY_PROTOTXT = """
name: "TinyNet"
input: "data"
input_shape { dim: 1 dim: 1 dim: 28 dim: 28 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 5 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
"""


@pytest.fixture(scope="module")
def digits():
    X, y = load("digits", size=28)
    return np.asarray(X[:256], dtype=np.float32), np.asarray(y[:256])


def _proba_in_fresh_process(path, X, tmp_path) -> np.ndarray:
    """predict_proba of the model saved at `path`, loaded in a new interpreter with no dask client."""
    np.save(tmp_path / "X.npy", X)
    script = textwrap.dedent(
        f"""
        import numpy as np
        from distributed import default_client
        from dasknn import DistributedCNN
        est = DistributedCNN.load({str(path)!r})
        np.save({str(tmp_path / "proba.npy")!r}, est.predict_proba(np.load({str(tmp_path / "X.npy")!r})))
        try:
            default_client()
        except ValueError:
            print("no client")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no client"  # predicted without a cluster
    return np.load(tmp_path / "proba.npy")


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_a_saved_lenet_predicts_identically_in_a_fresh_process(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.5, **QUICK).fit(X, y)
    path = est.save(tmp_path / "model")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "model.json"]
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        assert len(npz.files) > 0
    doc = json.loads((path / "model.json").read_text())
    assert doc["format"] == "dasknn-model" and doc["version"] == 1
    np.testing.assert_array_equal(_proba_in_fresh_process(path, X[:50], tmp_path), est.predict_proba(X[:50]))


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_a_saved_resnet20_graph_net_predicts_identically_in_a_fresh_process(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((64, 3, 8, 8), dtype=np.float32)
    y = np.arange(64) % 4
    est = DistributedCNN(net="resnet20", batch_size=16, max_epochs=0.25, **QUICK).fit(X, y)
    path = est.save(tmp_path / "resnet")
    np.testing.assert_array_equal(_proba_in_fresh_process(path, X[:20], tmp_path), est.predict_proba(X[:20]))


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_a_net_read_from_a_prototxt_loads_after_the_file_is_deleted(digits, tmp_path):
    X, y = digits
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(TINY_PROTOTXT)
    est = DistributedCNN(net=str(proto), batch_size=32, max_epochs=0.5, **QUICK).fit(X, y)
    path = est.save(tmp_path / "tiny-model")
    proto.unlink()
    np.testing.assert_array_equal(_proba_in_fresh_process(path, X[:50], tmp_path), est.predict_proba(X[:50]))


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_a_loaded_model_continues_with_partial_fit_and_round_trips_its_records(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.25, **QUICK).fit(X, y)
    loaded = DistributedCNN.load(est.save(tmp_path / "m"))
    assert loaded.get_params()["net"] == "lenet" and loaded.n_iter_ == est.n_iter_
    assert list(loaded.classes_) == list(est.classes_) and loaded.history_ == est.history_
    assert loaded.trace_.equals(est.trace_) and loaded.report_.equals(est.report_)
    assert loaded.stopped_by_ == est.stopped_by_
    before = loaded.n_iter_
    loaded.partial_fit(X, y)
    assert loaded.n_iter_ > before and loaded.history_[-1]["iteration"] == loaded.n_iter_
    est.partial_fit(X, y)  # the same continuation as the model that was never saved
    np.testing.assert_array_equal(loaded.predict_proba(X[:20]), est.predict_proba(X[:20]))


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_unsaveable_parameters_and_newer_formats_are_refused_by_name(digits, tmp_path):
    from dasknn.callbacks import CSVLogger

    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, **QUICK)
    with pytest.raises(ValueError, match="not fitted|fit"):
        est.save(tmp_path / "unfitted")
    est.fit(X, y)
    est.set_params(callbacks=[CSVLogger(tmp_path / "log.csv")])
    with pytest.raises(ValueError, match="callbacks"):
        est.save(tmp_path / "cb")
    est.set_params(callbacks=None, security=object())
    with pytest.raises(ValueError, match="security"):
        est.save(tmp_path / "sec")
    assert not (tmp_path / "cb").exists() and not (tmp_path / "sec").exists()
    est.set_params(security=None)
    path = est.save(tmp_path / "ok")
    with pytest.raises(FileExistsError, match="ok"):
        est.save(path)
    doc = json.loads((path / "model.json").read_text())
    doc["version"] = 99
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="newer"):
        DistributedCNN.load(path)
    with pytest.raises(ValueError, match="not a saved DistributedCNN"):
        DistributedCNN.load(tmp_path)


@pytest.mark.xfail(strict=True, reason="save/load not built yet")
def test_pickle_and_joblib_keep_working(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, **QUICK).fit(X, y)
    proba = est.predict_proba(X[:20])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict_proba(X[:20]), proba)
    joblib.dump(est, tmp_path / "est.joblib")
    np.testing.assert_array_equal(joblib.load(tmp_path / "est.joblib").predict_proba(X[:20]), proba)
    loaded = DistributedCNN.load(est.save(tmp_path / "m"))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(loaded)).predict_proba(X[:20]), proba)
