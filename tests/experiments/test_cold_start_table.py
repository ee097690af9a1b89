"""Experiment 7 at its tiny setting: a (µ*, η*) per staleness S ∈ {0, 31, 127} and seed, beside
Table III's."""

import numpy as np
import pytest

from experiments import cold_start_table


def test_cold_start_table_tiny(run_tiny):
    ds, out = run_tiny("cold_start_table")
    assert list(ds["staleness"].values) == [0, 31, 127]
    assert list(ds["case"].values) == ["MNIST (LeNet)", "CIFAR-10 (quick)"]
    assert list(ds["seed"].values) == [0, 1]
    np.testing.assert_allclose(ds["paper_momentum"].sel(case="MNIST (LeNet)"), [0.6, 0.0, 0.8])
    np.testing.assert_allclose(ds["paper_lr"].sel(case="CIFAR-10 (quick)"), [1e-3, 1e-4, 1e-4])
    # every S has a best point at every seed, drawn from the grid that was run
    assert ds["best_momentum"].dims == ("case", "seed", "staleness")
    assert np.isfinite(ds["best_momentum"]).all()
    assert set(np.unique(ds["best_momentum"])) <= set(ds["momentum"].values)
    assert set(np.unique(ds["best_lr"])) <= set(ds["lr"].values)
    assert np.isfinite(ds["final_loss"]).sum() >= 12
    # the seeds differ (data order and initial weights)
    first = ds["final_loss"].sel(staleness=0)
    assert not np.allclose(first.sel(seed=0), first.sel(seed=1), equal_nan=True)
    text = (out / "table.md").read_text()
    assert "synthetic" in text and "[" in text  # the seeds' range is in the table


def test_bad_seeds():
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        cold_start_table.run(tiny=True, seeds=0)
