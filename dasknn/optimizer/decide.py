"""The online optimizer's decisions: small pure functions of measured numbers (Pollux's habit).

Nothing here runs an engine or reads a Trace (`optimizer.measure` does); a test can plant every
number. Each returns its choice and a reason naming the numbers that drove it.

- `explicit_momentum`: Omnivore §IV-B: asynchrony adds implicit momentum 1 − 1/g, so the explicit
  µ for a target total is the target minus it.
- `steer_momentum`: YellowFin's closed loop (Zhang & Mitliagkas 2017, §4): µ ← µ + γ (target − µ̂_T).
- `efficiency`, `goodput`, `choose_groups`: Pollux (Qiao et al. OSDI'21, §3):
  GOODPUT = THROUGHPUT × EFFICIENCY, EFFICIENCY(M) = (φ + M0) / (φ + M). g asynchronous groups
  compute g gradients of B samples on (nearly) the same weights before each sees the others'
  updates, so their window is one effective batch M = g·B against M0 = B.
- `scale_lr`: AdaScale's gain (Johnson et al. ICML'20) r = (σ² + µ²)/(σ²/S + µ²) for an effective
  batch S times larger; the per-update rate becomes η·r/S (g updates share the window).
- `judge_trial`, `explore_allowed`, `diverging`: when a trial run wins, when one may be run,
  when one is abandoned.
- `back_off`: η after a training window diverged and was rolled back, and whether the retry
  restarts momentum (O'Donoghue & Candès 2015's adaptive restart).
- `regroup`: g again when the cluster's size changed (docs/architecture.md, "Elastic clusters"):
  the prior's rule (`optimizer.prior.groups_prior`) on HE(g) at the new worker count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = [
    "back_off",
    "choose_groups",
    "diverging",
    "efficiency",
    "explicit_momentum",
    "explore_allowed",
    "goodput",
    "judge_trial",
    "trial_bar",
    "regroup",
    "scale_lr",
    "SPIKE_SAMPLES",
    "spiked",
    "steer_momentum",
]


def explicit_momentum(target_total: float, n_groups: int) -> float:
    """The explicit µ that with g groups' implicit 1 − 1/g makes `target_total` (Omnivore §IV-B)."""
    return max(0.0, float(target_total) - (1 - 1 / int(n_groups)))


def steer_momentum(
    explicit: float, measured_total: float, target: float, gain: float = 0.5, tolerance: float = 0.03
) -> tuple[float, str]:
    """YellowFin's negative feedback on the explicit µ: (new µ, why). Within `tolerance` of the
    target, or with no measurement, µ is left as it is; µ stays in [0, 0.99]."""
    if not math.isfinite(measured_total):
        return explicit, "no total momentum measured: µ unchanged"
    error = target - measured_total
    if abs(error) <= tolerance:
        return explicit, f"total momentum {measured_total:.3f} on target {target:g}: µ unchanged"
    new = min(0.99, max(0.0, explicit + gain * error))
    return new, f"total momentum {measured_total:.3f} vs target {target:g}: µ {explicit:.3g} -> {new:.3g}"


def efficiency(noise_scale: float, batch_size: int, n_groups: int) -> float:
    """Pollux's statistical efficiency of an effective batch g·B against B: (φ + B)/(φ + g·B);
    1 when the noise scale is unknown (NaN) or infinite."""
    if not math.isfinite(noise_scale):
        return 1.0
    b = float(batch_size)
    return (noise_scale + b) / (noise_scale + int(n_groups) * b)


def goodput(seconds_per_iteration: float, noise_scale: float, batch_size: int, n_groups: int) -> float:
    """Samples per second × efficiency: the useful samples per second at g groups (Pollux §3.1)."""
    if not (seconds_per_iteration > 0 and math.isfinite(seconds_per_iteration)):
        return math.nan
    return batch_size / seconds_per_iteration * efficiency(noise_scale, batch_size, n_groups)


