"""The simulated engine's clock is a model fixed by the fit's inputs, never the live machine's speed
(docs/architecture.md "The simulator's clock"): same seed, same weights, idle or loaded."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint
from dasknn.estimator import SIMULATED_GFLOPS, DistributedCNN
from tests.conftest import cpu_hogs

PARAMS = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "n_workers": 4,
    "batch_size": 32,
    "time_budget": 0.02,  # simulated s: ~1,000 iterations of this small MLP, the search's every phase
    "eval_size": 200,
}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def _weights(est: DistributedCNN) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in est.state_.params.items()}


@pytest.mark.slow  # identical simulated fits stay in the default run (test_resume.py); + CPU hogs
def test_two_simulated_fits_give_identical_weights_idle_and_beside_a_cpu_hog(digits):
    X, y = digits
    idle = DistributedCNN(**PARAMS).fit(X, y)  # the optimizer's search: every charge on the model clock
    with cpu_hogs(2) as hogs:
        loaded = DistributedCNN(**PARAMS).fit(X, y)
        assert all(h.poll() is None for h in hogs), "the hogs ran the whole fit"
    assert idle.n_iter_ == loaded.n_iter_ > 0
    a, b = _weights(idle), _weights(loaded)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert idle.decisions_["score"].equals(loaded.decisions_["score"])
    assert idle.trace_["t_end"].equals(loaded.trace_["t_end"])
    assert idle.trace_.attrs["simulated_gflops"] == SIMULATED_GFLOPS


def test_a_given_speed_changes_the_simulated_clock_and_calibrate_is_recorded_and_resumed(tmp_path, digits):
    X, y = digits
    fixed = {
        **PARAMS,
        "n_groups": 2,
        "learning_rate": 0.1,
        "momentum": 0.9,
        "time_budget": None,
        "max_epochs": 2,
    }
    slow = DistributedCNN(**fixed, simulated_gflops=SIMULATED_GFLOPS / 10).fit(X, y)
    fast = DistributedCNN(**fixed).fit(X, y)
    assert slow.history_[-1]["time"] > 2 * fast.history_[-1]["time"]  # the network part stays

    cal = DistributedCNN(**fixed, simulated_gflops="calibrate", checkpoint_dir=tmp_path).fit(X, y)
    measured = cal.trace_.attrs["simulated_gflops"]
    assert measured > 0 and checkpoint.latest(tmp_path).meta["simulated_gflops"] == measured
    with cpu_hogs(1):  # a resume under load reads the recorded speed back, it does not measure again
        again = DistributedCNN(**fixed, simulated_gflops="calibrate", checkpoint_dir=tmp_path, resume=True)
        again.fit(X, y)
    assert again.simulated_gflops_ == measured


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "fast", True])
def test_simulated_gflops_bad_values_are_named(bad, digits):
    X, y = digits
    with pytest.raises(ValueError, match="simulated_gflops must be a number > 0 or 'calibrate'"):
        DistributedCNN(**PARAMS, simulated_gflops=bad).fit(X, y)
