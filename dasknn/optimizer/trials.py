"""Capped trials of the "auto" optimizer: exploration that never costs more than 5% of the run.

After the η ramp, "auto" may try a neighbour of its configuration (η × 2, η ÷ 2, g one step up or
down) A-B-A: the current configuration's window before and after the trial, so that the slowing of
progress over time favours neither (`decide.judge_trial`). A trial's iterations are training (kept
unless it diverges), but its time is exploration, and exploration is capped on the trace's clock:
a trial may start only while the exploration so far plus the trial stays within `fraction` of the
elapsed time (the trial's own time included), and it is given exactly the seconds left under that
cap, so one that would overrun is cut short. A 5-second job explores almost nothing; an hour-long
one explores for minutes (Omnivore's Algorithm 1 spends ~10% on search only
because its epochs last an hour).

A trial is short (the cap gives it tens of iterations where a training run has hundreds), so its
progress per second is noisy: it is adopted only when it beats the runs around it beyond the
standard error of the difference (`trial_noise`), as the ramp keeps a doubled rate only beyond a
window's noise. A trial is not started at all when the noise it would have (`predicted_noise`:
the last run's, scaled to the trial's length) lets it be adopted only above `MAX_TRIAL_GAIN` times
the current progress (`resolvable`): it would cost its time and could be adopted only on noise.
The measurements behind both rules: experiments/README.md, "bench_auto_sim32".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dasknn.optimizer.decide import TRIAL_MARGIN, trial_bar

__all__ = [
    "MAX_TRIAL_GAIN",
    "TRIAL_FRACTION",
    "neighbours",
    "predicted_noise",
    "resolvable",
    "trial_noise",
    "trial_seconds",
]

TRIAL_FRACTION = 0.05
"""Trials' share of the elapsed time, at most."""
MAX_TRIAL_GAIN = 2.0
"""A trial starts only if it could be adopted below this gain over the current progress per
second. Larger gains are not what trials are for: a rate twice as good is what the ramp finds
(it doubles η while windows pay) and the plateau rule corrects (η ÷ 3 when progress stalls), a g
twice as fast is what the prior's HE model sees; a trial that must beat that is adopted, if ever,
on noise (`resolvable`)."""


def trial_seconds(elapsed: float, explored: float, fraction: float = TRIAL_FRACTION) -> float:
    """The longest trial that may start now: the d with explored + d = fraction · (elapsed + d).

    `elapsed`: the run's time so far on the trace's clock (trials included); `explored`: the
    trials' share of it. 0 when the cap is already reached."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    if not (math.isfinite(elapsed) and elapsed >= 0 and math.isfinite(explored) and explored >= 0):
        raise ValueError(f"elapsed and explored must be finite and >= 0, got {elapsed}, {explored}")
    return max(0.0, (fraction * elapsed - explored) / (1 - fraction))


def trial_noise(trial_se: float, before_se: float, after_se: float, before: float = math.nan) -> float:
    """The standard error of (trial − the mean of the runs before and after it), from each run's
    progress standard error (per second; 0 or NaN: not measured); `before` NaN means no run
    before was measured, and the mean is the run after alone."""
    errs = [e if math.isfinite(e) and e > 0 else 0.0 for e in (trial_se, before_se, after_se)]
    around = errs[1:] if math.isfinite(before) else errs[2:]
    base = math.sqrt(sum(e * e for e in around)) / len(around)
    return math.sqrt(errs[0] ** 2 + base**2)


def predicted_noise(before_se: float, before_iterations: int, trial_iterations: int, before: float) -> float:
    """The standard error `trial_noise` will give a trial of `trial_iterations` judged between two
    runs like the last one (`before_iterations` long, progress error `before_se` per second): a
    fitted slope's error grows as n^-1.5 with fewer equally spaced losses of the same spread."""
    if not (before_iterations > 0 and trial_iterations > 0 and math.isfinite(before_se) and before_se > 0):
        return 0.0
    trial_se = before_se * (before_iterations / trial_iterations) ** 1.5
    return trial_noise(trial_se, before_se, before_se, before)


def resolvable(noise: float, base: float, margin: float = TRIAL_MARGIN, gain: float = MAX_TRIAL_GAIN) -> bool:
    """Whether a trial could be adopted on its merit: the bar `decide.judge_trial` adopts above
    (`decide.trial_bar`) must stay below `gain` × base (`MAX_TRIAL_GAIN`); with no progress to
    compare against (base ≤ 0: the plateau rule's case) a trial is not started."""
    if not math.isfinite(base) or base <= 0:
        return False
    return trial_bar(base, margin, noise) < gain * base


def neighbours(
    n_groups: int, lr: float, candidates: Sequence[int], turn: int, lr_factor: float = 2.0
) -> list[tuple[str, int, float]]:
    """The trials around (g, η), starting at the `turn`-th in the cycle η × factor, η ÷ factor,
    the next larger g, the next smaller g among `candidates`: (key, g, η) each."""
    gs = sorted(int(c) for c in candidates)
    up = [c for c in gs if c > n_groups]
    down = [c for c in gs if c < n_groups]
    cycle = [("lr_up", n_groups, lr * lr_factor), ("lr_down", n_groups, lr / lr_factor)]
    cycle += [("g_up", up[0], lr)] if up else []
    cycle += [("g_down", down[-1], lr)] if down else []
    k = turn % len(cycle)
    return cycle[k:] + cycle[:k]
