"""Experiment 8 at its tiny setting: merged FC is never stale; unmerged FC is and costs more, at
every seed."""

import numpy as np


def test_merged_vs_unmerged_tiny(run_tiny):
    ds, out = run_tiny("merged_vs_unmerged")
    assert list(ds["seed"].values) == [0, 1]
    assert np.all(ds["fc_staleness"].sel(physical_map="merged") == 0.0)
    assert np.all(ds["fc_staleness"].sel(physical_map="unmerged") > 0.5)  # g = 4: FC updates are stale too
    assert float(ds["t_fc"].sel(physical_map="unmerged")) > float(ds["t_fc"].sel(physical_map="merged"))
    assert np.all(ds["ratio"].sel(measure="HE") > 1.0)
    np.testing.assert_allclose(ds["paper_ratio"], [1.18, 2.55, 3.01])
    assert np.all(np.isfinite(ds["final_loss"]))
    # the seeds differ (data order and initial weights)
    assert not np.array_equal(*ds["final_loss"].sel(physical_map="merged").values)
    assert "[" in (out / "table.md").read_text()
