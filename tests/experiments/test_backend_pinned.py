"""The papers' experiments 1-3 measure batched lowering whatever kernels are installed."""

import pytest

from experiments import batched_lowering, flops_proportionality, lowering_types


@pytest.mark.parametrize("module", [batched_lowering, lowering_types, flops_proportionality])
def test_experiments_1_to_3_pin_lowering(module):
    assert module.BACKEND == "lowering"


def test_flops_proportionality_builds_its_nets_on_lowering():
    nets = flops_proportionality.make_nets("lenet", (1,))
    assert [net.backend for net in nets.values()] == ["lowering"]
    layers = [layer for layer in nets[1].layers if hasattr(layer, "backend")]
    assert layers and all(layer.backend == "lowering" for layer in layers)
