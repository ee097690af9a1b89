"""Experiment 6 at its tiny setting: three momentum rules at one g, timed to a common loss."""

import numpy as np


def test_momentum_lesion_tiny(run_tiny):
    ds, _ = run_tiny("momentum_lesion")
    assert list(ds["rule"].values) == ["mu=0.9", "mu tuned for sync", "mu tuned for g"]
    assert float(ds["momentum_used"].sel(rule="mu=0.9")) == 0.9
    # the rule tuned for g picks the lowest final loss of the grid at g, so no other rule beats it
    final = ds["final_loss"]
    assert float(final.sel(rule="mu tuned for g")) == float(ds["grid_final_loss"].min())
    assert np.all(final >= final.sel(rule="mu tuned for g"))
    assert float(ds["slowdown"].sel(rule="mu tuned for g")) == 1.0
    assert np.all(np.isfinite(ds["time_to_target"]))
    assert ds.attrs["n_groups"] == 4
