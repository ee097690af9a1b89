"""Dropout in the conv phase draws from the run's seeded streams: two Dask-engine runs with the same
seed train the same weights, and they are the weights the simulator trains with the same streams."""

from __future__ import annotations

import numpy as np

from dasknn.engine.dask import DaskEngine, tasks
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.streams import shard_rng
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn.layers import Convolution, Dropout, InnerProduct, Pooling, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff.hardware import HEModel

CFG = RunConfig(n_groups=1, lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=32, seed=3)


def dropout_net(seed: int = 0) -> Net:
    """A small net whose conv phase ends in Dropout (its masks cross the shard boundary)."""
    layers = [
        Convolution("conv1", 6, 5, stride=2),
        ReLU("relu1"),
        Pooling("pool1", "max", 2, stride=2),
        Dropout("drop1", 0.5),
        InnerProduct("ip1", 10),
    ]
    return Net(layers, (1, 28, 28), name="dropnet", seed=seed)


def test_two_synchronous_runs_with_dropout_in_the_conv_phase_train_the_same_weights(client2, digits):
    X, y = digits
    nets = [dropout_net(), dropout_net()]
    for net in nets:
        engine = DaskEngine(client2)
        engine.run(net, X, y, CFG, Budget(iterations=6))
        assert len(engine.placement_.groups[0]) == 2  # g = 1, k = 2: two shards, two streams
    # the same masks give the same weights up to the order of float sums (about 1 run in 3 differs
    # in the 8th digit on a 2-core machine); different masks move them by more than 1e-3 (below)
    for k, v in nets[0].params.items():
        np.testing.assert_allclose(nets[1].params[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    simulated = dropout_net()
    SimulatedEngine(HEModel(1.0, 0.01, 0.1, 2), verbose=0).run(simulated, X, y, CFG, Budget(iterations=6))
    undropped = dropout_net()
    undropped.layer("drop1").dropout_ratio = 0.0
    SimulatedEngine(HEModel(1.0, 0.01, 0.1, 2), verbose=0).run(undropped, X, y, CFG, Budget(iterations=6))
    for k, v in nets[0].params.items():  # the simulator's shards draw the same masks ...
        np.testing.assert_allclose(simulated.params[k], v, rtol=1e-3, atol=5e-5, err_msg=k)
    changed = max(float(np.abs(undropped.params[k] - v).max()) for k, v in nets[0].params.items())
    assert changed > 1e-3  # ... and the masks did change the training


def test_a_shard_forward_draws_its_masks_from_the_stream_of_its_batch_and_shard():
    net = dropout_net()
    conv, _ = net.split_phases()
    weights = conv.get_params()
    x = np.random.default_rng(0).random((8, 1, 28, 28), dtype=np.float32)
    acts = [tasks.conv_forward("r", f"t{i}", 1, conv, weights, x, "cpu", (3, 7)) for i in range(2)]
    np.testing.assert_array_equal(acts[0], acts[1])
    ref, _ = conv.forward(x, train=True, rng=shard_rng(3, 7, 1))
    np.testing.assert_array_equal(acts[0], ref)
    other = tasks.conv_forward("r", "t2", 0, conv, weights, x, "cpu", (3, 7))  # shard 0: other masks
    assert not np.array_equal(other, acts[0])
    tasks.forget_run("r")
