"""Momentum by measurement: the total momentum read off the weights' own trajectory (YellowFin).

With momentum, consecutive updates of each weight follow Δw_t ≈ µ_T · Δw_{t−1} − η ∇f: the
update keeps a fraction µ_T of the last one. Regressing Δw_t on Δw_{t−1} over a fixed sample of
parameters estimates µ_T without assuming where it comes from (explicit µ, or the implicit
momentum of asynchrony, Omnivore Theorem 1); YellowFin's closed loop (Zhang & Mitliagkas 2017,
§4) then steers the explicit µ so that the measured total meets a target
(`decide.steer_momentum`). The formula 1 − 1/g alone is never used to lower µ.

`ParameterSample` picks the fixed coordinates (seeded) and reads them from weight dicts;
`regressed_momentum` is the least-squares slope through the origin over all coordinates and
iteration pairs, with each coordinate's mean update over the window removed first so that the slow
drift of the gradient (which makes consecutive updates alike at any µ) does not read as momentum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["ParameterSample", "regressed_momentum", "steer_from_trajectory"]


class ParameterSample:
    """A fixed, seeded sample of `size` coordinates across a weight dict's arrays (the same ones at
    every read, so successive reads form a trajectory)."""

    def __init__(self, params: Mapping[str, np.ndarray], size: int = 256, seed: int = 0) -> None:
        if int(size) < 1:
            raise ValueError(f"the sample needs at least 1 coordinate, got {size}")
        names = sorted(params)
        sizes = np.array([np.asarray(params[k]).size for k in names])
        rng = np.random.default_rng(seed)
        flat = rng.choice(int(sizes.sum()), size=min(int(size), int(sizes.sum())), replace=False)
        edges = np.concatenate([[0], np.cumsum(sizes)])
        self.index = {
            k: np.sort(flat[(flat >= edges[i]) & (flat < edges[i + 1])] - edges[i])
            for i, k in enumerate(names)
        }

    def read(self, params: Mapping[str, np.ndarray]) -> np.ndarray:
        """The sampled coordinates of `params`, as one float64 vector."""
        return np.concatenate(
            [np.asarray(params[k], dtype=np.float64).ravel()[i] for k, i in self.index.items() if len(i)]
        )


def regressed_momentum(trajectory) -> float:
    """µ̂_T from a (T, P) array of sampled weights at T consecutive updates: the slope of Δw_t on
    Δw_{t−1} (through the origin, each coordinate's mean update removed); NaN with fewer than 4
    rows or no movement."""
    w = np.asarray(trajectory, dtype=np.float64)
    if w.ndim != 2 or len(w) < 4:
        return math.nan
    d = np.diff(w, axis=0)
    d = d - d.mean(axis=0)
    prev, now = d[:-1], d[1:]
    denom = float((prev * prev).sum())
    if not (denom > 0 and math.isfinite(denom)):
        return math.nan
    return float((now * prev).sum() / denom)


def steer_from_trajectory(
    explicit: float, trajectory, target: float, gain: float = 0.5, tolerance: float = 0.03
) -> tuple[float, float, str]:
    """(new explicit µ, measured total, why): YellowFin's feedback on the regressed total momentum."""
    from dasknn.optimizer.decide import steer_momentum

    measured = regressed_momentum(trajectory)
    mu, why = steer_momentum(explicit, measured, target, gain, tolerance)
    return mu, measured, why
