"""SimulatedEngine: the Engine contract on a modeled clock, in one process.

docs/architecture.md "The simulator's clock".

The engine checks its timing model and strategy, picks the event loop of its strategy
(`events.Simulation` for Omnivore's compute groups, `strategies` for the others), runs it for the
budget and returns the Trace (time in simulated seconds) with the state it ended in. Nothing here
or below reaches the Dask engine or `distributed`: a simulated run needs no cluster.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from dasknn.backend import blas_threads
from dasknn.data.augment import Augment
from dasknn.data.batching import check_window
from dasknn.engine.autotune import run_auto_learners
from dasknn.engine.averaging import check_averaging
from dasknn.engine.control import RunControl
from dasknn.engine.simulated.events import Simulation
from dasknn.engine.simulated.strategies import ReplicaSimulation, UnmergedSimulation
from dasknn.engine.strategy import Strategy, split_layer
from dasknn.engine.trace import SIMULATED_SECONDS, Budget, RunConfig, RunResult, TrainState, make_trace
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

    `worker_schedule`: the cluster's size over simulated time, as (time, workers) pairs sorted by
    time, the first at 0 — e.g. ((0, 8), (10, 32)): 8 workers, then 32 from t = 10 s (an elastic
    cluster, docs/architecture.md "Elastic clusters"). At each change inside a run the groups are
    re-planned as the Dask engine re-plans them: n_groups kept while the workers allow (fewer groups
    when fewer workers remain), group size N // g, every group starting afresh from the servers'
    state (in-flight iterations are dropped, as at a hand-off). The Trace gets an `n_workers`
    column and `attrs["worker_events"]`. Without it, `n_workers` is fixed.

    `strategy` (`engine.strategy.Strategy`; default Omnivore's) selects the other papers' layouts
    (`simulated.strategies`): `split` moves the FC server's first layer (RALP's 'auto'),
    physical_map 'unmerged' runs FC on every group (`t_fc_worker` simulated seconds, default t_fc),
    and 'sma' / 'model_averaging' train n_groups synchronised replicas (each iteration also takes
    `t_sync` simulated seconds when the replicas synchronise). `aggregation` does not change the
    simulated maths (a sum is a sum); model its time through t_conv.

    `averaging` ("ema"; Omnivore's compute groups only): both servers keep an exponential moving
    average of their weights (`engine.averaging`); the returned state's `params` are the average
    (what a fit scores, returns and saves), and its `extra["averaging"]` the weights training goes
    on from and the average's counts.
    """

    time_unit = SIMULATED_SECONDS
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
        worker_schedule: Sequence[tuple[float, int]] | None = None,
        averaging: str | None = None,
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
        self.worker_schedule = None if worker_schedule is None else check_schedule(worker_schedule)
        if self.worker_schedule is not None and self.strategy != Strategy():
            raise ValueError(
                f"worker_schedule runs Omnivore's compute groups, not strategy {self.strategy.name!r}"
            )
        self.averaging = check_averaging(averaging, self.strategy)
        self.wall_deadline: float | None = None
        """A `time.perf_counter()` value after which every run ends at its next update, whatever
        its budget (the fitting loop's max_wall_time): simulated seconds may take far longer."""

    def past_wall_deadline(self) -> bool:
        """True once the real clock has passed `wall_deadline`."""
        return self.wall_deadline is not None and time.perf_counter() >= self.wall_deadline

    def workers_at(self, t: float) -> int | None:
        """The number of workers at simulated time `t` (the schedule's, else the fixed `n_workers`)."""
        if self.worker_schedule is None:
            return self.n_workers
        times = [when for when, _ in self.worker_schedule]
        return self.worker_schedule[bisect.bisect_right(times, t) - 1][1]

    def conv_worker_count(self) -> int | None:
        """The conv workers N a fit starts on: the schedule's first count, else `n_workers`."""
        return self.workers_at(0.0)

    def conv_time(self, k: int) -> float:
        """Mean conv-phase time of a group of k workers (simulated seconds)."""
        if self.t_conv is None:
            return float(self.timing.t_conv(k))
        return float(self.t_conv(k) if callable(self.t_conv) else self.t_conv)

    def run(
        self,
        net: Net,
        X,
        y,
        config: RunConfig,
        budget: Budget,
        start: TrainState | None = None,
        control: RunControl | None = None,
    ) -> RunResult:
        """Train `net` from `start` (or its weights) for `budget` simulated seconds or iterations.

        `control` (`engine.control.RunControl`) is polled after every update, on the simulated
        clock, and its commands apply before the next event (Omnivore's groups on the merged map,
        without a `worker_schedule`)."""
        self.strategy.check_knobs(config.lr, config.momentum)
        if control is not None and (self.strategy != Strategy() or self.worker_schedule is not None):
            raise ValueError(
                "a run control needs Omnivore's compute groups on the merged map and a fixed cluster; "
                f"this engine runs strategy {self.strategy.name!r}"
                + (" with a worker_schedule" if self.worker_schedule is not None else "")
            )
        if self.strategy.learners == "auto":  # Crossbow's auto-tuner picks n_groups first
            return run_auto_learners(self, net, X, y, config, budget, start)
        if self.worker_schedule is not None:
            return self._run_scheduled(net, X, y, config, budget, start)
        g = int(config.n_groups)
        n_workers = g if self.n_workers is None else int(self.n_workers)
        if g > n_workers:
            raise ValueError(f"n_groups={g} needs at least {g} workers; the timing model has {n_workers}")
        state = TrainState.from_net(net) if start is None else start
        with blas_threads(1):  # one process computes for all groups: one BLAS thread, never spinning
            sim = self._simulation(net, X, y, config, n_workers // g, state)
            sim.control = control
            rows = sim.advance(budget)
        new_state = sim.train_state()
        net.set_params(new_state.params)
        attrs = self._trace_attrs(sim, config.batch_size, n_workers)
        if control is not None:
            attrs["control"] = [a.as_dict() for a in sim.applied]
        return RunResult(trace=make_trace(rows, "simulated", **attrs), state=new_state)

    def _trace_attrs(self, sim, batch_size: int, n_workers: int, **more) -> dict:
        """What a run's trace records of the run: its groups, the timing model and the strategy."""
        return {
            "n_groups": sim.config.n_groups,
            "batch_size": batch_size,
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
            **more,
        }

    def _run_scheduled(
        self, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None
    ) -> RunResult:
        """A run on a cluster whose size follows `worker_schedule`: one stretch per size, each
        re-planned (groups kept while the workers allow, k = N // g) from the state the last one
        ended in."""
        state = TrainState.from_net(net) if start is None else start
        rows: list[dict] = []
        events: list[dict] = []
        spent, done, sim = 0.0, 0, None
        t = _clock(state)  # a change at the very start of this run counts in it
        n_before = self.workers_at(math.nextafter(t, -math.inf)) if t > 0 else None
        with blas_threads(1):
            while True:
                clock = _clock(state)
                n = self.workers_at(clock)
                g = min(int(config.n_groups), n)
                left = None if budget.seconds is None else budget.seconds - spent
                change = self._next_change(clock)
                seconds = left if change is None else min(x for x in (left, change - clock) if x is not None)
                iterations = None if budget.iterations is None else budget.iterations - done
                if n_before is not None and n != n_before:
                    events.append(
                        {
                            "time": clock,
                            "n_workers": n,
                            "n_workers_before": n_before,
                            "n_groups": g,
                            "group_size": n // g,
                            "iterations_done": state.iterations_done,
                        }
                    )
                sim, n_before = self._simulation(net, X, y, config.with_(n_groups=g), n // g, state), n
                piece = sim.advance(Budget(seconds=seconds, iterations=iterations))
                rows.extend(dict(r, n_workers=n) for r in piece)
                state = sim.train_state()
                spent, done = spent + (_clock(state) - clock), done + len(piece)
                over = (budget.iterations is not None and done >= budget.iterations) or sim.diverged
                over = over or self.past_wall_deadline()
                if over or change is None or (left is not None and spent >= budget.seconds):
                    break
        net.set_params(state.params)
        attrs = self._trace_attrs(
            sim, config.batch_size, self.workers_at(_clock(state)), worker_events=events
        )
        return RunResult(trace=make_trace(rows, "simulated", **attrs), state=state)

    def _next_change(self, t: float) -> float | None:
        """The first time after `t` at which the schedule changes the number of workers."""
        return next((when for when, _ in self.worker_schedule if when > t), None)

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


def _clock(state: TrainState) -> float:
    """The simulated clock a state was left at (0 for a fresh one)."""
    sim = state.extra.get("simulator")
    return 0.0 if sim is None else float(sim["clock"])


def check_schedule(schedule: Sequence[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """`worker_schedule` as ((time, workers), ...), or a ValueError naming what is wrong with it."""
    try:
        out = tuple((float(t), int(n)) for t, n in schedule)
    except (TypeError, ValueError):
        raise ValueError(f"worker_schedule must be (time, workers) pairs, got {schedule!r}") from None
    if not out or out[0][0] != 0:
        raise ValueError(f"worker_schedule must start at time 0, got {schedule!r}")
    times = [t for t, _ in out]
    if any(b <= a for a, b in zip(times, times[1:], strict=False)) or not all(
        math.isfinite(t) for t in times
    ):
        raise ValueError(f"worker_schedule's times must be finite and increasing, got {times}")
    if any(n < 1 for _, n in out):
        raise ValueError(f"worker_schedule needs at least 1 worker at every time, got {schedule!r}")
    return out
