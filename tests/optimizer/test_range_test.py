"""The in-run range test on planted loss curves: ramp on while the smoothed loss falls, end at the
η of its low ÷ backoff once it turns, undo the segment that blew the loss up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.optimizer.range_test import RangeTest, judge_range, smoothed_log_loss

BEST = 0.4
"""The planted curve's best η: the loss falls fastest there, rises above it, blows up past 2·BEST."""


def planted_segment(start_loss: float, lrs, noise: float = 0.0, seed: int = 0) -> list[float]:
    """Batch losses along a ramp: each iteration multiplies the loss by exp(-rate), with rate
    growing with η up to BEST, falling past it and negative (a rise) past 1.5·BEST; ×3 an
    iteration past 2·BEST (a blow-up); multiplicative noise of `noise` on each reading."""
    rng = np.random.default_rng(seed)
    loss, out = start_loss, []
    for lr in lrs:
        if lr > 2 * BEST:
            loss *= 3.0
        else:
            loss *= math.exp(-0.05 * (lr / BEST if lr <= BEST else 3 - 2 * lr / BEST))
        out.append(loss * math.exp(noise * rng.standard_normal()))
    return out


def run_test(test: RangeTest, start_loss: float = 2.3, noise: float = 0.0):
    """Feed `test` planted segments until it ends; returns the verdicts."""
    verdicts, loss = [], start_loss
    while not test.done:
        lrs = test.lr * test.factor ** (np.arange(test.length) / test.length)
        losses = planted_segment(loss, lrs, noise, seed=len(verdicts))
        verdict = test.observe(lrs, losses)
        verdicts.append(verdict)
        if not verdict.restore:
            loss = losses[-1]
    return verdicts


def test_smoothing_is_bias_corrected_and_stops_at_the_first_bad_loss():
    s = smoothed_log_loss([2.0, 2.0, 2.0, math.nan, 1.0])
    np.testing.assert_allclose(s, math.log(2.0))  # no pull toward 0 at the start, cut at the NaN
    assert len(smoothed_log_loss([math.inf, 1.0])) == 0


def test_a_loss_still_falling_at_the_segment_end_ramps_on_from_its_end_rate():
    lrs = np.geomspace(0.01, 0.04, 32)
    verdict = judge_range(lrs, planted_segment(2.3, lrs), 0)
    assert not verdict.done and not verdict.restore
    assert verdict.lr == pytest.approx(0.04)
    last = judge_range(lrs, planted_segment(2.3, lrs), 0, last=True)
    assert last.done and last.lr == pytest.approx(0.04)


def test_a_turn_ends_the_test_at_the_low_divided_by_backoff_and_keeps_a_mild_rise():
    lrs = np.geomspace(0.1, 1.0, 64)
    losses = [2.3 * 0.95**i for i in range(40)] + [2.3 * 0.95**39 * 1.04**i for i in range(1, 25)]
    verdict = judge_range(lrs, losses, 0, backoff=4.0)  # a rise of 2.6× in the raw losses, 1.4× smoothed
    low = int(np.argmin(smoothed_log_loss(losses)))
    assert verdict.done and not verdict.restore
    assert verdict.lr == pytest.approx(lrs[low] / 4.0)
    assert 39 <= low <= 39 + 10  # the smoothed low lags the raw one by a few iterations


def test_a_blow_up_undoes_the_segment_and_chooses_from_the_curve_before_it():
    first = np.geomspace(0.1, 0.4, 32)
    second = np.geomspace(0.4, 1.6, 32)  # blows up past 0.8
    losses = planted_segment(2.3, first)
    losses += planted_segment(losses[-1], second)
    verdict = judge_range(np.r_[first, second], losses, 32)
    assert verdict.done and verdict.restore
    assert 0.5 * BEST / 4 <= verdict.lr <= 2 * BEST / 4


def test_a_non_finite_loss_blows_up_even_when_the_smoothed_loss_has_not_turned():
    lrs = np.geomspace(0.01, 0.04, 8)
    losses = [2.3, 2.2, 2.1, 2.0, 1.9, 1.8, math.inf, math.nan]
    verdict = judge_range(lrs, losses, 0, backoff=2.0)
    assert verdict.done and verdict.restore
    assert verdict.lr == pytest.approx(lrs[5] / 2.0)


