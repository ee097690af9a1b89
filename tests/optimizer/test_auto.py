"""The "auto" optimizer on the simulated engine: its decisions from real (simulated-clock) training."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.fitting import final_loss, run_policy
from dasknn.nn import zoo
from dasknn.optimizer.auto import AutoPolicy
from dasknn.optimizer.decide import back_off, spiked
from dasknn.optimizer.prior import PriorCache
from dasknn.tradeoff.hardware import HEModel
from tests.planted import RaisingEngine, small_net

TIMING = HEModel(T_cc=5.0, T_nc=0.0, t_fc=0.5, n_workers=8)


@pytest.fixture(scope="module")
def digits8():
    X, y = load("digits", size=8, batch_size=32)
    return np.asarray(X), np.asarray(y)


def fit(digits8, budget=300.0, engine=None, **options):
    X, y = digits8
    settings = {name: options.pop(name) for name in ("prior_cache", "cache_key") if name in options}
    policy = AutoPolicy(**{"window": 16, **options}).for_fit(**settings)  # 16: this small problem's
    engine = engine or SimulatedEngine(TIMING, verbose=0)
    return run_policy(policy, engine, small_net(), X, y, batch_size=32, time_budget=budget)


@pytest.fixture(scope="module")
def long_fit(digits8):
    return fit(digits8, budget=1200.0)


def test_trials_stay_within_five_percent_of_the_elapsed_time_on_the_traces_clock(long_fit):
    trace = long_fit.trace
    runs = trace.groupby("run").agg(phase=("phase", "first"), start=("t_start", "min"), end=("t_end", "max"))
    trials = runs[runs["phase"] == "explore"]
    assert len(trials) >= 1  # a 600 s job explores
    spent = 0.0
    for _, trial in trials.iterrows():
        spent += trial["end"] - trial["start"]
        assert spent <= 0.05 * trial["end"] + 1e-9  # at the end of every trial
    assert spent <= 0.05 * float(trace["t_end"].max())


def test_the_ramp_doubles_then_the_plateau_divides_by_three(long_fit):
    d = long_fit.decisions
    windows = d[(d["phase"] == "ramp") & (d["action"] == "window")]
    lrs = windows["lr"].to_numpy()
    assert d.iloc[0]["lr"] == pytest.approx(0.01)  # Caffe's 0.01: one window there, then × 4
    assert lrs[0] == pytest.approx(0.04) and lrs.max() >= 0.04  # (a row holds the η the fit goes on with)
    end = d[d["action"] == "end"].iloc[0]
    plateau = d[d["action"] == "plateau"]
    assert len(plateau) >= 1
    before = d.loc[: plateau.index[0] - 1]
    lr_before = before[before["chosen"].astype(bool)]["lr"].iloc[-1]
    assert plateau["lr"].iloc[0] == pytest.approx(lr_before / 3)
    assert end["lr"] >= 0.04


def test_a_window_whose_batch_loss_spiked_and_came_back_is_rolled_back_and_ends_the_ramp(long_fit):
    # at η = 0.32 the batch loss jumps and falls back; its end stays under the loop's loss limit,
    # so only the spike rule sees the blow-up (`decide.spiked`): kept, the net went on at 0.16 with
    # its loss wandering at 1.6-2.4 for 400 simulated s
    d, trace = long_fit.decisions, long_fit.trace
    rollback = d[(d["phase"] == "ramp") & (d["action"] == "rollback")].iloc[0]
    losses = trace.loc[trace["run"] == rollback["run"], "loss"].to_numpy(dtype=float)
    assert np.isfinite(losses).all() and final_loss(pd.DataFrame({"loss": losses})) < 2 * np.log(10)
    assert losses.max() > max(2 * losses[0], np.log(10))
    top = trace.loc[trace["run"] == rollback["run"], "lr"].iloc[0]
    assert rollback["lr"] == pytest.approx(top / 4)  # a margin below the rate that blew up
    later = trace[trace["t_start"] > trace.loc[trace["run"] == rollback["run"], "t_end"].max()]
    assert later["lr"].max() <= top / 2 and later.groupby("run")["loss"].mean().iloc[-3:].max() < 0.5


@pytest.mark.parametrize(
    ("losses", "reference", "blown"),
    [
        ([1.9, 6.5, 6.0, 2.4, 2.3, 2.3], 1.9, True),  # up and back at chance: the CIFAR-10 quick case
        ([2.3, 2.2, 2.1, 2.0], 2.3, False),  # falling
        ([0.2, 0.5, 0.9, 0.3], 0.2, False),  # noisy, below uniform guessing's ln(10)
        ([0.2, 2.5, 2.6, 2.7, 0.3], 0.2, True),  # above both
        ([0.8, 0.4, 4.0, 0.9, 0.6], 0.9, False),  # one batch: noise at a small batch, not a blow-up
        ([2.7, 3.0, 4.9, 2.6], 2.7, False),  # an untrained BatchNorm net starts above ln(10)
        ([1.0, np.nan, 1.0], 1.0, False),  # non-finite losses are the loop's own rule
    ],
)
def test_a_spike_is_above_twice_the_start_level_and_above_uniform_guessing(losses, reference, blown):
    assert spiked(losses, reference, np.log(10), span=3) is blown


def test_the_spike_rule_starts_from_the_trained_weights_batch_level_not_the_averages_loss(digits8):
    # with weight averaging the samples score the average (loss 0.6) while the batches run on the
    # trained weights, at 2.0 near uniform guessing's ln(10) at a small batch: a run that goes on at
    # that level, from a lucky first batch, is not a spike; one that doubles it is
    from dasknn.optimizer.auto import keep_level, spike_rule

    X, y = digits8
    policy = AutoPolicy(window=16).for_fit()
    run_policy(policy, SimulatedEngine(TIMING, verbose=0), small_net(), X, y, batch_size=32, time_budget=20.0)
    assert policy.fit.chance_loss == pytest.approx(np.log(10))  # the labels' classes
    kept = pd.DataFrame({"iteration": np.arange(1, 41), "loss": np.r_[np.full(38, 2.0), 1.9, 2.1]})
    keep_level(policy, 0.6, kept)
    assert policy.s.eval_loss == 0.6 and policy.s.batch_level == pytest.approx(2.0)
    goes_on = pd.DataFrame({"loss": [0.5, 2.4, 2.6, 2.5, 2.2]})
    blown = pd.DataFrame({"loss": [0.5, 2.4, 7.0, 6.5, 6.0, 2.3]})
    assert not spike_rule(policy)(goes_on, np.nan) and spike_rule(policy)(blown, np.nan)
    policy.s.batch_level = None  # the level before: the average's loss and the first batch's
    assert spike_rule(policy)(goes_on, np.nan)


def test_the_same_seed_gives_the_same_decisions(digits8):
    a, b = fit(digits8, budget=150.0), fit(digits8, budget=150.0)
    pd.testing.assert_frame_equal(a.decisions, b.decisions)


def test_a_diverging_doubling_is_undone_within_one_window(digits8):
    X, y = digits8
    engine = RaisingEngine(TIMING, verbose=0, raises=lambda config, budget: config.lr >= 0.04)
    result = fit(digits8, budget=150.0, engine=engine)
    d = result.decisions
    undo = d[(d["phase"] == "ramp") & (d["action"] == "rollback")]  # the loop rolled it back
    assert len(undo) == 1 and undo["diverged"].iloc[0] and "not finite" in undo["reason"].iloc[0]
    assert undo["lr"].iloc[0] == pytest.approx(0.02)  # the row holds the η the fit goes on with
    assert undo["iterations"].iloc[0] <= 16  # within one window
    kept = result.trace[result.trace["kept"]]
    assert kept["lr"].max() < 0.04  # nothing trained at the diverging rate stayed in the model
    assert d[d["action"] == "end"]["lr"].iloc[0] == pytest.approx(0.02)


def test_a_second_fit_of_the_same_job_starts_from_the_cache_and_another_net_ignores_it(digits8, tmp_path):
    X, _ = digits8
    path = tmp_path / "cache.json"
    key = PriorCache.key(small_net(), "digits8", 32, (1, 8, 8), 0.0)
    first = fit(digits8, budget=150.0, prior_cache=path, cache_key=key)
    assert "last successful fit" not in first.decisions["reason"].iloc[0]
    cached = PriorCache(path).get(key)
    assert cached is not None and cached.lr >= 0.04  # the ramp's peak η, not a plateau's lowered one
    second = fit(digits8, budget=150.0, prior_cache=path, cache_key=key)
    start = second.decisions.iloc[0]
    assert "last successful fit" in start["reason"]
    assert (start["n_groups"], start["lr"], start["momentum"]) == (
        cached.n_groups,
        cached.lr,
        cached.momentum,
    )
    assert not (second.decisions["phase"] == "ramp").any()  # the cache's η needs no ramp
    other = PriorCache.key(zoo.lenet(), "digits8", 32, (1, 8, 8), 0.0)
    third = fit(digits8, budget=60.0, prior_cache=path, cache_key=other)
    assert "last successful fit" not in third.decisions["reason"].iloc[0]
    off = fit(digits8, budget=60.0, prior_cache=False, cache_key=key)
    assert "last successful fit" not in off.decisions["reason"].iloc[0]


def test_unknown_options_and_bad_values_are_refused():
    with pytest.raises(TypeError, match="lr_grid"):
        AutoPolicy(lr_grid=(0.1,))
    with pytest.raises(ValueError, match="trial_fraction"):
        AutoPolicy(trial_fraction=1.5).for_fit()
    with pytest.raises(ValueError, match=r"no setting\(s\) \['window'\]"):
        AutoPolicy().for_fit(window=16)  # an option, not a fit's setting


def test_a_raised_rate_is_first_run_for_half_a_window(long_fit):
    """The calibration window runs w iterations; the first window at η × 4 half of them (a rate
    past the best is undone after w / 2); a second look, when one is needed, runs w again."""
    d = long_fit.decisions
    ramp = d[(d["phase"] == "ramp") & d["iterations"].notna()]
    assert ramp["iterations"].iloc[0] == 16 and ramp["lr"].iloc[0] == pytest.approx(0.04)
    assert ramp["iterations"].iloc[1] == 8  # η = 0.04's first look
    looks = ramp[ramp["reason"].str.contains("second look")]
    after = [ramp.index.get_loc(i) + 1 for i in looks.index if ramp.index.get_loc(i) + 1 < len(ramp)]
    assert all(ramp["iterations"].iloc[k] == 16 or ramp["diverged"].iloc[k] for k in after)


def test_a_rate_whose_first_window_rose_and_second_look_failed_leaves_no_trace_in_the_model():
    """32 simulated asynchronous groups at batch 8 (experiments/bench_auto_sim32.py, seed 1): the
    first window at η × 4 doubles the loss, is kept for a second look, and the second falls short
    too. Both are undone: the next rate starts from the state before η × 4, and no iteration at it
    stays in the model (kept, that window left a fit that peaked at 94.7% held-out, 96.4% without).
    A first window whose loss rose only within its noise is undone too when its second look fails."""
    from experiments.bench_auto_sim32 import N_WORKERS, contender
    from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY

    X, y = load("mnist-sample", batch_size=8)
    model = HEModel.estimate(zoo.lenet(seed=0), 8, N_WORKERS, C4_GFLOPS, 1e9 / 8, efficiency=EFFICIENCY)
    # the unshifted digits; the ramp's rule on the weights themselves (no average to lag them)
    est = contender("auto", 1, model, 0.2, target=0.999, augment=None, averaging=None)
    est.fit(np.asarray(X), np.asarray(y))
    d = est.decisions_
    undo = d[d["reason"].str.contains("first window \\(its loss rose\\) undone too")]
    # η × 4's two windows undone; the next rate, η × 2, may fail the same way (its first window rose
    # within its noise on this seed) and is undone likewise: the ramp then ends at the start η
    # (the second look at η × 4 blows its batch losses up to 18: the loop rolls it back)
    assert len(undo) >= 1 and undo["action"].isin(["undo", "rollback"]).all()
    look = d[d["reason"].str.contains("kept, a second look")].iloc[0]
    assert look["lr"] == pytest.approx(0.04) and look["run"] < undo["run"].iloc[0]
    trace = est.trace_
    kept = trace[trace["kept"]]
    assert not (trace[trace["run"] == look["run"]]["kept"]).any()
    assert kept["lr"].max() < 0.04  # nothing trained at η × 4 stayed in the model
    iterations = np.sort(kept["iteration"].to_numpy())
    assert (iterations == np.arange(1, len(iterations) + 1)).all()  # the next rate went on from before it


def test_back_off_goes_a_margin_below_a_rate_on_the_edge_and_divides_by_three_once_settled():
    assert back_off(0.08, settled=False)[0] == pytest.approx(0.02)
    assert back_off(0.09, settled=True)[0] == pytest.approx(0.03)
    assert "momentum restarted" in back_off(0.08, settled=False)[1]


def test_a_training_window_diverging_after_the_ramp_is_retried_a_margin_below_momentum_restarted(digits8):
    # the first training run (24 iterations; the ramp's windows are 16 or 8) overflows once
    blown = []

    def raises(config, budget):
        if budget.iterations == 24 and not blown:
            blown.append(config.lr)
            return True
        return False

    engine = RaisingEngine(TIMING, verbose=0, raises=raises)
    result = fit(digits8, budget=120.0, engine=engine, run_iterations=24)
    d = result.decisions
    rollback = d[(d["phase"] == "train") & (d["action"] == "rollback")]
    assert len(blown) == 1 and len(rollback) == 1  # one rollback, not one per ÷ 3
    assert rollback["lr"].iloc[0] == pytest.approx(blown[0] / 4)  # no span at that η yet: ÷ 4
    assert "momentum restarted" in rollback["reason"].iloc[0]
    trace = result.trace
    retry = trace[trace["run"] == int(rollback["run"].iloc[0]) + 1].sort_values("iteration")
    assert len(retry) == 24 and np.allclose(retry["lr"], blown[0] / 4)
    mu = d[d["action"] == "start"]["momentum"].iloc[0]
    assert retry["momentum"].iloc[0] == 0.0 and (retry["momentum"].iloc[1:] == mu).all()
    assert (trace[trace["run"] > retry["run"].iloc[0]]["momentum"] > 0).all()  # one update at µ = 0
