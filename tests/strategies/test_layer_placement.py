"""RALP's layer placement (layer-placement §3): the split rule, the byte report, split="auto"."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy, layer_costs, ralp_split, split_layer
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from dasknn.tradeoff.layer_placement import placement_report


def test_lenet_costs_are_output_plus_cumulative_parameter_bytes():
    costs = layer_costs(zoo.lenet(), batch_size=64)
    conv_params = (20 * 25 + 20 + 50 * 20 * 25 + 50) * 4
    assert costs.loc["pool2", "P_cumulative"] == conv_params
    assert costs.loc["pool2", "O"] == 50 * 4 * 4 * 4 * 64
    assert costs.loc["pool2", "cost"] == conv_params + 50 * 4 * 4 * 4 * 64
    assert costs.loc["ip1", "P"] == (800 * 500 + 500) * 4
    assert costs["cost"].iloc[:-1].idxmin() == "pool2"


@pytest.mark.parametrize(
    "net, batch_size, ralp, agrees",
    [
        (zoo.lenet, 64, "ip1", True),
        (zoo.cifar10_quick, 64, "ip1", True),
        (zoo.cifar10_quick, 100, "ip2", False),  # Caffe's batch: ip1's output is smaller than pool3's
        (zoo.caffenet, 256, "fc6", True),
        (zoo.caffenet, 32, "norm2", False),  # small batches: pool2/norm2 output beats conv3-5's params
    ],
)
def test_ralp_split_against_omnivores_first_fc_split(net, batch_size, ralp, agrees):
    n = net()
    first_fc = n.layers[n.split_point()].name
    assert ralp_split(n, batch_size) == ralp
    assert (ralp == first_fc) is agrees


def test_report_predicts_fewer_bytes_for_the_ralp_split():
    report = placement_report(zoo.caffenet(), batch_size=32, n_workers=8)
    assert report.loc["ralp", "bytes_per_worker"] < report.loc["first_fc", "bytes_per_worker"]
    assert report.loc["first_fc", "bytes_per_worker"] < report.loc["all_on_workers", "bytes_per_worker"]
    costs = layer_costs(zoo.caffenet(), 32)
    assert report.loc["ralp", "bytes_per_worker"] == 2 * costs.loc["pool2":"norm2", "cost"].iloc[-1]
    assert report.loc["all_on_workers", "bytes_per_worker"] == 2 * costs["P"].sum()
    np.testing.assert_allclose(report["total_bytes"], 8 * report["bytes_per_worker"])


def test_split_option_resolves_auto_names_and_default():
    net = zoo.cifar10_quick()
    assert split_layer(net, Strategy(), 100) is None
    assert split_layer(net, Strategy(split="auto"), 100) == "ip2"
    assert split_layer(net, Strategy(split="ip1"), 100) == "ip1"


def test_simulator_runs_with_the_fc_server_starting_at_the_chosen_layer(digits):
    X, y = digits
    cfg = RunConfig(n_groups=2, lr=0.01, momentum=0.9, batch_size=16)
    for split, first in ((None, "ip1"), ("auto", "ip1"), ("ip2", "ip2")):
        net = zoo.lenet(seed=0)
        engine = SimulatedEngine(t_conv=1.0, t_fc=0.2, verbose=0, strategy=Strategy(split=split))
        result = engine.run(net, X, y, cfg, Budget(iterations=4))
        assert result.trace.attrs["split"] == first
        assert set(result.state.params) == set(zoo.lenet().get_params())
        assert np.isfinite(result.trace["loss"]).all()
