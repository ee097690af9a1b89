"""`DistributedCNN.to_onnx` and `dasknn export`: every zoo net, trained a few iterations on the
simulated engine, exported and run by onnxruntime, gives the fitted model's logits and
predict_proba within 1e-4, at input sizes where Caffe's rounded-up pooling matters; the command's
exit codes (2 bad input naming the file, 5 local I/O) and its atomic write.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from dasknn.cli import exits
from dasknn.estimator import DistributedCNN
from dasknn.nn import zoo
from dasknn.nn.export import INPUT, LOGITS, PROBABILITIES
from tests.nn.test_export import TOLERANCE, rounded_up_pools
from tests.test_bad_input import cli
from tests.test_failures_named import full_folder  # noqa: F401  (a fixture)

ort = pytest.importorskip("onnxruntime")

ZOO = {
    "mlp": (64,),
    "lenet": (1, 29, 29),
    "cifar10_quick": (3, 33, 33),
    "cifar10_full": (3, 33, 33),
    "caffenet": (3, 63, 63),
    "resnet20": (3, 11, 11),
}
"""Every zoo net at the per-sample shape of X it is trained and exported at: odd image sizes,
where its strided pooling rounds up (CaffeNet's smallest such input has 63 pixels a side); the MLP
takes rows of 64 features (input_shape="flat"), so its graph reshapes them. CaffeNet's fit costs
10-16 s on 2 busy cores (its 4096-wide FC layers): -m slow; tests/nn/test_export.py exports it
after two SGD steps in the default run."""

REFUSED_NETS: dict[str, str] = {}
"""The zoo nets export refuses, with the reason: none."""

FITS: dict[str, DistributedCNN] = {}


def fitted(name: str) -> DistributedCNN:
    """The zoo net `name` fitted on 32 random samples of 3 classes, 3 iterations of batch 8 on the
    simulated engine (BatchNorm's running statistics accumulated), cached for the module."""
    if name not in FITS:
        rng = np.random.default_rng(0)
        X = rng.uniform(0.0, 1.0, (32, *ZOO[name])).astype(np.float32)
        y = np.array(["ant", "bee", "cat"])[rng.integers(0, 3, 32)]
        est = DistributedCNN(
            net=name,
            input_shape="flat" if len(ZOO[name]) == 1 else None,
            engine="simulated",
            n_workers=1,
            n_groups=1,
            learning_rate=0.01,
            momentum=0.9,
            batch_size=8,
            eval_size=8,
            max_epochs=1,
            time_budget=None,
            verbose=0,
        )
        FITS[name] = est.fit(X, y)
    return FITS[name]


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_every_zoo_net_is_exported_here():
    assert set(ZOO) == set(zoo.NETS)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "caffenet" else n for n in sorted(ZOO)]
)
def test_a_trained_zoo_net_round_trips_through_onnxruntime(name, tmp_path):
    est = fitted(name)
    assert est.n_iter_ >= 3
    if name not in ("mlp", "resnet20"):  # no strided pooling / global pooling only
        assert rounded_up_pools(est.net_)
    if name in REFUSED_NETS:
        with pytest.raises(ValueError, match=REFUSED_NETS[name]):
            est.to_onnx(tmp_path / "model.onnx")
        return
    stats = {k: v for k, v in est.net_.get_params().items() if k.endswith((".mean", ".scale_factor"))}
    assert all(np.any(v != 0) for v in stats.values()) and (name != "resnet20" or len(stats) == 2 * 21)
    path = est.to_onnx(tmp_path / "model.onnx")
    X = np.random.default_rng(5).uniform(0.0, 1.0, (5, *ZOO[name])).astype(np.float32)
    logits, proba = session(path).run([LOGITS, PROBABILITIES], {INPUT: X})
    expected, _ = est.net_.forward(X.reshape(5, *est.net_.input_shape), train=False)
    expected = expected.reshape(5, -1)
    assert np.abs(logits - expected).max() <= TOLERANCE * max(1.0, float(np.abs(expected).max()))
    assert np.abs(proba - est.predict_proba(X)).max() <= TOLERANCE
    meta = {p.key: p.value for p in __import__("onnx").load(str(path)).metadata_props}
    assert json.loads(meta["classes"]) == est.classes_.tolist()
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_a_model_trained_on_crops_takes_the_whole_images(tmp_path):
    """With Caffe's crop (augment "crop_mirror:29" on 31×31 digits-sized images) predict_proba cuts
    the centre of what it is given; the graph does the same, at any size from the crop up."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0.0, 1.0, (32, 1, 31, 31)).astype(np.float32), rng.integers(0, 3, 32)
    est = DistributedCNN(
        net="lenet", augment="crop_mirror:29", engine="simulated", n_workers=1, n_groups=1,
        learning_rate=0.01, momentum=0.9, batch_size=8, eval_size=8, max_epochs=1, time_budget=None,
        verbose=0,
    ).fit(X, y)  # fmt: skip
    run = session(est.to_onnx(tmp_path / "model.onnx"))
    for images in (X[:4], X[:4, :, 1:30, 1:30], rng.uniform(0.0, 1.0, (2, 1, 33, 36)).astype(np.float32)):
        (proba,) = run.run([PROBABILITIES], {INPUT: images})
        assert np.abs(proba - est.predict_proba(images)).max() <= TOLERANCE


def test_to_onnx_refuses_before_writing(tmp_path):
    with pytest.raises(NotFittedError):
        DistributedCNN(net="mlp").to_onnx(tmp_path / "model.onnx")
    est = fitted("mlp")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        est.to_onnx(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        est.to_onnx(tmp_path / "no" / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_to_onnx_without_onnx_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    with pytest.raises(ImportError, match=r'pip install "dasknn\[export\]"'):
        fitted("mlp").to_onnx(tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def saved_lenet(tmp_path):
    return fitted("lenet").save(tmp_path / "model")


def test_dasknn_export_writes_the_saved_model(saved_lenet, tmp_path):
    out = tmp_path / "lenet.onnx"
    code, err = cli("export", "--model", str(saved_lenet), "--output", str(out))
    assert (code, err) == (0, "")
    X = np.random.default_rng(6).uniform(0.0, 1.0, (4, 1, 29, 29)).astype(np.float32)
    (proba,) = session(out).run([PROBABILITIES], {INPUT: X})
    assert np.abs(proba - fitted("lenet").predict_proba(X)).max() <= TOLERANCE


def test_dasknn_export_bad_input_is_exit_2_naming_the_file(saved_lenet, tmp_path):
    code, err = cli("export", "--model", str(tmp_path / "nothing"), "--output", str(tmp_path / "m.onnx"))
    assert code == exits.EXIT_BAD_INPUT and str(tmp_path / "nothing") in err
    assert len(err.strip().splitlines()) == 1
    for output in (tmp_path / "m.txt", tmp_path / "missing" / "m.onnx"):
        code, err = cli("export", "--model", str(saved_lenet), "--output", str(output))
        assert code == exits.EXIT_BAD_INPUT and repr(str(output)) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_dasknn_export_to_a_full_disk_is_exit_5_and_leaves_nothing(saved_lenet, full_folder):  # noqa: F811
    out = full_folder / "lenet.onnx"  # LeNet's graph is 1.7 MB, the folder holds 1 MiB
    code, err = cli("export", "--model", str(saved_lenet), "--output", str(out))
    assert code == exits.EXIT_LOCAL_IO == 5
    (line,) = err.strip().splitlines()
    assert "No space left on device" in line and str(out) in line
    assert list(full_folder.iterdir()) == []


def test_dasknn_export_without_onnx_is_exit_2_naming_the_extra(saved_lenet, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    code, err = cli("export", "--model", str(saved_lenet), "--output", str(tmp_path / "m.onnx"))
    assert code == exits.EXIT_BAD_INPUT and 'pip install "dasknn[export]"' in err
    assert not (tmp_path / "m.onnx").exists()
