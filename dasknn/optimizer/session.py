"""One fit of Omnivore's Algorithm 1 (§IV-C, appendix E): the cold start, then epochs of search and training.

`_Session` holds one fit's steps as a generator: it yields the runs it asks the loop for
(`dasknn.policy.NextRun`) and is sent what they measured; the cold start (`cold_start.py`) and the
epochs both use it. `OptimizerResult` is what `GridPolicy.optimize` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from dasknn.engine.trace import RunConfig, TrainState
from dasknn.optimizer.cold_start import cold_start_groups, cold_start_lr
from dasknn.optimizer.search import (
    Probe,
    Prober,
    Runs,
    group_candidates,
    he_model_from_probe,
    initial_groups,
    mark_winner,
    momentum_lr_grid,
)
from dasknn.policy import Stop
from dasknn.tradeoff.hardware import HEModel
from dasknn.tradeoff.statistical import final_loss

if TYPE_CHECKING:  # pragma: no cover
    from dasknn.optimizer.grid import GridPolicy

__all__ = ["OptimizerResult", "StopCallback"]

StopCallback = Callable[[TrainState, pd.DataFrame], bool]


@dataclass
class OptimizerResult:
    """What `optimize` returns: the final state, the whole trace, every decision and the history.

    `trace`: every engine run, probes included, on one clock (search time counted) with columns
    `phase` ("cold_start" / "search" / "train"), `run` and `kept` (on the final model's path);
    `decisions`: `optimizer.search.DECISION_COLUMNS`; `history`: one dict per train epoch.
    """

    state: TrainState
    trace: pd.DataFrame
    decisions: pd.DataFrame
    chosen: RunConfig
    history: list[dict[str, Any]] = field(default_factory=list)
    he_model: HEModel | None = None


class _Session:
    """One fit of Algorithm 1: the log and clock it reads, and its steps (generators of runs)."""

    def __init__(self, opt: GridPolicy, fit, base: RunConfig, max_epochs: int | None) -> None:
        self.opt, self.fit, self.base = opt, fit, base
        self.log = fit.log
        self.prober = Prober(
            self.log, opt.probe_length, opt.clear_winner, opt.winner_window, opt.max_extensions
        )
        self.prober.judge = opt.probe_losses
        self.prober.scored = fit.has_selection
        self.max_epochs = max_epochs
        self.n_workers = opt.n_workers or (opt.he_model.n_workers if opt.he_model else None)
        self.n_workers = self.n_workers or getattr(fit.engine, "n_workers", None)
        self.candidates: list[int] = []
        self.history: list[dict[str, Any]] = []
        self.stopped = ""
        self.he_model: HEModel | None = None
        self.checkpoints = False
        self.session: dict[str, Any] | None = None  # the last epoch's, for checkpoints
        self.pending = False  # a session not yet handed to the loop

    # -- the algorithm ---------------------------------------------------------------------------
    def run(self, state: TrainState) -> Runs:
        """Cold start, then epochs of search and training (Algorithm 1) until a limit is reached."""
        opt, log = self.opt, self.log
        config = self.base
        best, g = yield from self.cold_start(state)
        if best is None:
            return self.finish(state, config)
        search_seconds = log.elapsed
        state, config = best.state, best.config
        if not self.finished():
            seconds = opt.epoch_factor * search_seconds
            if log.time_budget is not None:  # the paper's cold start is < 15% of the run (appendix E-D)
                seconds = min(seconds, opt.cold_start_fraction * log.time_budget)
            state, config = yield from self.train(config, state, seconds, "cold_start")
        config = config.with_(n_groups=g)
        self.epoch_done(state, config, search_seconds, "cold_start")
        return (yield from self.epochs(state, config, search_seconds))

    def epochs(self, state: TrainState, config: RunConfig, search_seconds: float) -> Runs:
        """Algorithm 1's loop after the cold start: a grid search, then an epoch of training."""
        opt, log = self.opt, self.log
        while not self.finished():
            if log.time_left() < (1 + opt.epoch_factor) * search_seconds:
                why = "too little time left for a search and its epoch: train with the last config"
                log.record("train", "no_search", config, why)
                state, config = yield from self.train(config, state, log.time_left(), "train")
                self.epoch_done(state, config, search_seconds, "train")
                continue
            t0 = log.elapsed
            found = yield from self.search(config, state)
            if found is None:
                break
            config, state = found
            search_seconds = log.elapsed - t0
            state, config = yield from self.train(config, state, opt.epoch_factor * search_seconds, "train")
            self.epoch_done(state, config, search_seconds, "train")
        return self.finish(state, config)

    def finish(self, state: TrainState, config: RunConfig) -> Stop:
        """Stop with the knobs the model last trained with (the last chosen decision): after the cold
        start Algorithm 1 would go on at the initial g, but no run has used it yet."""
        config = self.log.chosen_config(config)
        reason = self.stopped or self.stop_reason()
        self.log.record("train", "stop", config, reason)
        return Stop(reason, config, state=self.prober.snapshots.name(state))

    # -- checkpoints ------------------------------------------------------------------------------
    def epoch_done(self, state: TrainState, config: RunConfig, search_seconds: float, phase: str) -> None:
        """The session's own state after a train epoch, for the checkpoint before the next run."""
        if not self.checkpoints:
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
        self.session, self.pending = session, True

    def resume(self, state: TrainState, session: dict[str, Any]) -> Runs:
        """Go on from an `epoch_done` session (the loop restored the clock and records)."""
        self.history = list(session["history"])
        self.candidates = [int(g) for g in session["candidates"]]
        self.n_workers = session["n_workers"]
        self.he_model = None if session["he_model"] is None else HEModel(**session["he_model"])
        self.stopped = session["stopped"]
        config = RunConfig(**session["config"])
        return (yield from self.epochs(state, config, float(session["search_seconds"])))

    def cold_start(self, state: TrainState) -> Runs:
        """Appendix E-D: η* at g = 1, the initial g from the HE model, then (with
        `cold_start_groups`) g = 2, 4, … up to it tuned and compared at equal time
        (optimizer.cold_start). Returns (the winning probe, or None if the budget ran out; the
        initial g of Algorithm 1's loop)."""
        best = yield from cold_start_lr(self, state)
        if best is None:
            return None, 1
        g = self.initial_groups(best)
        why = "cold_start_groups=False: the cold start runs at g = 1"
        if self.opt.n_groups is not None:
            why = f"n_groups = {self.opt.n_groups} given by the user: the cold start runs at g = 1"
        elif self.opt.cold_start_groups and not self.finished():
            best, why = yield from cold_start_groups(self, state, best, g)
        mark_winner(self.log, best)
        self.log.record("cold_start", "choose_groups", best.config, why, score=best.score, chosen=True)
        return best, g

    def initial_groups(self, best: Probe) -> int:
        """The smallest g saturating the FC server per the HE model (Omnivore §V-B)."""
        opt = self.opt
        placement = getattr(self.fit.engine, "placement_", None)
        if self.n_workers is None and placement is not None:
            self.n_workers = len(placement.conv_workers)
        engine_model = getattr(self.fit.engine, "timing", None)
        if opt.he_model is not None:
            self.he_model, source = opt.he_model, "HE model from the he_model argument"
        elif isinstance(engine_model, HEModel) and engine_model.n_workers == (
            self.n_workers or engine_model.n_workers
        ):
            self.he_model, source = engine_model, "HE model of the engine's timing (the simulated cluster)"
        else:
            self.he_model, source = he_model_from_probe(
                best.trace, self.fit.net, self.base.batch_size, self.n_workers
            )
        self.candidates = group_candidates(self.n_workers, opt.max_groups or self.n_workers or 32)
        g, why = initial_groups(self.he_model, self.candidates, fixed_workers=self.n_workers is not None)
        if opt.n_groups is not None:
            g, why = opt.n_groups, f"n_groups = {opt.n_groups} given by the user (HE model: {why})"
        self.log.record("cold_start", "initial_groups", best.config.with_(n_groups=g), f"{source}; {why}")
        return g

    def search(self, config: RunConfig, checkpoint: TrainState) -> Runs:
        """gridSearch(M, H | W, g) and the halving of g while µ* = 0 (Algorithm 1, appendix E)."""
        opt, log = self.opt, self.log
        g = config.n_groups
        while True:
            grid = momentum_lr_grid(config.lr, config.momentum, opt.momentum_grid)
            if opt.learning_rate is not None:
                grid = [(m, lr) for m, lr in grid if lr == opt.learning_rate]
            probes = yield from self.prober.grid(
                config.with_(n_groups=g), grid, checkpoint, "search", early_stop=opt.momentum_early_stop
            )
            if not probes:
                return None
            finite = [p for p in probes if not p.diverged]
            winner, repeats, why = (yield from self.prober.pick(finite)) if finite else (probes[0], 1, "")
            if winner.diverged:
                smaller = self.smaller_g(g)
                if smaller is None:
                    raise FloatingPointError(f"every probe diverged at n_groups={g}")
                log.record("search", "halve_groups", config.with_(n_groups=smaller), "every probe diverged")
                g = smaller
                continue
            if winner.config.momentum == 0 and opt.small_momenta:
                why_small = "µ* = 0: also try a small momentum"
                tried = []
                for m in opt.small_momenta:
                    p = yield from self.prober.probe(
                        winner.config.with_(momentum=m), checkpoint, "search", why_small, repeats
                    )
                    tried.append(p)
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
            mark_winner(log, winner)
            log.record("search", "choose", winner.config, why, score=winner.score, chosen=True)
            return winner.config, winner.state

    def train(self, config: RunConfig, state: TrainState, seconds: float, phase: str) -> Runs:
        """Train an epoch of `seconds` (when the fit is evaluated: in runs of at most seconds /
        `stop_checks` and `stop_check_iterations`, evaluated after each); on divergence (the loop
        rolled it back) divide lr by 10 for the next search. Returns (state, config)."""
        log = self.log
        checking = self.fit.evaluates
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
            before = log.elapsed
            out = yield from self.prober.run(config, budget, state, phase, keep=True)
            if out.diverged:
                config = config.with_(lr=config.lr / 10)
                why = "diverged: back to the last good state, lr / 10"
                log.record(phase, "diverged", config, why, diverged=True, chosen=True)
                break
            seg = out.trace
            trained.append(seg)
            state = out.state
            if out.stop:
                self.stopped = "should_stop returned True"
                break
            if not len(seg) or log.elapsed <= before:  # no iteration, or a clock that cannot advance
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
            chosen=True,
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
