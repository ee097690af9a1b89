"""Experiment 10 at its tiny setting: SMA with one learner is synchronous SGD, so the two agree at k = 1."""

import numpy as np
import pytest

from experiments import sma_vs_sync


def test_sma_vs_sync_tiny(run_tiny):
    ds, out = run_tiny("sma_vs_sync")
    assert list(ds["scheme"].values) == ["sma", "s-sgd"] and list(ds["learners"].values) == [1, 2]
    assert list(ds["seed"].values) == [0, 1]
    # k = 1: SMA (alpha = 1) is exactly SGD with momentum on the same batches, at every seed
    one = ds.sel(learners=1)
    np.testing.assert_array_equal(one["final_loss"].sel(scheme="sma"), one["final_loss"].sel(scheme="s-sgd"))
    np.testing.assert_array_equal(ds["aggregate_batch"], [8, 16])
    assert np.all(np.isfinite(ds["final_loss"])) and np.all(ds["final_loss"] < 5.0)
    # the seeds differ (data order and initial weights)
    assert not np.array_equal(*ds["final_loss"].sel(scheme="sma", learners=2).values)
    # time to target on the clock of 1 s per iteration: S-SGD's iterations are k·b images each
    reached = np.isfinite(ds["epochs_to_target"].values)
    assert np.array_equal(reached, np.isfinite(ds["time_to_target"].values))
    assert "[" in (out / "table.md").read_text()


def test_epochs_and_time_to_target_are_at_the_first_crossing():
    import pandas as pd

    trace = pd.DataFrame(
        {"group": 0, "t_end": np.arange(1.0, 9.0), "accuracy": [0.1, 0.2, 0.6, 0.9, 0.9, 0.2, 0.9, 0.9]}
    )
    ep, t, epoch, acc = sma_vs_sync.epochs_to(trace, batch=4, n_samples=16, target=0.8, window_images=8)
    assert (ep, t) == (1.25, 5.0)  # the mean of two batches first reaches 0.8 at update 5
    assert np.isnan(sma_vs_sync.epochs_to(trace, 4, 16, 0.95, 8)[0])


def test_bad_input():
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        sma_vs_sync.settings(True, None, None, 0)
    with pytest.raises(ValueError, match="target must be"):
        sma_vs_sync.settings(True, None, 1.5, None)
