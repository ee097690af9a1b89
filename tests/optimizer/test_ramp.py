"""The η ramp on planted loss curves: doubling while progress beats what the old η would have
done, undoing the first worse window, and not fooled by the fast early fall of the loss."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.optimizer.ramp import (
    LrRamp,
    end_rate,
    expected_ratio,
    loss_exponent,
    window_level,
    window_progress,
)

BEST = 0.4
"""The planted curve's best η: progress grows with η up to it, falls above, diverges past 2·BEST."""


def loss_at(s: float) -> float:
    """The planted loss after `s` units of effective progress: a power law, steep at the start."""
    return 0.01 + 2.3 / (1 + 20 * s)


def effective(lr: float) -> float:
    return lr if lr <= BEST else BEST * max(0.0, 2 - lr / BEST)


def run_ramp(ramp: LrRamp, max_windows: int = 40, transient=None):
    """Feed the ramp the planted curve; returns (kept windows' (lr, progress), steps).

    `transient(old, new)`: the first window after a change of η runs at this effective rate
    instead of effective(new) (from the rates before and after), or with its loss rising by this
    factor when it is a `Rise`; the windows after it at effective(new)."""
    s, kept, steps, previous = 0.0, [], [], None
    for _ in range(max_windows):
        if ramp.done:
            break
        lr, w = ramp.lr, ramp.window
        first = transient is not None and previous is not None and lr != previous
        rate = transient(effective(previous), effective(lr)) if first else effective(lr)
        if lr > 2 * BEST:  # diverges: the loss grows 40% an iteration, overflowing to inf
            losses = [loss_at(s) * 1.4**i if i < w - 3 else math.inf for i in range(1, w + 1)]
        elif isinstance(rate, Rise):
            losses = [loss_at(s) * rate.factor ** (i / w) for i in range(1, w + 1)]
            rate = 0.0
        else:
            losses = [loss_at(s + rate * i) for i in range(1, w + 1)]
        step = ramp.observe(losses)
        steps.append(step)
        if not step.restore:
            kept.append((lr, window_progress(losses)))
            s += rate * w
            previous = lr
    return kept, steps


class Rise:
    """A planted transient: the loss rises by `factor` over the first window at a new η."""

    def __init__(self, factor: float) -> None:
        self.factor = factor


def test_window_progress_is_the_fall_of_log_loss_per_iteration():
    losses = 2.0 * np.exp(-0.05 * np.arange(10))
    assert window_progress(losses) == pytest.approx(0.05)
    assert window_progress([1.0, 1.1, 1.2]) < 0
    assert window_progress([1.0, math.nan]) == -math.inf
    with pytest.raises(ValueError, match="at least 2"):
        window_progress([1.0])


def test_the_expected_decay_of_progress_is_a_power_of_the_loss_level():
    gamma = loss_exponent(1.0, 0.25, 2.0, 1.0)  # progress fell 4x while the loss halved
    assert gamma == pytest.approx(2.0)
    assert expected_ratio(gamma, 1.0, 0.5) == pytest.approx(0.25)
    assert loss_exponent(1.0, 2.0, 2.0, 1.0) == 0.0  # progress rose: no decay expected
    assert window_level([1.0, 4.0]) == pytest.approx(2.0)


def test_the_ramp_doubles_while_progress_improves_and_restores_the_first_worse_window():
    ramp = LrRamp(lr=0.01, window=20)
    kept, steps = run_ramp(ramp)
    assert ramp.done
    assert ramp.lr == pytest.approx(0.32)  # the last doubling within BEST; 0.64 was worse
    last = steps[-1]
    assert last.restore and last.done and "expected" in last.reason
    # 0.64's first window fell short and was kept (a rate's first window is its transient); its
    # second fell short again and was undone
    assert [lr for lr, _ in kept] == pytest.approx([0.01, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64])
    assert "second look" in steps[-2].reason and "again" in last.reason
    assert all(not s.restore for s in steps[:-1])


