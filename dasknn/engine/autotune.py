"""Crossbow's learner auto-tuner (§3.4, Alg. 2; §4.4): pick the number of learners by throughput.

Start with one learner; train a few synchronous rounds and measure the throughput t (images/s);
add a learner while t improves on the previous count by more than a threshold τ (relative, e.g.
5%), remove one when t drops, keep the count on a plateau. Every probe is real training that
continues from the previous probe's state (Crossbow adds a learner between two iterations and
starts its replica at the average model z, which is how every run of the replica strategies
starts). The engine's clock gives t: measured on the DaskEngine, simulated on the SimulatedEngine.
The tuner only calls `engine.run`, so it sits with the contract and serves both engines.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from dasknn.engine.trace import SIMULATED_SECONDS, Budget, RunConfig, RunResult, TrainState, make_trace
from dasknn.nn.net import Net

__all__ = ["MEASUREMENT_COLUMNS", "LearnerTuning", "round_throughput", "run_auto_learners", "tune_learners"]

MEASUREMENT_COLUMNS = ("step", "learners", "rounds", "round_seconds", "throughput", "change", "decision")


@dataclass
class LearnerTuning:
    """What the auto-tuner chose and measured: one row per probe (`MEASUREMENT_COLUMNS`)."""

    learners: int
    measurements: pd.DataFrame
    state: TrainState
    trace: pd.DataFrame


def round_throughput(trace: pd.DataFrame, batch_size: int) -> tuple[float, float, int]:
    """(images/s, median seconds per round, rounds) of a replica run's Trace.

    A round ends when its last learner's row ends (the synchronisation); the first round is the
    warm-up and only starts the clock. Throughput = learners · batch / median round time.
    """
    ends = trace.groupby("version_read")["t_end"].max().sort_index().to_numpy()
    if len(ends) < 3:
        raise ValueError(f"throughput needs at least 3 rounds, the trace has {len(ends)}")
    seconds = float(np.median(np.diff(ends)))
    learners = int(trace["group"].nunique())
    return (learners * batch_size / seconds if seconds > 0 else math.inf), seconds, len(ends)


@contextmanager
def _fixed_learners(engine) -> Iterator[None]:
    """The engine runs its strategy with n_groups learners (no tuning) inside this block."""
    saved = engine.strategy
    engine.strategy = replace(saved, learners=None)
    try:
        yield
    finally:
        engine.strategy = saved


def _spent(trace: pd.DataFrame, wall: float) -> float:
    """Budget seconds a run used: its simulated clock, or the measured wall time of the call."""
    if trace.attrs.get("time_unit") == SIMULATED_SECONDS:
        return float(trace["t_end"].max()) if len(trace) else 0.0
    return wall


def _join(parts: list[tuple[float, pd.DataFrame]], engine_name: str, **attrs) -> pd.DataFrame:
    """Traces of consecutive runs as one, each shifted by the budget seconds spent before it."""
    frames = []
    for offset, trace in parts:
        shifted = trace.copy()
        shifted[["t_start", "t_end"]] += offset
        frames.append(shifted)
    records = pd.concat(frames, ignore_index=True).to_dict("records") if frames else []
    merged = dict(parts[-1][1].attrs) if parts else {}
    merged.pop("engine", None)
    merged.pop("time_unit", None)
    return make_trace(records, engine_name, **{**merged, **attrs})


def _check(engine, threshold: float, probe_rounds: int, max_learners: int) -> None:
    if not getattr(engine, "strategy", None) or not engine.strategy.synchronous:
        raise ValueError("the learner auto-tuner needs an engine with strategy 'sma' or 'model_averaging'")
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold}")
    if int(probe_rounds) < 3:
        raise ValueError(f"probe_rounds must be >= 3 (a warm-up round and two timed), got {probe_rounds}")
    if int(max_learners) < 1:
        raise ValueError(f"max_learners must be >= 1, got {max_learners}")


def _probe_budget(budget: Budget | None, spent: float, done: int, iterations: int) -> Budget | None:
    """The next probe's budget: `iterations`, cut to what is left of `budget` after `spent` seconds
    and `done` iterations of probes; None when `budget` is spent."""
    seconds = None
    if budget is not None:
        if budget.exhausted(spent, done):
            return None
        if budget.iterations is not None:
            iterations = min(iterations, budget.iterations - done)
        if budget.seconds is not None:
            seconds = budget.seconds - spent
    return Budget(seconds=seconds, iterations=iterations)


def _decide(
    throughput: float, previous: float | None, threshold: float, learners: int, max_learners: int
) -> tuple[str, float]:
    """Crossbow Alg. 2 after a probe of `learners`: (decision, relative change of the throughput).

    'add' a learner while the throughput rose by more than `threshold` over `previous` (or on the
    first probe; 'max' at `max_learners`), 'remove' one when it fell, else 'keep'."""
    change = math.nan if previous is None else throughput / previous - 1.0
    if previous is None or change > threshold:
        return ("add" if learners < max_learners else "max"), change
    if throughput < previous and learners > 1:
        return "remove", change
    return "keep", change


def tune_learners(
    engine,
    net: Net,
    X,
    y,
    config: RunConfig,
    *,
    threshold: float = 0.05,
    probe_rounds: int = 4,
    max_learners: int = 8,
    start: TrainState | None = None,
    budget: Budget | None = None,
) -> LearnerTuning:
    """Crossbow Alg. 2 on `engine` (strategy 'sma' or 'model_averaging'): the learners count to use.

    Probe l = 1, 2, ... learners, each for `probe_rounds` rounds; after each probe: add a learner if
    the throughput rose by more than `threshold` (relative), remove one if it fell, else keep.
    Stops at the first keep/remove, at `max_learners`, or when `budget` (all probes together) is
    spent. Returns the chosen count, the measurements, the state reached and the probes' Trace.
    """
    _check(engine, threshold, probe_rounds, max_learners)
    max_learners = int(max_learners)
    n_workers = getattr(engine, "n_workers", None)
    if n_workers is not None:  # the simulator needs a worker per learner
        max_learners = min(max_learners, int(n_workers))
    state = start.copy() if start is not None else TrainState.from_net(net)
    rows, parts = [], []
    learners, previous, spent, done, decision = 1, None, 0.0, 0, "add"
    with _fixed_learners(engine):
        while True:
            probe = _probe_budget(budget, spent, done, learners * int(probe_rounds))
            if probe is None:
                decision = "budget"
                break
            t = time.time()
            result = engine.run(net, X, y, config.with_(n_groups=learners), probe, state)
            parts.append((spent, result.trace))
            spent += _spent(result.trace, time.time() - t)
            done += len(result.trace)
            state = result.state
            if result.trace["group"].nunique() < learners or result.trace["version_read"].nunique() < 3:
                decision = "budget"  # the budget cut the probe short: no throughput to compare
                break
            throughput, round_seconds, rounds = round_throughput(result.trace, config.batch_size)
            decision, change = _decide(throughput, previous, threshold, learners, max_learners)
            rows.append(
                {
                    "step": len(rows),
                    "learners": learners,
                    "rounds": rounds,
                    "round_seconds": round_seconds,
                    "throughput": throughput,
                    "change": change,
                    "decision": decision,
                }
            )
            if decision != "add":
                break
            previous, learners = throughput, learners + 1
    chosen = learners - 1 if decision == "remove" else learners
    if decision == "budget" and rows:
        chosen = int(rows[-1]["learners"])
    measurements = pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))
    measurements.attrs.update({"threshold": threshold, "unit": "images/s", "chosen": chosen})
    engine_name = parts[-1][1].attrs.get("engine", "") if parts else ""
    trace = _join(parts, engine_name, learners=chosen)
    return LearnerTuning(learners=chosen, measurements=measurements, state=state, trace=trace)


def run_auto_learners(
    engine, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None, **tuner
) -> RunResult:
    """An engine run with strategy learners='auto': tune the learners (Crossbow §3.4), then train.

    The tuning probes are training and count against `budget`; the rest of the budget runs with
    the chosen count. The Trace joins both (times since the start of the first probe) and carries
    attrs `learners` (the choice) and `learner_tuning` (the measurements, as records).
    """
    t = time.time()
    tuning = tune_learners(engine, net, X, y, config, start=start, budget=budget, **tuner)
    wall = time.time() - t
    spent = _spent(tuning.trace, wall)
    done = len(tuning.trace)
    parts = [(0.0, tuning.trace)]
    state = tuning.state
    if not budget.exhausted(spent, done):
        rest = Budget(
            seconds=None if budget.seconds is None else budget.seconds - spent,
            iterations=None if budget.iterations is None else budget.iterations - done,
        )
        with _fixed_learners(engine):
            result = engine.run(net, X, y, config.with_(n_groups=tuning.learners), rest, state)
        parts.append((spent, result.trace))
        state = result.state
    net.set_params(state.params)
    trace = _join(
        parts,
        parts[-1][1].attrs.get("engine", ""),
        learners=tuning.learners,
        learner_tuning=tuning.measurements.to_dict("records"),
    )
    return RunResult(trace=trace, state=state)
