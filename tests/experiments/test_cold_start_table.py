"""Experiment 7 at its tiny setting: a (µ*, η*) per staleness S ∈ {0, 31, 127}, beside Table III's."""

import numpy as np


def test_cold_start_table_tiny(run_tiny):
    ds, out = run_tiny("cold_start_table")
    assert list(ds["staleness"].values) == [0, 31, 127]
    assert list(ds["case"].values) == ["MNIST (LeNet)", "CIFAR-10 (quick)"]
    np.testing.assert_allclose(ds["paper_momentum"].sel(case="MNIST (LeNet)"), [0.6, 0.0, 0.8])
    np.testing.assert_allclose(ds["paper_lr"].sel(case="CIFAR-10 (quick)"), [1e-3, 1e-4, 1e-4])
    # every S has a best point, drawn from the grid that was run
    assert set(np.unique(ds["best_momentum"])) <= set(ds["momentum"].values)
    assert set(np.unique(ds["best_lr"])) <= set(ds["lr"].values)
    assert np.isfinite(ds["final_loss"]).sum() >= 6
    assert "synthetic" in (out / "table.md").read_text()