@pytest.mark.parametrize(
    "transient",
    [
        pytest.param(lambda old, new: old / 2, id="half the old rate"),
        pytest.param(lambda old, new: 0.0, id="flat"),
        pytest.param(lambda old, new: Rise(1.1), id="loss rises 10%"),
    ],
)
def test_a_transient_after_each_doubling_does_not_stop_the_ramp(transient):
    """The first window after each doubling makes half the old rate's progress, none, or its loss
    rises (momentum building up at the new η, stale updates of the old one): judged alone it
    stops the ramp at its first doubling; the second look at the same η goes on to BEST."""
    plain = LrRamp(lr=0.01, window=20)
    kept, steps = run_ramp(plain, transient=transient, max_windows=4)
    assert "second look" in steps[2].reason and not steps[2].restore  # the 0.02 window fell short
    ramp = LrRamp(lr=0.01, window=20)
    kept, steps = run_ramp(ramp, transient=transient)
    assert ramp.done and ramp.lr == pytest.approx(0.32)
    assert sum("second look" in s.reason for s in steps) == 6  # each doubling, 0.64's included
    assert [s.restore for s in steps].count(True) == 1 and steps[-1].restore


def test_a_really_worse_rate_after_a_transient_still_stops_the_ramp():
    """Beyond BEST the rate's steady progress is lower (effective(0.64) = effective(0.16)): with
    the same transient planted, its second window falls short of the old η's expectation too."""
    ramp = LrRamp(lr=0.08, window=20)
    kept, steps = run_ramp(ramp, transient=lambda old, new: old / 2)
    assert ramp.done and ramp.lr == pytest.approx(0.32)
    assert [lr for lr, _ in kept][-1] == pytest.approx(0.64) and steps[-1].restore
    assert "again" in steps[-1].reason


def test_the_planted_curve_has_the_confound_that_fools_a_plain_comparison():
    """The loss falls fast early at any η: a plain "faster per iteration than the window before"
    would stop at the first doubling whose raw progress fell, far below the best η; the
    comparison at the same loss level goes on to 0.32."""
    kept, _ = run_ramp(LrRamp(lr=0.01, window=20))
    lrs, raw = [lr for lr, _ in kept], [p for _, p in kept]
    assert raw[1] < 0.5 * raw[0]  # the same η, one window later: progress more than halved
    plain_stop = next(k for k in range(2, len(raw)) if raw[k] < raw[k - 1])
    assert lrs[plain_stop - 1] <= 0.04 and max(lrs[:-1]) == pytest.approx(0.32)  # (0.64: a first look)


def test_a_diverging_doubling_is_rolled_back_within_one_window():
    ramp = LrRamp(lr=0.2, window=20)  # 0.2, 0.2, then 0.4 (best), then 0.8: flat, then 1.6 never
    kept, steps = run_ramp(ramp)
    assert ramp.lr == pytest.approx(0.4) and ramp.done and steps[-1].restore
    ramp = LrRamp(lr=1.0, window=10)  # diverges at once: each window undone, η halved
    kept, steps = run_ramp(ramp)
    assert steps[0].restore and not steps[0].done and steps[0].lr == pytest.approx(0.5)
    assert "not finite" in steps[0].reason or "rose" in steps[0].reason
    assert all(lr <= 2 * BEST for lr, _ in kept)  # no diverging window was kept


def test_a_ramp_diverging_at_every_rate_gives_up_and_resumes_from_its_dict():
    ramp = LrRamp(lr=0.1, window=5)
    with pytest.raises(FloatingPointError, match="diverges"):
        for _ in range(20):
            ramp.observe([1.0, 2.0, 4.0, 8.0, math.inf])
    ramp = LrRamp(lr=0.01, window=20)
    run_ramp(ramp, max_windows=3)
    again = LrRamp.from_dict(ramp.to_dict())
    assert again == ramp or (again.to_dict() == ramp.to_dict())


def noisy_ramp_end(z: float, seed: int, noise: float = 0.15) -> float:
    """The η a ramp ends at on the planted curve with batch-loss noise (lognormal, σ = `noise`)."""
    rng = np.random.default_rng(seed)
    ramp, s = LrRamp(lr=0.01, window=20, z=z), 0.0
    for _ in range(40):
        if ramp.done:
            break
        lr = ramp.lr
        if lr > 2 * BEST:
            losses = [loss_at(s) * 1.4**i for i in range(1, 21)]
        else:
            losses = [loss_at(s + effective(lr) * i) * math.exp(rng.normal(0, noise)) for i in range(1, 21)]
        if not ramp.observe(losses).restore:
            s += effective(lr) * 20
    return ramp.lr


