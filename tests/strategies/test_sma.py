"""Crossbow's SMA (§3.2, Alg. 1) and SparkNet's model averaging on the SimulatedEngine."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.simulated.strategies import ReplicaSimulation
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn import zoo
from dasknn.tradeoff.hardware import time_per_iteration

from .conftest import training_accuracy


def run(strategy, X, y, cfg, iterations, **engine_kw):
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=strategy, **engine_kw)
    return engine.run(net, X, y, cfg, Budget(iterations=iterations))


@pytest.mark.parametrize("strategy", [Strategy("sma"), Strategy("model_averaging", tau=3)])
def test_one_learner_equals_sgd_with_momentum(digits, strategy):
    X, y = digits
    cfg = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=16, seed=3)
    sgd = run(Strategy(), X, y, cfg, 7)
    replica = run(strategy, X, y, cfg, 7)
    np.testing.assert_allclose(sgd.trace["loss"], replica.trace["loss"], rtol=1e-5)
    for key, value in sgd.state.params.items():
        np.testing.assert_allclose(value, replica.state.params[key], rtol=1e-4, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(
            sgd.state.momentum[key], replica.state.momentum[key], rtol=1e-3, atol=1e-6, err_msg=key
        )


def test_alpha_one_keeps_every_replica_at_the_average(digits):
    X, y = digits
    cfg = RunConfig(n_groups=3, lr=0.01, momentum=0.5, batch_size=16)
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=Strategy("sma", alpha=1.0))
    sim = ReplicaSimulation(engine, net, X, y, cfg, k=1, state=TrainState.from_net(net))
    sim.advance(Budget(iterations=6))
    assert sim.rounds == 2
    for replica in sim.replicas:
        for key, z in sim.z.items():
            np.testing.assert_allclose(replica[key], z, rtol=1e-6, atol=1e-7)


def test_trace_has_one_row_per_learner_batch_and_a_synchronous_clock(digits):
    X, y = digits
    k = 2
    cfg = RunConfig(n_groups=k, lr=0.01, momentum=0.9, batch_size=16)
    result = run(Strategy("sma"), X, y, cfg, 3 * k, n_workers=k, t_fc_worker=0.25, t_sync=0.5)
    trace = result.trace
    assert len(trace) == 3 * k
    assert (trace["staleness"] == 0).all()
    assert sorted(trace["batch"]) == list(range(3 * k))
    np.testing.assert_allclose(sorted(set(trace["t_end"])), [1.75, 3.5, 5.25])
    assert time_per_iteration(trace) == pytest.approx(1.75 / k)
    assert result.state.batches_done == 3 * k


def test_model_averaging_synchronises_every_tau_iterations(digits):
    X, y = digits
    cfg = RunConfig(n_groups=2, lr=0.01, momentum=0.9, batch_size=16)
    result = run(Strategy("model_averaging", tau=2), X, y, cfg, 8, n_workers=2, t_fc_worker=0.0, t_sync=1.0)
    np.testing.assert_allclose(sorted(set(result.trace["t_end"])), [1.0, 3.0, 4.0, 6.0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, lr, iterations",
    # SMA's step on z is α = 1/k of the learners' (Crossbow §3.2): it needs a larger η than averaging
    [(Strategy("sma"), 0.1, 1200), (Strategy("model_averaging", tau=4), 0.02, 800)],
)
def test_four_learners_train_lenet_to_97_percent(mnist, strategy, lr, iterations):
    X, y, Xn, yn = mnist
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=4, verbose=0, strategy=strategy)
    cfg = RunConfig(n_groups=4, lr=lr, momentum=0.9, batch_size=64)
    engine.run(net, X, y, cfg, Budget(iterations=iterations))
    assert training_accuracy(net, Xn, yn) >= 0.97
