"""Experiment 8 at its tiny setting: merged FC is never stale; unmerged FC is and costs more."""

import numpy as np


def test_merged_vs_unmerged_tiny(run_tiny):
    ds, _ = run_tiny("merged_vs_unmerged")
    assert float(ds["fc_staleness"].sel(physical_map="merged")) == 0.0
    assert float(ds["fc_staleness"].sel(physical_map="unmerged")) > 0.5  # g = 4: FC updates are stale too
    assert float(ds["t_fc"].sel(physical_map="unmerged")) > float(ds["t_fc"].sel(physical_map="merged"))
    assert float(ds["ratio"].sel(measure="HE")) > 1.0
    np.testing.assert_allclose(ds["paper_ratio"], [1.18, 2.55, 3.01])
    assert np.all(np.isfinite(ds["final_loss"]))