def test_noisy_batch_losses_do_not_stop_the_ramp_early():
    """A window counts as worse (or as a rise) only beyond its slope's standard error: with the
    noise of batch losses a point comparison (z = 0) stops early on chance (at or below 0.16, a
    quarter of the best rate or less) far more often, even with a second look at each rate."""
    judged = [noisy_ramp_end(1.0, seed) for seed in range(10)]
    plain = [noisy_ramp_end(0.0, seed) for seed in range(10)]
    assert np.median(judged) >= 0.32
    assert sum(lr <= 0.16 for lr in judged) <= 1 and sum(lr <= 0.16 for lr in plain) >= 3
    assert max(noisy_ramp_end(1.0, seed) for seed in range(10)) < 2 * BEST  # the diverging rate never kept


def test_a_rise_larger_than_the_old_rates_fall_is_undone_at_once():
    """A doubled window whose loss rose by more than the old η would have lowered it in a window
    (here it doubles) is no transient: undone at once, not kept for a second look."""
    ramp = LrRamp(lr=0.01, window=20)
    kept, steps = run_ramp(ramp, transient=lambda old, new: Rise(2.0))
    assert len(steps) == 3 and steps[-1].restore and steps[-1].done
    assert "second look" not in steps[-1].reason and "rose" in steps[-1].reason
    assert ramp.lr == pytest.approx(0.01) and [lr for lr, _ in kept] == [0.01, 0.01]


def test_a_ramp_stopped_during_a_second_look_resumes_with_it():
    """The second look is in the ramp's dict (a checkpoint's session): rebuilt between the two
    windows, the ramp judges the next window as the uninterrupted one does; a dict written before
    the second look existed loads as not in one."""
    ramp = LrRamp(lr=0.01, window=20)
    run_ramp(ramp, transient=lambda old, new: old / 2, max_windows=3)  # 2 calibrations, 0.02's first
    assert ramp.second_look and ramp.to_dict()["second_look"] is True
    again = LrRamp.from_dict(ramp.to_dict())
    losses = [0.3 * math.exp(-0.001 * i) for i in range(20)]  # a second window that falls short
    assert again.observe(losses) == ramp.observe(losses)
    assert again.done and again.lr == pytest.approx(0.01) and again.to_dict() == ramp.to_dict()
    old = {k: v for k, v in ramp.to_dict().items() if k != "second_look"}
    assert LrRamp.from_dict(old).second_look is False


def test_one_calibration_window_and_a_first_step_of_four_reach_the_best_rate_sooner():
    """The "auto" tuner's ramp: one window at the start η (γ taken as `gamma_prior`), then η × 4,
    then doublings. On the planted curve it ends at the same η as the two-window ramp, in fewer
    windows, and every kept window but the calibration ran at 4× the start η or more."""
    plain = LrRamp(lr=0.01, window=20)
    plain_kept, plain_steps = run_ramp(plain)
    ramp = LrRamp(lr=0.01, window=20, calibrations=1, first_factor=4.0)
    kept, steps = run_ramp(ramp)
    assert ramp.done and ramp.lr == pytest.approx(plain.lr) == pytest.approx(0.32)
    assert [lr for lr, _ in kept] == pytest.approx([0.01, 0.04, 0.08, 0.16, 0.32, 0.64])
    assert len(steps) == len(plain_steps) - 2
    assert ramp.gamma == 1.0 and "loss^1.00" in steps[0].reason


def test_a_first_step_that_overshoots_tries_the_plain_step_and_never_goes_back_above():
    """×4 from 0.2 lands on 0.8, past the best (flat there): that window is undone and 0.4 (the
    plain doubling) tried next; it beats the start's expectation, and the ramp ends there rather
    than doubling back to the rate already found worse."""
    ramp = LrRamp(lr=0.2, window=5, calibrations=1, first_factor=4.0)  # short: far above the floor
    kept, steps = run_ramp(ramp)
    assert ramp.done and ramp.lr == pytest.approx(0.4)
    assert [lr for lr, _ in kept] == pytest.approx([0.2, 0.8, 0.4])  # 0.8's first look, then 0.4
    undo = next(s for s in steps if s.restore)
    assert not undo.done and undo.lr == pytest.approx(0.4) and "0.4 next" in undo.reason
    assert "was worse" in steps[-1].reason and not steps[-1].restore
    again = LrRamp.from_dict(ramp.to_dict())
    assert again.ceiling == pytest.approx(0.8) and again.first_factor == 4.0


