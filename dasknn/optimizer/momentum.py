"""Momentum by measurement: the total momentum read off the weights' own trajectory (YellowFin).

With momentum, consecutive updates of each weight follow Δw_t ≈ µ_T · Δw_{t−1} − η ∇f: the
update keeps a fraction µ_T of the last one. Regressing Δw_t on Δw_{t−1} over a fixed sample of
parameters estimates µ_T without assuming where it comes from (explicit µ, or the implicit
momentum of asynchrony, Omnivore Theorem 1); YellowFin's closed loop (Zhang & Mitliagkas 2017,
§4) then steers the explicit µ so that the measured total meets a target
(`decide.steer_momentum`). The formula 1 − 1/g alone is never used to lower µ.

The measurement: the conv model server reads a fixed sample of its weights after every update
(`engine.servers.UpdateCorrelation`) and records Δw_t·Δw_{t−1} and |Δw_{t−1}|² in the Trace
(`update_dot`, `update_sq`); `trace_momentum` sums them over a segment, the least-squares slope
through the origin; `regressed_momentum` is the same slope from a (T, P) trajectory of sampled
weights. What it does and does not see: in noise-dominated SGD the lag-one regression recovers the
explicit µ, and the implicit momentum of asynchrony (a response of the gradient to stale weights)
shows in it only as far as it changes consecutive updates.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["regressed_momentum", "steer_from_trajectory", "trace_momentum"]


def regressed_momentum(trajectory) -> float:
    """µ̂_T from a (T, P) array of sampled weights at T consecutive updates: the least-squares
    slope of Δw_t on Δw_{t−1} through the origin; NaN with fewer than 4 rows or no movement."""
    w = np.asarray(trajectory, dtype=np.float64)
    if w.ndim != 2 or len(w) < 4:
        return math.nan
    d = np.diff(w, axis=0)
    prev, now = d[:-1], d[1:]
    denom = float((prev * prev).sum())
    if not (denom > 0 and math.isfinite(denom)):
        return math.nan
    return float((now * prev).sum() / denom)


def trace_momentum(trace: pd.DataFrame) -> float:
    """µ̂_T of a segment from its Trace's `update_dot` and `update_sq`: Σ dot / Σ sq (NaN without
    them or without movement)."""
    if "update_dot" not in trace or "update_sq" not in trace:
        return math.nan
    rows = trace[["update_dot", "update_sq"]].dropna()
    sq = float(rows["update_sq"].sum())
    if not (len(rows) >= 2 and sq > 0 and math.isfinite(sq)):
        return math.nan
    return float(rows["update_dot"].sum()) / sq


def steer_from_trajectory(
    explicit: float, trajectory, target: float, gain: float = 0.5, tolerance: float = 0.03
) -> tuple[float, float, str]:
    """(new explicit µ, measured total, why): YellowFin's feedback on the regressed total momentum."""
    from dasknn.optimizer.decide import steer_momentum

    measured = regressed_momentum(trajectory)
    mu, why = steer_momentum(explicit, measured, target, gain, tolerance)
    return mu, measured, why
