"""The unmerged physical map (Omnivore appendix C): FC on every group, FC model on a model server."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

from .conftest import training_accuracy

UNMERGED = Strategy(physical_map="unmerged")


def test_one_group_unmerged_equals_merged(digits):
    X, y = digits
    cfg = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=16)
    results = []
    for strategy in (Strategy(), UNMERGED):
        engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=strategy)
        results.append(engine.run(zoo.lenet(seed=0), X, y, cfg, Budget(iterations=6)))
    merged, unmerged = results
    np.testing.assert_allclose(merged.trace["loss"], unmerged.trace["loss"], rtol=1e-5)
    for key, value in merged.state.params.items():
        np.testing.assert_allclose(value, unmerged.state.params[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert (unmerged.trace["fc_staleness"] == 0).all()


def test_fc_becomes_stale_like_the_conv_model(digits):
    X, y = digits
    g = 4
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=g, verbose=0, strategy=UNMERGED, t_fc_worker=0.3)
    result = engine.run(zoo.lenet(seed=0), X, y, RunConfig(n_groups=g, batch_size=16), Budget(iterations=8))
    trace = result.trace
    assert sorted(trace["fc_staleness"].iloc[-g:]) == list(range(g))
    assert (trace["fc_staleness"] == trace["staleness"]).all()
    # no FC queue: each group's iteration takes t_conv + t_fc_worker, the g groups in parallel
    np.testing.assert_allclose(trace["t_end"].iloc[-1], 2 * 1.3)


@pytest.mark.slow
def test_unmerged_four_groups_train_lenet_to_97_percent(mnist):
    X, y, Xn, yn = mnist
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=4, verbose=0, strategy=UNMERGED)
    cfg = RunConfig(n_groups=4, lr=0.01, momentum=0.9, batch_size=64)
    engine.run(net, X, y, cfg, Budget(iterations=600))
    assert training_accuracy(net, Xn, yn) >= 0.97