def test_a_ramp_dict_written_before_the_first_step_existed_loads_as_the_plain_ramp():
    ramp = LrRamp(lr=0.01, window=20)
    run_ramp(ramp, max_windows=2)
    old = {
        k: v
        for k, v in ramp.to_dict().items()
        if k not in ("calibrations", "gamma_prior", "first_factor", "ceiling")
    }
    again = LrRamp.from_dict(old)
    assert again.calibrations == 2 and math.isnan(again.first_factor) and math.isnan(again.ceiling)
    with pytest.raises(ValueError, match="first_factor"):
        LrRamp(lr=0.01, first_factor=1.5)
    with pytest.raises(ValueError, match="1 or 2"):
        LrRamp(lr=0.01, calibrations=3)


@pytest.mark.parametrize("factor", [2.0, 1e5])
def test_a_rise_is_never_owed_the_progress_of_its_own_higher_loss(factor):
    """A doubled window whose loss blew up (×1e5: too high an η on stale weights) sits at a far
    higher loss level; carried there, the old η's expected fall would be huge and the rise would
    look small beside it (kept for a second look, from a ruined state). It is undone at once."""
    ramp = LrRamp(lr=0.01, window=20)
    kept, steps = run_ramp(ramp, transient=lambda old, new: Rise(factor))
    assert len(steps) == 3 and steps[-1].restore and steps[-1].done
    assert "second look" not in steps[-1].reason and "rose" in steps[-1].reason
    assert expected_ratio(1.0, 0.2, 1e4) == 1.0 and expected_ratio(1.0, 0.2, 0.1) == pytest.approx(0.5)


def test_a_window_whose_loss_did_not_fall_never_counts_as_better():
    """A short, noisy window (its slope's standard error larger than its rise) is within the noise
    of the expectation but made no progress: never a reason to raise η again (a second look)."""
    ramp = LrRamp(lr=0.01, window=8, calibrations=1, first_factor=4.0)
    ramp.observe([1.0 * math.exp(-0.05 * i) for i in range(8)])  # calibration: 0.05/it, then × 4
    noisy = [0.7, 1.3, 0.5, 1.2, 0.6, 1.1, 0.9, 0.75]  # a slight rise in much noise
    assert window_progress(noisy) < 0
    step = ramp.observe(noisy)
    assert not step.restore and ramp.lr == pytest.approx(0.04) and "second look" in step.reason


def test_a_failed_second_look_undoes_a_first_window_whose_loss_rose():
    """A rate's first window whose loss rose was kept only as its transient: when the second look
    finds the rate worse too, both windows are undone (`undo_look`) and the ramp forgets the
    first one's iterations; a first window that fell short but lowered the loss stays."""
    ramp = LrRamp(lr=0.08, window=20)
    kept, steps = run_ramp(ramp, transient=lambda old, new: Rise(1.1))
    assert ramp.done and ramp.lr == pytest.approx(0.32)
    last = steps[-1]
    assert last.restore and last.undo_look and "first window" in last.reason
    assert not any(s.undo_look for s in steps[:-1])
    assert ramp.windows == len(kept) - 1  # 0.64's first window no longer counts
    assert ramp.iterations == 20 * (len(kept) - 1)
    assert not ramp.second_look and not ramp.look_rose

    fell_short = LrRamp(lr=0.08, window=20)
    kept, steps = run_ramp(fell_short, transient=lambda old, new: old / 2)
    assert steps[-1].restore and not steps[-1].undo_look
    assert fell_short.windows == len(kept)


def test_a_ramp_dict_from_before_the_undone_first_window_loads():
    """The first window's rise is in the ramp's dict (a checkpoint's session); an older dict
    without it loads as a first window that did not rise."""
    ramp = LrRamp(lr=0.01, window=20)
    run_ramp(ramp, transient=lambda old, new: Rise(1.1), max_windows=3)
    assert ramp.second_look and ramp.look_rose and ramp.look_iterations == 20
    assert LrRamp.from_dict(ramp.to_dict()) == ramp
    old = {k: v for k, v in ramp.to_dict().items() if k not in ("look_rose", "look_iterations")}
    assert LrRamp.from_dict(old).look_rose is False


def climb_to(top: float) -> LrRamp:
    """A ramp from 0.01 (× 4, then doublings, γ = 1) fed falling planted losses up to η = `top`:
    every window's loss falls 4% an iteration from where the last one ended (clear wins)."""
    ramp, level = LrRamp(0.01, window=8, calibrations=1, first_factor=4.0), 2.3
    while ramp.lr < top:
        losses = [level * 0.96**i for i in range(1, 9)]
        step = ramp.observe(losses)
        assert not step.restore and not step.done
        level = losses[-1]
    return ramp


