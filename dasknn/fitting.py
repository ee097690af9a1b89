"""The one training loop behind every fit: engine runs, clock and budget, evaluation, the one
divergence rollback, checkpoints and callbacks; a policy says what to run next.

`Loop.run(policy, start)` asks its policy (`dasknn.policy.Policy`) for the next run, makes it on
the engine from the state the policy names, charges it to the clock (`dasknn.policy.RunLog`),
judges divergence, evaluates a kept run's new state and calls the callbacks, then hands the policy
what it measured (docs/architecture.md, "The loop and its policies", with the divergence rules and
how a resumed fit repeats the uninterrupted one).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasknn import in_run, run_events
from dasknn.data.batching import n_batches
from dasknn.engine import checkpoint
from dasknn.engine.control import RunControl
from dasknn.engine.trace import SIMULATED_SECONDS, Budget, RunConfig, TrainState, make_trace
from dasknn.logs import verbose_logging
from dasknn.policy import CURRENT, START, NextRun, Outcome, Policy, RunLog, Stop
from dasknn.tradeoff.statistical import final_loss

__all__ = [
    "BUDGET",
    "CHECKPOINTS_KEPT",
    "DIVERGED_LOSS",
    "MAX_ROLLBACKS",
    "Evaluator",
    "FitResult",
    "Loop",
    "run_policy",
    "runs_by_config",
    "TrainingFigures",
    "blew_up",
    "training_scores",
]

logger = logging.getLogger(__name__)

BUDGET = ("time_budget", "max_epochs", "target_accuracy")
"""The parameters that say when a fit ends: a resumed fit may change them (a longer budget); the
estimator's checkpoint metadata carries them as `budget`."""
CHECKPOINTS_KEPT = 3
"""Checkpoints kept in checkpoint_dir during a fit (older ones are deleted after each save)."""
MAX_ROLLBACKS = 6
"""Rollbacks in a row (lr lowered each time) before training gives up with FloatingPointError."""
DIVERGED_LOSS = 2.0
"""A run whose training loss at its end exceeds DIVERGED_LOSS × ln(n_classes) (twice the loss of
uniform guessing), and DIVERGED_LOSS × its first batch's loss, has blown up, even with finite numbers."""


class Evaluator:
    """The held-out scores of a state that the history records: `val_loss` and `val_accuracy` on
    the validation data (at most `eval_size` samples of it, drawn once), nothing without any; and,
    for the "auto" tuner only, `tuner_loss` and `tuner_accuracy` on its fixed training samples
    (`tuner`), which the loop keeps for it (`TrainingFigures.measured_loss`) and no row records.

    The history's training figures come from the trace (`training_scores`). The batches of both
    sets run side by side on the process's threads (`nn.scoring.Scorer`), which counts the
    samples it scores. A net with BatchNorm is scored with its running statistics recomputed for
    the state's weights on the fixed training samples `statistics` (`model`,
    `nn.scoring.Statistics`), and the fit returns that model."""

    def __init__(self, net, X_val=None, y_val=None, tuner=None, confirm=None, statistics=None) -> None:
        from dasknn.nn.scoring import Scorer, Statistics
        from dasknn.nn.train import scoring_batch_size

        self.model = Statistics(net, None if statistics is None else np.asarray(statistics))

        self.X_val = None if X_val is None else np.asarray(X_val)
        self.y_val = None if y_val is None else np.asarray(y_val)
        sets = {} if self.X_val is None else {"val_": (self.X_val, self.y_val)}
        if tuner is not None:
            sets["tuner_"] = (np.asarray(tuner[0]), np.asarray(tuner[1]))
        self.scorer = Scorer(net, sets, scoring_batch_size(net)) if sets else None
        # the held-out set alone, for evaluations taken while a run trains (`held_out`)
        self.held_scorer = self.scorer
        if tuner is not None and self.X_val is not None:
            self.held_scorer = Scorer(net, {"val_": (self.X_val, self.y_val)}, scoring_batch_size(net))
        self.confirmer = None
        if confirm is not None and len(confirm[1]):
            confirm_set = {"confirm_": (np.asarray(confirm[0]), np.asarray(confirm[1]))}
            self.confirmer = Scorer(net, confirm_set, scoring_batch_size(net))

    @property
    def confirms(self) -> bool:
        """Whether a training-accuracy target is checked on training samples (`confirm`)."""
        return self.confirmer is not None

    def confirm(self, state: TrainState) -> tuple[float, int]:
        """The accuracy of `state` on the fixed training samples given as `confirm`, and their count:
        what a target judged on the batches' running mean is checked against before a fit stops
        (that mean averages weights that moved while it was taken)."""
        assert self.confirmer is not None
        with np.errstate(over="ignore", invalid="ignore"):
            _, accuracy = self.confirmer(self.model(state.params))["confirm_"]
        return float(accuracy), len(self.confirmer.sets["confirm_"][1])

    @property
    def n_samples(self) -> int:
        """The samples one evaluation scores (both sets)."""
        return sum(len(y) for _, y in self.scorer.sets.values()) if self.scorer is not None else 0

    def __call__(self, state: TrainState, held_out: bool = False) -> dict[str, float]:
        """The scores of `state`; `held_out`: of the validation data alone (what a history row
        records), not the tuner's samples, which the tuner reads at its runs' ends."""
        scores: dict[str, float] = {}
        scorer = self.held_scorer if held_out else self.scorer
        if scorer is None:
            return scores
        for prefix, (loss, acc) in scorer(self.model(state.params)).items():
            scores[f"{prefix}loss"], scores[f"{prefix}accuracy"] = loss, acc
        return scores


