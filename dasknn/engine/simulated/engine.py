"""SimulatedEngine: the Engine contract on a modeled clock, in one process.

docs/architecture.md "The simulator's clock".

The engine checks its timing model and strategy, picks the event loop of its strategy
(`events.Simulation` for Omnivore's compute groups, `strategies` for the others), runs it for the
budget and returns the Trace (time in simulated seconds) with the state it ended in. Nothing here
or below reaches the Dask engine or `distributed`: a simulated run needs no cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from dasknn.backend import blas_threads
from dasknn.data.augment import Augment
from dasknn.data.batching import check_window
from dasknn.engine.autotune import run_auto_learners
from dasknn.engine.simulated.events import Simulation
from dasknn.engine.simulated.strategies import ReplicaSimulation, UnmergedSimulation
from dasknn.engine.strategy import Strategy, split_layer
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace
from dasknn.nn.net import Net

__all__ = ["VARIABILITY", "ConvFCTiming", "SimulatedEngine"]

VARIABILITY = ("deterministic", "gamma", "exponential")


class ConvFCTiming(Protocol):
    """What the simulator needs of a hardware model: `tradeoff.hardware.HEModel` is one."""

    n_workers: int
    t_fc: float

    def t_conv(self, k: int) -> float: ...


class SimulatedEngine:
    """Runs g compute groups by discrete events with real SGD; the Engine protocol of `engine.trace`.

    Timing from `timing` (an `HEModel`: t_conv(k), t_fc, n_workers) or from explicit `t_conv`
    (seconds, or a function of k) and `t_fc`; `n_workers` defaults to the model's, else to
    n_groups (k = 1). `variability`: 'deterministic', 'gamma' (each duration drawn with
    coefficient of variation `cv`; Omnivore measured < 6%, §III-B and appendix D) or 'exponential'
    (Theorem 1's assumption A2). `verbose=0` silences the progress bar of long runs.

    Batches follow `epoch_indices` on X's chunks (numpy X: the chunks `from_numpy` would give) in
    the order groups start iterations; X and y are computed to numpy once per run. The returned
    state's `batches_done` counts batches taken, in-flight ones included; conv-server versions
    continue across runs. A run continues the in-flight iterations of its start state when
    n_groups, group size, batch size and seed are unchanged (with the durations they were drawn
    with); otherwise every group starts afresh from the state's weights (the in-flight batches are
    skipped). A non-finite loss ends the run early with the trace attr `diverged` = True.
    `shuffle_window` and `augment` shape the batches as on the Dask engine (`events.Batches`).

    `strategy` (`engine.strategy.Strategy`; default Omnivore's) selects the other papers' layouts
    (`simulated.strategies`): `split` moves the FC server's first layer (RALP's 'auto'),
    physical_map 'unmerged' runs FC on every group (`t_fc_worker` simulated seconds, default t_fc),
    and 'sma' / 'model_averaging' train n_groups synchronised replicas (each iteration also takes
    `t_sync` simulated seconds when the replicas synchronise). `aggregation` does not change the
    simulated maths (a sum is a sum); model its time through t_conv.
    """

    time_unit = "simulated s"
    """The unit of this engine's clock, even for a run that raised before writing a trace."""

    def __init__(
        self,
        timing: ConvFCTiming | None = None,
        *,
        t_conv: float | Callable[[int], float] | None = None,
        t_fc: float | None = None,
        n_workers: int | None = None,
        variability: str = "deterministic",
        cv: float = 0.06,
        forward_fraction: float = 1 / 3,
        verbose: int = 1,
        strategy: Strategy | None = None,
        t_fc_worker: float | None = None,
        t_sync: float = 0.0,
        augment: Augment | None = None,
        shuffle_window: int = 1,
    ) -> None:
        if timing is None and (t_conv is None or t_fc is None):
            raise ValueError("SimulatedEngine needs a timing model (e.g. an HEModel) or both t_conv and t_fc")
        if variability not in VARIABILITY:
            raise ValueError(f"variability must be one of {VARIABILITY}, got {variability!r}")
        if not (math.isfinite(cv) and cv >= 0):
            raise ValueError(f"cv must be a finite number >= 0, got {cv}")
        if not 0 <= forward_fraction <= 1:
            raise ValueError(f"forward_fraction must be in [0, 1], got {forward_fraction}")
        self.timing = timing
        self.t_conv = t_conv
        self.t_fc = float(t_fc if t_fc is not None else timing.t_fc)
        self.n_workers = n_workers if n_workers is not None else getattr(timing, "n_workers", None)
        self.variability, self.cv = variability, float(cv)
        self.forward_fraction = float(forward_fraction)
        self.verbose = verbose
        self.strategy = strategy if strategy is not None else Strategy()
        self.t_fc_worker = self.t_fc if t_fc_worker is None else float(t_fc_worker)
        self.t_sync = float(t_sync)
        if augment is not None and not isinstance(augment, Augment):
            raise ValueError(f"augment must be None or a dasknn.data.augment.Augment, got {augment!r}")
        self.augment, self.shuffle_window = augment, check_window(shuffle_window)
        if not (math.isfinite(self.t_sync) and self.t_sync >= 0 and self.t_fc_worker >= 0):
            raise ValueError(f"t_sync and t_fc_worker must be >= 0, got {t_sync}, {t_fc_worker}")

    def conv_time(self, k: int) -> float:
        """Mean conv-phase time of a group of k workers (simulated seconds)."""
        if self.t_conv is None:
            return float(self.timing.t_conv(k))
        return float(self.t_conv(k) if callable(self.t_conv) else self.t_conv)

    def run(
        self, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None
    ) -> RunResult:
        """Train `net` from `start` (or its weights) for `budget` simulated seconds or iterations."""
        if self.strategy.learners == "auto":  # Crossbow's auto-tuner picks n_groups first
            return run_auto_learners(self, net, X, y, config, budget, start)
        g = int(config.n_groups)
        n_workers = g if self.n_workers is None else int(self.n_workers)
        if g > n_workers:
            raise ValueError(f"n_groups={g} needs at least {g} workers; the timing model has {n_workers}")
        state = TrainState.from_net(net) if start is None else start
        with blas_threads(1):  # one process computes for all groups: one BLAS thread, never spinning
            sim = self._simulation(net, X, y, config, n_workers // g, state)
            rows = sim.advance(budget)
        new_state = sim.train_state()
        net.set_params(new_state.params)
        attrs = {
            "n_groups": g,
            "batch_size": config.batch_size,
            "n_workers": n_workers,
            "group_size": sim.k,
            "t_conv": sim.t_conv_mean,
            "t_fc": self.t_fc,
            "variability": self.variability,
            "cv": self.cv,
            "forward_fraction": self.forward_fraction,
            "diverged": sim.diverged,
            "strategy": self.strategy.name,
            "physical_map": self.strategy.physical_map,
            "split": getattr(sim, "split", None),
        }
        return RunResult(trace=make_trace(rows, "simulated", **attrs), state=new_state)

    def _simulation(self, net: Net, X, y, config: RunConfig, k: int, state: TrainState):
        """The event loop of this engine's strategy (Omnivore's, or one of `simulated.strategies`)."""
        if self.strategy == Strategy():
            return Simulation(self, net, X, y, config, k=k, state=state)
        if self.strategy.synchronous:
            return ReplicaSimulation(self, net, X, y, config, k=k, state=state)
        split = split_layer(net, self.strategy, config.batch_size)
        if self.strategy.physical_map == "unmerged":
            return UnmergedSimulation(self, net, X, y, config, k=k, state=state, split=split)
        return Simulation(self, net, X, y, config, k=k, state=state, split=split)
