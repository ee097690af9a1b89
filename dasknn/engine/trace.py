"""The contract every engine keeps: a run configuration, a budget, the training state, and the Trace.

An engine runs g compute groups for a budget and returns a `RunResult`: the Trace (a pandas
DataFrame, one row per group iteration) and the `TrainState` it ended in. The optimizer talks to
engines only through `run(net, X, y, config, budget, start) -> RunResult`, so the same optimizer
drives the real cluster (DaskEngine) and the simulator (SimulatedEngine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pandas as pd

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
    """What one run trains with: Omnivore's knobs (n_groups, lr, momentum) and the fixed settings."""

    n_groups: int = 1
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.n_groups) < 1:
            raise ValueError(f"n_groups must be >= 1, got {self.n_groups}")
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for key in ("lr", "momentum", "weight_decay"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key} must be a finite number >= 0, got {value}")
        if self.momentum >= 1:
            raise ValueError(f"momentum must be < 1, got {self.momentum}")

    def with_(self, **changes) -> RunConfig:
        return replace(self, **changes)


STRATEGIES = ("omnivore", "sma", "model_averaging")
PHYSICAL_MAPS = ("merged", "unmerged")
AGGREGATIONS = ("tree", "ps")


@dataclass(frozen=True)
class Strategy:
    """How an engine lays out and synchronises training; the default is Omnivore's (issue #7).

    name: 'omnivore' (g asynchronous compute groups, Omnivore §III-B), 'sma' (Crossbow's synchronous
    model averaging, §3.2: n_groups learners, each with its own replica) or 'model_averaging'
    (SparkNet: replicas averaged every `tau` iterations).
    physical_map: 'merged' (FC compute and FC model on one server, never stale) or 'unmerged'
    (Omnivore appendix C, the MXNet/SINGA layout: FC compute on every conv worker, FC model on a
    model server, so FC is stale too).
    aggregation: how the k gradients of a group are summed: 'tree' (FireCaffe's reduction tree,
    branching factor `branching`) or 'ps' (all k at one place, the conv model server's worker).
    split: the first FC-server layer: None (the first InnerProduct, Omnivore §II-B), 'auto' (RALP's
    rule, layer-placement §3) or a layer name.
    alpha: SMA's correction factor (None: 1/k, Crossbow §3.2).
    learners: None (n_groups learners) or 'auto' (SMA / model averaging only: Crossbow §3.4's
    auto-tuner picks the number of learners from measured throughput, `engine.autotune`).
    """

    name: str = "omnivore"
    physical_map: str = "merged"
    aggregation: str = "tree"
    branching: int = 2
    split: str | None = None
    alpha: float | None = None
    tau: int = 1
    learners: str | None = None

    def __post_init__(self) -> None:
        for key, allowed in (
            ("name", STRATEGIES),
            ("physical_map", PHYSICAL_MAPS),
            ("aggregation", AGGREGATIONS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(f"strategy {key} must be one of {allowed}, got {getattr(self, key)!r}")
        if int(self.branching) < 2:
            raise ValueError(f"branching must be >= 2, got {self.branching}")
        if int(self.tau) < 1:
            raise ValueError(f"tau must be >= 1, got {self.tau}")
        if self.alpha is not None and not (math.isfinite(self.alpha) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.learners not in (None, "auto"):
            raise ValueError(f"learners must be None or 'auto', got {self.learners!r}")
        if self.learners == "auto" and not self.synchronous:
            raise ValueError("learners='auto' tunes the learners of 'sma' or 'model_averaging' only")

    @property
    def synchronous(self) -> bool:
        """True for the replica strategies (SMA, model averaging): no FC server, no asynchrony."""
        return self.name != "omnivore"


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
    """Put a Dask run's rows on its own clock (seconds from `t0`), with its lr, momentum and epoch."""
    from dasknn.data.batching import n_batches

    nb = n_batches(n_samples, config.batch_size)
    for row in rows:
        row.update(
            t_start=row["t_start"] - t0,
            t_end=row["t_end"] - t0,
            lr=config.lr,
            momentum=config.momentum,
            epoch=row["batch"] / nb,
        )


def make_trace(rows: list[dict[str, Any]], engine: str, **attrs: Any) -> pd.DataFrame:
    """A Trace DataFrame with the standard columns (in order) and attrs naming the engine.

    Simulated runs carry `time_unit = "simulated s"`: their clock is a model, not a measurement.
    """
    df = pd.DataFrame(
        rows, columns=list(TRACE_COLUMNS) + sorted({k for r in rows for k in r} - set(TRACE_COLUMNS))
    )
    if not df.empty:
        df = df.sort_values(["t_end", "group"], kind="stable").reset_index(drop=True)
    df.attrs.update({"engine": engine, "time_unit": "simulated s" if engine == "simulated" else "s", **attrs})
    return df


class Engine(Protocol):
    """Anything that runs compute groups: DaskEngine, SimulatedEngine."""

    def run(self, net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None) -> RunResult:
        """Train `net` from `start` (or its current weights) for `budget`; set the final weights on `net`."""
        ...
