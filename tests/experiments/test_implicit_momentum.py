"""Experiment 4 at its tiny setting: measured implicit momentum follows Theorem 1 under assumption A2."""

import numpy as np


def test_implicit_momentum_tiny(run_tiny):
    ds, _ = run_tiny("implicit_momentum")
    expo = ds["momentum"].sel(timing="exponential").mean("seed")
    predicted = ds["predicted_momentum"]
    assert np.all(np.abs(expo - predicted) < 0.08)
    # the implicit momentum grows with g under both timing models
    for timing in ds["timing"].values:
        m = ds["momentum"].sel(timing=timing).mean("seed").values
        assert m[-1] > m[0] + 0.5
