"""Experiment 2 at its tiny setting: all three lowerings timed per d/o, auto's choice recorded."""

import numpy as np

from dasknn.nn.lowering import LOWERINGS
from experiments.lowering_types import channels


def test_lowering_types_tiny(run_tiny):
    ds, _ = run_tiny("lowering_types")
    assert list(ds["lowering"].values) == list(LOWERINGS)
    assert np.all(np.isfinite(ds["time_s"].values)) and np.all(ds["time_s"].values > 0)
    # d·o is fixed and the ratio d/o as stated
    prod = (ds["d"] * ds["o"]).values
    assert np.all(prod == prod.flat[0])
    assert np.allclose((ds["d"] / ds["o"]).values, ds["ratio"].values[None, :], rtol=0.3)
    # auto follows CcT's d/o rule: Type 1 for small d/o, Type 3 for large
    auto = ds["auto_lowering"].values[0]
    assert auto[0] == "type1" and auto[-1] == "type3"
    assert set(ds["fastest_lowering"].values.ravel()) <= set(LOWERINGS)
    # auto's time over the best is a measurement (auto is timed apart from the others), not a test
    assert np.all(np.isfinite(ds["auto_over_best"].values)) and np.all(ds["auto_over_best"].values > 0)
    # the bytes model: Type 1's lowered matrix grows with d (k² blow-up), Type 3's lifting with o
    lb = ds["lowered_bytes"].isel(shape=0)
    assert lb.sel(lowering="type1")[-1] > lb.sel(lowering="type1")[0]
    assert lb.sel(lowering="type3")[0] > lb.sel(lowering="type3")[-1]


def test_channels():
    assert (
        channels(16, 1) == (256, 256)
        and channels(16, 64) == (2048, 32)
        and channels(16, 1 / 16) == (64, 1024)
    )