def choose_groups(
    seconds_per_iteration: Mapping[int, float],
    noise_scale: float,
    batch_size: int,
    current: int,
    margin: float = 0.1,
    momentum_excess: bool = False,
) -> tuple[int, str, dict[int, float]]:
    """(g, why, goodput of each g): the g of highest goodput, if it beats the current g's by `margin`.

    `seconds_per_iteration`: measured for the g that ran, the HE model's prediction for the others.
    `momentum_excess`: the explicit µ is already 0 and the measured total still above target: the
    implicit momentum alone is too much, so the next smaller g wins (Algorithm 1's g ← g/2).
    """
    values = {
        int(g): goodput(t, noise_scale, batch_size, g) for g, t in sorted(seconds_per_iteration.items())
    }
    finite = {g: v for g, v in values.items() if math.isfinite(v)}
    if momentum_excess:
        smaller = [g for g in finite if g < current]
        if smaller:
            g = max(smaller)
            return g, f"explicit µ = 0 and the total momentum still above target: g {current} -> {g}", values
    if not finite:
        return current, "no time per iteration known: g unchanged", values
    best = max(finite, key=finite.get)
    now = finite.get(current, math.nan)
    phi = "unmeasured" if math.isnan(noise_scale) else f"{noise_scale:.3g}"
    if best != current and not (now > 0 and finite[best] < (1 + margin) * now):
        return (
            best,
            f"goodput {finite[best]:.4g} at g={best} vs {now:.4g} at g={current} (B_noise {phi})",
            values,
        )
    return current, f"g={current} within {margin:.0%} of the best goodput (B_noise {phi})", values


def scale_lr(lr: float, noise_scale: float, batch_size: int, g_from: int, g_to: int) -> float:
    """The per-update rate at g_to groups for the rate `lr` at g_from: AdaScale's gain r for the
    effective batch ratio S = g_to / g_from, shared by the g_to updates of a window (η·r/S).
    Unknown noise scale: r = 1 (the rate of each update is kept)."""
    s = int(g_to) / int(g_from)
    if s == 1 or not math.isfinite(noise_scale):
        return float(lr)
    noise = noise_scale / batch_size / int(g_from)  # σ²/µ² of one window's batch at g_from
    gain = (noise + 1) / (noise / s + 1)
    return float(lr) * gain / s


TRIAL_MARGIN = 0.1
"""The share of the current progress a trial must beat it by (beyond its noise) to be adopted."""


def trial_bar(base: float, margin: float = TRIAL_MARGIN, noise: float = 0.0) -> float:
    """The progress per second a trial must exceed to be adopted over `base`, the current
    configuration's: `margin` of it and the standard error of the difference (`noise`; 0, NaN or
    negative: not measured) above it."""
    noise = noise if math.isfinite(noise) and noise > 0 else 0.0
    return base + margin * abs(base) + noise


def judge_trial(
    trial: float, before: float, after: float, margin: float = TRIAL_MARGIN, noise: float = 0.0
) -> tuple[bool, str]:
    """Adopt a trial configuration when its progress per second beats the mean of the current
    configuration's runs before and after it (A-B-A, so the slowing of progress over time does
    not favour either) by `margin` of that mean and by `noise`: the standard error of the
    difference (0: not measured), as the ramp judges a window only beyond its noise."""
    around = [r for r in (before, after) if math.isfinite(r)]
    if not math.isfinite(trial) or not around:
        return False, "progress not measured: keep the current configuration"
    base = sum(around) / len(around)
    noise = noise if math.isfinite(noise) and noise > 0 else 0.0
    better = trial > trial_bar(base, margin, noise)
    verb = "adopt" if better else "keep the current configuration"
    within = f" ± {noise:.4g}" if noise else ""
    return better, f"progress {trial:.4g}/s on trial vs {base:.4g}{within}/s around it: {verb}"


def explore_allowed(explored: float, trial_seconds: float, time_to_target: float, fraction: float) -> bool:
    """A trial may run when the exploration time with it stays within `fraction` of the estimated
    time to target (re-estimated as training goes)."""
    return math.isfinite(time_to_target) and explored + trial_seconds <= fraction * time_to_target


def diverging(score_start: float, score_end: float, limit: float = 2.0) -> bool:
    """A run diverges when its end score is not finite or `limit` times its start score."""
    return not math.isfinite(score_end) or (math.isfinite(score_start) and score_end > limit * score_start)


