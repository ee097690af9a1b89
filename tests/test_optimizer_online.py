"""The online optimizer: its decisions fed planted measurements, its measurements from planted
traces, and end-to-end runs that reach a stated accuracy on the simulator and a LocalCluster."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dasknn.data import load
from dasknn.engine.servers import grad_norms
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import TrainState
from dasknn.estimator import DistributedCNN
from dasknn.nn.loss import softmax_with_loss
from dasknn.optimizer import OnlinePolicy, decide, measure
from dasknn.optimizer.search import state_hash
from dasknn.tradeoff.hardware import HEModel
from tests.planted import RaisingEngine, small_net

PLANTED = HEModel(T_cc=5.0, T_nc=0.0, t_fc=1.0, n_workers=8)
"""8 conv devices; the FC server saturates at g = 4 (t_conv(2) + t_fc = 3.5 < 4·t_fc)."""


@pytest.fixture(scope="module")
def digits8():
    X, y = load("digits", size=8, batch_size=32)
    return np.asarray(X), np.asarray(y)


def reached(trace: pd.DataFrame, target: float = 0.99, window: int = 50) -> bool:
    kept = trace[trace["kept"]]
    return len(kept) >= window and kept["accuracy"].tail(window).mean() >= target


# -- decisions from planted numbers ---------------------------------------------------------------
def test_a_best_g_below_the_saturating_one_makes_it_lower_g():
    # measured at the saturating g = 8: FC-bound, barely faster per iteration than g = 4
    seconds = {8: 0.50, 4: 0.52, 2: 0.9, 1: 1.7}
    g, why, goodputs = decide.choose_groups(seconds, noise_scale=200.0, batch_size=32, current=8)
    assert g == 4 and goodputs[4] > goodputs[8] and "g=4" in why
    # the same holds when the implicit momentum alone is too much (explicit µ already 0)
    g, why, _ = decide.choose_groups(seconds, math.nan, 32, current=8, momentum_excess=True)
    assert g == 4 and "total momentum" in why


def test_planted_high_total_momentum_lowers_the_explicit_momentum_and_on_target_changes_nothing():
    mu, why = decide.steer_momentum(0.4, measured_total=1.05, target=0.9)
    assert mu < 0.4 and "0.4 -> " in why
    mu, why = decide.steer_momentum(0.4, measured_total=0.9, target=0.9)
    assert mu == 0.4 and "unchanged" in why
    # the measurement behind it: staleness far above g − 1 at g = 2 reads as a high total
    trace = pd.DataFrame({"staleness": [6.0] * 10})
    total = measure.total_momentum(trace, explicit=0.4)
    assert total == pytest.approx(0.4 + 6 / 7)
    assert decide.steer_momentum(0.4, total, 0.9)[0] < 0.4
    on_target = measure.total_momentum(pd.DataFrame({"staleness": [1.0] * 10}), 0.4)
    assert decide.steer_momentum(0.4, on_target, 0.9)[0] == 0.4


def test_a_noise_scale_favouring_a_larger_effective_batch_moves_g_and_one_that_does_not_leaves_it():
    seconds = {1: 1.0, 2: 0.7, 4: 0.5}  # more groups, faster iterations
    noisy, _, _ = decide.choose_groups(seconds, noise_scale=1e5, batch_size=32, current=2)
    assert noisy == 4, "large B_noise: a bigger effective batch is nearly free, so the faster g wins"
    quiet, _, values = decide.choose_groups(seconds, noise_scale=2.0, batch_size=32, current=2)
    assert quiet == 1 and values[1] > values[2] > values[4]
    # goodput of g = 2 within the margin of the best: nothing moves
    flat = {1: 1.0, 2: 0.55, 4: 0.3}
    kept, why, values = decide.choose_groups(flat, noise_scale=8.0, batch_size=32, current=2)
    assert kept == 2 and "within" in why and max(values.values()) < 1.1 * values[2]
    # the rate follows AdaScale's gain: per-update η kept when noise dominates, η/S when it does not
    assert decide.scale_lr(0.1, 1e6, 32, 2, 4) == pytest.approx(0.1, rel=1e-3)
    assert decide.scale_lr(0.1, 1e-6, 32, 2, 4) == pytest.approx(0.05, rel=1e-3)
    assert decide.scale_lr(0.1, math.nan, 32, 2, 4) == 0.1


def test_trial_judging_and_the_exploration_allowance():
    assert decide.judge_trial(0.02, 0.01, 0.012)[0]
    assert not decide.judge_trial(0.0115, 0.01, 0.012)[0], "within the margin: keep the current one"
    assert not decide.judge_trial(math.nan, 0.01, 0.01)[0]
    assert decide.explore_allowed(explored=2.0, trial_seconds=0.5, time_to_target=30.0, fraction=0.1)
    assert not decide.explore_allowed(2.0, 1.5, 30.0, 0.1)
    assert not decide.explore_allowed(0.0, 0.1, math.nan, 0.1)
    assert decide.diverging(1.0, 2.5) and decide.diverging(1.0, math.inf) and not decide.diverging(1.0, 1.5)


# -- measurements ---------------------------------------------------------------------------------
def test_the_noise_scale_is_recovered_from_planted_squared_norms():
    g2, tr_sigma, batch = 0.5, 40.0, 32
    trace = pd.DataFrame(
        {
            "grad_sq": [g2 + tr_sigma / batch] * 8 + [math.nan] * 8,
            "grad_sq_half": [g2 + tr_sigma / (batch // 2)] * 8 + [math.nan] * 8,
        }
    )
    noise = measure.NoiseScale()
    noise.update(trace, batch)
    assert noise.value == pytest.approx(tr_sigma / g2)
    assert math.isnan(measure.NoiseScale().value)


def test_the_fc_server_norms_are_those_of_the_batch_and_its_halves(digits8):
    X, y = digits8
    net = small_net()
    conv, fc = net.split_phases()
    acts, _ = conv.forward(X[:32].astype(np.float32))
    heads, caches = fc.forward_heads(acts)
    dheads = fc.loss(heads, y[:32])["dheads"]
    _, grads = fc.backward(dheads, caches)
    big, half = grad_norms(fc, dheads, caches, grads)
    assert big == pytest.approx(sum(float((g**2).sum()) for g in grads.values()), rel=1e-5)
    halves = []
    for part in (slice(0, 16), slice(16, 32)):
        lg, cc = fc.forward(acts[part])
        _, dl = softmax_with_loss(lg, y[:32][part])
        _, gp = fc.backward(dl, cc)
        halves.append(sum(float((g**2).sum()) for g in gp.values()))
    assert half == pytest.approx(np.mean(halves), rel=1e-4)


# -- the driver on the simulator ------------------------------------------------------------------
@pytest.fixture(scope="module")
def online_run(digits8):
    X, y = digits8
    net = small_net()
    start = state_hash(TrainState.from_net(net))
    opt = OnlinePolicy().for_fit(SimulatedEngine(PLANTED, verbose=0), target_accuracy=0.99)
    result = opt.optimize(net, X, y, batch_size=32, time_budget=20_000, should_stop=lambda s, t: reached(t))
    return result, start


def test_online_starts_at_the_saturating_g_with_momentum_for_its_implicit_momentum(online_run):
    result, _ = online_run
    first = result.decisions.iloc[0]
    assert first["action"] == "start" and first["n_groups"] == 4
    assert first["momentum"] == pytest.approx(0.9 - (1 - 1 / 4))
    assert (
        result.trace["run"].min() == 0
        and result.trace.loc[result.trace["run"] == 0, "phase"].iloc[0] == "train"
    )


def test_online_reaches_the_target_on_the_simulator_and_keeps_every_trial_that_did_not_diverge(online_run):
    result, _ = online_run
    assert reached(result.trace)
    d = result.decisions
    trials = d[d["action"] == "trial"]
    assert len(trials) >= 1, "it explored"
    assert result.trace[result.trace["run"].isin(trials["run"])]["kept"].all()
    # every decision carries the measured numbers that drove it
    segments = d[d["action"] == "run"]
    assert segments["seconds_per_iteration"].notna().all() and segments["noise_scale"].gt(0).any()
    assert segments["total_momentum"].notna().all() and segments["time_to_target"].notna().all()
    # exploration stays within the fraction of the time to target estimated when each trial began
    for _, row in trials.iterrows():
        before = d.loc[: row.name - 1]
        estimate = before["time_to_target"].dropna().iloc[-1]
        assert row["exploration"] <= 0.1 * estimate + 1e-9
    assert (
        d.iloc[-1]["action"] == "stop"
        and d.iloc[-1]["exploration"]
        == trials["seconds"].sum() + d.loc[d["action"] == "abandon", "seconds"].sum()
    )


def test_a_diverging_rate_is_abandoned_within_the_trial_and_rolled_back(digits8):
    X, y = digits8
    net = small_net()
    # lr 0.9 overflows as a DaskEngine run would (FloatingPointError); 0.3 is the rate trained at
    engine = RaisingEngine(PLANTED, verbose=0, raises=lambda config, budget: config.lr > 0.5)
    hashes: list[str] = []

    def watch(state, trace):
        hashes.append(state_hash(state))
        return False

    opt = OnlinePolicy(initial_lr=0.3, run_iterations=40, trial_iterations=16).for_fit(engine, n_groups=4)
    result = opt.optimize(net, X, y, batch_size=32, time_budget=5_000, max_iterations=400, should_stop=watch)
    d = result.decisions
    abandoned = d[d["action"] == "abandon"]
    assert len(abandoned) >= 1 and (abandoned["lr"] > 0.5).all()
    assert (abandoned["iterations"] <= 16).all()
    first = abandoned.index[0]
    assert not result.trace[result.trace["run"] == abandoned.loc[first, "run"]]["kept"].any()
    # the segment after the abandoned trial continued from the state before it
    segment_after = d.loc[first:][d.loc[first:, "action"] == "run"].iloc[0]
    runs_before = d.loc[:first][d.loc[:first, "action"].isin(["run", "trial"])]
    assert segment_after["run"] > abandoned.loc[first, "run"]
    trained = result.trace[result.trace["run"] == segment_after["run"]]
    last_kept = result.trace[result.trace["run"] == runs_before["run"].iloc[-1]]
    assert trained["iteration"].min() == last_kept["iteration"].max() + 1
    # no rate at or above the diverged one is tried again
    later = d.loc[first + 1 :]
    assert not ((later["action"] == "trial") & (later["lr"] >= abandoned["lr"].min())).any()


def test_online_options_are_checked():
    engine = SimulatedEngine(PLANTED, verbose=0)
    with pytest.raises(ValueError, match="exploration_fraction"):
        OnlinePolicy(exploration_fraction=1.5).for_fit(engine)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lr_grid'"):
        OnlinePolicy(lr_grid=(0.1,))
    with pytest.raises(ValueError, match="tuner must be one of"):
        DistributedCNN(tuner="adam").fit(np.zeros((4, 1, 8, 8), np.float32), np.arange(4))


# -- the estimator: simulated and a real LocalCluster ---------------------------------------------
def test_the_estimator_trains_online_on_a_local_dask_cluster():
    X, y = load("digits", size=28)
    est = DistributedCNN(tuner="online", engine="dask", n_workers=2, time_budget=90, target_accuracy=0.9)
    est.fit(X, y)
    assert est.history_[-1]["accuracy"] >= 0.9
    d = est.decisions_
    assert d.iloc[0]["action"] == "start" and d["action"].isin(["run"]).any()
    assert est.trace_.attrs["engine"] == "dask" and est.trace_["grad_sq"].notna().any()
    ds = est.tradeoff_
    assert ds is not None and ds.sizes["decision"] == len(d)
    assert list(ds["decision_action"].values) == list(d["action"])
