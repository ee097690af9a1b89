"""DistributedCNN(backend=...): the conv phase's kernels chosen for the whole net, kept by a saved
model and by checkpoints (a resume with other kernels is refused)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.data import load
from dasknn.estimator import DistributedCNN

QUICK = {
    "engine": "simulated", "n_workers": 1, "time_budget": None, "eval_size": 64, "max_epochs": 0.25,
    "n_groups": 1, "learning_rate": 0.01, "momentum": 0.9,
}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    X, y = load("digits", size=28)
    return np.asarray(X[:256], dtype=np.float32), np.asarray(y[:256])


def _backends(net) -> set[str]:
    return {layer.backend for layer in net.layers if hasattr(layer, "backend")}


def test_backend_is_set_on_every_layer_and_kept_by_a_saved_model(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(backend="lowering", **QUICK).fit(X, y)
    assert _backends(est.net_) == {"lowering"}
    est.save(tmp_path / "model")
    loaded = DistributedCNN.load(tmp_path / "model")
    assert loaded.backend == "lowering" and _backends(loaded.net_) == {"lowering"}
    np.testing.assert_array_equal(loaded.predict_proba(X[:8]), est.predict_proba(X[:8]))


def test_none_keeps_the_nets_own_kernels(digits):
    X, y = digits
    est = DistributedCNN(**QUICK).fit(X, y)
    assert _backends(est.net_) == {"auto"}


def test_a_resume_with_other_kernels_is_refused_naming_backend(digits, tmp_path):
    X, y = digits
    DistributedCNN(backend="lowering", checkpoint_dir=tmp_path, **QUICK).fit(X, y)
    with pytest.raises(ValueError, match="backend"):
        DistributedCNN(backend="auto", checkpoint_dir=tmp_path, resume=True, **QUICK).fit(X, y)


def test_a_bad_backend_is_refused_before_any_work(digits):
    X, y = digits
    with pytest.raises(ValueError, match="backend must be one of"):
        DistributedCNN(backend="mkl", **QUICK).fit(X, y)
