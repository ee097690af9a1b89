"""Weight averaging in the model servers (`engine.averaging`): the EMA's update against numpy, its
warm-up, and the average carried exactly by snapshots, states and a simulated run's continuation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasknn.engine.averaging import EMA_DECAY, check_averaging, ema_decay
from dasknn.engine.servers import ConvModelServer, FCServer
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn.layers import Dropout, InnerProduct, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff.hardware import HEModel
from tests.engine.simulated.test_engine import assert_same_weights, tiny_net


def reference_ema(trajectory: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The EMA of weights w_0 (the start), w_1, ... by its definition, in float32 as the weights."""
    average = {k: v.copy() for k, v in trajectory[0].items()}
    for t, weights in enumerate(trajectory[1:]):
        d = min(EMA_DECAY, (1 + t) / (10 + t))
        average = {k: (d * average[k] + (1 - d) * weights[k]).astype(np.float32) for k in average}
    return average


def conv_server(seed: int = 0) -> ConvModelServer:
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    return ConvModelServer(params, weight_decay=5e-4)


def grads(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + i)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(4).astype(np.float32),
    }


def test_decay_warms_up_to_beta():
    assert ema_decay(0) == pytest.approx(0.1) and ema_decay(90) == pytest.approx(0.91)
    assert ema_decay(10**6) == EMA_DECAY
    assert check_averaging(None) is None and check_averaging("ema") == "ema"
    with pytest.raises(ValueError, match="averaging must be None or one of"):
        check_averaging("swa")


def test_conv_server_average_equals_numpy_bit_for_bit():
    plain, averaged = conv_server(), conv_server()
    averaged.average_weights()
    trajectory = [plain.pull()[1]]
    for i in range(25):
        plain.push(grads(i), i, 0.05, 0.9)
        averaged.push(grads(i), i, 0.05, 0.9)
        trajectory.append(plain.pull()[1])
    assert_same_weights(averaged.params, plain.params)  # averaging leaves training alone
    assert averaged.average.count == 25
    assert_same_weights(averaged.average.params, reference_ema(trajectory))


def fc_net(seed: int = 0) -> Net:
    return Net(
        [InnerProduct("ip1", 6), ReLU("r"), Dropout("d", 0.3), InnerProduct("ip2", 3)], (5, 1, 1), seed=seed
    )


def test_fc_server_average_equals_numpy_bit_for_bit():
    plain, averaged = FCServer(fc_net(), seed=4), FCServer(fc_net(), seed=4)
    averaged.average_weights()
    rng = np.random.default_rng(1)
    trajectory = [plain.net.get_params()]
    for _ in range(12):
        acts, labels = rng.standard_normal((8, 5, 1, 1)).astype(np.float32), rng.integers(0, 3, 8)
        a = plain.step(acts, labels, 0.1, 0.9)
        b = averaged.step(acts, labels, 0.1, 0.9)
        assert a["loss"] == b["loss"]
        trajectory.append(plain.net.get_params())
    assert_same_weights(averaged.average.state()["params"], reference_ema(trajectory))


def test_snapshots_and_states_carry_the_average_exactly():
    server = conv_server()
    server.average_weights()
    for i in range(5):
        server.push(grads(i), i, 0.05, 0.9)
    server.keep_snapshot("s")
    kept = server.get_state()
    for i in range(5, 9):
        server.push(grads(i), i, 0.05, 0.9)
    server.restore_snapshot("s")
    assert server.average.count == 5
    assert_same_weights(server.average.params, kept["average"]["params"])
    twin = conv_server(seed=9)
    twin.set_state(kept)
    for s in (server, twin):  # both go on alike from the restored average
        s.push(grads(20), 0, 0.05, 0.9)
    assert_same_weights(twin.average.params, server.average.params)

    fc = FCServer(fc_net(), seed=4)
    fc.average_weights()
    acts = np.ones((4, 5, 1, 1), np.float32)
    fc.step(acts, np.arange(4) % 3, 0.1, 0.9)
    fc.keep_snapshot("s")
    before = fc.get_state()["average"]
    fc.step(acts, np.arange(4) % 3, 0.1, 0.9)
    fc.restore_snapshot("s")
    after = fc.get_state()["average"]
    assert after["count"] == before["count"] == 1
    assert_same_weights(after["params"], before["params"])


def test_a_server_without_averaging_keeps_its_state_as_before():
    server = conv_server()
    server.push(grads(0), 0, 0.05, 0.9)
    assert "average" not in server.get_state() and server.average is None
    assert "average" not in FCServer(fc_net()).get_state()


def test_a_simulated_run_scores_the_average_and_continues_it_exactly(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(
        HEModel(2.0, 0.05, 0.4, 6), variability="gamma", cv=0.2, verbose=0, averaging="ema"
    )
    cfg = RunConfig(n_groups=3, lr=0.05, momentum=0.5, weight_decay=1e-3, batch_size=16)
    long_net, a_net = tiny_net(dropout=True), tiny_net(dropout=True)
    long = engine.run(long_net, X, y, cfg, Budget(iterations=40))
    a = engine.run(a_net, X, y, cfg, Budget(iterations=17))
    b = engine.run(a_net, X, y, cfg, Budget(iterations=23), start=a.state)
    assert_same_weights(long.state.params, b.state.params)  # the average, continued exactly
    assert_same_weights(long.state.extra["averaging"]["weights"], b.state.extra["averaging"]["weights"])
    assert_same_weights(long_net.get_params(), long.state.params)  # the net holds the average
    pd.testing.assert_frame_equal(long.trace, pd.concat([a.trace, b.trace], ignore_index=True))

    plain = SimulatedEngine(HEModel(2.0, 0.05, 0.4, 6), variability="gamma", cv=0.2, verbose=0)
    trained = plain.run(tiny_net(dropout=True), X, y, cfg, Budget(iterations=40))
    assert_same_weights(long.state.extra["averaging"]["weights"], trained.state.params)  # training unchanged
    pd.testing.assert_frame_equal(long.trace, trained.trace)
    assert long.state.extra["averaging"]["conv_count"] == 40
    assert not np.array_equal(long.state.params["ip2.weight"], trained.state.params["ip2.weight"])


def test_averaging_is_refused_where_no_server_keeps_it():
    with pytest.raises(ValueError, match="averaging must be None or one of"):
        SimulatedEngine(t_conv=1.0, t_fc=1.0, averaging="swa")
    with pytest.raises(ValueError, match="merged map"):
        SimulatedEngine(t_conv=1.0, t_fc=1.0, averaging="ema", strategy=Strategy(name="sma"))
