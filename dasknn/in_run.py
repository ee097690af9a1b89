"""Evaluations while a run trains: the loop's run control (`engine.control`) for a kept run on a
real clock whose evaluations are bounded (`NextRun.eval_share`; docs/architecture.md "Evaluations
at a bounded cost").

At a poll of the engine it asks for a snapshot of the servers' state, fetched to the driver
(`TakeSnapshot(fetch=True)`), and scores it on the loop's evaluation thread while the groups train
on; the history row is stamped with the fit's clock at the snapshot, its training figures are the
running means of the iterations up to it. When a score stops the fit (its target, a callback,
`max_wall_time`) the run ends and the fit returns the state that was scored. No run boundary is
needed to evaluate, so a policy's runs can be as long as its knobs stay the same.

The cadence follows the scoring's measured cost `c` (wall seconds of the last score): a snapshot
when `c / share` seconds of the fit's clock have passed since the last one and the evaluations so
far taken under a share (not a tuner's evaluations at its runs' ends, which also score its own
samples), with one more, stay within `share` of the clock, or at the latest once the clock has grown by
`GROWTH` since the last evaluation (so a short fit is not left unevaluated until the share allows
one); while the running training accuracy is within
`NEAR_MARGIN` of the fit's target (the held-out score may reach it any moment) the share is
`NEAR_SHARE` instead, so that the target is seen soon after it is reached. A run whose recent
training losses are not finite or have blown up (the loss limit and `fitting.DIVERGED_LOSS` × its
first loss) is ended at once: the loop then rolls it back as any diverged run.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dasknn.engine.control import Command, End, Progress, TakeSnapshot
from dasknn.engine.trace import SIMULATED_SECONDS, TrainState, make_trace

if TYPE_CHECKING:
    from dasknn.fitting import Loop
    from dasknn.policy import NextRun

__all__ = ["InRunEvaluations", "NEAR_MARGIN", "NEAR_SHARE", "SNAPSHOT", "applies", "watcher"]

SNAPSHOT = "evaluation"
"""The name of the servers' snapshot an evaluation scores (each replaces the last)."""
NEAR_MARGIN = 0.02
"""How close (in accuracy) the running training accuracy must come to the target for the
evaluations to come at `NEAR_SHARE`."""
NEAR_SHARE = 0.25
"""The evaluations' share of the fit's clock while the running training accuracy is near the target."""
RECENT = 32
"""The iterations the running training figures of the cadence and the divergence check look at."""
GROWTH = 0.5
"""A snapshot is due at the latest when the fit's clock has grown by this fraction since the last
evaluation (and by one evaluation's cost): so a target reached at clock t is seen by about
(1 + GROWTH) t, however slow the scoring, and a fit of T seconds pays about log(T) / log(1 + GROWTH)
such evaluations (a short fit a larger share than `eval_share`, a long one less)."""
FIRST_AFTER = 1.0
"""Seconds of a run before its first snapshot when no evaluation has been timed yet."""


def applies(loop: Loop) -> bool:
    """Whether `loop` evaluates kept runs that bound their evaluations while they train: held-out
    scoring, a real clock and an engine that takes a run control (otherwise at their ends, beside
    the next run: `fitting.EvaluationCadence`)."""
    return (
        loop.evaluator is not None
        and getattr(loop.engine, "time_unit", None) != SIMULATED_SECONDS
        and bool(getattr(loop.engine, "takes_control", False))
    )


def watcher(loop: Loop, step: NextRun) -> InRunEvaluations | None:
    """The control that evaluates `step`'s run while it trains, or None where it does not apply (a
    probe, a run evaluated at every end, `applies`)."""
    if not (step.keep and step.eval_share is not None and applies(loop)):
        return None
    return InRunEvaluations(loop, step, loop.log.elapsed, time.perf_counter(), dict(step.note or {}))


