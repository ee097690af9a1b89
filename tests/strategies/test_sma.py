"""Crossbow's SMA (§3.2, Alg. 1) and SparkNet's model averaging on the SimulatedEngine."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.simulated.strategies import ReplicaSimulation
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn import zoo
from dasknn.nn.solver import SGD
from dasknn.tradeoff.hardware import time_per_iteration

from .conftest import training_accuracy


def run(strategy, X, y, cfg, iterations, **engine_kw):
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=strategy, **engine_kw)
    return engine.run(net, X, y, cfg, Budget(iterations=iterations))


def test_one_learner_of_model_averaging_equals_sgd_with_momentum(digits):
    X, y = digits
    cfg = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=16, seed=3)
    sgd = run(Strategy(), X, y, cfg, 7)
    replica = run(Strategy("model_averaging", tau=3), X, y, cfg, 7)
    np.testing.assert_allclose(sgd.trace["loss"], replica.trace["loss"], rtol=1e-5)
    for key, value in sgd.state.params.items():
        np.testing.assert_allclose(value, replica.state.params[key], rtol=1e-4, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(
            sgd.state.momentum[key], replica.state.momentum[key], rtol=1e-3, atol=1e-6, err_msg=key
        )


def algorithm_1(net, data, cfg: RunConfig, alpha: float, rounds: int) -> tuple[dict, list[dict]]:
    """Crossbow's Alg. 1 written out: (z, the replicas) after `rounds` rounds of k = n_groups learners.

    Learner j of round i takes batch i·k + j; g_j is the solver's plain SGD step at w_j (γ, lr_mult,
    weight decay), c_j = α (w_j − z), w_j ← w_j − g_j − c_j, z ← z + Σ_j c_j + µ (z − z_prev)."""
    k, mu = cfg.n_groups, cfg.momentum
    z = net.get_params()
    z_prev = {key: v.copy() for key, v in z.items()}
    w = [{key: v.copy() for key, v in z.items()} for _ in range(k)]
    for i in range(rounds):
        c = []
        for j in range(k):
            xb, yb = data.get(i * k + j)
            net.set_params(w[j])
            _, _, grads = net.loss_and_grads(xb, yb, rng=np.random.default_rng([cfg.seed, 4, i * k + j]))
            stepped = {key: v.copy() for key, v in w[j].items()}
            SGD.for_net(net, weight_decay=cfg.weight_decay).step(stepped, grads, lr=cfg.lr, momentum=0.0)
            g = {key: w[j][key] - stepped[key] for key in z}
            c.append({key: alpha * (w[j][key] - z[key]) for key in z})
            w[j] = {key: w[j][key] - g[key] - c[j][key] for key in z}
        z, z_prev = {key: z[key] + sum(cj[key] for cj in c) + mu * (z[key] - z_prev[key]) for key in z}, z
    return z, w


@pytest.mark.parametrize("alpha", [None, 0.5])
def test_sma_follows_crossbow_algorithm_1(digits, alpha):
    """Three rounds of three learners: z and every replica as Alg. 1 computes them (α = 1/k or 0.5);
    the correction uses each replica at its gradient's point and the round's z, not the new z."""
    X, y = dask.compute(*digits)
    cfg = RunConfig(n_groups=3, lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=16, seed=1)
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=Strategy("sma", alpha=alpha))
    sim = ReplicaSimulation(engine, net, X, y, cfg, k=1, state=TrainState.from_net(net))
    sim.advance(Budget(iterations=9))
    assert sim.rounds == 3
    z, replicas = algorithm_1(zoo.lenet(seed=0), sim.data, cfg, 1 / 3 if alpha is None else alpha, 3)
    for key in z:
        np.testing.assert_allclose(sim.z[key], z[key], rtol=1e-5, atol=1e-7, err_msg=key)
        for mine, theirs in zip(sim.replicas, replicas, strict=True):
            np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-5, atol=1e-7, err_msg=key)
    # the replicas differ from z and from each other: the check is not of three copies of one model
    assert not np.allclose(sim.replicas[0]["conv1.weight"], sim.replicas[1]["conv1.weight"])
    assert not np.allclose(sim.replicas[0]["conv1.weight"], sim.z["conv1.weight"])


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
    # under Alg. 1 µ moves z only, so SMA's replicas advance by about η·ḡ a round: a larger η than averaging
    [(Strategy("sma"), 0.1, 1200), (Strategy("model_averaging", tau=4), 0.02, 800)],
)
def test_four_learners_train_lenet_to_97_percent(mnist, strategy, lr, iterations):
    X, y, Xn, yn = mnist
    net = zoo.lenet(seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=4, verbose=0, strategy=strategy)
    cfg = RunConfig(n_groups=4, lr=lr, momentum=0.9, batch_size=64)
    engine.run(net, X, y, cfg, Budget(iterations=iterations))
    assert training_accuracy(net, Xn, yn) >= 0.97
