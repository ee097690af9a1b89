"""Experiment 10 at its tiny setting: SMA (Crossbow Alg. 1) and synchronous SGD on one clock, judged
on held-out images."""

import numpy as np
import pytest

from experiments import sma_vs_sync


def test_sma_vs_sync_tiny(run_tiny):
    ds, out = run_tiny("sma_vs_sync")
    assert list(ds["scheme"].values) == ["sma", "s-sgd"] and list(ds["learners"].values) == [1, 2]
    assert list(ds["seed"].values) == [0, 1]
    np.testing.assert_array_equal(ds["aggregate_batch"], [8, 16])
    acc = ds["heldout_accuracy"].values
    assert np.all(np.isfinite(acc)) and np.all((acc >= 0) & (acc <= 1))
    # the seeds differ (data order and initial weights)
    assert not np.array_equal(*ds["heldout_accuracy"].sel(scheme="s-sgd", learners=2).values)
    # one simulated second per iteration of k·b images in both schemes: time = epochs · n / (k·b)
    n_train = ds.attrs["training_images"]
    ep, t = ds["epochs_to_target"], ds["time_to_target"]
    assert np.array_equal(np.isfinite(ep.values), np.isfinite(t.values)) and np.isfinite(ep.values).any()
    expected = ep * n_train / ds["aggregate_batch"]
    np.testing.assert_allclose(t.values[np.isfinite(t.values)], expected.values[np.isfinite(t.values)])
    assert "[" in (out / "table.md").read_text()


def test_a_target_is_reached_when_the_median_of_the_last_three_evaluations_is_at_it():
    accuracy = np.array([0.1, 0.9, 0.2, 0.85, 0.9, 0.3, 0.95])
    assert sma_vs_sync.reached(accuracy, 0.8) == 3  # median(0.9, 0.2, 0.85) = 0.85; 0.2 before
    assert sma_vs_sync.reached(accuracy, 0.95) is None
    assert sma_vs_sync.reached(np.array([0.99, 0.99]), 0.5) is None  # fewer than three evaluations


def test_bad_input():
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        sma_vs_sync.settings(True, None, None, 0)
    with pytest.raises(ValueError, match="target must be"):
        sma_vs_sync.settings(True, None, 1.5, None)
