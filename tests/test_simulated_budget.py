"""engine="simulated": budgets in simulated seconds say so, and a wall-clock bound ends a fit whose
simulation runs slower than the clock it models."""

from __future__ import annotations

import io

import numpy as np
import pytest

from dasknn.callbacks import ProgressBar
from dasknn.data import load
from dasknn.estimator import DistributedCNN

FIXED = {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9}
QUICK = {"net": "lenet", "engine": "simulated", "n_workers": 1, "batch_size": 32, "eval_size": 100}


@pytest.fixture(scope="module")
def digits():
    X, y = load("digits", size=28)
    return np.asarray(X[:512], dtype=np.float32), np.asarray(y[:512])


def test_the_default_simulated_budget_is_bounded_in_wall_time_and_says_so(digits):
    """The default time_budget (120 simulated s) of LeNet takes several times longer in real time;
    the bound ends the fit, names itself, and keeps the model trained so far."""
    X, y = digits
    bar = io.StringIO()
    est = DistributedCNN(max_wall_time=2, callbacks=[ProgressBar(file=bar)], **QUICK, **FIXED).fit(X, y)
    assert est.time_budget == 120 and est.history_[-1]["time"] < 120
    assert est.stopped_by_.startswith("max_wall_time") and "simulated" in est.stopped_by_
    assert est.n_iter_ > 0 and est.history_[-1]["iteration"] == est.n_iter_
    # the bound ended the fit at its last evaluation (not a timer: how far 2 s get depends on the machine)
    assert f"after {est.history_[-1]['time']:.4g} " in est.stopped_by_, est.stopped_by_
    assert "simulated" in bar.getvalue() and "sim s" in bar.getvalue()
    assert est.report_.attrs["time_unit"] == "simulated s"


def test_the_bound_stops_the_optimizer_too_and_defaults_from_the_budget(digits):
    X, y = digits
    est = DistributedCNN(max_wall_time=2, **QUICK).fit(X, y)  # "auto" knobs: the optimizer's search
    assert est.stopped_by_.startswith("max_wall_time") and est.history_[-1]["time"] < 120
    assert est.max_wall_time_ == 2.0
    est = DistributedCNN(time_budget=0.3, **QUICK, **FIXED).fit(X, y)
    assert est.max_wall_time_ == 60.0 and est.stopped_by_.startswith("time_budget")
    assert DistributedCNN(**{**QUICK, "engine": "dask"}).max_wall_time == "auto"
    with pytest.raises(ValueError, match="max_wall_time"):
        DistributedCNN(max_wall_time=-1, **QUICK).fit(X, y)
