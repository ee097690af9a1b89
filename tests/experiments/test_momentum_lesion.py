"""Experiment 6 at its tiny setting: three momentum rules at one g, timed to a common loss per seed."""

import numpy as np
import pytest

from experiments import momentum_lesion


def test_momentum_lesion_tiny(run_tiny):
    ds, out = run_tiny("momentum_lesion")
    assert list(ds["rule"].values) == ["mu=0.9", "mu tuned for sync", "mu tuned for g"]
    assert list(ds["seed"].values) == [0, 1]
    assert float(ds["momentum_used"].sel(rule="mu=0.9")) == 0.9
    # the rule tuned for g picks the lowest seed-mean final loss of the grid at g: no rule beats it
    mean_final = ds["final_loss"].mean("seed")
    assert float(mean_final.sel(rule="mu tuned for g")) == pytest.approx(float(ds["grid_final_loss"].min()))
    assert np.all(mean_final >= mean_final.sel(rule="mu tuned for g") - 1e-12)
    # each seed's l_F is at least the tuned rule's final loss, which that rule reaches
    assert np.all(ds["target_loss"] >= ds["final_loss"].sel(rule="mu tuned for g") - 1e-12)
    assert np.all(np.isfinite(ds["time_to_target"].sel(rule="mu tuned for g")))
    np.testing.assert_array_equal(ds["slowdown"].sel(rule="mu tuned for g"), [1.0, 1.0])
    assert ds.attrs["n_groups"] == 4 and ds.attrs["seeds"] == 2
    assert "[" in (out / "table.md").read_text()  # the seeds' range is in the table


def test_bad_seeds():
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        momentum_lesion.run(tiny=True, seeds=0)


def test_a_run_that_ends_above_twice_its_first_loss_diverged():
    import pandas as pd

    rising = pd.DataFrame({"group": 0, "t_end": np.arange(1.0, 41.0), "loss": np.linspace(2.3, 9.0, 40)})
    falling = rising.assign(loss=np.linspace(2.3, 0.5, 40))
    noisy = rising.assign(loss=np.linspace(2.3, 2.6, 40))  # a short noisy run, not a blow-up
    assert momentum_lesion.diverged(rising) and not momentum_lesion.diverged(falling)
    assert not momentum_lesion.diverged(noisy)
    runs = {(0.9, 0.1): [rising], (0.0, 0.1): [falling]}
    assert momentum_lesion.best(runs) == (0.0, 0.1)
    assert momentum_lesion.best({(0.9, 0.1): [rising]}) == (0.9, 0.1)  # every point diverged
