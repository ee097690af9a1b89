"""Graph nets on the engines: a net with BatchNorm, a residual sum and an auxiliary loss head trains
on the simulator and on a real LocalCluster exactly as in process; BatchNorm's running statistics
are combined from the shards and groups as documented, and travel in checkpoints."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dasknn.data.batching import iterate_batches
from dasknn.engine import checkpoint
from dasknn.engine.dask import DaskEngine, local_client
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn.layers import Convolution, InnerProduct, ReLU
from dasknn.nn.merge import Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale
from dasknn.nn.solver import SGD

CFG = RunConfig(n_groups=1, lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=16, seed=1)
FRACTION = 0.8


def graph_net(seed: int = 0) -> Net:
    """conv → BatchNorm → Scale → ReLU, a residual conv summed back, an auxiliary head (0.3)."""
    return Net(
        [
            (Convolution("c1", 3, 3, pad=1, bias_term=False), "data", "c1"),
            (BatchNorm("bn1", moving_average_fraction=FRACTION), "c1", "c1"),
            (Scale("s1"), "c1", "c1"),
            (ReLU("r1"), "c1", "c1"),
            (Convolution("c2", 3, 3, pad=1), "c1", "c2"),
            (Eltwise("sum"), ["c1", "c2"], "sum"),
            (InnerProduct("aux", 3), "c1", "aux"),
            (InnerProduct("fc", 3), "sum", "fc"),
        ],
        (1, 6, 6),
        name="graph",
        seed=seed,
        loss_weights={"aux": 0.3},
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((160, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64) + (X[:, 0, 3, 3] > 0)
    return X, y


def in_process(X, y, iterations):
    net = graph_net()
    solver = SGD.for_net(net, weight_decay=CFG.weight_decay)
    batches = iterate_batches(X, y, CFG.batch_size, epoch=0, seed=CFG.seed)
    losses = []
    for _ in range(iterations):
        xb, yb = dask.compute(*next(batches))
        out = net.train_step(xb, yb)
        solver.step(net.params, out["grads"], lr=CFG.lr, momentum=CFG.momentum)
        losses.append((out["loss"], out["main_loss"]))
    return net, losses


def running_factor(iterations: int, images: int) -> float:
    """BatchNorm's scale_factor after `iterations` batches of `images`: Σ f^t · images."""
    return sum(FRACTION**t * images for t in range(iterations))


def test_simulator_trains_a_graph_net_as_in_process(data):
    X, y = data
    net = graph_net()
    result = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0).run(net, X, y, CFG, Budget(iterations=8))
    ref, losses = in_process(X, y, 8)
    for key, value in ref.get_params().items():
        np.testing.assert_allclose(net.get_params()[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(result.trace[["loss", "main_loss"]].to_numpy(), losses, rtol=1e-5)
    assert (result.trace["loss"] > result.trace["main_loss"]).all()
    assert net.params["bn1.scale_factor"][0] == pytest.approx(running_factor(8, 16))
    assert "bn1.mean" in result.state.params  # the statistics are training state


def test_shards_and_groups_add_their_statistics_and_checkpoints_carry_them(data, tmp_path):
    """Each shard normalises with its own statistics and contributes n·mean, n·variance and n; the
    conv model server accumulates the sums of one group's shards, one update per group iteration."""
    X, y = data
    net = graph_net()
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=4, verbose=0)
    result = engine.run(net, X, y, CFG.with_(n_groups=2), Budget(iterations=6))
    assert net.params["bn1.scale_factor"][0] == pytest.approx(running_factor(6, 16))
    path = checkpoint.save(tmp_path, result.state)
    state = checkpoint.load(path).state
    for key in ("bn1.mean", "bn1.variance", "bn1.scale_factor"):
        np.testing.assert_array_equal(state.params[key], result.state.params[key])
    more = engine.run(graph_net(), X, y, CFG.with_(n_groups=2), Budget(iterations=2), start=state)
    assert more.state.params["bn1.scale_factor"][0] == pytest.approx(running_factor(8, 16))


def test_dask_engine_trains_a_graph_net_as_in_process(data):
    X, y = data
    Xd = dask.array.from_array(X, chunks=40)
    with local_client(n_workers=1) as client:
        net = graph_net()
        result = DaskEngine(client).run(net, Xd, y, CFG, Budget(iterations=6))
    ref, losses = in_process(Xd, y, 6)
    for key, value in ref.get_params().items():
        np.testing.assert_allclose(net.get_params()[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(result.trace[["loss", "main_loss"]].to_numpy(), losses, rtol=1e-5)


def test_dask_engine_sums_two_shards_statistics(data):
    """One group on two workers: the packed activations of both heads cross to the FC server and the
    two shards' BatchNorm contributions reach the conv model server as one update per iteration."""
    X, y = data
    with local_client(n_workers=2) as client:
        net = graph_net()
        result = DaskEngine(client).run(
            net, dask.array.from_array(X, chunks=40), y, CFG, Budget(iterations=4)
        )
    assert net.params["bn1.scale_factor"][0] == pytest.approx(running_factor(4, 16))
    assert np.isfinite(result.trace["main_loss"]).all() and len(result.trace) == 4
