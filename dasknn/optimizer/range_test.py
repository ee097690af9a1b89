"""η found on the training path within runs: a learning-rate range test on a geometric schedule.

Smith's range test (Smith, "Cyclical learning rates", WACV 2017; fastai's `lr_find`) raises η by a
constant factor every iteration and reads the batch losses: the loss falls faster as η grows, then
stops falling and blows up; a good η lies below the one where the smoothed loss was lowest. Here the
test trains: each segment is one run whose η is an `engine.schedule.Schedule.geometric` ramp
(× `factor` over `length` iterations, from where the last segment ended), and a segment in which
the loss still falls at its end is kept and the next one ramps on from its end η. The first
segment in which the smoothed loss turned up ends the test at the η of the lowest smoothed loss ÷
`backoff`; when that segment blew the loss up (`blowup` × its lowest level, or a loss not finite)
it is undone: training goes back to its start snapshot, the end of the last kept segment.

The rule (`judge_range`) is a pure function of the per-iteration (η, loss) pairs of every segment
so far, tested with planted loss curves; `RangeTest` is its JSON-able state for the policy.

Why the smoothed minimum and not the raw one: a batch loss is noisy (one batch) and lags the
weights (momentum, and with asynchronous groups stale reads, Omnivore §IV-B); an exponential
moving average of log loss (bias-corrected, as fastai's) takes the noise out, and `backoff`
covers the lag.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

__all__ = ["RangeTest", "RangeVerdict", "judge_range", "smoothed_log_loss"]


def smoothed_log_loss(losses, beta: float = 0.9) -> np.ndarray:
    """The bias-corrected exponential moving average of log(loss) (fastai's smoothing), up to the
    first loss that is not finite or not positive (the rest is cut off)."""
    x = np.asarray(losses, dtype=float)
    bad = ~(np.isfinite(x) & (x > 0))
    if bad.any():
        x = x[: int(np.argmax(bad))]
    out = np.empty(len(x))
    mean = 0.0
    for i, v in enumerate(np.log(x)):
        mean = beta * mean + (1 - beta) * v
        out[i] = mean / (1 - beta ** (i + 1))
    return out


@dataclass(frozen=True)
class RangeVerdict:
    """The range test's answer after a segment: the next η, whether the search is over, whether the
    segment is undone (its start snapshot restored), and why."""

    lr: float
    done: bool
    restore: bool
    reason: str


def judge_range(
    lrs,
    losses,
    segment_start: int,
    *,
    beta: float = 0.9,
    rise: float = 1.2,
    blowup: float = 2.0,
    backoff: float = 4.0,
    last: bool = False,
) -> RangeVerdict:
    """Judge the segment that began at index `segment_start` of the test's (η, loss) pairs.

    The loss turned when the smoothed loss at the segment's end lies above its lowest level so far
    by `rise` (a factor), or when a loss is not finite: the test ends at η(lowest) ÷ `backoff`,
    and the segment is undone when the smoothed loss within it passed `blowup` × the lowest level
    (or a loss is not finite). Otherwise the loss still falls: the next segment ramps on from the
    segment's end η, unless this was the `last` segment allowed (then its end η is kept).
    """
    lrs, losses = np.asarray(lrs, dtype=float), np.asarray(losses, dtype=float)
    if len(lrs) != len(losses) or not 0 <= segment_start < len(lrs):
        raise ValueError(
            f"the range test needs one η per loss and a segment start inside them, got {len(lrs)} η, "
            f"{len(losses)} losses, segment start {segment_start}"
        )
    s = smoothed_log_loss(losses, beta)
    finite = len(s) == len(losses)
    if len(s) == 0:
        return RangeVerdict(lrs[0] / backoff, True, True, f"the first loss was not finite: η ÷ {backoff:g}")
    low = int(np.argmin(s))
    floor = float(s[low])
    after = s[max(segment_start, low) :]  # the rise past the low, within this segment
    peak = float(after.max()) if len(after) else math.inf
    blown = not finite or peak > floor + math.log(blowup)
    turned = blown or float(s[-1]) > floor + math.log(rise)
    best = float(lrs[low]) / backoff
    if turned:
        ratio = math.exp(s[-1] - floor)
        what = "a loss not finite" if not finite else f"the smoothed loss {ratio:.2f}× its low"
        undo = "; the segment blew the loss up: undone" if blown else ""
        return RangeVerdict(
            best,
            True,
            blown,
            f"{what} (lowest at η = {lrs[low]:g}): η = {lrs[low]:g} ÷ {backoff:g} = {best:g}{undo}",
        )
    end = float(lrs[-1])
    if last:
        return RangeVerdict(end, True, False, f"the loss still falls at η = {end:g}: the test's last segment")
    return RangeVerdict(end, False, False, f"the loss still falls at η = {end:g}: ramp on")


@dataclass
class RangeTest:
    """The range test's state: the η it ramps from, the segments' (η, loss) pairs, whether it is over.

    `lr`: the next segment's start η; `factor`: η's growth over one segment of `length`
    iterations; `max_segments`: segments at most (the last one's end η is kept when the loss
    still falls there); `beta`, `rise`, `blowup`, `backoff`: `judge_range`'s. JSON-able
    (`to_dict` / `from_dict`), so a fit checkpointed mid-test resumes it.
    """

    lr: float
    length: int = 32
    factor: float = 4.0
    max_segments: int = 4
    beta: float = 0.9
    rise: float = 1.2
    blowup: float = 2.0
    backoff: float = 4.0
    lrs: list[float] | None = None
    losses: list[float] | None = None
    segments: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"the range test's start lr must be a finite number > 0, got {self.lr}")
        if int(self.length) < 2:
            raise ValueError(f"the range test's segment must be >= 2 iterations, got {self.length}")
        if not self.factor > 1:
            raise ValueError(f"the range test's factor must be > 1, got {self.factor}")
        if not (self.rise > 1 and self.blowup >= self.rise and self.backoff >= 1):
            raise ValueError(
                f"the range test needs rise > 1, blowup >= rise and backoff >= 1, got "
                f"{self.rise}, {self.blowup}, {self.backoff}"
            )
        self.lrs = list(self.lrs or [])
        self.losses = list(self.losses or [])

    @property
    def end_lr(self) -> float:
        """The η the next segment ramps to."""
        return self.lr * self.factor

    def observe(self, lrs, losses) -> RangeVerdict:
        """Judge a segment from its iterations' η and batch losses, in order (an empty segment, one
        the loop rolled back before it traced anything, counts as a blow-up at its start η)."""
        if self.done:
            raise RuntimeError("the range test is over: no more segments to judge")
        start = len(self.losses)
        lrs, losses = [float(v) for v in lrs], [float(v) for v in losses]
        if not losses:
            lrs, losses = [self.lr], [math.inf]
        self.lrs += lrs
        self.losses += losses
        self.segments += 1
        verdict = judge_range(
            self.lrs, self.losses, start, beta=self.beta, rise=self.rise, blowup=self.blowup,
            backoff=self.backoff, last=self.segments >= self.max_segments,
        )  # fmt: skip
        if verdict.restore:  # the undone segment's losses are not the training path's any more
            del self.lrs[start:], self.losses[start:]
        if not verdict.done:  # the next segment starts where this one's schedule ends
            verdict = replace(verdict, lr=self.end_lr)
        self.lr, self.done = verdict.lr, verdict.done
        return verdict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RangeTest:
        return cls(**d)
