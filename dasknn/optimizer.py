"""Omnivore's optimizer: a cold start, then epochs of a grid search over (g, µ, η) and training.

Omnivore Algorithm 1 (L1000-1075), appendix E (L3636-3811) and its cold start (§IV-C L940-946,
appendix E-D L3668-3700). Engine-agnostic: it talks to an engine only through
`run(net, X, y, config, budget, start) -> RunResult`, so it drives the SimulatedEngine and the
DaskEngine alike. Times and budgets are in the engine's clock ("simulated s" on the simulator).

1. Cold start (g = 1, µ = 0.9): probe η in `lr_grid` order from the same state, stopping at the
   first rate worse than the previous one (or diverging) → η*.
2. Initial g: the smallest g that saturates the FC server per the HE model (the `he_model`
   argument, or one built from the cold-start probe's time per iteration).
   Appendix E-D: g = 2, 4, … up to it get a (µ, η) grid too, and each g's winner runs the same
   time; the lowest loss picks the cold start's g ("a cold-start run with slight asynchrony may
   more quickly terminate the cold start phase"; optimizer_cold_start). Then train an epoch at
   that g so that the weights find their scale, and go on at the initial g.
3. Each epoch: probe µ ∈ momentum_grid × η ∈ {η*_last, η*_last/10} (no µ > µ*_last at η*_last)
   from the same checkpoint; without a clear winner (5% over the last 50 iterations) probe the tied
   ones longer; if µ* = 0 also try µ = 0.1, 0.2; if 0 still wins and g > 1, halve g and search
   again. Train with the winner for `epoch_factor` × the search time, continuing from the winning
   probe's end state, and repeat until a budget is spent or `should_stop` says so.

Probe length: `probe_iterations` (default max(20, 5·g): every group gets five turns, so staleness
reaches its steady value g − 1 within the probe) and/or `probe_seconds`. On a real cluster each
engine run pays a start-up cost (actors), so prefer fewer, longer probes there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from dasknn.engine.trace import RunConfig, TrainState
from dasknn.optimizer_cold_start import cold_start_groups, cold_start_lr
from dasknn.optimizer_search import (
    Judge,
    Probe,
    Prober,
    SearchLog,
    check,
    check_values,
    float_option,
    group_candidates,
    he_model_from_probe,
    initial_groups,
    int_option,
    momentum_lr_grid,
)
from dasknn.tradeoff.hardware import HEModel
from dasknn.tradeoff.statistical import final_loss

__all__ = ["OmnivoreOptimizer", "OptimizerResult"]

StopCallback = Callable[[TrainState, pd.DataFrame], bool]
EpochCallback = Callable[[TrainState, dict, pd.DataFrame, pd.DataFrame], None]


@dataclass
class OptimizerResult:
    """What `optimize` returns: the final state, the whole trace, every decision and the history.

    `trace`: every engine run, probes included, on one clock (search time counted) with columns
    `phase` ("cold_start" / "search" / "train"), `run` and `kept` (on the final model's path);
    `decisions`: `optimizer_search.DECISION_COLUMNS`; `history`: one dict per train epoch.
    """

    state: TrainState
    trace: pd.DataFrame
    decisions: pd.DataFrame
    chosen: RunConfig
    history: list[dict[str, Any]] = field(default_factory=list)
    he_model: HEModel | None = None


def _unit(value: float) -> bool:
    return 0 <= value < 1


class OmnivoreOptimizer:
    """Omnivore Algorithm 1 with its cold start, over any engine (see the module docstring).

    Every number is a parameter with the paper's value as its default: the grids (appendix E),
    `clear_winner` = 5% over `winner_window` = 50 iterations, `small_momenta` = (0.1, 0.2) tried
    when µ* = 0, `epoch_factor` = 10 (search ≤ 10% of the time); the cold start's training epoch is
    at most `cold_start_fraction` = 15% of the time budget (appendix E-D: the cold start is < 15% of
    the run). `max_extensions`: how many times tied probes are run longer; `stop_checks`: train
    runs per epoch when `should_stop` is given, each at most `stop_check_iterations` long (default
    no limit; DistributedCNN passes one pass over the data, as its fixed loop checks: the optimizer's
    training is then evaluated, and stops at the target, as often as a fixed run's).
    `n_workers`: the conv devices N (default: he_model's, the engine's `n_workers`, or the number of
    conv workers of its `placement_` after a run); `max_groups`: the largest g (default N, else 32).
    `probe_losses(trace, config)`: the per-iteration losses probes are judged by (default: the
    training loss column; e.g. a planted or validation loss); `probe_score(state)`: judge probes by
    the loss of their end weights instead (e.g. `optimizer_search.HeldOutLoss` on fixed samples;
    its time is charged to the clock). `cold_start_groups`: tune g during the cold start too
    (appendix E-D; False: the cold-start epoch runs at g = 1). `momentum_early_stop`: each rate's
    momenta are probed from the highest down, stopping at the first worse one (the cold start's rule
    for η, applied to µ; about half the probes when the loss is unimodal in µ); False: every point
    of the grid, as appendix E lists it. `n_groups`, `learning_rate`,
    `momentum` pin a knob the user fixed; the others are still tuned. Unknown options raise ValueError.
    """

    def __init__(
        self,
        engine,
        *,
        n_workers: int | None = None,
        lr_grid: Sequence[float] = (0.1, 0.01, 0.001, 1e-4, 1e-5),
        momentum_grid: Sequence[float] = (0.0, 0.3, 0.6, 0.9),
        cold_start_momentum: float = 0.9,
        small_momenta: Sequence[float] = (0.1, 0.2),
        probe_iterations: int | None = None,
        probe_seconds: float | None = None,
        clear_winner: float = 0.05,
        winner_window: int = 50,
        max_extensions: int = 1,
        epoch_factor: float = 10,
        cold_start_fraction: float = 0.15,
        stop_checks: int = 4,
        stop_check_iterations: int | None = None,
        max_groups: int | None = None,
        he_model: HEModel | None = None,
        probe_losses: Judge | None = None,
        probe_score: Callable[[TrainState], float] | None = None,
        cold_start_groups: bool = True,
        momentum_early_stop: bool = True,
        n_groups: int | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
        verbose: int = 0,
        **unknown: Any,
    ) -> None:
        check(not unknown, f"unknown option(s) {sorted(unknown)} for OmnivoreOptimizer")
        check(callable(getattr(engine, "run", None)), f"engine must have a run(...) method; got {engine!r}")
        self.engine = engine
        self.n_workers = int_option(n_workers, "n_workers")
        self.lr_grid = check_values(lr_grid, "lr_grid", lambda v: v > 0, "> 0")
        self.momentum_grid = check_values(momentum_grid, "momentum_grid", _unit, "in [0, 1)")
        self.cold_start_momentum = check_values(
            [cold_start_momentum], "cold_start_momentum", _unit, "in [0, 1)"
        )[0]
        self.small_momenta = (
            check_values(small_momenta, "small_momenta", _unit, "in [0, 1)") if small_momenta else ()
        )
        self.probe_iterations = int_option(probe_iterations, "probe_iterations")
        self.probe_seconds = float_option(probe_seconds, "probe_seconds")
        self.clear_winner = check_values([clear_winner], "clear_winner", _unit, "in [0, 1)")[0]
        self.winner_window = int_option(winner_window, "winner_window")
        self.max_extensions = int_option(max_extensions, "max_extensions", minimum=0)
        self.epoch_factor = float_option(epoch_factor, "epoch_factor")
        self.cold_start_fraction = check_values(
            [cold_start_fraction], "cold_start_fraction", lambda v: 0 < v <= 1, "in (0, 1]"
        )[0]
        self.stop_checks = int_option(stop_checks, "stop_checks")
        self.stop_check_iterations = int_option(stop_check_iterations, "stop_check_iterations")
        self.max_groups = int_option(max_groups, "max_groups")
        check(
            he_model is None or isinstance(he_model, HEModel),
            f"he_model must be an HEModel; got {he_model!r}",
        )
        if he_model is not None and self.n_workers is not None:
            check(
                he_model.n_workers == self.n_workers,
                f"n_workers={self.n_workers} disagrees with he_model.n_workers={he_model.n_workers}",
            )
        self.he_model = he_model
        check(
            probe_losses is None or callable(probe_losses),
            f"probe_losses must be callable; got {probe_losses!r}",
        )
        self.probe_losses = probe_losses
        check(
            probe_score is None or callable(probe_score),
            f"probe_score must be callable (a TrainState -> loss); got {probe_score!r}",
        )
        self.probe_score = probe_score
        check(
            isinstance(cold_start_groups, bool),
            f"cold_start_groups must be True or False; got {cold_start_groups!r}",
        )
        self.cold_start_groups = cold_start_groups
        check(
            isinstance(momentum_early_stop, bool),
            f"momentum_early_stop must be True or False; got {momentum_early_stop!r}",
        )
        self.momentum_early_stop = momentum_early_stop
        self.verbose = int_option(verbose, "verbose", minimum=0)
        # pinned knobs: the user fixed them, the optimizer tunes only the others
        self.n_groups = int_option(n_groups, "n_groups")
        self.learning_rate = None
        if learning_rate is not None:
            self.learning_rate = check_values([learning_rate], "learning_rate", lambda v: v > 0, "> 0")[0]
            self.lr_grid = (self.learning_rate,)
        if momentum is not None:
            self.cold_start_momentum = check_values([momentum], "momentum", _unit, "in [0, 1)")[0]
            self.momentum_grid, self.small_momenta = (self.cold_start_momentum,), ()

    def probe_length(self, n_groups: int) -> tuple[int | None, float | None]:
        """(iterations, seconds) of one probe at g groups: the arguments, else max(20, 5·g) iterations."""
        if self.probe_iterations is None and self.probe_seconds is None:
            return max(20, 5 * int(n_groups)), None
        return self.probe_iterations, self.probe_seconds

    def optimize(
        self,
        net,
        X,
        y,
        *,
        batch_size: int,
        weight_decay: float = 0.0,
        seed: int = 0,
        time_budget: float | None = None,
        max_epochs: int | None = None,
        max_iterations: int | None = None,
        should_stop: StopCallback | None = None,
        start: TrainState | None = None,
        on_epoch: EpochCallback | None = None,
        resume: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> OptimizerResult:
        """Train `net` on (X, y) by Omnivore Algorithm 1 until a budget is spent; sets its final weights.

        `time_budget` in the engine's clock, probes included; `max_iterations` counts every update
        run, probes included; `max_epochs` counts train epochs, the synchronous cold-start epoch
        included; `should_stop(state, trace_so_far)` is checked after each train run.
        `on_epoch(state, session, trace, decisions)` is called after each train epoch (a checkpoint
        hook, issue #8): `session` is the JSON-able rest of the optimizer's state (phase, the
        config it goes on with, clock, budgets spent, history, g candidates, HE model). `resume`:
        such a `session`, with `start` its state and `resume["trace"]`, `resume["decisions"]` the
        records so far: the optimizer goes on from that epoch's end as the original run would.
        """
        check(not unknown, f"unknown option(s) {sorted(unknown)} for optimize")
        limits = {
            "time_budget": float_option(time_budget, "time_budget"),
            "max_epochs": int_option(max_epochs, "max_epochs"),
            "max_iterations": int_option(max_iterations, "max_iterations"),
        }
        check(
            any(v is not None for v in limits.values()),
            "give time_budget, max_epochs or max_iterations: should_stop alone may never stop",
        )
        check(
            should_stop is None or callable(should_stop), f"should_stop must be callable; got {should_stop!r}"
        )
        check(start is None or isinstance(start, TrainState), f"start must be a TrainState; got {start!r}")
        check(on_epoch is None or callable(on_epoch), f"on_epoch must be callable; got {on_epoch!r}")
        base = RunConfig(1, self.lr_grid[0], self.cold_start_momentum, weight_decay, batch_size, seed)
        session = _Session(self, net, X, y, base, should_stop, limits)
        session.on_epoch = on_epoch
        state = start.copy() if start is not None else TrainState.from_net(net)
        if resume is not None:
            return session.resume(state, resume)
        return session.run(state)


class _Session:
    """One `optimize` call: the data, the log and clock, and the steps of Algorithm 1."""

    def __init__(self, opt: OmnivoreOptimizer, net, X, y, base: RunConfig, should_stop, limits: dict) -> None:
        self.opt, self.net, self.base = opt, net, base
        self.log = SearchLog(
            opt.engine, net, X, y, limits["time_budget"], limits["max_iterations"], opt.verbose
        )
        self.prober = Prober(
            self.log, opt.probe_length, opt.clear_winner, opt.winner_window, opt.max_extensions
        )
        self.prober.judge = opt.probe_losses
        self.prober.scorer = opt.probe_score
        self.max_epochs, self.should_stop = limits["max_epochs"], should_stop
        self.n_workers = opt.n_workers or (opt.he_model.n_workers if opt.he_model else None)
        self.n_workers = self.n_workers or getattr(opt.engine, "n_workers", None)
        self.candidates: list[int] = []
        self.history: list[dict[str, Any]] = []
        self.stopped = ""
        self.he_model: HEModel | None = None
        self.on_epoch: EpochCallback | None = None

    # -- the algorithm ---------------------------------------------------------------------------
    def run(self, state: TrainState) -> OptimizerResult:
        """Cold start, then epochs of search and training (Algorithm 1) until a limit is reached."""
        opt, log = self.opt, self.log
        config = self.base
        best, g = self.cold_start(state)
        if best is None:
            return self.finish(state, config)
        search_seconds = log.elapsed
        state, config = best.state, best.config
        if not self.finished():
            seconds = opt.epoch_factor * search_seconds
            if log.time_budget is not None:  # the paper's cold start is < 15% of the run (appendix E-D)
                seconds = min(seconds, opt.cold_start_fraction * log.time_budget)
            state, config = self.train(config, state, seconds, "cold_start")
        config = config.with_(n_groups=g)
        self.epoch_done(state, config, search_seconds, "cold_start")
        return self.epochs(state, config, search_seconds)

    def epochs(self, state: TrainState, config: RunConfig, search_seconds: float) -> OptimizerResult:
        """Algorithm 1's loop after the cold start: a grid search, then an epoch of training."""
        opt, log = self.opt, self.log
        while not self.finished():
            if log.time_left() < (1 + opt.epoch_factor) * search_seconds:
                why = "too little time left for a search and its epoch: train with the last config"
                log.record("train", "no_search", config, why)
                state, config = self.train(config, state, log.time_left(), "train")
                self.epoch_done(state, config, search_seconds, "train")
                continue
            t0 = log.elapsed
            found = self.search(config, state)
            if found is None:
                break
            config, state = found
            search_seconds = log.elapsed - t0
            state, config = self.train(config, state, opt.epoch_factor * search_seconds, "train")
            self.epoch_done(state, config, search_seconds, "train")
        return self.finish(state, config)

    def finish(self, state: TrainState, config: RunConfig) -> OptimizerResult:
        self.log.record("train", "stop", config, self.stopped or self.stop_reason())
        self.net.set_params(state.params)
        return OptimizerResult(
            state, self.log.trace(), self.log.decisions(), config, self.history, self.he_model
        )

    # -- checkpoints (issue #8) ------------------------------------------------------------------
    def epoch_done(self, state: TrainState, config: RunConfig, search_seconds: float, phase: str) -> None:
        """Hand the state after a train epoch and the session's own state to `on_epoch`."""
        if self.on_epoch is None:
            return
        log = self.log
        session = {
            "kind": "auto",
            "phase": phase,
            "config": asdict(config),
            "search_seconds": search_seconds,
            "elapsed": log.elapsed,
            "iterations": log.iterations,
            "charged": list(log.charged),
            "kept": sorted(log.kept),
            "history": list(self.history),
            "candidates": list(self.candidates),
            "n_workers": self.n_workers,
            "he_model": None if self.he_model is None else asdict(self.he_model),
            "stopped": self.stopped,
        }
        self.on_epoch(state, session, log.trace(), log.decisions())

    def resume(self, state: TrainState, session: dict[str, Any]) -> OptimizerResult:
        """Go on from an `on_epoch` session (its trace and decisions in session["trace"/"decisions"])."""
        log = self.log
        log.elapsed, log.iterations = float(session["elapsed"]), int(session["iterations"])
        log.charged, log.kept = [float(c) for c in session["charged"]], {int(r) for r in session["kept"]}
        trace = session["trace"]
        runs = trace["run"].to_numpy() if "run" in trace else []
        log.segments = [
            trace[runs == i].drop(columns=["kept"], errors="ignore") for i in range(len(log.charged))
        ]
        log.attrs.update(trace.attrs)
        log.rows = session["decisions"].to_dict("records")
        self.history = list(session["history"])
        self.candidates = [int(g) for g in session["candidates"]]
        self.n_workers = session["n_workers"]
        self.he_model = None if session["he_model"] is None else HEModel(**session["he_model"])
        self.stopped = session["stopped"]
        config = RunConfig(**session["config"])
        return self.epochs(state, config, float(session["search_seconds"]))

    def cold_start(self, state: TrainState) -> tuple[Probe | None, int]:
        """Appendix E-D: η* at g = 1, the initial g from the HE model, then (with
        `cold_start_groups`) g = 2, 4, … up to it tuned and compared at equal time
        (optimizer_cold_start). Returns (the winning probe, or None if the budget ran out; the
        initial g of Algorithm 1's loop)."""
        best = cold_start_lr(self, state)
        if best is None:
            return None, 1
        g = self.initial_groups(best)
        why = "cold_start_groups=False: the cold start runs at g = 1"
        if self.opt.n_groups is not None:
            why = f"n_groups = {self.opt.n_groups} given by the user: the cold start runs at g = 1"
        elif self.opt.cold_start_groups and not self.finished():
            best, why = cold_start_groups(self, state, best, g)
        self.log.mark_winner(best)
        self.log.record("cold_start", "choose_groups", best.config, why, score=best.score, chosen=True)
        return best, g

    def initial_groups(self, best: Probe) -> int:
        """The smallest g saturating the FC server per the HE model (Omnivore §V-B, L1036-1040)."""
        opt = self.opt
        placement = getattr(opt.engine, "placement_", None)
        if self.n_workers is None and placement is not None:
            self.n_workers = len(placement.conv_workers)
        engine_model = getattr(opt.engine, "timing", None)
        if opt.he_model is not None:
            self.he_model, source = opt.he_model, "HE model from the he_model argument"
        elif isinstance(engine_model, HEModel) and engine_model.n_workers == (
            self.n_workers or engine_model.n_workers
        ):
            self.he_model, source = engine_model, "HE model of the engine's timing (the simulated cluster)"
        else:
            self.he_model, source = he_model_from_probe(
                best.trace, self.net, self.base.batch_size, self.n_workers
            )
        self.candidates = group_candidates(self.n_workers, opt.max_groups or self.n_workers or 32)
        g, why = initial_groups(self.he_model, self.candidates, fixed_workers=self.n_workers is not None)
        if opt.n_groups is not None:
            g, why = opt.n_groups, f"n_groups = {opt.n_groups} given by the user (HE model: {why})"
        self.log.record("cold_start", "initial_groups", best.config.with_(n_groups=g), f"{source}; {why}")
        return g

    def search(self, config: RunConfig, checkpoint: TrainState) -> tuple[RunConfig, TrainState] | None:
        """gridSearch(M, H | W, g) and the halving of g while µ* = 0 (Algorithm 1, appendix E)."""
        opt, log = self.opt, self.log
        g = config.n_groups
        while True:
            grid = momentum_lr_grid(config.lr, config.momentum, opt.momentum_grid)
            if opt.learning_rate is not None:
                grid = [(m, lr) for m, lr in grid if lr == opt.learning_rate]
            probes = self.prober.grid(
                config.with_(n_groups=g), grid, checkpoint, "search", early_stop=opt.momentum_early_stop
            )
            if not probes:
                return None
            finite = [p for p in probes if not p.diverged]
            winner, repeats, why = self.prober.pick(finite) if finite else (probes[0], 1, "")
            if winner.diverged:
                smaller = self.smaller_g(g)
                if smaller is None:
                    raise FloatingPointError(f"every probe diverged at n_groups={g}")
                log.record("search", "halve_groups", config.with_(n_groups=smaller), "every probe diverged")
                g = smaller
                continue
            if winner.config.momentum == 0 and opt.small_momenta:
                why_small = "µ* = 0: also try a small momentum"
                tried = [
                    self.prober.probe(
                        winner.config.with_(momentum=m), checkpoint, "search", why_small, repeats
                    )
                    for m in opt.small_momenta
                ]
                winner = min([winner, *(p for p in tried if p is not None)], key=lambda p: p.score)
                why += f"; µ* = 0, tried {', '.join(f'{m:g}' for m in opt.small_momenta)}"
            smaller = self.smaller_g(g)
            if winner.config.momentum == 0 and smaller is not None:
                log.record(
                    "search",
                    "halve_groups",
                    winner.config.with_(n_groups=smaller),
                    f"{why}; µ* = 0 still wins at g={g}: implicit momentum too high, halve g",
                    score=winner.score,
                )
                g = smaller
                continue
            log.mark_winner(winner)
            log.record("search", "choose", winner.config, why, score=winner.score, chosen=True)
            return winner.config, winner.state

    def train(
        self, config: RunConfig, state: TrainState, seconds: float, phase: str
    ) -> tuple[TrainState, RunConfig]:
        """Train an epoch of `seconds` (with should_stop: in runs of at most seconds / `stop_checks`
        and `stop_check_iterations`, checked after each); on divergence go back to the last good
        state and divide lr by 10 for the next search."""
        log = self.log
        checking = self.should_stop is not None
        chunk = seconds / (self.opt.stop_checks if checking else 1)
        per_check = self.opt.stop_check_iterations if checking else None
        trained: list[pd.DataFrame] = []
        end_time = log.elapsed + seconds
        # runs of at most `chunk` seconds and `per_check` iterations until the epoch's time is spent
        # (a run's charge may overrun its budget a little: a remainder under 5% of a chunk is dropped)
        while end_time - log.elapsed > 0.05 * chunk:
            budget = log.budget(seconds=min(chunk, end_time - log.elapsed), iterations=per_check)
            if budget is None:
                break
            seg, end, diverged, _, run = log.run(config, budget, state, phase)
            if diverged:
                config = config.with_(lr=config.lr / 10)
                log.record(phase, "diverged", config, "diverged: back to the last good state, lr / 10")
                break
            log.kept.add(run)
            trained.append(seg)
            state = end
            if checking and self.should_stop(state, log.trace()):
                self.stopped = "should_stop returned True"
                break
            if not len(seg):  # a run that did no iteration: its time is spent, nothing to go on with
                break
        done = pd.concat(trained) if trained else pd.DataFrame({"loss": [], "accuracy": []})
        self.history.append(
            {
                "epoch": len(self.history) + 1,
                "phase": phase,
                "time": log.elapsed,
                "iterations": log.iterations,
                "model_iterations": state.iterations_done,
                "loss": final_loss(done),
                "accuracy": float(done["accuracy"].tail(10).mean()) if len(done) else math.nan,
                "n_groups": config.n_groups,
                "lr": config.lr,
                "momentum": config.momentum,
            }
        )
        log.record(
            phase,
            "train",
            config,
            f"epoch {len(self.history)}: {len(done)} iterations",
            score=final_loss(done),
            iterations=len(done),
        )
        return state, config

    # -- helpers ---------------------------------------------------------------------------------
    def smaller_g(self, g: int) -> int | None:
        """The largest candidate g ≤ g / 2 (Algorithm 1: g ← g/2), None at g = 1 or when g is pinned."""
        if self.opt.n_groups is not None:
            return None
        below = [c for c in self.candidates if c <= g / 2]
        return max(below) if below else None

    def finished(self) -> bool:
        return (
            bool(self.stopped)
            or self.log.exhausted()
            or (self.max_epochs is not None and len(self.history) >= self.max_epochs)
        )

    def stop_reason(self) -> str:
        if self.max_epochs is not None and len(self.history) >= self.max_epochs:
            return f"max_epochs={self.max_epochs} reached"
        if self.log.max_iterations is not None and self.log.iterations >= self.log.max_iterations:
            return f"max_iterations={self.log.max_iterations} reached"
        return "time budget spent"
