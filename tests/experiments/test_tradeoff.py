"""Experiment 5 at its tiny setting: the CPU-L clock follows the HE model; penalties vs sync."""

import numpy as np


def test_tradeoff_tiny(run_tiny):
    ds, out = run_tiny("tradeoff")
    sim = ds.sel(cluster="simulated CPU-L", seed=0)
    # P_* are relative to g = 1 and P_total = P_HE * P_SE (Omnivore appendix E)
    assert float(sim["P_HE"].sel(groups=1)) == 1.0 and float(sim["P_SE"].sel(groups=1)) == 1.0
    np.testing.assert_allclose(sim["P_total"], sim["P_HE"] * sim["P_SE"])
    # the simulated time per iteration is the CPU-L HE model's (gamma CV 6%): within 10%
    for g in (1, 4):
        assert abs(float(sim["HE"].sel(groups=g)) / float(sim["HE_predicted"].sel(groups=g)) - 1) < 0.1
    assert float(sim["P_HE"].sel(groups=4)) < 0.2  # 4 groups iterate > 5x faster on CPU-L
    assert 1 <= int(ds["chosen_groups"]) <= 32
    assert "optimizer" in (out / "table.md").read_text()
