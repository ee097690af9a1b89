"""Divergence: a blown-up run rolls back to the last good state, lowers lr and still learns."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint
from dasknn.estimator import DistributedCNN
from dasknn.fitting import MAX_ROLLBACKS

COMMON = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "n_workers": 2,
    "time_budget": None,
    "eval_size": 300,
    "n_groups": 2,
    "momentum": 0.9,
}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def test_a_huge_learning_rate_rolls_back_lowers_lr_and_still_learns(digits, tmp_path):
    X, y = digits
    est = DistributedCNN(**COMMON, learning_rate=50.0, max_epochs=6, checkpoint_dir=tmp_path)
    est.fit(X, y)
    rollbacks = est.decisions_[est.decisions_["action"] == "rollback"]
    assert len(rollbacks) >= 1
    assert rollbacks["lr"].tolist() == [50.0 / 10**i for i in range(1, len(rollbacks) + 1)]
    assert est.config_.lr == rollbacks["lr"].iloc[-1] < 1.0
    events = [h for h in est.history_ if h["event"].startswith("rollback")]
    assert len(events) == len(rollbacks) and events[0]["lr"] == 5.0
    assert (est.trace_["phase"] == "rolled_back").any()  # the failed chunks' time stays on the record
    assert all(np.isfinite(v).all() for v in est.state_.params.values())
    assert checkpoint.healthy(est.state_)
    assert est.score(X, y) >= 0.9
    # the checkpoints carry the lowered rate: a resume goes on with it
    assert checkpoint.latest(tmp_path).meta["loop"]["config"]["lr"] == est.config_.lr


def test_a_run_that_diverges_at_every_rate_raises_instead_of_returning_nan(digits):
    X, y = digits
    est = DistributedCNN(**COMMON, learning_rate=0.1, max_epochs=1)
    with pytest.raises(ValueError, match="overflows net"):  # seen in the first batch: before any work
        est.fit(X * np.float32(3e37), y)
    later = X.copy()
    later[est.batch_size :] *= np.float32(3e37)  # past the first batch: the training finds it
    with pytest.raises(FloatingPointError, match=f"diverged {MAX_ROLLBACKS + 1} times in a row"):
        est.fit(later, y)  # the forward pass overflows float32 at any rate
    assert not hasattr(est, "net_")


def bn_net(seed: int = 0):
    """Conv → BatchNorm (Caffe's default moving_average_fraction 0.999) → Scale → ReLU → pool → FC."""
    from dasknn.nn.layers import Convolution, Filler, InnerProduct, Pooling, ReLU
    from dasknn.nn.net import Net
    from dasknn.nn.normalization import BatchNorm, Scale

    entries = [
        (Convolution("conv", 8, 3, pad=1, bias_term=False, weight_filler=Filler("msra")), "data", "conv"),
        (BatchNorm("conv/bn", moving_average_fraction=0.999), "conv", "conv"),
        (Scale("conv/scale"), "conv", "conv"),
        (ReLU("conv/relu"), "conv", "conv"),
        (Pooling("pool", "max", kernel_size=2, stride=2), "conv", "pool"),
        (InnerProduct("fc", 10, weight_filler=Filler("gaussian", std=0.01)), "pool", "fc"),
    ]
    return Net(entries, (1, 8, 8), name="bn-digits", seed=seed)


def test_batchnorm_running_sums_beyond_the_weight_limit_are_not_divergence():
    # Caffe's BatchNorm keeps running *sums*: about batch × variance / (1 − 0.999) on 0-255 pixels,
    # far beyond the size at which a weight counts as exploding; training goes on at its rate
    d = load_digits()
    X, y = (d.data * 16).astype(np.float32).reshape(-1, 1, 8, 8), d.target  # Caffe's 0-255 scale
    knobs = {**COMMON, "net": bn_net(), "input_shape": None, "n_groups": 1, "learning_rate": 0.01}
    with pytest.warns(UserWarning, match="unscaled"):
        est = DistributedCNN(**knobs, batch_size=64, max_epochs=3, random_state=0).fit(X, y)
    assert "rollback" not in set(est.decisions_["action"])
    sums = list(bn_net().statistics)  # conv/bn.mean, .variance, .scale_factor
    assert float(est.state_.params["conv/bn.variance"].max()) > checkpoint.WEIGHT_LIMIT
    assert checkpoint.healthy(est.state_, statistics=sums)
    assert not checkpoint.healthy(est.state_)  # the premise: the old check called this divergence
    assert est.score(X, y) >= 0.9
