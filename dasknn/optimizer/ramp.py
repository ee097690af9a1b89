"""The η ramp of the "auto" optimizer: doubling the rate on the training path, window by window.

An LR range test throws its iterations away; this ramp trains with every window it keeps. From the
first iteration it runs windows of w iterations: while a window at 2η makes more progress than the
rate before it would have made there, η doubles again; at the first worse window, or a rise, or a
non-finite loss, that window is undone (its start snapshot restored) and the previous η kept; when
that window blew the loss up, the ramp ends one step further down (`end_rate`): the previous η was
at the edge of stability.

The confound: early in training the loss falls fast at any η, and the fall slows as the loss gets
lower, so a plain "faster than the window before" would judge every doubling against the steep
start and stop too early (the earlier window looks better only because it came first).
`window_progress` is the fall of log loss per iteration. How it slows is progress as a power of
the loss level, p ∝ L^γ: measured at the start η on two calibration windows (both are training;
`loss_exponent`), or with one calibration window taken as γ = `gamma_prior` (1: the main job
measured 0.96-1.11), which saves a window at the slowest η. It is a function of where training
is (the loss), not of how many iterations it took to get there, so it holds across rates. A
doubled window is judged against the previous window's progress carried to the new window's loss
level, p_prev · (L_now/L_prev)^γ (`expected_ratio`): it must beat what the old η would have done at
the same point.

The transient: the first window at a new η is not the rate's steady progress. With momentum µ the
velocity takes ~1/(1 − µ) iterations to build up at the new η, and with asynchronous groups the
model server keeps receiving updates computed at the old η and on stale weights (Omnivore §IV-B,
implicit momentum) for a while: on the main job on Dask (µ = 0.9, g = 2) that first window made
about half the expected progress, or its loss rose, at rates (0.02, 0.04) that win as fixed
settings. So a doubled window that falls short, or whose loss rose by less than the old η's
window would have lowered it (within the window's noise), is kept (its iterations are training:
the transient costs at most what undoing the window would) and the rate gets a second look: the
next window at the same η, judged against the same expectation (the old η's last window carried
to the new loss level). A second window that also falls short, a larger rise, or a non-finite
loss ends the ramp; then that window is undone and the previous η kept, and when the rate's first
window raised the loss (at all, within its noise too) that one is undone too: it was kept only as the
rate's transient, and a rate judged worse leaves its rise as damage (`RampStep.undo_look`; the policy
restores the state before the rate's first window).

The first step may be larger (`first_factor`, × 4 for "auto": a prior from a solver tuned for long
synchronous runs is usually low for time to accuracy, and each doubling costs a window or two).
When that step is undone, the rate a plain step reaches is tried next, and the rate found worse is
a ceiling the later doublings stop below.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LrRamp",
    "RampStep",
    "end_rate",
    "expected_ratio",
    "loss_exponent",
    "progress_and_error",
    "window_level",
    "window_progress",
]

MAX_HALVINGS = 6
"""Windows undone in a row at the start η (halving it each time) before the ramp gives up."""
MAX_GAMMA = 4.0
"""The steepest dependence of progress on the loss level the calibration may fit (p ∝ L^γ)."""


def window_progress(losses) -> float:
    """The fall of log(loss) per iteration over one window: minus the least-squares slope of
    log(loss) against the iteration; −inf when a loss is not finite or not positive."""
    return progress_and_error(losses)[0]


def progress_and_error(losses) -> tuple[float, float]:
    """(`window_progress`, its standard error): batch losses are noisy, so a window's slope is
    judged with its uncertainty (the residuals' spread over the iterations' spread)."""
    x = np.asarray(losses, dtype=float)
    if len(x) < 2:
        raise ValueError(f"a window needs at least 2 losses, got {len(x)}")
    if not (np.isfinite(x).all() and (x > 0).all()):
        return -math.inf, 0.0
    t = np.arange(len(x), dtype=float)
    slope, intercept = np.polyfit(t, np.log(x), 1)
    if len(x) < 3:
        return float(-slope), 0.0
    residual = np.log(x) - (slope * t + intercept)
    se = math.sqrt(float((residual**2).sum()) / (len(x) - 2) / float(((t - t.mean()) ** 2).sum()))
    return float(-slope), se


def window_level(losses) -> float:
    """The loss level of a window: the geometric mean of its losses (NaN if any is not positive)."""
    x = np.asarray(losses, dtype=float)
    if not (np.isfinite(x).all() and (x > 0).all()):
        return math.nan
    return float(np.exp(np.log(x).mean()))


def loss_exponent(p0: float, p1: float, level0: float, level1: float) -> float:
    """γ of p ∝ L^γ through two windows' progress p0, p1 at loss levels level0 > level1, in
    [0, MAX_GAMMA] (0 when progress did not fall with the loss, or is not positive)."""
    if not (p0 > 0 and p1 > 0 and level0 > level1 > 0):
        return 0.0
    return float(min(MAX_GAMMA, max(0.0, math.log(p0 / p1) / math.log(level0 / level1))))


def end_rate(lr: float, factor: float, blown: bool, beat_lr: float = math.nan) -> float:
    """The η a ramp ends at when the window at `lr` (one step of `factor` above the last kept η)
    is undone: the last kept η, lr ÷ factor, when the window only made less progress than it (the
    loss stopped falling faster there: the range test's "below where the loss stopped falling");
    when it blew the loss up (a loss not finite, or the loop rolled it back), one step further
    down, lr ÷ factor²: the last kept η is then itself at the edge of stability (its window's
    progress did not tell it: a rate just below the divergence point still falls fast in a short
    window, then diverges in longer training as the loss sharpens), and the range test ends a
    margin (× 4) below the rate where the loss blew up (Smith 2017; `range_test.judge_range`).
    After a blow-up the ramp also ends a step below `beat_lr`, the highest η whose window beat
    the one below it, when that is lower: rates kept only within the noise above it did not
    train faster, so the progress had levelled off there, and the edge of stability of a long run
    lies below that of a short window (experiments/README.md, bench_suite: simulated CIFAR-10
    quick, where a ramp ended at the edge)."""
    if not blown:
        return lr / factor
    return min(lr / factor**2, beat_lr / factor) if beat_lr > 0 else lr / factor**2


def expected_ratio(gamma: float, level_before: float, level_now: float) -> float:
    """The progress a fixed η keeps from a window at loss level `level_before` to one at `level_now`,
    at most 1: a window whose loss rose above the level before is never owed more progress (its
    level is its own doing: a loss blown up to 1e5 by too high an η would owe a huge fall, so that
    its rise would look small next to it and be kept as a transient)."""
    if not level_now < level_before:
        return 1.0
    return (level_now / level_before) ** gamma


@dataclass
class RampStep:
    """The ramp's answer after a window: the next η, whether to restore the window's start
    snapshot, whether the ramp is over, and why."""

    lr: float
    restore: bool
    done: bool
    reason: str
    undo_look: bool = False  # restore the state before the rate's first window too (it rose)


@dataclass
class LrRamp:
    """The ramp's state: feed it each window's losses (`observe`), run the window it answers with.

    `lr`: the starting η (the prior's); `window`: w, iterations per window; `factor`: 2 (doubling);
    `max_steps`: doublings at most; `margin`: how much the doubled window must beat the expectation;
    `z`: standard errors of a window's slope within which it does not count as worse, or as a rise
    (a rise or a worse window must stand out of the batch losses' noise). A doubled rate is judged
    on its second window when its first falls short (the module docstring: the transient).
    JSON-able (`to_dict` / `from_dict`), so a fit checkpointed mid-ramp resumes exactly.
    """

    lr: float
    window: int = 20
    factor: float = 2.0
    max_steps: int = 12
    margin: float = 0.0
    z: float = 1.0
    calibrations: int = 2  # windows at the start η that measure γ (1: γ = `gamma_prior`)
    gamma_prior: float = 1.0
    first_factor: float = math.nan  # the first step's factor (NaN: `factor`)
    ceiling: float = math.nan  # an η found worse: the ramp never goes to it again
    windows: int = 0  # windows kept so far
    iterations: int = 0  # iterations kept so far (the t of the power law)
    calibration: list[list[float]] = field(default_factory=list)  # [progress, level] at the start η
    halvings: int = 0
    gamma: float = math.nan
    last_progress: float = math.nan
    last_level: float = math.nan
    steps: int = 0
    second_look: bool = False  # the window being run is the second at this η (the first fell short)
    look_rose: bool = False  # that first window's loss rose (at all: it made no progress)
    look_iterations: int = 0  # that first window's iterations
    done: bool = False
    final_progress: float = math.nan  # progress of the last kept window: the plateau rule's baseline
    beat_lr: float = math.nan  # the highest η whose window beat the one below (the start η at first)

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"the ramp's start lr must be a finite number > 0, got {self.lr}")
        if int(self.window) < 2:
            raise ValueError(f"the ramp's window must be >= 2 iterations, got {self.window}")
        if not self.factor > 1:
            raise ValueError(f"the ramp's factor must be > 1, got {self.factor}")
        if not (math.isnan(self.first_factor) or self.first_factor >= self.factor):
            raise ValueError(f"the ramp's first_factor must be >= its factor, got {self.first_factor}")
        if self.calibrations not in (1, 2):
            raise ValueError(f"the ramp calibrates on 1 or 2 windows, got {self.calibrations}")

    def observe(self, losses) -> RampStep:
        """Judge the window just run at `self.lr` from its training losses, in order."""
        p, se = progress_and_error(losses)
        return self.judge(p, se, window_level(losses), len(losses))

    def judge(self, p: float, se: float, level: float, n: int) -> RampStep:
        """Judge the window just run at `self.lr` from its progress `p` (fall of log loss per
        iteration, ± `se`) at loss level `level`, over `n` iterations: e.g. the loss of fixed
        evaluation samples before and after it, far less noisy than the batch losses."""
        if self.done:
            raise RuntimeError("the ramp is over: no more windows to judge")
        if not math.isfinite(p):
            return self._undo(p, "a loss was not finite, or blew up (the loop rolled the window back)")
        rose = p < -self.z * se  # beyond the window's noise
        calibrating = len(self.calibration) < self.calibrations
        if calibrating and rose:
            return self._undo(p, "the loss rose")
        if calibrating:  # windows at the start η measure how progress decays
            self._keep(p, level, n)
            self.beat_lr = self.lr
            self.calibration.append([p, level])
            if len(self.calibration) < self.calibrations:
                return RampStep(self.lr, False, False, f"calibration window at η = {self.lr:g}: {p:.3g}/it")
            if self.calibrations == 1:
                self.gamma = self.gamma_prior
                return self._double(f"{p:.3g}/it at η; progress taken to go as loss^{self.gamma:.2f}")
            (p0, l0), (p1, l1) = self.calibration
            self.gamma = loss_exponent(p0, p1, l0, l1)
            return self._double(f"calibration at η: progress goes as loss^{self.gamma:.2f}")
        expected = self.last_progress * expected_ratio(self.gamma, self.last_level, level)
        if (
            p > 0 and not rose and p + self.z * se > expected * (1 + self.margin)
        ):  # not worse beyond the noise
            self.second_look, self.look_rose, self.look_iterations = False, False, 0
            self._keep(p, level, n)
            if self.steps >= self.max_steps:
                return self._finish(f"{self.max_steps} doublings: the ramp ends at η = {self.lr:g}")
            if self.lr * self.factor >= self.ceiling:
                why = f"η = {self.lr * self.factor:g} was worse: the ramp ends at η = {self.lr:g}"
                return self._finish(why)
            if p > expected * (1 + self.margin):
                self.beat_lr = self.lr
                why = f"progress {p:.3g}/it beat the previous η's expected {expected:.3g}/it"
            else:  # short of it, but not beyond the window's noise
                why = f"progress {p:.3g}±{se:.2g}/it: within the noise of the old η's {expected:.3g}/it"
            return self._double(why)
        if rose:
            short = f"the loss rose ({p:.3g}±{se:.2g}/it)"
        else:
            short = f"progress {p:.3g}±{se:.2g}/it below the previous η's expected {expected:.3g}/it"
        if -p - self.z * se > expected:  # rose more than the old η would have lowered it: no transient
            return self._undo(p, f"{short}, more than the previous η's expected fall {expected:.3g}/it")
        if not self.second_look:  # the rate's first window: its transient, kept; the next one judges
            self.second_look, self.look_rose, self.look_iterations = True, p < 0, n
            self.windows += 1
            self.iterations += n
            return RampStep(self.lr, False, False, f"{short}: kept, a second look at η = {self.lr:g}")
        return self._undo(p, f"{short} again", rose=rose or self.look_rose)

    def _keep(self, p: float, level: float, n: int) -> None:
        self.windows += 1
        self.iterations += n
        self.last_progress, self.last_level, self.final_progress = p, level, p

    def _step_factor(self) -> float:
        return self.first_factor if self.steps == 0 and self.first_factor > self.factor else self.factor

    def _double(self, why: str) -> RampStep:
        old, self.lr = self.lr, self.lr * self._step_factor()
        self.steps += 1
        return RampStep(self.lr, False, False, f"{why}: η {old:g} -> {self.lr:g}")

    def _undo(self, p: float, why: str, rose: bool = False) -> RampStep:
        """The window is rolled back. Before any doubling, the start η was too high: halve it and
        calibrate again; after one, keep the previous η and end the ramp.

        A second look that fails also undoes the rate's first window when that window's loss rose:
        it was kept only as the rate's transient, and the rate turned out worse, so the rise is
        damage, not a transient (on 32 simulated async groups, a first window at 4η that doubled
        the loss left a state whose fit peaked 1.5 points of held-out accuracy below one without it).
        A first window that fell short but still lowered the loss stays (it is training)."""
        undo_look = self.second_look and self.look_rose
        if undo_look:
            self.windows -= 1
            self.iterations -= self.look_iterations
            why = f"{why}; the rate's first window (its loss rose) undone too"
        self.second_look, self.look_rose, self.look_iterations = False, False, 0
        step = self._undo_window(p, why, rose)
        step.undo_look = undo_look
        return step

    def _undo_window(self, p: float, why: str, rose: bool = False) -> RampStep:
        if self.steps == 0:
            self.halvings += 1
            if self.halvings > MAX_HALVINGS:
                raise FloatingPointError(f"{why} at every η down to {self.lr:g}: training diverges")
            self.lr /= self.factor
            self.calibration = []
            return RampStep(self.lr, True, False, f"{why} at the start η: restored, η halved to {self.lr:g}")
        if self.steps == 1 and self.first_factor > self.factor and math.isnan(self.ceiling):
            # the first step overshot the rates between: the one a plain step reaches is tried next
            start = self.lr / self.first_factor
            self.ceiling, self.lr = self.lr, start * self.factor
            self.second_look = False
            return RampStep(
                self.lr,
                True,
                False,
                f"{why}: window restored, η {start:g} × {self.factor:g} = {self.lr:g} next",
            )
        blown, top = not math.isfinite(p), self.lr
        self.done = True
        if not blown and rose and self.steps == 2 and self.first_factor > self.factor:
            # the only rate kept above the start is the first step's, on one window, and the loss
            # rose one step above it: the edge lies between the start and that rate
            kept = top / self.factor
            self.lr = kept / math.sqrt(self.first_factor)
            why = f"{why}: window restored; the loss rose one step above η = {kept:g}, the first step's"
            return RampStep(
                self.lr, True, True, f"{why} rate: the ramp ends between it and the start, at {self.lr:g}"
            )
        self.lr = end_rate(top, self.factor, blown, self.beat_lr)
        if blown and self.lr < top / self.factor**2:
            why = f"{why}: window restored, ramp ends a step below η = {self.beat_lr:g}"
            why = f"{why}, the last rate that beat the one below it (those above only matched it)"
            return RampStep(self.lr, True, True, f"{why}: {self.lr:g}")
        if blown:
            why = f"{why}: window restored, ramp ends a margin below it, at η = {top:g} ÷ {top / self.lr:g}"
            return RampStep(self.lr, True, True, f"{why} = {self.lr:g}")
        return RampStep(self.lr, True, True, f"{why}: window restored, ramp ends at η = {self.lr:g}")

    def _finish(self, why: str) -> RampStep:
        self.done = True
        return RampStep(self.lr, False, True, why)

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LrRamp:
        return cls(**{k: (math.nan if v is None else v) for k, v in d.items()})