def training_scores(interval: pd.DataFrame) -> dict[str, float]:
    """The history's training figures over the iterations of `interval` (the trace since the last
    evaluation): `loss` and `accuracy`, the running means of the batches' own figures weighted by
    their images (as Keras and skorch report them); NaN for an empty interval (the start)."""
    rows = interval.dropna(subset=["loss", "accuracy"]) if len(interval) else interval
    if not len(rows):
        return {"loss": math.nan, "accuracy": math.nan}
    weights = rows["n_images"].to_numpy(dtype=float) if "n_images" in rows else None
    if weights is not None and not weights.sum() > 0:
        weights = None
    return {
        name: float(np.average(rows[name].to_numpy(dtype=float), weights=weights))
        for name in ("loss", "accuracy")
    }


def blew_up(seg: pd.DataFrame, limit: float) -> bool:
    """Whether a run's training loss at its end (its smoothed batch losses) exceeds `limit` and
    `DIVERGED_LOSS` × its first batch's loss (the start state's: an untrained net on raw inputs
    starts beyond the limit, so it is measured from it)."""
    if not len(seg):
        return False
    now = final_loss(seg)
    return not now <= limit and not now <= DIVERGED_LOSS * float(seg["loss"].iloc[0])


class TrainingFigures:
    """What the history's training figures are taken from: the traces of the kept runs since the
    last row (`unrecorded`), and the "auto" tuner's samples' loss of the state last scored."""

    def __init__(self) -> None:
        self.unrecorded: list[pd.DataFrame] = []
        self.measured: tuple[int, float] | None = None  # (iterations, the tuner's samples' loss)

    @staticmethod
    def scores_of(interval: pd.DataFrame) -> dict[str, float]:
        """`training_scores` of `interval`."""
        return training_scores(interval)

    def of(self, state: TrainState, snapshots: dict[str, TrainState], traces: list) -> dict[str, float]:
        """`training_scores` of the trace rows that trained `state` since the last row: the kept
        runs not yet recorded for the current state, the run that made it for a snapshot of a run
        ("run3", `traces` indexed by run), none for the start."""
        if state is snapshots.get(CURRENT):
            frames = self.unrecorded
        else:
            made = [n for n, s in snapshots.items() if s is state and n.startswith("run")]
            frames = [traces[int(made[0][3:])]] if made else []
        return training_scores(pd.concat(frames, ignore_index=True) if frames else make_trace([], "unknown"))

    def recorded(self, state: TrainState, scores: dict[str, float], current: bool) -> dict[str, float]:
        """The row's scores of `state`, less the tuner's, which are kept (`measured_loss`); a row of
        the `current` state starts the next interval."""
        scores = dict(scores)
        if "tuner_loss" in scores:
            self.measured = (state.iterations_done, scores.pop("tuner_loss"))
            scores.pop("tuner_accuracy", None)
        if current:
            self.unrecorded = []
        return scores

    def measured_loss(self, state: TrainState) -> float | None:
        """The loss of `state` on the "auto" tuner's fixed training samples, when the last history
        row scored them at its iterations (None otherwise, or without such samples)."""
        if self.measured is None or self.measured[0] != state.iterations_done:
            return None
        return self.measured[1]


