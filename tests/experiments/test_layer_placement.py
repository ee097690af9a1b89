"""Experiment 11 at its tiny setting: RALP's split moves fewer bytes than plain data parallelism on LeNet."""

import numpy as np
import pytest

from experiments.layer_placement import PLACEMENTS, measure


def test_layer_placement_tiny(run_tiny):
    ds, out = run_tiny("layer_placement")
    assert list(ds["net"].values) == ["LeNet", "CIFAR-10 quick"] and list(ds["placement"].values) == list(
        PLACEMENTS
    )
    lenet = ds.sel(net="LeNet")
    # LeNet's parameters sit in ip1: RALP (and Omnivore) split before it
    assert str(lenet["first_server_layer"].sel(placement="ralp").values) == "ip1"
    assert float(lenet["model_bytes"]) == 4 * (20 * 26 + 50 * 20 * 25 + 50 + 800 * 500 + 500 + 500 * 10 + 10)
    for w in ds["workers"].values:
        tot = lenet["total_bytes"].sel(workers=w)
        assert tot.sel(placement="ralp") < tot.sel(placement="all_on_workers") / 3
        assert np.isclose(
            float(tot.sel(placement="ring_allreduce")), 2 * float(lenet["model_bytes"]) * (w - 1)
        )
    assert np.allclose(ds["vs_all_on_workers"].sel(placement="all_on_workers"), 1.0)
    assert "RALP Table 2" in (out / "table.md").read_text()


def test_bad_input():
    with pytest.raises(ValueError, match="unknown nets"):
        measure(["VGG11"], [8])
    with pytest.raises(ValueError, match="worker counts"):
        measure(["LeNet"], [1])
