"""SimulatedEngine: real SGD maths (g = 1 equals in-process training bit for bit), round-robin
staleness g − 1, a clock that matches the HE model, sharded gradients, exact continuation."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest

from dasknn.backend import blas_threads
from dasknn.data import load
from dasknn.data.batching import iterate_batches
from dasknn.engine.simulated import SimulatedEngine, conv_backward_shards, conv_forward_shards, shard_slices
from dasknn.engine.trace import TRACE_COLUMNS, Budget, RunConfig, TrainState
from dasknn.nn import zoo
from dasknn.nn.layers import Convolution, Dropout, InnerProduct, ReLU
from dasknn.nn.loss import softmax_with_loss
from dasknn.nn.net import Net
from dasknn.nn.solver import SGD
from dasknn.nn.train import train_step
from dasknn.tradeoff.hardware import HEModel, time_per_iteration


def tiny_net(seed: int = 0, dropout: bool = False) -> Net:
    """A conv phase and a two-layer FC phase on 1×6×6 inputs: cheap enough for long event runs."""
    fc = [InnerProduct("ip1", 8), ReLU("relu2")] + ([Dropout("drop1", 0.3)] if dropout else [])
    layers = [Convolution("conv1", 2, 3), ReLU("relu1"), *fc, InnerProduct("ip2", 3)]
    return Net(layers, (1, 6, 6), name="tiny", seed=seed)


@pytest.fixture(scope="module")
def digits():
    return load("digits", size=28, batch_size=32)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_one_group_equals_in_process_training_bit_for_bit(digits):
    X, y = digits
    cfg = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=32, seed=3)
    net = zoo.lenet(seed=0)
    result = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0).run(net, X, y, cfg, Budget(iterations=12))

    ref = zoo.lenet(seed=0)
    solver = SGD.for_net(ref, weight_decay=cfg.weight_decay)
    batches = iterate_batches(X, y, cfg.batch_size, epoch=0, seed=cfg.seed)
    with blas_threads(1):  # the simulator's BLAS threads: sums in the same order
        losses = [
            train_step(ref, solver, *dask.compute(*next(batches)), lr=cfg.lr, momentum=cfg.momentum)[0]
            for _ in range(12)
        ]
    assert_same_weights(net.get_params(), ref.get_params())
    assert_same_weights(result.state.momentum, {k: v for k, v in solver.history.items()})
    assert result.trace["loss"].tolist() == losses
    assert result.state.batches_done == 12 and result.state.iterations_done == 12


def test_one_group_crosses_epochs_in_the_data_order():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((100, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 100)
    Xd = dask.array.from_array(X, chunks=30)
    cfg = RunConfig(n_groups=1, lr=0.05, momentum=0.5, batch_size=16, seed=2)
    net = tiny_net()
    result = SimulatedEngine(t_conv=1.0, t_fc=1.0, verbose=0).run(net, Xd, y, cfg, Budget(iterations=14))
    ref = tiny_net()
    solver = SGD.for_net(ref)
    with blas_threads(1):  # the simulator's count: oneDNN's sums follow the kernel's thread count
        for epoch in range(3):
            for xb, yb in list(iterate_batches(Xd, y, 16, epoch=epoch, seed=2))[: 14 - 6 * epoch]:
                train_step(ref, solver, *dask.compute(xb, yb), lr=cfg.lr, momentum=cfg.momentum)
    assert_same_weights(net.get_params(), ref.get_params())
    assert result.trace["epoch"].iloc[-1] == pytest.approx(13 / 6)


def test_trace_has_the_contract_columns_and_simulated_time(tiny_data):
    X, y = tiny_data
    r = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0).run(
        tiny_net(), X, y, RunConfig(n_groups=2, batch_size=16), Budget(iterations=10)
    )
    assert list(r.trace.columns[: len(TRACE_COLUMNS)]) == list(TRACE_COLUMNS)
    assert r.trace.attrs["engine"] == "simulated" and r.trace.attrs["time_unit"] == "simulated s"
    assert r.trace["t_end"].is_monotonic_increasing and r.trace["iteration"].tolist() == list(range(1, 11))
    assert (r.trace["n_images"] == 16).all() and len(r.trace) == 10


@pytest.mark.parametrize("g", [2, 4])
def test_zero_variance_groups_run_round_robin_with_staleness_g_minus_1(tiny_data, g):
    X, y = tiny_data
    he = HEModel(T_cc=4.0, T_nc=0.01, t_fc=0.3, n_workers=4)
    r = SimulatedEngine(he, verbose=0).run(
        tiny_net(), X, y, RunConfig(n_groups=g, batch_size=8), Budget(iterations=10 * g)
    )
    staleness = r.trace["staleness"].to_numpy()
    assert staleness[:g].tolist() == list(range(g))
    assert (staleness[g:] == g - 1).all()
    assert r.trace["group"].tolist()[g:] == list(range(g)) * 9


HE_CASES = [  # (T_cc, T_nc, t_fc, n_workers, g)
    (8.0, 0.1, 0.5, 8, 1),
    (8.0, 0.1, 0.5, 8, 8),  # conv-bound, FC not saturated
    (2.0, 0.05, 1.0, 8, 2),
    (2.0, 0.05, 1.0, 8, 8),  # FC saturated
    (4.0, 1.0, 0.1, 4, 1),
    (4.0, 1.0, 0.1, 4, 2),  # network-bound t_conv (T_nc·k)
    (16.0, 0.2, 0.3, 16, 16),
]


@pytest.mark.parametrize("T_cc,T_nc,t_fc,n_workers,g", HE_CASES)
def test_simulated_time_per_iteration_matches_the_HE_model(tiny_data, T_cc, T_nc, t_fc, n_workers, g):
    X, y = tiny_data
    he = HEModel(T_cc, T_nc, t_fc, n_workers)
    r = SimulatedEngine(he, verbose=0).run(
        tiny_net(), X, y, RunConfig(n_groups=g, batch_size=16), Budget(iterations=6 * g + 6)
    )
    assert time_per_iteration(r.trace) == pytest.approx(he.he(g), rel=0.05)


def test_HE_cases_cover_saturated_and_unsaturated_FC():
    flags = {HEModel(*case[:4]).saturates(case[4]) for case in HE_CASES}
    assert flags == {True, False}


def test_two_shards_summed_equal_the_full_batch_gradient(digits):
    X, y = digits
    xb, yb = np.asarray(X[:16]), np.asarray(y[:16])
    net = zoo.lenet(seed=0)
    _, _, full = net.loss_and_grads(xb, yb)
    conv, fc = net.split_phases()
    slices = shard_slices(16, 2)
    assert [(s.start, s.stop) for s in slices] == [(0, 8), (8, 16)]
    acts, caches = conv_forward_shards(conv, xb, slices)
    logits, fc_caches = fc.forward(acts)
    _, dlogits = softmax_with_loss(logits, yb)
    dacts, fc_grads = fc.backward(dlogits, fc_caches, need_dx=True)
    summed = conv_backward_shards(conv, dacts, caches, slices)
    assert summed.keys() == set(conv.params)
    for key, grad in {**summed, **fc_grads}.items():
        np.testing.assert_allclose(grad, full[key], rtol=2e-5, atol=1e-7, err_msg=key)


def test_groups_of_two_workers_train_like_one_worker(tiny_data):
    X, y = tiny_data
    cfg = RunConfig(n_groups=1, lr=0.05, momentum=0.9, batch_size=16)
    nets = [tiny_net(), tiny_net()]
    for net, n_workers in zip(nets, (1, 2), strict=True):
        SimulatedEngine(t_conv=1.0, t_fc=1.0, n_workers=n_workers, verbose=0).run(
            net, X, y, cfg, Budget(iterations=5)
        )
    for key, value in nets[0].params.items():
        np.testing.assert_allclose(nets[1].params[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize(
    "first,second",
    [(Budget(iterations=17), Budget(iterations=23)), (Budget(seconds=12.3), Budget(seconds=17.7))],
)
def test_continuing_from_a_state_equals_one_long_run(tiny_data, first, second):
    X, y = tiny_data
    engine = SimulatedEngine(HEModel(2.0, 0.05, 0.4, 6), variability="gamma", cv=0.2, verbose=0)
    cfg = RunConfig(n_groups=3, lr=0.05, momentum=0.5, weight_decay=1e-3, batch_size=16)
    whole = Budget(iterations=40) if first.iterations else Budget(seconds=30.0)
    long_net, a_net = tiny_net(dropout=True), tiny_net(dropout=True)
    long = engine.run(long_net, X, y, cfg, whole)
    a = engine.run(a_net, X, y, cfg, first)
    b = engine.run(a_net, X, y, cfg, second, start=a.state)
    assert_same_weights(long_net.get_params(), a_net.get_params())
    assert_same_weights(long.state.momentum, b.state.momentum)
    pd.testing.assert_frame_equal(long.trace, pd.concat([a.trace, b.trace], ignore_index=True))
    assert (long.state.batches_done, long.state.iterations_done) == (
        b.state.batches_done,
        b.state.iterations_done,
    )


def test_probes_from_one_state_are_identical_and_leave_it_untouched(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(HEModel(2.0, 0.05, 0.4, 4), variability="exponential", verbose=0)
    cfg = RunConfig(n_groups=4, lr=0.05, momentum=0.0, batch_size=16)
    state = engine.run(tiny_net(), X, y, cfg, Budget(iterations=9)).state
    before = state.copy()
    runs = [
        engine.run(tiny_net(), X, y, cfg.with_(momentum=0.3), Budget(iterations=8), start=state)
        for _ in range(2)
    ]
    pd.testing.assert_frame_equal(runs[0].trace, runs[1].trace)
    assert_same_weights(state.params, before.params)
    assert state.extra["simulator"]["clock"] == before.extra["simulator"]["clock"]


def test_a_new_group_count_starts_every_group_afresh_from_the_state(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=4, verbose=0)
    cfg = RunConfig(n_groups=4, batch_size=16)
    a = engine.run(tiny_net(), X, y, cfg, Budget(iterations=10))
    b = engine.run(tiny_net(), X, y, cfg.with_(n_groups=2), Budget(iterations=6), start=a.state)
    assert b.trace["t_start"].min() == a.state.extra["simulator"]["clock"]
    assert b.trace["staleness"].tolist()[:2] == [0, 1]
    assert b.state.iterations_done == 16 and b.trace["iteration"].tolist() == list(range(11, 17))


def test_a_fresh_train_state_starts_at_the_nets_weights(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.1, verbose=0)
    net = tiny_net()
    r1 = engine.run(tiny_net(), X, y, RunConfig(batch_size=16), Budget(iterations=3))
    r2 = engine.run(
        tiny_net(), X, y, RunConfig(batch_size=16), Budget(iterations=3), start=TrainState.from_net(net)
    )
    pd.testing.assert_frame_equal(r1.trace, r2.trace)


def test_variability_spreads_durations_and_staleness(tiny_data):
    X, y = tiny_data
    cfg = RunConfig(n_groups=4, batch_size=8)
    r = SimulatedEngine(HEModel(4.0, 0.01, 0.1, 4), variability="exponential", verbose=0).run(
        tiny_net(), X, y, cfg, Budget(iterations=60)
    )
    durations = (r.trace["t_end"] - r.trace["t_start"]).to_numpy()
    assert durations.std() / durations.mean() > 0.3
    assert r.trace["staleness"].nunique() > 3


def test_a_time_budget_stops_at_its_simulated_seconds(tiny_data):
    X, y = tiny_data
    r = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0).run(
        tiny_net(), X, y, RunConfig(n_groups=1, batch_size=16), Budget(seconds=10.0)
    )
    assert len(r.trace) == 6 and r.trace["t_end"].max() <= 10.0
    assert r.state.extra["simulator"]["clock"] == 10.0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_stops_the_run_and_is_flagged(tiny_data):
    X, y = tiny_data
    cfg = RunConfig(lr=1e6, momentum=0.99, batch_size=16)
    r = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0).run(
        tiny_net(), X * 1e3, y, cfg, Budget(iterations=50)
    )
    assert r.trace.attrs["diverged"] and len(r.trace) < 50
    assert not np.isfinite(r.trace["loss"].iloc[-1])


def test_bad_settings_are_rejected_with_clear_messages(tiny_data):
    X, y = tiny_data
    with pytest.raises(ValueError, match="timing model"):
        SimulatedEngine(t_conv=1.0)
    with pytest.raises(ValueError, match="variability"):
        SimulatedEngine(t_conv=1.0, t_fc=1.0, variability="normal")
    with pytest.raises(ValueError, match="at least 4 workers"):
        SimulatedEngine(HEModel(1.0, 0.1, 0.1, 2), verbose=0).run(
            tiny_net(), X, y, RunConfig(n_groups=4), Budget(iterations=1)
        )
    with pytest.raises(ValueError, match="cannot split a batch of 4 images over 8 workers"):
        shard_slices(4, 8)
