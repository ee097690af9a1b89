"""Experiment 10 at its tiny setting: SMA with one learner is synchronous SGD, so the two agree at k = 1."""

import numpy as np


def test_sma_vs_sync_tiny(run_tiny):
    ds, _ = run_tiny("sma_vs_sync")
    assert list(ds["scheme"].values) == ["sma", "s-sgd"] and list(ds["learners"].values) == [1, 2]
    # k = 1: SMA (alpha = 1) is exactly SGD with momentum on the same batches
    one = ds.sel(learners=1)
    assert float(one["final_loss"].sel(scheme="sma")) == float(one["final_loss"].sel(scheme="s-sgd"))
    np.testing.assert_array_equal(ds["aggregate_batch"], [8, 16])
    assert np.all(np.isfinite(ds["final_loss"])) and np.all(ds["final_loss"] < 5.0)