class EvaluationCadence:
    """When a kept run is evaluated, and what the evaluations cost (`seconds`, one per kept run's
    evaluation): always, unless the run bounds the evaluations' share of the fit's clock
    (`NextRun.eval_share`) and one more, at the last one's cost, would pass it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.bounded: list[float] = []  # the costs of the evaluations taken under a share
        self.lock = threading.Lock()  # held while the evaluator scores
        self.pool: ThreadPoolExecutor | None = None
        self.pending: tuple | None = None  # (state, clock, training figures, fields, future)
        self.start: tuple | None = None  # the start row scored beside the first run

    def beside(self, loop: Loop, step: NextRun) -> bool:
        """Whether `step`'s evaluations score beside the next run: a bounded share on a real clock."""
        return step.eval_share is not None and clock_unit(loop.engine) != "simulated s"

    def submit(self, loop: Loop, state: TrainState, fields: dict[str, Any]) -> None:
        """Score `state` (the snapshot the kept run left) in a thread while the next run trains; its
        row is written at the next `collect`, stamped with the fit's clock now."""
        since = loop.figures.unrecorded
        figures = training_scores(pd.concat(since, ignore_index=True) if len(since) > 1 else since[0])
        loop.figures.unrecorded = []

        self.pending = (state, loop._trace_end(), figures, fields, self.score_beside(loop, state))

    def begin(self, loop: Loop, state: TrainState, fields: dict[str, Any]) -> None:
        """The fit's start `state` is scored beside the first run, once its groups train
        (`score_start`; its row written by `flush_start`, stamped with the clock now): neither the
        run's start-up nor its groups wait for it."""
        self.start = (state, loop.log.elapsed, fields, None)

    def score_start(self, loop: Loop) -> None:
        """Start scoring the start state on the evaluation thread (once)."""
        if self.start is None or self.start[3] is not None:
            return
        self.start = (*self.start[:3], self.score_beside(loop, self.start[0]))

    def flush_start(self, loop: Loop, wait: bool = True) -> bool:
        """Write the start row scored beside the first run, if any (only once it is done, unless
        `wait`); True when it stops the fit."""
        if self.start is None or not (wait or (self.start[3] is not None and self.start[3].done())):
            return False
        self.score_start(loop)
        state, t, fields, future = self.start
        self.start = None
        return loop.record(state, t, {**training_scores(make_trace([], "unknown")), **future.result()[0]},
                           phase="start", **fields)  # fmt: skip

    def score_beside(self, loop: Loop, state: TrainState, held_out: bool = False) -> Future:
        """Score `state` with the loop's evaluator on the evaluation thread (one: the scores share
        the scorer's nets, and `lock` keeps the loop's own scoring off them meanwhile); the future
        gives (scores, the score's wall seconds). `held_out`: the validation data alone
        (`Evaluator.__call__`)."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="dasknn-evaluation")
        kwargs = {"held_out": True} if held_out and isinstance(loop.evaluator, Evaluator) else {}

        def score() -> tuple[dict[str, float], float]:
            with self.lock, np.errstate(over="ignore", invalid="ignore"):
                t0 = time.perf_counter()
                return loop.evaluator(state, **kwargs), time.perf_counter() - t0

        return self.pool.submit(score)

    def collect(self, loop: Loop, last: bool = False) -> bool:
        """Write the row of the score pending (waiting for it); True when it stops the fit, which
        then returns the state that was scored (the current one goes). `last`: the fit ends."""
        if self.pending is None:
            return False
        state, t, figures, fields, future = self.pending
        self.pending = None
        scores, cost = future.result()
        self.seconds.append(cost)
        self.bounded.append(cost)
        stop = loop.record(state, t, {**figures, **scores}, **fields)
        if stop and not last:
            loop.snapshots[CURRENT] = state
            loop.log.discard_after(state.iterations_done)
        if last and self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        return stop

    def due(self, share: float | None, elapsed: float) -> bool:
        if share is None or not self.seconds:
            return True
        return sum(self.seconds) + self.seconds[-1] <= share * elapsed

    def scores(self, loop: Loop, state: TrainState, seg: pd.DataFrame) -> dict[str, float]:
        """The training figures since the last row and the evaluator's scores of `state`; the cost
        goes to `seconds`: the evaluation's wall time, or on a simulated clock the modelled forward
        passes over the samples it scored (`_scoring_seconds`), beside the groups (the training's
        clock does not advance)."""
        t0 = time.perf_counter()
        since = loop.figures.unrecorded  # kept runs left unevaluated before this one
        interval = pd.concat([*since, seg], ignore_index=True) if since else seg
        with np.errstate(over="ignore", invalid="ignore"):
            scores = {**training_scores(interval), **loop.evaluator(state)}
        simulated = clock_unit(loop.engine) == "simulated s"
        n = getattr(loop.evaluator, "n_samples", None)
        timed = next((t for t in (interval, *reversed(loop.log.traces)) if len(t)), interval)
        self.seconds.append(_scoring_seconds(time.perf_counter() - t0, timed, simulated, n))
        return scores


@dataclass
class FitResult:
    """What `Loop.run` returns: the model's state, the knobs it goes on with, the records."""

    state: TrainState
    config: RunConfig
    trace: pd.DataFrame
    decisions: pd.DataFrame
    session: dict[str, Any]
    history: list[dict[str, Any]]
    stopped_by: str = ""


