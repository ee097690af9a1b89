"""Fixed knobs: the trivial policy of the training loop.

Where the loop evaluates runs while they train (`Fit.evaluates_in_run`: the Dask engine, held-out
data; `in_run=True`, the default), it trains with the given (g, η, µ) in one run for the whole time
budget (or `WATCHED_SECONDS` at a time; to each epoch's end when the fit writes checkpoints), its
evaluations bounded to `eval_share` (`policy.EVAL_SHARE` by default) of the fit's clock and taken
beside the groups (`dasknn.in_run`). Otherwise it trains in runs of at most one epoch of iterations
and at most `run_seconds` (time_budget / 20, at least 2 s; 3 s without a time budget), until the
time budget, the iteration budget or an evaluation stops it; the loop evaluates every kept run,
unless `eval_share` bounds the evaluations' share of the fit's clock; runs are lengthened when the
last run's measured boundary would pass `boundary_share` of one (`run_length`). Both are off by
default there: a fit then finds its target at the first run that reaches it. After a run
that diverged (rolled back by the loop) it divides η by 10 and records why, in the decisions and
the history. A checkpoint goes with the first run after each completed epoch, and with the end.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

from dasknn.engine.trace import Budget, RunConfig
from dasknn.optimizer.measure import seconds_per_iteration
from dasknn.policy import EVAL_SHARE, NextRun, Outcome, Stop

__all__ = ["BOUNDARY_SHARE", "WATCHED_SECONDS", "FixedKnobs", "boundary_seconds", "run_length"]

BOUNDARY_SHARE = 0.05
"""The share of a run's time its boundary (start-up, warm-up, tear-down) may take, for fixed knobs
that size their runs by it (`FixedKnobs(boundary_share=)`, `run_length`)."""


WATCHED_SECONDS = 60.0
"""The longest run of fixed knobs evaluated while it trains, when the fit has no time budget."""


def boundary_seconds(trace, seconds: float) -> float:
    """A run's boundary cost: its charge on the fit's clock less its iterations at the run's own
    steady time per iteration (`measure.seconds_per_iteration`); 0 when it ran too little to say."""
    per_iteration = seconds_per_iteration(trace)
    if not math.isfinite(per_iteration):
        return 0.0
    return max(0.0, seconds - len(trace) * per_iteration)


def run_length(least: float, boundary: float, elapsed: float, share: float = BOUNDARY_SHARE) -> float:
    """A run's seconds: long enough that a boundary of `boundary` seconds is `share` of it, at
    least `least`, and at most the fit's clock so far (`elapsed`), so that runs lengthen as the fit
    goes on and the first evaluations come as early as before."""
    return max(least, min(boundary / share, elapsed))


logger = logging.getLogger(__name__)


class FixedKnobs:
    """Train with `config` (η lowered only by rollbacks) for `time_budget` seconds of the fit's
    clock and/or `max_iterations` iterations of the model (the rolled-back ones not counted)."""

    def __init__(
        self,
        config: RunConfig,
        time_budget: float | None,
        max_iterations: int | None,
        eval_share: float | None = None,
        boundary_share: float | None = None,
        in_run: bool = True,
    ):
        self.config, self.time_budget, self.max_iterations = config, time_budget, max_iterations
        self.run_seconds = max(2.0, (time_budget or 60.0) / 20)
        self.eval_share, self.boundary_share, self.in_run = eval_share, boundary_share, in_run

    @property
    def start_fields(self) -> dict[str, Any]:
        """The fields of the history's start row (the rate the fit starts with)."""
        return {"lr": self.config.lr}

    def begin(self, fit, resume: dict[str, Any] | None) -> None:
        self.fit = fit
        self.watched = self.in_run and fit.evaluates_in_run
        if self.watched and self.eval_share is None:
            self.eval_share = EVAL_SHARE
        state = fit.snapshot("current")
        if resume is None:
            self.loop: dict[str, Any] = {
                "kind": "fixed",
                "elapsed": fit.log.elapsed,
                "first_iteration": state.iterations_done,
                "rollbacks_in_row": 0,
                "checkpoint_epoch": math.floor(state.batches_done / fit.n_batches),
                "finished": fit.stop_at_start,
                "time_start": fit.log.elapsed,
            }
        else:
            self.loop = dict(resume)
            self.config = RunConfig(**resume["config"])
            if self.loop.pop("budget_changed", False):
                self.rebudget()
        if "time_end" not in self.loop:
            self.loop["time_end"] = (
                None if self.time_budget is None else self.loop["elapsed"] + self.time_budget
            )

    def rebudget(self) -> None:
        """A resumed fit's new budget (time_budget, max_epochs, target_accuracy): the time limit counted
        from the start of the checkpointed fit, and finished only when this budget is spent or the
        last evaluation reached this target."""
        loop, fit = self.loop, self.fit
        start = loop.get("time_start", 0.0)
        loop["time_end"] = None if self.time_budget is None else start + self.time_budget
        spent = fit.snapshot("current").iterations_done - loop["first_iteration"]
        loop["finished"] = bool(
            (loop["time_end"] is not None and loop["elapsed"] >= loop["time_end"])
            or (self.max_iterations is not None and spent >= self.max_iterations)
            or fit.target_reached()
        )

    def session(self, final: bool) -> dict[str, Any]:
        return {**self.loop, "final_saved": final, "config": asdict(self.config)}

    def next_run(self, last: Outcome | None) -> NextRun | Stop:
        loop, fit = self.loop, self.fit
        checkpoint = None
        if last is not None:
            loop["elapsed"] = fit.log.elapsed
            loop["rollbacks_in_row"] = fit.rollbacks_in_row
            if last.diverged:
                self.rolled_back(last)
            else:
                loop["finished"] = loop["finished"] or last.stop
                loop["boundary"] = boundary_seconds(last.trace, last.seconds)
            state = fit.snapshot("current")
            epoch = math.floor(state.batches_done / fit.n_batches)
            spent = state.iterations_done - loop["first_iteration"]
            time_end = loop["time_end"]
            loop["finished"] = (
                loop["finished"]
                or (time_end is not None and loop["elapsed"] >= time_end)
                or (self.max_iterations is not None and spent >= self.max_iterations)
            )
            if not loop["finished"] and not last.diverged and epoch > loop["checkpoint_epoch"]:
                loop["checkpoint_epoch"] = epoch
                checkpoint = self.session(final=False)
        if loop["finished"]:
            state = fit.snapshot("current")
            loop["checkpoint_epoch"] = math.floor(state.batches_done / fit.n_batches)
            return Stop("finished", self.config, session=self.session(final=True))
        return NextRun(
            self.config,
            self.budget(),
            checkpoint=checkpoint,
            note={"lr": self.config.lr, "event": ""},
            loss_limit=True,
            eval_share=self.eval_share,
        )

    def budget(self) -> Budget:
        """One run: at most `run_seconds` (`run_length` with a `boundary_share`) and what is left of
        the time budget, at most an epoch."""
        loop, fit = self.loop, self.fit
        time_end = loop["time_end"]
        if self.watched:
            return self.watched_budget()
        seconds = self.run_seconds
        if self.boundary_share is not None:
            elapsed = loop["elapsed"] - loop.get("time_start", 0.0)
            seconds = run_length(seconds, loop.get("boundary", 0.0), elapsed, self.boundary_share)
        seconds = seconds if time_end is None else min(seconds, time_end - loop["elapsed"])
        iterations = fit.n_batches
        if self.max_iterations is not None:
            spent = fit.snapshot("current").iterations_done - loop["first_iteration"]
            iterations = min(iterations, self.max_iterations - spent)
        return Budget(seconds=seconds, iterations=iterations)

    def watched_budget(self) -> Budget:
        """One run evaluated while it trains (`dasknn.in_run`): what is left of the time and
        iteration budgets (at most `WATCHED_SECONDS` without a time budget), up to the end of the
        epoch when the fit writes checkpoints (one goes with the next run)."""
        loop, fit = self.loop, self.fit
        time_end = loop["time_end"]
        seconds = WATCHED_SECONDS if time_end is None else time_end - loop["elapsed"]
        iterations = None
        state = fit.snapshot("current")
        if self.max_iterations is not None:
            iterations = self.max_iterations - (state.iterations_done - loop["first_iteration"])
        if fit.checkpoints:
            left = fit.n_batches - state.batches_done % fit.n_batches
            iterations = left if iterations is None else min(iterations, left)
        return Budget(seconds=seconds, iterations=iterations)

    def rolled_back(self, last: Outcome) -> None:
        """η / 10 after a run that diverged: a decision row, and a history row of the state it is back at."""
        old, state = self.config, last.start_state
        self.config = old.with_(lr=old.lr / 10)
        why = f"diverged at lr={old.lr:g}: back to the state of iteration {state.iterations_done}, lr / 10"
        self.fit.log.record(
            "train", "rollback", self.config, why, iteration=state.iterations_done, diverged=True, chosen=True
        )
        logger.info(why)
        event = f"rollback: lr {old.lr:g} -> {self.config.lr:g}"
        self.loop["finished"] = self.fit.evaluate({"lr": self.config.lr, "event": event})