SPIKE_SAMPLES = 64
"""Samples a spike's loss is averaged over (`spiked`): a small batch's loss alone swings several-fold
in steady training (batches of 8 on many asynchronous groups)."""


def spiked(losses, reference: float, floor: float, limit: float = 2.0, span: int = 3) -> bool:
    """Whether a run's batch losses blew up on the way, even when they came back down: the mean of
    `span` consecutive batch losses above both `limit` × `reference` (the loss level the run started
    from) and `floor` (the loss of uniform guessing, ln(n_classes)). A net that blows up in one
    update and comes back at that floor with its ReLUs dead ends its run below any end-of-run limit,
    and its momentum buffers carry the blow-up into every retry from the run's end."""
    x = np.asarray(losses, dtype=float)
    x = x[np.isfinite(x)]
    span = max(1, int(span))
    if len(x) < span:
        return False
    means = np.convolve(x, np.full(span, 1.0 / span), mode="valid")
    return float(means.max()) > max(limit * float(reference), float(floor))


ROLLBACK_FACTOR = 3.0
"""η's divisor after a training window diverged once the fit has trained at that η for a span."""
EDGE_FACTOR = 4.0
"""η's divisor after a training window diverged before the plateau rule measured a span at that η
(right after the ramp, or after a drop): the range test's margin below a rate that blew up."""


def back_off(lr: float, settled: bool) -> tuple[float, str]:
    """(η for the retry, why) after a training window at `lr` diverged and the loop rolled it back.

    `settled`: the fit trained a whole span at `lr` before (the plateau rule measured it). Then a
    divergence is late (the loss sharpened under the rate): η ÷ `ROLLBACK_FACTOR`. Before that, the
    rate was on the edge from the start (the ramp judged it on windows too short to see it diverge),
    so the retry goes a margin below it, η ÷ `EDGE_FACTOR`, as the range test ends below a blow-up:
    one rollback at a rate on the edge, not a rollback for each ÷ 3.

    Either way the retry restarts momentum (its first update at µ = 0, the adaptive restart of
    O'Donoghue & Candès 2015: momentum reset when the objective rises): the rolled-back window
    starts from a state whose momentum buffers were built at the rate on the edge; kept, they carry
    about µ/(1 − µ) more of its updates into the retry at any η (9 at µ = 0.9), so that every retry
    from that state diverged on the simulated main job, η ÷ 3 at a time down to 1e-4.
    """
    factor = ROLLBACK_FACTOR if settled else EDGE_FACTOR
    new = float(lr) / factor
    when = "after a span at this η" if settled else "before a span at this η: it was on the edge"
    why = f"diverged {when}: back to the window's start, η {lr:g} ÷ {factor:g} = {new:g}"
    return new, f"{why}, momentum restarted"


def regroup(
    he_times: Mapping[int, float],
    n_workers: int,
    n_workers_before: int,
    current: int,
    pinned: int | None = None,
    tolerance: float = 0.1,
) -> tuple[int, str]:
    """(g, why) once the cluster has `n_workers` conv workers instead of `n_workers_before`.

    `he_times`: g → the HE model's time per iteration at the new count (Omnivore §IV-B). The
    smallest g within `tolerance` of the best, as the prior chooses (less staleness for at most
    that much time, Theorem 1); a `pinned` g stays, fewer when fewer workers remain (the engines
    then run one group per worker)."""
    n, before = int(n_workers), int(n_workers_before)
    change = f"{before} -> {n} workers"
    if pinned is not None:
        g = min(int(pinned), n)
        kept = "kept" if g == int(pinned) else f"cut to {g}, one group per worker"
        return g, f"{change}: n_groups = {pinned} pinned, {kept} (k = {n // g})"
    usable = {int(g): float(t) for g, t in he_times.items() if 1 <= int(g) <= n and math.isfinite(t)}
    if not usable:
        return min(int(current), n), f"{change}: no HE(g) known, g = {min(int(current), n)}"
    best = min(usable.values())
    g = min(k for k, t in usable.items() if t <= (1 + tolerance) * best)
    verb = "kept" if g == int(current) else f"{current} -> {g}"
    return g, (
        f"{change}: g {verb}, the smallest g with HE(g) = {usable[g]:.4g} within {tolerance:.0%} "
        f"of the best ({best:.4g})"
    )
