"""The contract every engine keeps: a run configuration, a budget, the training state, and the Trace.

An engine runs g compute groups for a budget and returns a `RunResult`: the Trace (a pandas
DataFrame, one row per group iteration) and the `TrainState` it ended in. The fit's loop talks to
engines only through `run(net, X, y, config, budget, start) -> RunResult`, so the same policies
drive the real cluster (DaskEngine) and the simulator (SimulatedEngine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dasknn.engine.schedule import Schedule
from dasknn.rules import LEARNING_RATE, MOMENTUM

TRACE_COLUMNS = (
    "group",
    "iteration",
    "t_start",
    "t_end",
    "version_read",
    "version_written",
    "staleness",
    "loss",
    "accuracy",
    "lr",
    "momentum",
    "n_images",
    "epoch",
)


@dataclass(frozen=True)
class RunConfig:
    """What one run trains with: Omnivore's knobs (n_groups, lr, momentum) and the fixed settings.

    `lr` and `momentum` are each a float or a `Schedule` of the iteration (or its `to_dict` form),
    which the model servers evaluate at each update; a constant schedule is kept as its float.
    """

    n_groups: int = 1
    lr: float | Schedule = 0.01
    momentum: float | Schedule = 0.9
    weight_decay: float = 0.0
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.n_groups) < 1:
            raise ValueError(f"n_groups must be >= 1, got {self.n_groups}")
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for name, rule in (("lr", LEARNING_RATE), ("momentum", MOMENTUM)):
            object.__setattr__(self, name, _knob(name, getattr(self, name)))
            knob = getattr(self, name)
            for value in knob.values() if isinstance(knob, Schedule) else (knob,):
                rule.check(name if knob is value else f"every value of the {name} schedule", value)
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")

    def with_(self, **changes) -> RunConfig:
        return replace(self, **changes)


def _knob(name: str, value: Any) -> Any:
    """η or µ as given: a float stays, a schedule's dict becomes a `Schedule`, a constant schedule
    its float."""
    if isinstance(value, dict):
        try:
            value = Schedule.from_dict(value)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    if isinstance(value, Schedule) and value.kind == "constant":
        return value.start
    return value


COLD_START = RunConfig()
"""Omnivore's cold start, the knobs a fit starts from when nothing else is known: g = 1, Caffe's
reference solvers' η = 0.01 and µ = 0.9 (the one place these defaults are written)."""


@dataclass(frozen=True)
class Budget:
    """When a run stops: after `seconds` (wall or simulated) or `iterations` (all groups together)."""

    seconds: float | None = None
    iterations: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is None and self.iterations is None:
            raise ValueError("a Budget needs seconds or iterations")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"budget seconds must be > 0, got {self.seconds}")
        if self.iterations is not None and int(self.iterations) < 1:
            raise ValueError(f"budget iterations must be >= 1, got {self.iterations}")

    def exhausted(self, seconds: float, iterations: int) -> bool:
        return (self.seconds is not None and seconds >= self.seconds) or (
            self.iterations is not None and iterations >= self.iterations
        )


@dataclass
class TrainState:
    """Everything needed to continue training exactly: weights, momentum buffers, data position.

    `params` and `momentum` are flat dicts of numpy arrays keyed "layer.param" (conv and FC phases
    together); `batches_done` counts batches consumed since epoch 0 (the data cursor).
    """

    params: dict[str, np.ndarray]
    momentum: dict[str, np.ndarray] = field(default_factory=dict)
    batches_done: int = 0
    iterations_done: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_net(cls, net) -> TrainState:
        """A fresh state at the net's current weights, zero momentum, at the start of the data."""
        return cls(params=net.get_params())

    def copy(self) -> TrainState:
        return TrainState(
            params={k: v.copy() for k, v in self.params.items()},
            momentum={k: v.copy() for k, v in self.momentum.items()},
            batches_done=self.batches_done,
            iterations_done=self.iterations_done,
            extra=dict(self.extra),
        )


@dataclass
class RunResult:
    """What a run returns: the Trace and the state it ended in."""

    trace: pd.DataFrame
    state: TrainState


def on_run_clock(rows: list[dict[str, Any]], t0: float, config: RunConfig, n_samples: int) -> None:
    """Put a Dask run's rows on its own clock (seconds from `t0`), with their epoch and the lr and
    momentum the model server applied (a row that does not carry them: the config's constants)."""
    from dasknn.data.batching import n_batches

    nb = n_batches(n_samples, config.batch_size)
    for row in rows:
        row.update(
            t_start=row["t_start"] - t0,
            t_end=row["t_end"] - t0,
            lr=row.get("lr", config.lr),
            momentum=row.get("momentum", config.momentum),
            epoch=row["batch"] / nb,
        )


SIMULATED_SECONDS = "simulated s"
"""The unit of the simulator's clock: a model of the time, not a measurement."""


def time_unit(engine: str) -> str:
    """The unit of the clock of the engine named `engine`: `SIMULATED_SECONDS` on the simulator, else "s"."""
    return SIMULATED_SECONDS if engine == "simulated" else "s"


def make_trace(rows: list[dict[str, Any]], engine: str, **attrs: Any) -> pd.DataFrame:
    """A Trace DataFrame with the standard columns (in order) and attrs naming the engine.

    `attrs["time_unit"]` is the engine's (`time_unit`).
    """
    df = pd.DataFrame(
        rows, columns=list(TRACE_COLUMNS) + sorted({k for r in rows for k in r} - set(TRACE_COLUMNS))
    )
    if not df.empty:
        df = df.sort_values(["t_end", "group"], kind="stable").reset_index(drop=True)
    df.attrs.update({"engine": engine, "time_unit": time_unit(engine), **attrs})
    return df


def worker_changes(trace: pd.DataFrame) -> list[dict[str, Any]]:
    """The cluster's changes under a run, in time order, from what either engine records
    (docs/architecture.md, "Elastic clusters"): one dict per change with `time` (the trace's clock),
    `action` ("join", "leave": a graceful retirement, "lost": an abrupt loss), `workers` (their
    addresses, or on the simulator how many) and `n_workers` (the conv workers after it; -1 unknown).

    Read from `attrs["worker_events"]` (the Dask engine's joined/left lists, the simulator's counts)
    and `attrs["recoveries"]` (the Dask engine's recoveries from lost workers)."""
    out = []
    for e in trace.attrs.get("worker_events") or []:
        n = int(e.get("n_workers", -1))
        if "n_workers_before" in e:  # the simulator: counts, no addresses
            before = int(e["n_workers_before"])
            action = "join" if n > before else "leave"
            out.append({"time": float(e["time"]), "action": action, "workers": f"{abs(n - before)} workers",
                        "n_workers": n})  # fmt: skip
            continue
        for action, key in (("join", "joined"), ("leave", "left")):
            if e.get(key):
                out.append({"time": float(e["time"]), "action": action, "workers": ", ".join(e[key]),
                            "n_workers": n})  # fmt: skip
    for r in trace.attrs.get("recoveries") or []:
        out.append({"time": float(r["time"]), "action": "lost", "workers": str(r["worker"]),
                    "n_workers": int(r.get("n_workers", -1))})  # fmt: skip
    return sorted(out, key=lambda c: c["time"])


class Engine(Protocol):
    """Anything that runs compute groups: DaskEngine, SimulatedEngine."""

    def run(self, net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None) -> RunResult:
        """Train `net` from `start` (or its current weights) for `budget`; set the final weights on `net`."""
        ...