class InRunEvaluations:
    """The run control that evaluates kept run `step` while it trains on `loop`'s engine (its
    `step.control`, if any, is polled first and its commands pass through). `clock0` is the fit's
    clock at the run's start and `wall0` the `time.perf_counter()` then."""

    def __init__(
        self, loop: Loop, step: NextRun, clock0: float, wall0: float, fields: dict[str, Any]
    ) -> None:
        self.loop, self.inner, self.share = loop, step.control, float(step.eval_share)
        self.limit = loop.loss_limit if step.loss_limit else math.inf
        self.scores_of, self.factor = loop.figures.scores_of, loop.diverged_loss
        self.clock0, self.wall0, self.fields = clock0, wall0, dict(fields)
        self.rows: list[dict[str, Any]] = []  # trace rows since the last row recorded
        self.recent: deque = deque(maxlen=RECENT)  # (loss, accuracy) of the latest iterations
        self.first_loss: float | None = None
        self.pending: tuple | None = None  # (state, clock, figures, future)
        self.last = -math.inf  # the fit's clock at the last snapshot
        self.recorded = -1  # the iteration of the last row this run recorded
        self.scored: TrainState | None = None  # the state whose evaluation stopped the fit
        self.ended = ""  # why this control ended the run

    def clock(self) -> float:
        """The fit's clock now (the run's charge is its wall time: `fitting._run_seconds`)."""
        return self.clock0 + time.perf_counter() - self.wall0

    def poll(self, progress: Progress) -> Sequence[Command]:
        commands = list(self.inner.poll(progress)) if self.inner is not None else []
        self.rows.extend(progress.rows)
        for row in progress.rows:
            self.recent.append((float(row.get("loss", math.nan)), float(row.get("accuracy", math.nan))))
            if self.first_loss is None:
                self.first_loss = self.recent[-1][0]
        if self.ended:
            return commands
        start = self.loop.cadence.start
        if start is not None and progress.rows:  # the groups train: the start row scores beside them
            self.loop.cadence.score_start(self.loop)
        if start is not None and self.loop.cadence.flush_start(self.loop, wait=False):
            self.scored, self.ended = start[0], self.loop.stopped_by or "the start row stopped the fit"
        elif self.pending is not None and self.pending[2].done() and self.collect():
            self.ended = self.loop.stopped_by or "an evaluation stopped the fit"
        elif self.blew_up():
            self.ended = "diverged"
        elif self.pending is None and self.due():
            commands.append(TakeSnapshot(SNAPSHOT, fetch=True))
        return [*commands, End(self.ended)] if self.ended else commands

    def fetched(self, name: str, state: TrainState) -> None:
        """Score `state` on the loop's evaluation thread, its row stamped with the fit's clock now."""
        t = self.clock()
        self.pending = (state, t, self.loop.cadence.score_beside(self.loop, state, held_out=True))
        self.last = t

    def collect(self) -> bool:
        """Write the row of the pending score (waiting for it); True when it stops the fit."""
        state, t, future = self.pending
        self.pending = None
        scores, cost = future.result()
        figures = self.figures(state.iterations_done)
        self.loop.cadence.seconds.append(cost)
        self.loop.cadence.bounded.append(cost)
        stop = self.loop.record(state, t, {**figures, **scores}, **self.fields)
        self.recorded = state.iterations_done
        if stop:
            self.scored = state
        return stop

    def figures(self, upto: int) -> dict[str, float]:
        """The training figures of the row of iteration `upto`: the kept runs' iterations since the
        last row (the loop's unrecorded ones, then this run's rows up to `upto`)."""
        loop = self.loop
        mine = [r for r in self.rows if r.get("iteration", upto) <= upto]
        self.rows = [r for r in self.rows if r.get("iteration", upto) > upto]
        frames = [*loop.figures.unrecorded, pd.DataFrame(mine) if mine else make_trace([], "unknown")]
        loop.figures.unrecorded = []
        return self.scores_of(pd.concat(frames, ignore_index=True))

    def finish(self, trace: pd.DataFrame) -> bool:
        """After the run (`trace`, its rows): the row of a score still pending; True when an
        evaluation stopped the fit."""
        if self.loop.cadence.flush_start(self.loop) and self.scored is None:
            self.scored = self.loop.snapshots.get("start")
        if "iteration" in trace:  # the rows drained after the last poll too
            self.rows = trace[trace["iteration"] > self.recorded].to_dict("records")
        if self.pending is not None and self.scored is None and self.collect():
            return True
        return self.scored is not None

    def unrecorded(self, seg: pd.DataFrame) -> pd.DataFrame:
        """The rows of the run's trace `seg` after the last state this run recorded."""
        if self.recorded < 0 or "iteration" not in seg:
            return seg
        return seg[seg["iteration"] > self.recorded]

    def near(self) -> bool:
        """Whether the running training accuracy is within `NEAR_MARGIN` of the fit's target."""
        target = self.loop.target_accuracy
        if target is None or not self.recent:
            return False
        accuracies = np.array([a for _, a in self.recent], dtype=float)
        accuracies = accuracies[np.isfinite(accuracies)]
        return bool(len(accuracies) and accuracies.mean() >= target - NEAR_MARGIN)

    def due(self) -> bool:
        """Whether to take a snapshot now (the module docstring's cadence)."""
        costs, now = self.loop.cadence.bounded, self.clock()  # not a tuner's own evaluations
        if not self.recent:
            return False
        if not costs:
            return now - self.clock0 >= FIRST_AFTER
        history = self.loop.history
        last = max(self.last, float(history[-1]["time"]) if history else 0.0)
        cost = costs[-1]
        if now >= last * (1 + GROWTH) and now - last >= cost:
            return True  # the time to target is never seen later than GROWTH × the clock then
        share = max(self.share, NEAR_SHARE) if self.near() else self.share
        if now - last < cost / share:
            return False
        return share > self.share or sum(costs) + cost <= share * now

    def blew_up(self) -> bool:
        """Whether the latest training losses are not finite, or their mean exceeds the loss limit
        and `DIVERGED_LOSS` × the run's first loss."""
        losses = np.array([loss for loss, _ in self.recent], dtype=float)
        if not len(losses):
            return False
        if not np.isfinite(losses).all():
            return True
        if len(losses) < self.recent.maxlen:
            return False
        now, first = float(losses.mean()), float(self.first_loss)
        return now > self.limit and now > self.factor * first