def _one_iteration(engine, config: RunConfig, budget: Budget) -> float:
    """What a simulated run that raised is charged: the modelled time of the one iteration in which
    it failed (conv phase of a group of N/g workers plus the FC step), at most its seconds budget;
    never the wall clock, so the charge is the same on any machine. The whole seconds budget would
    charge an iteration-bounded trial the rest of the run."""
    conv_time = getattr(engine, "conv_time", None)
    if conv_time is None:
        return budget.seconds or 0.0
    k = max(1, (getattr(engine, "n_workers", None) or config.n_groups) // config.n_groups)
    seconds = float(conv_time(k)) + float(getattr(engine, "t_fc", 0.0))
    return seconds if budget.seconds is None else min(seconds, budget.seconds)


def _run_seconds(
    engine, trace: pd.DataFrame, wall: float, config: RunConfig, budget: Budget, raised: bool
) -> float:
    """What the fit's clock charges an engine run: the run's span in the engine's clock, or on a real
    clock its wall time `wall` (start-up included); a run with no iteration done its seconds budget;
    a raising run its wall time (on a simulated clock one modelled iteration: nothing read from the
    wall clock is charged there)."""
    span = float(trace["t_end"].max() - trace["t_start"].min()) if len(trace) else 0.0
    simulated = clock_unit(engine) == SIMULATED_SECONDS
    if trace.attrs.get("time_unit") == SIMULATED_SECONDS:
        seconds = span
    elif simulated:  # a raising simulated run: one modelled iteration, never the wall clock
        seconds = _one_iteration(engine, config, budget)
    else:
        seconds = max(span, wall)
    if not raised and not len(trace) and budget.seconds is not None:
        seconds = max(seconds, budget.seconds)  # the engine waited out its budget
    return seconds


def _scoring_seconds(wall: float, seg: pd.DataFrame, simulated: bool, n_samples: int | None) -> float:
    """What the fit's clock charges for scoring a state on `n_samples` samples after the run `seg`:
    its wall time, or on a simulated clock the forward passes over the samples, a third of an
    iteration's time per batch."""
    if not simulated:  # (before any run the log has no unit yet: the engine says it)
        return wall
    if not n_samples or not len(seg):
        return 0.0
    per_iteration = float((seg["t_end"] - seg["t_start"]).median())
    return per_iteration / 3 * n_samples / max(1, int(seg["n_images"].median()) if "n_images" in seg else 1)


def _clock(state: TrainState | None) -> float | None:
    """The simulator's clock carried in a state (None for engines whose runs start their clock at 0)."""
    sim = None if state is None else state.extra.get("simulator")
    return None if sim is None else float(sim["clock"])


def clock_unit(engine) -> str:
    """The unit of a fit's clock on `engine`: `SIMULATED_SECONDS` on the simulator, else "s"."""
    return getattr(engine, "time_unit", None) or "s"


class Loop:
    """One fit's training: the engine runs a policy asks for, the clock, evaluation, rollback,
    checkpoints and callbacks (the module docstring).

    `evaluate(state) -> scores` (an `Evaluator`), else `should_stop(state, trace) -> bool` (the
    tuners' own `optimize`), decides what a kept run's evaluation records; `selection(state) ->
    loss` scores states for the policy (the selection part, `optimizer.search.SelectionLoss`);
    `notify(hook, info) -> bool` calls the callbacks (True: a callback asks to stop); `n_classes`
    (default: the labels', 0 … max(y)) sets uniform guessing's loss, ln(n_classes), that the
    divergence rules measure from (`chance_loss`, `loss_limit`); `target_accuracy` stops the fit
    when the held-out metric (else the training one, the batches' running mean, confirmed on the
    Evaluator's training samples where it has them) reaches it;
    `max_wall_time` (real seconds since `wall_start`, default the loop's creation) stops it at the
    first evaluation after that much wall time (and makes an engine with a `wall_deadline`, the
    simulator, end its runs there). `verbose` shows the loop's and the policy's messages for a
    caller that has not (`dasknn.logs.verbose_logging`).
    """

    def __init__(
        self,
        engine,
        net,
        X,
        y,
        *,
        batch_size: int,
        weight_decay: float = 0.0,
        seed: int = 0,
        time_budget: float | None = None,
        max_iterations: int | None = None,
        evaluate: Callable[[TrainState], dict[str, float]] | None = None,
        should_stop: Callable[[TrainState, pd.DataFrame], bool] | None = None,
        selection: Callable[[TrainState], float] | None = None,
        notify: Callable[[str, dict[str, Any]], bool] | None = None,
        target_accuracy: float | None = None,
        n_classes: int | None = None,
        checkpoint_dir: str | Path | None = None,
        meta: dict[str, Any] | None = None,
        verbose: int = 0,
        max_wall_time: float | None = None,
        wall_start: float | None = None,
    ) -> None:
        self.engine, self.net, self.X, self.y = engine, net, X, y
        self.batch_size, self.weight_decay, self.seed = int(batch_size), float(weight_decay), seed
        self.n_batches = n_batches(int(X.shape[0]), int(batch_size))
        self.log = RunLog(time_budget, max_iterations)
        self.evaluator, self.should_stop, self.selection = evaluate, should_stop, selection
        self.notify = notify or (lambda hook, info: False)
        self.target_accuracy, self.verbose = target_accuracy, verbose
        if n_classes is None:  # the labels' classes, 0 … max(y)
            n_classes = int(np.max(y)) + 1 if len(y) else 2
        self.chance_loss = math.log(max(2, n_classes))  # uniform guessing's
        self.loss_limit = DIVERGED_LOSS * self.chance_loss
        self.diverged_loss = DIVERGED_LOSS
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.meta = dict(meta or {})
        self.history: list[dict[str, Any]] = []
        self.snapshots: dict[str, TrainState] = {}
        self.figures = TrainingFigures()
        self.cadence = EvaluationCadence()
        self.rollbacks_in_row = 0
        self.stop_at_start = False
        self.stopped_by = ""
        self.last_checkpoint: Path | None = None
        self.wall0, self.wall_offset = time.perf_counter(), 0.0
        self.max_wall_time = max_wall_time
        began = self.wall0 if wall_start is None else wall_start  # a `time.perf_counter()` value
        self.wall_deadline = None if max_wall_time is None else began + max_wall_time
        if hasattr(engine, "wall_deadline"):  # the simulator cuts its runs there, not only at evaluations
            engine.wall_deadline = self.wall_deadline

    # -- what a policy may read (dasknn.policy.Fit) ----------------------------------------------
    @property
    def has_selection(self) -> bool:
        return self.selection is not None

    @property
    def evaluates(self) -> bool:
        """Whether kept runs are evaluated (and may stop the fit)."""
        return self.evaluator is not None or self.should_stop is not None

    @property
    def evaluates_in_run(self) -> bool:
        """Whether bounded kept runs are evaluated while they train (`in_run.applies`)."""
        return in_run.applies(self)

    @property
    def checkpoints(self) -> bool:
        """Whether the fit writes checkpoints (policies then hand their sessions to the loop)."""
        return self.checkpoint_dir is not None

    def snapshot(self, name: str) -> TrainState:
        if name not in self.snapshots:
            raise KeyError(f"no snapshot {name!r}: the loop keeps those since the last kept run")
        return self.snapshots[name]

    def score(self, name: str) -> float:
        return self._score(self.snapshot(name), make_trace([], "unknown"))

    def evaluate(self, fields: dict[str, Any]) -> bool:
        """Evaluate the current state now (a history row with `fields`, after the row of a score still
        pending beside the runs); True when the fit should stop."""
        if self.cadence.collect(self):
            return True
        return self.record(self.snapshots[CURRENT], self.log.elapsed, **fields)

    # -- records ---------------------------------------------------------------------------------
    def note(
        self,
        state: TrainState,
        t: float,
        scores: dict[str, float] | None = None,
        phase: str = "train",
        **fields,
    ) -> dict[str, Any]:
        """Score `state` (unless `scores` are given) and append its history row, logged (DEBUG);
        returns the row. No callback sees it: `record` is an evaluation, this also the closing rows
        (the best model restored, an earlier state returned)."""
        self.cadence.flush_start(self)
        if scores is None:
            with np.errstate(over="ignore", invalid="ignore"):
                with self.cadence.lock:  # never beside a background score: they share the scorer's nets
                    scores = {
                        **self.figures.of(state, self.snapshots, self.log.traces),
                        **self.evaluator(state),
                    }
        scores = self.figures.recorded(state, scores, current=state is self.snapshots.get(CURRENT))
        row = {
            "time": float(t),
            "iteration": state.iterations_done,
            "epoch": state.batches_done / self.n_batches,
            "phase": phase,
            **scores,
            "wall_time": self.wall_offset + time.perf_counter() - self.wall0,
            **fields,
        }
        self.history.append(row)
        if logger.isEnabledFor(logging.DEBUG):
            note = f" {fields['event']}" if fields.get("event") else ""
            val = f" val_accuracy={row['val_accuracy']:.2%}" if "val_accuracy" in row else ""
            logger.debug(
                f"t={row['time']:7.1f} {clock_unit(self.engine)} it={state.iterations_done:6d} "
                f"epoch={row['epoch']:5.2f} loss={row['loss']:.4f} accuracy={row['accuracy']:.2%}{val}{note}"
            )
        return row

    def record(
        self,
        state: TrainState,
        t: float,
        scores: dict[str, float] | None = None,
        phase: str = "train",
        **fields,
    ) -> bool:
        """An evaluation: `note` the row of `state`, then call the callbacks with it.

        True when the fit should stop: the target accuracy reached (held-out metric if any, else the
        training one), a callback asked (`notify` returned True, or the reason as a string), or
        `max_wall_time` passed; `stopped_by` then says which.
        """
        if self.evaluator is None:
            return bool(self.should_stop is not None and self.should_stop(state, self.log.trace()))
        first = self.cadence.flush_start(self)  # the start row comes first
        row = self.note(state, t, scores, phase, **fields)
        target = self.target_accuracy
        metric = "val_accuracy" if "val_accuracy" in row else "accuracy"
        reached = target is not None and row[metric] >= target
        confirmed = ""
        if reached and metric == "accuracy" and getattr(self.evaluator, "confirms", False):
            row["confirmed_accuracy"], n = self.evaluator.confirm(state)  # its own nets: no lock
            on_samples = row["confirmed_accuracy"]
            reached = on_samples >= target
            confirmed = f" (the batches' running mean; {on_samples:.4f} on {n} training samples)"
        asked = self.notify("on_evaluation", {"row": row, "state": state})
        late = self.wall_deadline is not None and time.perf_counter() >= self.wall_deadline
        it = state.iterations_done
        if not self.stopped_by and asked:
            who = asked if isinstance(asked, str) else "a callback asked to stop"
            self.stopped_by = f"{who}, at iteration {it}"
        elif not self.stopped_by and reached:
            self.stopped_by = (
                f"target_accuracy={target:g} reached: {metric} {row[metric]:.4f}{confirmed}, "
                f"at iteration {it}"
            )
        elif not self.stopped_by and late:
            self.stopped_by = (
                f"max_wall_time={self.max_wall_time:g} s (real time) reached after {row['time']:.4g} "
                f"{clock_unit(self.engine)}, at iteration {it}"
            )
            if clock_unit(self.engine) == SIMULATED_SECONDS:
                logger.warning(
                    "%s: the simulation runs slower than the cluster it models; lower time_budget "
                    "(simulated seconds) or raise max_wall_time (None: no bound)",
                    self.stopped_by,
                )
        return first or bool(asked) or reached or late

    def restore(self, ckpt: checkpoint.Checkpoint) -> dict[str, Any]:
        """History, decisions, trace and clock from a checkpoint; returns its policy session."""
        tables, session = ckpt.tables, dict(ckpt.meta.get("loop", {}))
        self.history = tables["history"].to_dict("records") if "history" in tables else []
        if self.history:
            self.wall_offset = float(self.history[-1]["wall_time"])
        trace = tables.get("trace", pd.DataFrame({"t_end": []}))
        events = tables.get("events", pd.DataFrame())
        log = self.log
        log.elapsed = float(session.get("elapsed", 0.0))
        log.iterations = int(session.get("iterations", len(trace)))
        if "charged" in session:  # a tuner's session: its runs one by one
            log.restore({**session, "trace": trace, "decisions": events})
        else:
            log.adopt(trace, events, log.elapsed)
        self.rollbacks_in_row = int(session.get("rollbacks_in_row", 0))
        params = ckpt.meta.get("params", {})  # earlier checkpoints kept the budget among the params
        old = ckpt.meta.get("budget") or {name: params.get(name) for name in BUDGET}
        new = self.meta.get("budget")
        if new is not None and old != new:  # a new budget: the policy counts it from the fit's start
            session["budget_changed"] = True
            if "time_start" not in session:
                end, before = session.get("time_end"), old.get("time_budget")
                session["time_start"] = end - before if end is not None and before is not None else 0.0
        return session

    def target_reached(self) -> bool:
        """Whether the last evaluation reached `target_accuracy` (held-out metric, else training:
        its check on training samples where one was made, `Evaluator.confirm`)."""
        row = self.history[-1] if self.history else {}
        metric = "val_accuracy" if "val_accuracy" in row else "accuracy"
        if metric == "accuracy" and "confirmed_accuracy" in row:
            metric = "confirmed_accuracy"
        return self.target_accuracy is not None and metric in row and row[metric] >= self.target_accuracy

    def continue_records(
        self, history: list[dict[str, Any]], trace: pd.DataFrame, decisions: pd.DataFrame
    ) -> None:
        """Go on from a previous fit's records (partial_fit): its history, trace, decisions and clock."""
        self.history = list(history)
        self.log.adopt(trace, decisions, float(history[-1]["time"]) if history else 0.0)

    def save(self, state: TrainState, session: dict[str, Any]) -> Path | None:
        """A checkpoint of `state` with the policy's session and the records; None without a directory."""
        if self.checkpoint_dir is None:
            return None
        log = self.log
        loop = {
            **session,
            "elapsed": log.elapsed,
            "iterations": log.iterations,
            "rollbacks_in_row": self.rollbacks_in_row,
        }
        if "charged" in session:
            loop["charged"] = list(log.charged)
            loop["kept"] = sorted(log.kept)
        tables = {"history": pd.DataFrame(self.history), "events": log.decisions(), "trace": log.trace()}
        self.last_checkpoint = checkpoint.save(
            self.checkpoint_dir, state, {**self.meta, "loop": loop}, tables, keep=CHECKPOINTS_KEPT
        )
        return self.last_checkpoint

    # -- the loop --------------------------------------------------------------------------------
    def run(self, policy: Policy, start: TrainState, resume: dict[str, Any] | None = None) -> FitResult:
        """Run `policy` from `start` (or go on from a checkpoint's `resume` session, `restore` first)."""
        with verbose_logging(self.verbose + 1 if self.verbose else 0):
            return self._run(policy, start, resume)

    def _run(self, policy: Policy, start: TrainState, resume: dict[str, Any] | None) -> FitResult:
        self.snapshots = {START: start, CURRENT: start}
        if resume is not None and resume.get("finished"):  # the checkpointed fit had ended
            if not resume.get("budget_changed"):
                return self.result(start, RunConfig(**resume["config"]), resume)
            if resume.get("kind") != "fixed":
                raise ValueError(
                    "resume: the tuner's fit in the checkpoint had ended; a new budget continues a fit "
                    "with n_groups, learning_rate and momentum given as numbers (or use warm_start=True)"
                )
        if resume is None and self.evaluator is not None:  # the curve starts at the starting weights
            fields = {**getattr(policy, "start_fields", {}), "event": "start"}
            if getattr(policy, "in_run", False) and in_run.applies(self):
                self.cadence.begin(self, start, fields)  # scored while the first run trains
            else:
                self.stop_at_start = self.record(start, self.log.elapsed, phase="start", **fields)
        policy.begin(self, resume)
        step = policy.next_run(None)
        while not isinstance(step, Stop):
            if step.checkpoint is not None:
                self.save(self.snapshots[CURRENT], step.checkpoint)
            step = policy.next_run(self.execute(step))
        state = self.snapshot(step.state)
        if step.reason.startswith("converged") and not self.stopped_by:  # the tuner's plateau rule
            self.stopped_by = f"{step.reason} (at iteration {state.iterations_done})"
        self.cadence.collect(self, last=True)
        last = self.history[-1]["iteration"] if self.history else -1
        if self.evaluator is not None and last != state.iterations_done:
            # the model returned, even mid-search: an evaluation when it is a new step, only noted
            # when it is an earlier state (a snapshot): callbacks never see iterations go back
            write = self.record if state.iterations_done > last else self.note
            write(state, self._trace_end(), phase="end", event="end")
        config = self.log.chosen_config(step.config)  # config_ and decisions_ agree by construction
        session = {**(step.session or {"kind": "auto", "finished": True}), "config": asdict(config)}
        self.save(state, session)
        return self.result(state, config, session)

    def result(self, state: TrainState, config: RunConfig, session: dict[str, Any]) -> FitResult:
        model = getattr(self.evaluator, "model", None)  # BatchNorm's statistics as they were scored
        self.net.set_params(model(state.params) if model is not None else state.params)
        trace = self.log.trace()
        return FitResult(state, config, trace, self.log.decisions(), session, self.history, self.stopped_by)

    def execute(self, step: NextRun) -> Outcome:
        """One engine run of `step`: charged, judged, rolled back or kept, evaluated."""
        start = self.snapshot(step.start)
        watch = in_run.watcher(self, step)
        trace, state, diverged, seconds = engine_run(
            self.engine, self.net, self.X, self.y, step, start, watch
        )
        stopped = watch is not None and watch.finish(trace)
        seg, run = self.log.add_run(trace, seconds, step.phase)
        changes = run_events.cluster_changes(self, trace, seg, run, step.config)
        score = None
        if step.score and not diverged:
            score = self._score(state, seg)
        if step.diverges is not None and not diverged:
            diverged = bool(step.diverges(seg, math.inf if score is None else score))
        due = self.evaluator is None or (not stopped and self.cadence.due(step.eval_share, self.log.elapsed))
        scores, beside = None, self.cadence.beside(self, step)
        if step.keep and not diverged and self.evaluator is not None:
            if due and not beside:
                scores = self.cadence.scores(self, state, seg)
            diverged = step.loss_limit and blew_up(seg, self.loss_limit)
        out = Outcome(run, step, seg, state, f"run{run}", start, diverged, seconds, score)
        if state is not None:
            self.snapshots[out.snapshot] = state
        if not step.keep:
            return out
        if diverged:
            return self._rolled_back(out)
        self.rollbacks_in_row = 0
        self.log.kept.add(run)
        self.figures.unrecorded.append(seg if watch is None else watch.unrecorded(seg))
        held = (START, step.hold)
        self.snapshots = {n: s for n, s in self.snapshots.items() if s is start or n in held}
        self.snapshots.update({CURRENT: state, out.snapshot: state})
        event = "; ".join(filter(None, [run_events.recoveries(self, seg, step.config), changes]))
        if stopped:  # an evaluation while the run trained stopped the fit: the scored state is the model
            self.snapshots[CURRENT] = watch.scored
            self.log.discard_after(watch.scored.iterations_done)
            run_events.note(self.history, event)
            out.stop = True
            return out
        out.stop = beside and self.cadence.collect(self)  # the last snapshot's score, if one is pending
        if self.evaluates and due and not out.stop:
            fields = dict(step.note or {})
            if "event" in fields:
                fields["event"] = event
            if beside:
                self.cadence.submit(self, state, fields)
            else:
                out.stop = self.record(state, self._trace_end(), scores, **fields)
        elif watch is not None:  # evaluated while it trained: its rows carry its events
            run_events.note(self.history, event)
        return out

    def _rolled_back(self, out: Outcome) -> Outcome:
        """The one divergence handler: the current state stays the run's start; too many in a row raise."""
        out.trace["phase"] = "rolled_back"
        self.log.traces[out.run]["phase"] = "rolled_back"
        self.rollbacks_in_row += 1
        if self.rollbacks_in_row > MAX_ROLLBACKS:
            raise FloatingPointError(
                f"training diverged {MAX_ROLLBACKS + 1} times in a row from iteration "
                f"{out.start_state.iterations_done}, down to lr={out.config.lr:g}; check the data and the net"
            )
        return out

    def _trace_end(self) -> float:
        trace = self.log.trace()
        return float(trace["t_end"].max()) if len(trace) else self.log.elapsed

    def _score(self, state: TrainState, seg: pd.DataFrame) -> float:
        """The selection loss of `state` (its time charged to the clock), else the run's smoothed
        training loss (NaN without a run); the callbacks hear of the progress."""
        if self.selection is None:
            return final_loss(seg) if len(seg) else math.nan
        t0 = time.perf_counter()
        value = float(self.selection(state))
        wall = time.perf_counter() - t0
        simulated = SIMULATED_SECONDS in (
            self.log.attrs.get("time_unit"),
            getattr(self.engine, "time_unit", None),
        )
        self.log.charge(_scoring_seconds(wall, seg, simulated, getattr(self.selection, "n_samples", None)))
        t = _clock(state)
        if t is None:
            t = self.wall_offset + time.perf_counter() - self.wall0
        self.notify(
            "on_progress", {"time": t, "epoch": state.batches_done / self.n_batches, "phase": "search"}
        )
        return value if math.isfinite(value) else math.inf


def engine_run(engine, net, X, y, step: NextRun, start: TrainState, control: RunControl | None = None):
    """The engine's run of `step` (polling `control`, else its own `control`, if any): (trace, end
    state or None, diverged, seconds charged: `_run_seconds`)."""
    config, budget = step.config, step.budget
    control = step.control if control is None else control
    more = {} if control is None else {"control": control}
    more["start"] = start.copy() if step.keep else start
    t0 = time.perf_counter()
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # divergence is an outcome
            result = engine.run(net, X, y, config, budget, **more)
    except FloatingPointError:
        result = None
    wall = time.perf_counter() - t0
    trace = make_trace([], "unknown") if result is None else result.trace
    state = None if result is None else result.state
    losses = trace["loss"].to_numpy(dtype=float)
    diverged = state is None or bool(trace.attrs.get("diverged")) or not np.isfinite(losses).all()
    diverged = diverged or not checkpoint.healthy(state, statistics=net.statistics)  # exploding weights
    seconds = _run_seconds(engine, trace, wall, config, budget, raised=result is None)
    return trace, state, diverged, seconds


def run_policy(policy: Policy, engine, net, X, y, *, start: TrainState | None = None, **options) -> FitResult:
    """Run `policy` on a `Loop` without evaluation data (the tuners' own `optimize`); sets the
    final weights on `net`."""
    loop = Loop(engine, net, X, y, **options)
    return loop.run(policy, start.copy() if start is not None else TrainState.from_net(net))


def runs_by_config(trace: pd.DataFrame, decisions: pd.DataFrame, seed: int) -> dict:
    """The tuner's runs keyed (n_groups, lr, momentum, seed), the longest run for each config,
    each on its own clock from 0 (for the xarray tradeoff record)."""
    if "run" not in trace or "run" not in decisions or not len(trace):
        return {}
    groups = decisions.dropna(subset=["run"]).drop_duplicates("run").set_index("run")["n_groups"]
    runs: dict = {}
    for run_id, rows in trace.groupby("run", sort=False):
        if run_id not in groups.index:
            continue
        key = (int(groups[run_id]), float(rows["lr"].iloc[0]), float(rows["momentum"].iloc[0]), seed)
        if key not in runs or len(rows) > len(runs[key]):
            rows = rows.copy()
            rows[["t_start", "t_end"]] -= rows["t_start"].min()
            runs[key] = rows
    return runs