def test_the_start_of_a_segment_above_the_low_is_not_a_blow_up():
    """The first segment starts at the untrained loss, far above the low it reaches: only the rise
    past the low counts."""
    lrs = np.geomspace(0.01, 0.04, 32)
    losses = [2.3 * 0.9**i for i in range(32)]
    assert not judge_range(lrs, losses, 0).restore


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_the_test_finds_a_rate_near_the_planted_best_below_its_divergence(noise):
    test = RangeTest(0.01, length=32, factor=4.0, max_segments=6)
    verdicts = run_test(test, noise=noise)
    assert test.done and verdicts[-1].done
    assert [v.restore for v in verdicts[:-1]] == [False] * (len(verdicts) - 1)
    assert BEST / 8 <= test.lr <= BEST / 2, [v.reason for v in verdicts]
    assert len(test.losses) == len(test.lrs) == 32 * (len(verdicts) - verdicts[-1].restore)


def test_a_prior_above_the_divergence_ends_at_once_below_it():
    test = RangeTest(1.0, length=16)
    (verdict,) = run_test(test)
    assert verdict.restore and verdict.done and test.lr <= 1.0 / 4


def test_an_empty_segment_counts_as_a_blow_up_at_its_start_rate():
    test = RangeTest(0.05, length=16)
    verdict = test.observe([], [])
    assert verdict.restore and verdict.done and test.lr == pytest.approx(0.05 / 4)


def test_the_state_round_trips_through_its_plain_form_and_checks_its_settings():
    test = RangeTest(0.01, length=16)
    lrs = 0.01 * 4.0 ** (np.arange(16) / 16)
    test.observe(lrs, planted_segment(2.3, lrs))
    back = RangeTest.from_dict(test.to_dict())
    assert back == test and back.segments == 1 and len(back.losses) == 16
    with pytest.raises(RuntimeError, match="over"):
        RangeTest(1.0, length=4, done=True).observe([1.0], [1.0])
    for bad in (
        {"lr": 0.0},
        {"lr": 0.1, "length": 1},
        {"lr": 0.1, "factor": 1.0},
        {"lr": 0.1, "blowup": 1.1},
    ):
        with pytest.raises(ValueError, match="range test"):
            RangeTest(**bad)
    with pytest.raises(ValueError, match="one η per loss"):
        judge_range([0.1, 0.2], [1.0], 0)


@pytest.mark.slow
def test_auto_with_the_range_test_ramps_eta_along_a_schedule_and_keeps_what_it_did_not_undo():
    """Real (simulated-clock) training: each segment's iterations apply the geometric schedule's η,
    every decision is taken from the segments, and an undone segment is not in the model."""
    from dasknn.data import load
    from dasknn.engine.simulated import SimulatedEngine
    from dasknn.fitting import run_policy
    from dasknn.optimizer.auto import AutoPolicy
    from dasknn.tradeoff.hardware import HEModel
    from tests.planted import small_net

    X, y = load("digits", size=8, batch_size=32)
    policy = AutoPolicy(window=16, lr_search="range").for_fit()
    engine = SimulatedEngine(HEModel(T_cc=5.0, T_nc=0.0, t_fc=0.5, n_workers=8), verbose=0)
    result = run_policy(
        policy, engine, small_net(), np.asarray(X), np.asarray(y), batch_size=32, time_budget=60.0
    )
    d, trace = result.decisions, result.trace
    rows = d[d["phase"] == "range"]
    assert len(rows) >= 2 and rows.iloc[-1]["action"] == "end"
    assert not (d["phase"] == "ramp").any()  # no ramp windows: the range test replaced them
    segments = trace[trace["phase"] == "ramp"].sort_values("iteration")
    first = segments[segments["run"] == segments["run"].min()]
    lrs = first["lr"].to_numpy()
    assert lrs[0] == pytest.approx(0.01, rel=0.1) and np.all(np.diff(lrs) > 0)  # the prior's η, × 4 a run
    assert lrs[-1] == pytest.approx(0.04, rel=0.1)
    assert rows.iloc[0]["lr"] == pytest.approx(0.04)  # the next segment ramps on from the schedule's end
    chosen = rows.iloc[-1]["lr"]
    assert chosen < lrs.max() * 4 ** len(rows) and (trace[trace["phase"] == "train"]["lr"] == chosen).any()
    undone = rows[rows["action"].isin(["undo", "rollback"])]
    kept = set(trace.loc[trace["kept"].astype(bool), "run"].astype(int))
    assert not set(undone["run"].astype(int)) & kept
    assert set(rows.loc[rows["action"] == "segment", "run"].astype(int)) <= kept