def test_a_window_that_blows_up_ends_the_ramp_a_margin_below_it_one_that_only_rises_at_the_rate_before():
    # the planted main-job case: 0.04 and 0.08 fell fast, 0.16 overflowed within its window
    ramp = climb_to(0.16)
    assert ramp.lr == pytest.approx(0.16)
    blown = ramp.observe([0.9, 1.4, 3.0, 40.0, math.inf])
    assert blown.restore and blown.done and blown.lr == pytest.approx(0.04)  # 0.16 ÷ 4, not ÷ 2
    assert "margin below" in blown.reason and "0.16 ÷ 4" in blown.reason
    # the same climb, where 0.16 only made the loss rise (finite): the rate before it is kept
    ramp = climb_to(0.16)
    rose = ramp.observe([0.9 * 1.05**i for i in range(1, 9)])
    assert rose.restore and rose.done and rose.lr == pytest.approx(0.08)
    assert end_rate(0.16, 2.0, blown=True) == pytest.approx(0.04)
    assert end_rate(0.16, 2.0, blown=False) == pytest.approx(0.08)


@pytest.mark.parametrize(("p_below", "end"), [(0.0029, 0.002), (0.0090, 0.004)])
def test_after_a_blow_up_the_ramp_ends_a_step_below_the_last_rate_that_beat_the_one_below(p_below, end):
    # the planted simulated CIFAR-10 quick ramp: 0.004 beat 0.001; 0.008 only matched 0.004 (kept
    # within the noise) or beat it too; 0.016 blew up. Levelled progress puts the edge lower
    ramp = LrRamp(lr=0.001, window=16, calibrations=1, first_factor=4.0)
    ramp.judge(0.0016, 0.0003, 2.2, 32)  # the start η: doubled × 4
    ramp.judge(0.0063, 0.001, 2.0, 16)  # 0.004 beat the expected 0.00145/it
    kept = ramp.judge(p_below, 0.0042, 1.95, 16)
    assert ("within the noise" in kept.reason) is (end == 0.002) and ramp.lr == pytest.approx(0.016)
    blown = ramp.judge(-math.inf, 0.0, math.nan, 16)
    assert blown.restore and blown.done and ramp.lr == pytest.approx(end)
    assert end_rate(0.016, 2.0, blown=True, beat_lr=0.004) == pytest.approx(0.002)
    assert end_rate(0.016, 2.0, blown=True, beat_lr=0.008) == pytest.approx(0.004)
    assert LrRamp.from_dict(ramp.to_dict()) == ramp  # and the state resumes


@pytest.mark.parametrize(("first_look", "end"), [(-0.0107, 0.002), (0.0030, 0.004)])
def test_a_rise_one_step_above_the_first_steps_rate_ends_the_ramp_between_it_and_the_start(first_look, end):
    # the planted CIFAR-10 quick ramp (bench_suite's long, simulated seeds 1 and 2): 0.001 × 4 =
    # 0.004 beat the start on one window; at 0.008 the loss rose, then fell short again. The only
    # evidence for 0.004 is that window, and the edge lies below 0.008: the ramp ends at the
    # geometric middle of the start and the first step's rate. A doubling that only fell short
    # (no rise) ends at the rate below it, as before
    ramp = LrRamp(lr=0.001, window=16, calibrations=1, first_factor=4.0)
    ramp.judge(0.0016, 0.0003, 2.2, 32)
    ramp.judge(0.0085, 0.001, 2.0, 16)
    assert ramp.lr == pytest.approx(0.008)
    look = ramp.judge(first_look, 0.0061 if first_look < 0 else 0.0001, 1.95, 16)
    assert "second look" in look.reason and not look.restore
    again = ramp.judge(0.00082, 0.00033, 1.9, 32)
    assert again.restore and again.done and ramp.lr == pytest.approx(end)
    # two doublings above the first step: the last kept rate, whatever rose above it
    ramp = LrRamp(lr=0.001, window=16, calibrations=1, first_factor=4.0)
    for p, level in ((0.0016, 2.2), (0.0085, 2.0), (0.012, 1.6)):
        ramp.judge(p, 0.0005, level, 16)
    assert ramp.lr == pytest.approx(0.016)
    assert "second look" in ramp.judge(-0.004, 0.003, 1.62, 16).reason  # rose, within a transient's
    assert ramp.judge(0.0001, 0.0001, 1.61, 16).done and ramp.lr == pytest.approx(0.008)
