"""Gradient aggregation inside a group (FireCaffe §6): reduction tree vs parameter server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.engine.dask import DaskEngine, cluster_workers, local_client, tasks
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from dasknn.tradeoff.hardware import t_parameter_server, t_reduction_tree
from dasknn.tradeoff.layer_placement import t_aggregation, tree_depth

from .conftest import training_accuracy


@pytest.fixture(scope="module")
def client2():
    with local_client(n_workers=2, threads_per_worker=2) as client:
        yield client


@pytest.mark.parametrize("p, b, depth", [(1, 2, 0), (2, 2, 1), (5, 2, 3), (8, 2, 3), (9, 3, 2), (10, 3, 3)])
def test_tree_depth_is_ceil_log_b_p(p, b, depth):
    assert tree_depth(p, b) == depth


def test_communication_model_predicts_ps_and_tree():
    grad, bw = 4e6, 1e9
    assert t_aggregation(grad, 8, bw, "ps") == t_parameter_server(grad, 8, bw) == pytest.approx(0.032)
    assert t_aggregation(grad, 8, bw, "tree") == t_reduction_tree(grad, 8, bw) == pytest.approx(0.024)
    assert t_aggregation(grad, 9, bw, "tree", branching=3) == pytest.approx(grad * 2 * 2 * 2 / bw)
    assert t_aggregation(grad, 32, bw, "tree") < t_aggregation(grad, 32, bw, "ps")
    assert t_aggregation(grad, 3, bw, "tree") > t_aggregation(grad, 3, bw, "ps")
    assert math.isclose(t_aggregation(grad, 1, bw, "tree"), 0.0)


@pytest.mark.parametrize("aggregation, branching", [("tree", 2), ("tree", 3), ("ps", 2)])
def test_tree_and_parameter_server_give_the_same_sum(client2, aggregation, branching):
    rng = np.random.default_rng(0)
    grads = [
        {"w": rng.standard_normal((7, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
        for _ in range(5)
    ]
    futures = client2.scatter(grads, hash=False)
    ps_worker = sorted(cluster_workers(client2))[0]
    total = tasks.aggregate(client2, futures, aggregation, branching, ps_worker)[0].result()
    for key in ("w", "b"):
        np.testing.assert_allclose(total[key], np.sum([g[key] for g in grads], axis=0), rtol=1e-6)


@pytest.mark.parametrize("aggregation", ["tree", "ps"])
def test_a_lead_workers_own_gradient_joins_the_sum(client2, aggregation):
    """The group's lead computes its shard inline: its gradient is added here (tree root, or PS on
    the lead) or sent to the parameter server's worker."""
    rng = np.random.default_rng(1)
    grads = [{"w": rng.standard_normal((4, 2)).astype(np.float32)} for _ in range(3)]
    futures = client2.scatter(grads[1:], hash=False)
    ps_worker = sorted(cluster_workers(client2))[0]
    summed, local = tasks.aggregate(client2, futures, aggregation, 2, ps_worker, local=grads[0])
    # from the client (no lead worker), PS sends the local gradient to ps_worker; the tree keeps it here
    assert (local is None) == (aggregation == "ps")
    total = summed.result() if local is None else tasks.sum_grads(local, summed.result())
    np.testing.assert_allclose(total["w"], np.sum([g["w"] for g in grads], axis=0), rtol=1e-6)


def test_dask_engine_ps_and_tree_train_the_same_weights(client2, digits):
    X, y = digits
    cfg = RunConfig(n_groups=1, lr=0.01, momentum=0.9, batch_size=32, seed=1)
    params = []
    for aggregation in ("tree", "ps"):
        net = zoo.lenet(seed=0)
        engine = DaskEngine(client2, strategy=Strategy(aggregation=aggregation))
        result = engine.run(net, X, y, cfg, Budget(iterations=3))
        assert result.trace.attrs["aggregation"] == aggregation
        assert len(engine.placement_.groups[0]) == 2
        params.append(result.state.params)
    for key in params[0]:
        np.testing.assert_allclose(params[0][key], params[1][key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_dask_engine_with_parameter_server_aggregation_trains_lenet_to_97_percent(client2, mnist):
    X, y, Xn, yn = mnist
    net = zoo.lenet(seed=0)
    engine = DaskEngine(client2, strategy=Strategy(aggregation="ps"))
    engine.run(net, X, y, RunConfig(n_groups=1, lr=0.01, momentum=0.9, batch_size=64), Budget(iterations=400))
    assert training_accuracy(net, Xn, yn) >= 0.97
