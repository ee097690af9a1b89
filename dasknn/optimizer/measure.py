"""What the online optimizer measures while it trains, from the Trace: no decision is taken here.

Pollux/AdaptDL keep the measuring (throughput, gradient noise scale) apart from the decisions that
use it; so does dasknn (`optimizer.decide` holds the decisions). Each function reads one run's
Trace, or folds it into a running estimate.

- time per iteration at a g (Omnivore §IV-B's HE, measured);
- the gradient noise scale B_noise = tr(Σ) / |G|² from the squared gradient norms of a batch and
  of its halves (McCandlish et al. 2018, appendix A: the two-batch-size estimator), smoothed
  before dividing;
- the total momentum present: the explicit µ plus the implicit momentum of the staleness the
  groups actually saw (Omnivore Theorem 1: S = g − 1 gives 1 − 1/g, i.e. S̄ / (S̄ + 1));
- progress per second: the drop of the log score over a run (the goodput that was realised);
- the time to the target accuracy, extrapolated from the training error's log-linear trend;
- the conv workers a run ended with (the engines record it: the cluster may change under a fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dasknn.tradeoff.hardware import time_per_iteration

__all__ = [
    "NoiseScale",
    "progress_rate",
    "seconds_per_iteration",
    "time_to_target",
    "total_momentum",
    "workers_at_end",
]


def seconds_per_iteration(trace: pd.DataFrame, warmup: int = 1) -> float:
    """Measured time per iteration of one run (all groups together), NaN if it ran too little."""
    if len(trace) < 2:
        return math.nan
    n_groups = int(trace["group"].nunique())
    return float(time_per_iteration(trace, warmup=warmup if len(trace) > 3 * n_groups else 0))


@dataclass
class NoiseScale:
    """The gradient noise scale from the squared norms `grad_sq` (batch B) and `grad_sq_half` (B/2).

    Unbiased estimates per measured batch: |G|² ≈ (B|G_B|² − b|G_b|²)/(B − b) and
    tr(Σ) ≈ (|G_b|² − |G_B|²)/(1/b − 1/B) (McCandlish et al. 2018, eqs. A.2-A.3); both are noisy,
    so each is an exponential moving average (weight `decay` per run, as AdaptDL smooths them)
    before B_noise = tr(Σ) / |G|² is formed.
    """

    decay: float = 0.5
    grad_sq: float = math.nan
    trace_sigma: float = math.nan
    samples: int = 0

    def update(self, trace: pd.DataFrame, batch_size: int) -> None:
        """Fold one run's measured norms in (rows without them are skipped)."""
        if "grad_sq" not in trace or "grad_sq_half" not in trace:
            return
        rows = trace[["grad_sq", "grad_sq_half"]].dropna()
        if not len(rows):
            return
        big, small = float(batch_size), float(batch_size // 2)
        g_big, g_small = float(rows["grad_sq"].mean()), float(rows["grad_sq_half"].mean())
        grad_sq = (big * g_big - small * g_small) / (big - small)
        trace_sigma = (g_small - g_big) / (1 / small - 1 / big)
        if self.samples == 0:
            self.grad_sq, self.trace_sigma = grad_sq, trace_sigma
        else:
            self.grad_sq = self.decay * self.grad_sq + (1 - self.decay) * grad_sq
            self.trace_sigma = self.decay * self.trace_sigma + (1 - self.decay) * trace_sigma
        self.samples += len(rows)

    @property
    def value(self) -> float:
        """B_noise in samples; NaN until measured, +inf when the true gradient is lost in the noise."""
        if self.samples == 0 or not math.isfinite(self.grad_sq):
            return math.nan
        if self.grad_sq <= 0:
            return math.inf
        return max(self.trace_sigma, 0.0) / self.grad_sq


def workers_at_end(trace: pd.DataFrame) -> int | None:
    """The conv workers N a run ended with (`attrs["n_workers"]`, both engines), None if unrecorded."""
    n = trace.attrs.get("n_workers")
    return None if n is None or not np.isfinite(n) else int(n)


def total_momentum(trace: pd.DataFrame, explicit: float) -> float:
    """Explicit µ plus the implicit momentum of the measured staleness, S̄ / (S̄ + 1) (Omnivore
    Theorem 1, where S = g − 1 gives 1 − 1/g); NaN without a `staleness` column."""
    if "staleness" not in trace or not len(trace):
        return math.nan
    s = float(np.nanmean(trace["staleness"].to_numpy(dtype=float)))
    return float(explicit) + s / (s + 1)


def progress_rate(score_start: float, score_end: float, seconds: float) -> float:
    """The drop of the log score per second over a run (goodput as realised); −inf if it blew up."""
    if not (seconds > 0 and score_start > 0 and math.isfinite(score_start)):
        return math.nan
    if not (math.isfinite(score_end) and score_end > 0):
        return -math.inf
    return (math.log(score_start) - math.log(score_end)) / seconds


def time_to_target(trace: pd.DataFrame, target_accuracy: float | None, window: int = 20) -> tuple[float, str]:
    """(seconds from the trace's start until the smoothed training error reaches 1 − target, how).

    The log of the error is fitted by a line in time over the second half of the trace; NaN when
    there is no target, too little trace, or no downward trend."""
    if target_accuracy is None or len(trace) < 2 * window:
        return math.nan, "no target or too little trace"
    t = trace["t_end"].to_numpy(dtype=float)
    err = 1 - pd.Series(trace["accuracy"].to_numpy(dtype=float)).rolling(window, min_periods=1).mean()
    err = np.clip(err.to_numpy(), 1e-4, 1)
    if err[-1] <= 1 - target_accuracy:
        return float(t[-1]), "reached"
    half = len(t) // 2
    slope, intercept = np.polyfit(t[half:], np.log(err[half:]), 1)
    if not slope < 0:
        return math.nan, "the training error is not falling"
    when = (math.log(1 - target_accuracy) - intercept) / slope
    return float(max(when, t[-1])), f"log-linear fit of the training error, slope {slope:.3g}/s"
