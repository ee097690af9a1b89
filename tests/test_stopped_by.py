"""`stopped_by_` names what ended a fit, and callbacks see the fit's evaluations in order."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.callbacks import Callback
from dasknn.data import load
from dasknn.estimator import DistributedCNN

FIXED = {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9}
QUICK = {"net": "lenet", "engine": "simulated", "n_workers": 1, "batch_size": 32, "eval_size": 100, **FIXED}


class Recorder(Callback):
    """Keeps every row the fit passes to `on_evaluation`."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_evaluation(self, est, record) -> bool:
        self.rows.append(dict(record))
        return False


@pytest.fixture(scope="module")
def digits():
    X, y = load("digits", size=28)
    return np.asarray(X[:512], dtype=np.float32), np.asarray(y[:512])


def test_stopped_by_names_max_epochs_the_target_and_the_time_budget(digits):
    X, y = digits
    est = DistributedCNN(time_budget=None, max_epochs=0.5, **QUICK).fit(X, y)
    assert est.stopped_by_.startswith("max_epochs") and "callback" not in est.stopped_by_
    assert f"iteration {est.n_iter_}" in est.stopped_by_
    est = DistributedCNN(time_budget=None, max_epochs=3, target_accuracy=0.3, **QUICK).fit(X, y)
    assert est.stopped_by_.startswith("target_accuracy") and est.history_[-1]["accuracy"] >= 0.3
    est = DistributedCNN(time_budget=0.3, **QUICK).fit(X, y)
    assert est.stopped_by_.startswith("time_budget") and "simulated" in est.stopped_by_


def test_a_resumed_fit_names_the_budget_that_ended_it(digits, tmp_path):
    X, y = digits
    X, y = X.reshape(len(X), -1)[:, ::13].copy(), y  # 61 features: a small MLP, cheap
    params = {**QUICK, "net": "mlp", "input_shape": "flat", "time_budget": None, "checkpoint_dir": tmp_path}
    first = DistributedCNN(max_epochs=1, **params).fit(X, y)
    assert first.stopped_by_ == "max_epochs=1 done: 16 iterations, at iteration 16"
    resumed = DistributedCNN(max_epochs=2, resume=True, **params).fit(X, y)
    assert resumed.stopped_by_ == "max_epochs=2 done: 32 iterations, at iteration 32"


def test_early_stopping_names_itself_and_callbacks_never_see_iterations_go_back(digits):
    X, y = digits
    seen = Recorder()
    est = DistributedCNN(
        time_budget=None, max_epochs=4, validation_fraction=0.2, early_stopping=True, n_iter_no_change=2,
        tol=10.0, callbacks=[seen], **QUICK,
    ).fit(X, y)  # fmt: skip
    iterations = [row["iteration"] for row in seen.rows]
    assert iterations == sorted(iterations) and len(iterations) == 3  # start, and two without change
    assert est.history_[-1]["iteration"] == 0 and "restored" in est.history_[-1]["event"]
    assert len(est.history_) == len(seen.rows) + 1  # the restored row is history, not a new evaluation
    assert est.stopped_by_.startswith("EarlyStopping") and f"iteration {iterations[-1]}" in est.stopped_by_
    assert est.best_iteration_ == 0 == est.n_iter_
