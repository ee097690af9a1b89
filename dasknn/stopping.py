"""When a fit ends: the wall-clock bound of simulated fits, and `stopped_by_`'s account of the end.

Two small pure functions of the estimator's parameters and what the loop measured. The loop
(`dasknn.fitting.Loop.record`) names the stops an evaluation decides (the target, a callback,
`max_wall_time`); `end_reason` names the others, the budgets, in the user's terms.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WALL_FLOOR", "end_reason", "wall_bound"]

WALL_FLOOR = 60.0
"""Real seconds below which max_wall_time="auto" never bounds a simulated fit (`wall_bound`)."""


def wall_bound(max_wall_time: Any, engine: str, time_budget: float | None) -> float | None:
    """The real seconds a fit may take (None: unbounded): `max_wall_time` as given, or for "auto"
    on the simulator max(`WALL_FLOOR`, time_budget): its budget is simulated seconds, which one
    machine computes several times slower than the cluster it models runs them; a user who typed
    120 expects the fit back in about that, and the floor keeps small simulated budgets (which take
    seconds) unbounded. "auto" on Dask: None (its time_budget is already wall-clock seconds)."""
    if max_wall_time != "auto":
        return None if max_wall_time is None else float(max_wall_time)
    if engine != "simulated" or time_budget is None:
        return None
    return max(WALL_FLOOR, float(time_budget))


def end_reason(
    *,
    limit: str,
    max_iterations: int | None,
    iterations: int,
    iteration: int,
    time_budget: float | None,
    elapsed: float,
    unit: str,
    decisions=None,
) -> str:
    """Why a fit that no evaluation stopped ended, after `iterations` iterations (now at `iteration`)
    and `elapsed` seconds of its clock (`unit`): `limit` (e.g. "max_epochs=2", what
    `max_iterations` stands for) done, or the time budget spent, or else the tuner's own last
    "stop" decision; "" when none applies."""
    if max_iterations is not None and iterations >= max_iterations:
        return f"{limit} done: {iterations} iterations, at iteration {iteration}"
    if time_budget is not None and elapsed >= time_budget * (1 - 1e-9):
        return f"time_budget={time_budget:g} {unit} spent, at iteration {iteration}"
    if decisions is not None and len(decisions) and "action" in decisions:
        stops = decisions[decisions["action"] == "stop"]
        if len(stops):
            return f"the tuner stopped: {stops['reason'].iloc[-1]}, at iteration {iteration}"
    return ""
