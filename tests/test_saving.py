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
import pandas as pd
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


def _probas_in_fresh_process(paths, X, tmp_path) -> list[np.ndarray]:
    """predict_proba of each model saved at `paths` on X[i], loaded in one new interpreter that has
    no dask client."""
    for i, x in enumerate(X):
        np.save(tmp_path / f"X{i}.npy", x)
    script = textwrap.dedent(
        f"""
        import numpy as np
        from distributed import default_client
        from dasknn import DistributedCNN
        for i, path in enumerate({[str(p) for p in paths]!r}):
            X = np.load({str(tmp_path)!r} + f"/X{{i}}.npy")
            np.save({str(tmp_path)!r} + f"/proba{{i}}.npy", DistributedCNN.load(path).predict_proba(X))
        try:
            default_client()
        except ValueError:
            print("no client")
        """
    )
    # oneDNN's inner product splits its sums over the threads it runs on: the same thread count as
    # this process, so that "identically" means bit for bit (across counts: float32 rounding)
    from threadpoolctl import threadpool_info

    n = str(max([pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"] or [1]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no client"  # predicted without a cluster
    return [np.load(tmp_path / f"proba{i}.npy") for i in range(len(paths))]


def test_saved_models_predict_identically_in_a_fresh_process_lenet_resnet20_and_a_deleted_prototxt(
    digits, tmp_path
):
    X, y = digits
    lenet = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.5, **QUICK).fit(X, y)
    path = lenet.save(tmp_path / "lenet")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "manifest.json", "model.json"]
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        assert len(npz.files) > 0
    doc = json.loads((path / "model.json").read_text())
    assert doc["format"] == "dasknn-model" and doc["version"] == 2

    rng = np.random.default_rng(0)
    X_rgb, y_rgb = rng.random((64, 3, 8, 8), dtype=np.float32), np.arange(64) % 4
    resnet = DistributedCNN(net="resnet20", batch_size=16, max_epochs=0.25, **QUICK).fit(X_rgb, y_rgb)
    resnet.save(tmp_path / "resnet")

    proto = tmp_path / "tiny.prototxt"
    proto.write_text(TINY_PROTOTXT)
    tiny = DistributedCNN(net=str(proto), batch_size=32, max_epochs=0.5, **QUICK).fit(X, y)
    tiny.save(tmp_path / "tiny")
    proto.unlink()

    models, inputs = [lenet, resnet, tiny], [X[:50], X_rgb[:20], X[:50]]
    probas = _probas_in_fresh_process([tmp_path / n for n in ("lenet", "resnet", "tiny")], inputs, tmp_path)
    for est, x, proba in zip(models, inputs, probas, strict=True):
        np.testing.assert_array_equal(proba, est.predict_proba(x))


def test_a_loaded_model_continues_with_partial_fit_and_round_trips_its_records(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.25, **QUICK).fit(X, y)
    loaded = DistributedCNN.load(est.save(tmp_path / "m"))
    assert loaded.get_params()["net"] == "lenet" and loaded.n_iter_ == est.n_iter_
    assert list(loaded.classes_) == list(est.classes_)
    assert pd.DataFrame(loaded.history_).equals(pd.DataFrame(est.history_))  # NaN where there is no figure
    assert loaded.trace_.equals(est.trace_) and loaded.report_.equals(est.report_)
    assert loaded.stopped_by_ == est.stopped_by_
    before = loaded.n_iter_
    loaded.partial_fit(X, y)
    assert loaded.n_iter_ > before and loaded.history_[-1]["iteration"] == loaded.n_iter_
    est.partial_fit(X, y)  # the same continuation as the model that was never saved
    np.testing.assert_array_equal(loaded.predict_proba(X[:20]), est.predict_proba(X[:20]))


def test_callbacks_security_and_validation_data_are_left_out_with_one_warning(digits, tmp_path):
    from distributed.security import Security

    from dasknn.callbacks import CSVLogger

    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, **QUICK)
    with pytest.raises(ValueError, match="not fitted|fit"):
        est.save(tmp_path / "unfitted")
    assert not (tmp_path / "unfitted").exists()
    est.fit(X, y)
    est.set_params(callbacks=[CSVLogger(tmp_path / "log.csv")], security=Security(), validation_data=(X, y))
    with pytest.warns(UserWarning) as said:
        path = est.save(tmp_path / "m")
    (line,) = [str(w.message) for w in said]
    assert "without callbacks, security, validation_data" in line and "\n" not in line
    loaded = DistributedCNN.load(path)
    assert (loaded.callbacks, loaded.security, loaded.validation_data) == (None, None, None)
    np.testing.assert_array_equal(loaded.predict_proba(X[:8]), est.predict_proba(X[:8]))


def test_save_overwrites_a_saved_model_only_when_asked_and_only_a_model(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, **QUICK).fit(X, y)
    path = est.save(tmp_path / "ok")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        est.save(path)
    est.partial_fit(X, y)
    assert est.save(path, overwrite=True) == path
    assert DistributedCNN.load(path).n_iter_ == est.n_iter_
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]  # no temporary or old folder left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a saved model"):
        est.save(tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    doc = json.loads((path / "model.json").read_text())
    doc["version"] = 99
    (path / "model.json").write_text(json.dumps(doc))
    (path / "manifest.json").unlink()
    with pytest.raises(ValueError, match="newer"):
        DistributedCNN.load(path)
    with pytest.raises(ValueError, match="not a saved DistributedCNN"):
        DistributedCNN.load(tmp_path)


def test_pickle_and_joblib_keep_working(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(net="lenet", batch_size=32, max_epochs=0.1, **QUICK).fit(X, y)
    proba = est.predict_proba(X[:20])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict_proba(X[:20]), proba)
    joblib.dump(est, tmp_path / "est.joblib")
    np.testing.assert_array_equal(joblib.load(tmp_path / "est.joblib").predict_proba(X[:20]), proba)
    loaded = DistributedCNN.load(est.save(tmp_path / "m"))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(loaded)).predict_proba(X[:20]), proba)


def test_a_record_with_optional_values_saves_without_pickle(digits, tmp_path):
    # xarray keeps a column of optional values (a reason, or None) as Python objects: the main job's
    # tradeoff_ had one, and its save failed with "a checkpoint cannot hold object arrays"
    X, y = digits
    est = DistributedCNN(max_epochs=0.25, **QUICK).fit(X, y)
    dim = next(iter(est.tradeoff_.dims))
    n = est.tradeoff_.sizes[dim]
    reasons = np.array((["probe", None] * n)[:n], dtype=object)
    est.tradeoff_ = est.tradeoff_.assign(reason=((dim,), reasons))
    est.save(tmp_path / "model")
    loaded = DistributedCNN.load(tmp_path / "model")
    assert loaded.tradeoff_["reason"].dtype.kind == "U"
    assert list(loaded.tradeoff_["reason"].values) == ["" if r is None else r for r in reasons]
    np.testing.assert_array_equal(loaded.predict_proba(X[:8]), est.predict_proba(X[:8]))
