"""Divergence (issue #8): a blown-up run rolls back to the last good state, lowers lr and still learns."""

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
