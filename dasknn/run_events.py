"""What a run's trace says happened to the cluster, recorded by the loop (`fitting.Loop.execute`):
the Dask engine's recoveries from lost workers and the workers that joined, left or were lost
during the run, as decision rows, log lines and callbacks, and as the note of a history row."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pandas as pd

from dasknn.engine.trace import RunConfig, worker_changes

if TYPE_CHECKING:
    from dasknn.fitting import Loop

__all__ = ["cluster_changes", "note", "recoveries"]

logger = logging.getLogger("dasknn.fitting")


def recoveries(loop: Loop, trace: pd.DataFrame, config: RunConfig) -> str:
    """The Dask engine's recoveries from lost workers in a run, as decision rows and a history note."""
    notes = []
    for r in trace.attrs.get("recoveries") or []:
        roles = r.get("roles")
        roles = ", ".join(roles) if isinstance(roles, (list, tuple)) else str(roles)
        why = (
            f"lost {r.get('worker')} ({roles}): {r.get('iterations_redone')} iterations redone, "
            f"n_groups {r.get('n_groups_before')} -> {r.get('n_groups_after')}"
        )
        loop.log.record(
            "train", "recovery", config.with_(n_groups=r.get("n_groups_after") or config.n_groups), why
        )
        notes.append(f"recovery: {why}")
    return "; ".join(notes)


def cluster_changes(loop: Loop, trace: pd.DataFrame, seg: pd.DataFrame, run: int, config: RunConfig) -> str:
    """Workers that joined, left or were lost during run `run` (`engine.trace.worker_changes`):
    a "cluster" decision row each (time on the fit's clock, `workers`, `n_workers` after), a log
    line, the callbacks' `on_cluster_change`; returns them as a history note."""
    changes = worker_changes(trace)
    if not changes:
        return ""
    start = loop.log.elapsed - loop.log.charged[run]  # where the run began on the fit's clock
    shift = float(seg["t_start"].min() - trace["t_start"].min()) if len(trace) else start
    notes = []
    for c in changes:
        c = dict(c, time=c["time"] + shift, run=run)
        verb = {"join": "joined", "leave": "left (retired)", "lost": "lost"}[c["action"]]
        why = f"{c['workers']} {verb}: {c['n_workers']} workers"
        loop.log.record("cluster", c["action"], config, why, time=c["time"], run=run,
                        workers=c["workers"], n_workers=c["n_workers"])  # fmt: skip
        logger.info("t=%.4g %s: %s", c["time"], getattr(loop.engine, "time_unit", None) or "s", why)
        loop.notify("on_cluster_change", c)
        notes.append(f"{c['action']}: {why}")
    return "; ".join(notes)


def note(history: list[dict[str, Any]], event: str) -> None:
    """Add `event` to the note of the latest history row (a run evaluated while it trained: its
    events are known once it ended, after its rows)."""
    if event and history:
        row = history[-1]
        row["event"] = "; ".join(filter(None, [str(row.get("event") or ""), event]))
