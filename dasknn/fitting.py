"""The training loops behind DistributedCNN.fit and partial_fit: fixed knobs or Omnivore's optimizer,
the history record, divergence rollback and checkpoints.

The fixed loop runs the engine in chunks: each at most time_budget / 20 seconds (2 s
without a time budget) and at most one epoch of iterations, and evaluates after each (training
samples and validation data, `Evaluator`), calling the callbacks (`dasknn.callbacks`). It
checkpoints (when given a directory) at the end of every chunk that completes an epoch and at the
end of the fit. The loop's own state (elapsed time, budgets spent, the current
learning rate, history, trace, events) travels in the checkpoint's metadata, and the engines
continue a `TrainState` exactly (the simulator carries its in-flight iterations, clock and random
generators in `TrainState.extra`), so a fit resumed from a checkpoint on the simulated engine makes
the same engine calls as the uninterrupted fit and ends with the same weights.

Divergence (a non-finite loss, a FloatingPointError, weights that are non-finite or larger than
`checkpoint.WEIGHT_LIMIT`, or an evaluation loss above `DIVERGED_LOSS` × ln(n_classes)): the chunk
is undone (back to the state it started from: the last good snapshot), the learning rate is divided
by 10, an `events` row (action "rollback") and a history row (`event`) record it, and training
continues; the time the failed chunk took stays spent. After `MAX_ROLLBACKS` rollbacks in a row
from one state, FloatingPointError.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasknn.callbacks import EarlyStopping, call
from dasknn.data.batching import n_batches
from dasknn.engine import checkpoint
from dasknn.engine.trace import Budget, RunConfig, TrainState

__all__ = ["CHECKPOINTS_KEPT", "MAX_ROLLBACKS", "Evaluator", "Trainer", "runs_by_config"]

CHECKPOINTS_KEPT = 3
"""Checkpoints kept in checkpoint_dir during a fit (older ones are deleted after each save)."""
MAX_ROLLBACKS = 6
"""Rollbacks in a row (lr divided by 10 each time) before training gives up with FloatingPointError."""
DIVERGED_LOSS = 2.0
"""A chunk whose end state's evaluation loss exceeds DIVERGED_LOSS × ln(n_classes) (twice the loss of
uniform guessing) has blown up, even with finite numbers."""


class Evaluator:
    """The scores of a state that the history records: `loss` and `accuracy` on fixed training
    samples, and `val_loss` and `val_accuracy` on the validation data (all of it) when there is any.

    The validation samples are never trained on; the training samples are a random subset of those
    trained on (drawn once), so the two curves show generalisation side by side."""

    def __init__(self, net, X_eval, y_eval, X_val=None, y_val=None) -> None:
        self.net, self.X, self.y = net.copy(), np.asarray(X_eval), np.asarray(y_eval)
        self.X_val = None if X_val is None else np.asarray(X_val)
        self.y_val = None if y_val is None else np.asarray(y_val)

    @property
    def has_validation(self) -> bool:
        return self.X_val is not None

    def __call__(self, state: TrainState) -> dict[str, float]:
        from dasknn.nn.train import evaluate

        self.net.set_params(state.params)
        loss, acc = evaluate(self.net, self.X, self.y)
        scores = {"loss": loss, "accuracy": acc}
        if self.X_val is not None:
            scores["val_loss"], scores["val_accuracy"] = evaluate(self.net, self.X_val, self.y_val)
        return scores


class _ReportingScore:
    """The optimizer's probe score (the selection part's loss), telling the callbacks how far the
    fit is after each probe: the search has no evaluations, but progress should still show."""

    def __init__(self, trainer: Trainer, score) -> None:
        self.trainer, self.score = trainer, score
        self.n_samples = getattr(score, "n_samples", None)

    def __call__(self, state: TrainState) -> float:
        loss = self.score(state)
        trainer = self.trainer
        t = _clock(state)
        if t is None:
            t = trainer.wall_offset + time.perf_counter() - trainer.wall0
        info = {"time": t, "epoch": state.batches_done / trainer.nb, "phase": "search"}
        call(trainer.callbacks, "on_progress", trainer.est, info)
        return loss


def _clock(state: TrainState) -> float | None:
    """The simulator's clock carried in a state (None for engines whose runs start their clock at 0)."""
    sim = state.extra.get("simulator")
    return None if sim is None else float(sim["clock"])


class Trainer:
    """One fit's (or partial_fit's) training: history, events, checkpoints, and the loop that runs."""

    def __init__(
        self,
        est,
        engine,
        net,
        X,
        y,
        evaluate,
        *,
        max_iterations: int | None,
        checkpoint_dir: str | Path | None = None,
        meta: dict[str, Any] | None = None,
        selection_score=None,
        callbacks=(),
    ) -> None:
        self.est, self.engine, self.net, self.X, self.y = est, engine, net, X, y
        self.evaluate = evaluate
        self.selection_score = selection_score
        self.callbacks = list(callbacks)
        self.nb = n_batches(X.shape[0], est.batch_size)
        self.max_iterations = max_iterations
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.meta = dict(meta or {})
        self.history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.traces: list[pd.DataFrame] = []
        self.wall0, self.wall_offset = time.perf_counter(), 0.0
        self.last_checkpoint: Path | None = None
        self.loss_limit = DIVERGED_LOSS * math.log(max(2, len(est.classes_)))
        self.restorer = next(
            (cb for cb in self.callbacks if isinstance(cb, EarlyStopping) and cb.restore_best), None
        )
        self.best_state: TrainState | None = None
        self.stopped_by = ""

    # -- records ---------------------------------------------------------------------------------
    def record(
        self,
        state: TrainState,
        t: float,
        scores: dict[str, float] | None = None,
        phase: str = "train",
        **fields,
    ) -> bool:
        """Score `state` (unless `scores` are given), append a history row and call the callbacks.

        True when the fit should stop: the target accuracy reached (on the held-out metric when there
        is validation data, else on training samples), or a callback's `on_evaluation` returned True.
        """
        if scores is None:
            with np.errstate(over="ignore", invalid="ignore"):
                scores = self.evaluate(state)
        row = {
            "time": float(t),
            "iteration": state.iterations_done,
            "epoch": state.batches_done / self.nb,
            "phase": phase,
            **scores,
            "wall_time": self.wall_offset + time.perf_counter() - self.wall0,
            **fields,
        }
        self.history.append(row)
        if self.est.verbose >= 2:
            note = f" {fields['event']}" if fields.get("event") else ""
            val = f" val_accuracy={row['val_accuracy']:.2%}" if "val_accuracy" in row else ""
            print(
                f"[dasknn] t={row['time']:7.1f}s it={state.iterations_done:6d} epoch={row['epoch']:5.2f} "
                f"loss={row['loss']:.4f} accuracy={row['accuracy']:.2%}{val}{note}"
            )
        stop = call(self.callbacks, "on_evaluation", self.est, row)
        r = self.restorer
        if r is not None and r.no_change == 0 and r.best_iteration == state.iterations_done:
            self.best_state = state.copy()  # the monitored value improved at this evaluation
        if stop and not self.stopped_by:
            self.stopped_by = f"a callback stopped the fit at iteration {state.iterations_done}"
        target = self.est.target_accuracy
        metric = "val_accuracy" if "val_accuracy" in row else "accuracy"
        reached = target is not None and row[metric] >= target
        return stop or reached

    def recoveries(self, trace: pd.DataFrame, config: RunConfig) -> str:
        """The Dask engine's recoveries from lost workers in this run, as events and a history note."""
        notes = []
        for r in trace.attrs.get("recoveries") or []:
            roles = r.get("roles")
            roles = ", ".join(roles) if isinstance(roles, (list, tuple)) else str(roles)
            why = (
                f"lost {r.get('worker')} ({roles}): {r.get('iterations_redone')} iterations redone, "
                f"n_groups {r.get('n_groups_before')} -> {r.get('n_groups_after')}"
            )
            self.events.append(
                {"phase": "train", "action": "recovery", "n_groups": r.get("n_groups_after"), "lr": config.lr,
                 "momentum": config.momentum, "reason": why}
            )  # fmt: skip
            notes.append(f"recovery: {why}")
        return "; ".join(notes)

    def restore(self, ckpt: checkpoint.Checkpoint) -> dict[str, Any]:
        """Take history, events and trace from a checkpoint; returns its loop state."""
        tables = ckpt.tables
        self.history = tables["history"].to_dict("records") if "history" in tables else []
        self.events = tables["events"].to_dict("records") if "events" in tables else []
        self.traces = [tables["trace"]] if "trace" in tables and len(tables["trace"]) else []
        if self.history:
            self.wall_offset = float(self.history[-1]["wall_time"])
        return dict(ckpt.meta.get("loop", {}))

    def full_trace(self) -> pd.DataFrame:
        frames = [t for t in self.traces if len(t)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"t_end": []})

    def save(self, state: TrainState, loop: dict[str, Any]) -> Path | None:
        """A checkpoint of `state` with the loop state and the records; None without a directory."""
        if self.checkpoint_dir is None:
            return None
        tables = {
            "history": pd.DataFrame(self.history),
            "events": pd.DataFrame(self.events),
            "trace": self.full_trace(),
        }
        self.last_checkpoint = checkpoint.save(
            self.checkpoint_dir, state, {**self.meta, "loop": loop}, tables, keep=CHECKPOINTS_KEPT
        )
        return self.last_checkpoint

    # -- fixed knobs -----------------------------------------------------------------------------
    def fixed(self, start: TrainState, config: RunConfig, loop: dict[str, Any] | None = None) -> dict:
        """Train with `config` (n_groups, lr, momentum fixed; lr only lowered by rollbacks) from `start`.

        `loop`: a checkpoint's loop state, to continue that fit where it stopped (`restore` first).
        """
        est = self.est
        state = start
        if loop is None:
            loop = {
                "kind": "fixed",
                "elapsed": self.history[-1]["time"] if self.history else 0.0,
                "first_iteration": state.iterations_done,
                "rollbacks_in_row": 0,
                "checkpoint_epoch": math.floor(state.batches_done / self.nb),
                "finished": False,
            }
            done = self.record(state, loop["elapsed"], phase="start", lr=config.lr, event="start")
            loop["finished"] = done
        else:
            config = RunConfig(**loop["config"])
        chunk = max(2.0, (est.time_budget or 60.0) / 20)
        if "time_end" not in loop:
            loop["time_end"] = None if est.time_budget is None else loop["elapsed"] + est.time_budget
        time_end = loop["time_end"]
        while not loop["finished"]:
            good = state
            state, config = self._chunk(state, config, loop, chunk)
            epoch = math.floor(state.batches_done / self.nb)
            spent = state.iterations_done - loop["first_iteration"]
            loop["finished"] = (
                loop["finished"]
                or (time_end is not None and loop["elapsed"] >= time_end)
                or (self.max_iterations is not None and spent >= self.max_iterations)
            )
            if loop["finished"] or (state is not good and epoch > loop["checkpoint_epoch"]):
                loop["checkpoint_epoch"], loop["final_saved"] = epoch, loop["finished"]
                self.save(state, {**loop, "config": asdict(config)})
        if not loop.get("final_saved"):
            loop["final_saved"] = True
            self.save(state, {**loop, "config": asdict(config)})
        self.net.set_params(state.params)
        full = self.full_trace()
        train = full[full["phase"] == "train"] if "phase" in full else full
        runs = {c: rows.drop(columns=["phase"]) for c, rows in _by_config(train, config).items()}
        events = pd.DataFrame(self.events)
        loop["config"] = asdict(config)
        return {
            "state": state,
            "trace": full,
            "decisions": events,
            "runs": runs,
            "config": config,
            "loop": loop,
        }

    def _chunk(self, state: TrainState, config: RunConfig, loop: dict, chunk: float):
        """One engine run from `state`; on divergence roll back and lower lr. Returns (state, config)."""
        est = self.est
        time_end = loop["time_end"]
        seconds = chunk if time_end is None else min(chunk, time_end - loop["elapsed"])
        iterations = self.nb
        if self.max_iterations is not None:
            spent = state.iterations_done - loop["first_iteration"]
            iterations = min(iterations, self.max_iterations - spent)
        budget = Budget(seconds=seconds, iterations=iterations)
        result = None
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            try:
                result = self.engine.run(self.net, self.X, self.y, config, budget, start=state.copy())
            except FloatingPointError:
                pass
        trace = result.trace.copy() if result is not None else pd.DataFrame({"t_start": [], "t_end": []})
        t0 = _clock(state) or 0.0
        end_clock = None if result is None else _clock(result.state)
        if end_clock is not None:
            duration = end_clock - t0
        else:
            duration = float(trace["t_end"].max()) if len(trace) else seconds
        if len(trace):
            trace[["t_start", "t_end"]] += loop["elapsed"] - (t0 if end_clock is not None else 0.0)
        loop["elapsed"] += duration
        diverged = (
            result is None
            or bool(trace.attrs.get("diverged"))
            or (len(trace) > 0 and not np.isfinite(trace["loss"].to_numpy(dtype=float)).all())
            or not checkpoint.healthy(result.state)
        )
        scores = None
        if not diverged:
            with np.errstate(over="ignore", invalid="ignore"):
                scores = self.evaluate(result.state)
            diverged = not scores["loss"] <= self.loss_limit
        trace["phase"] = "rolled_back" if diverged else "train"
        self.traces.append(trace)
        if not diverged:
            loop["rollbacks_in_row"] = 0
            event = self.recoveries(trace, config)
            loop["finished"] = self.record(result.state, loop["elapsed"], scores, lr=config.lr, event=event)
            return result.state, config
        loop["rollbacks_in_row"] += 1
        if loop["rollbacks_in_row"] > MAX_ROLLBACKS:
            raise FloatingPointError(
                f"training diverged {MAX_ROLLBACKS + 1} times in a row from iteration "
                f"{state.iterations_done}, down to lr={config.lr:g}; check the data and the net"
            )
        new = config.with_(lr=config.lr / 10)
        why = f"diverged at lr={config.lr:g}: back to the state of iteration {state.iterations_done}, lr / 10"
        self.events.append(
            {
                "phase": "train",
                "action": "rollback",
                "n_groups": new.n_groups,
                "lr": new.lr,
                "momentum": new.momentum,
                "time": loop["elapsed"],
                "iteration": state.iterations_done,
                "diverged": True,
                "chosen": True,
                "reason": why,
            }
        )
        if est.verbose >= 2:
            print(f"[dasknn] {why}")
        event = f"rollback: lr {config.lr:g} -> {new.lr:g}"
        loop["finished"] = self.record(state, loop["elapsed"], lr=new.lr, event=event)
        return state, new

    # -- Omnivore's optimizer --------------------------------------------------------------------
    def optimize(self, start: TrainState, loop: dict[str, Any] | None = None) -> dict:
        """Omnivore's Algorithm 1 picks the "auto" knobs; a checkpoint after every train epoch.

        `loop`: a checkpoint's optimizer session (`restore` first) to go on from. The optimizer rolls
        back diverged train runs itself (last good state, lr / 10; `optimizer._Session.train`).
        """
        from dasknn.estimator_params import optimizer_class

        est = self.est
        options: dict[str, Any] = {**(est.optimizer_options or {}), "verbose": max(0, est.verbose - 1)}
        # training is evaluated (and stops at the target) at least once per pass over the data, as
        # the fixed loop's chunks are: the two report time to accuracy at the same granularity
        if est.optimizer == "online":
            options.setdefault("segment_iterations", min(self.nb, 200))
            options.setdefault("target_accuracy", est.target_accuracy)
        else:
            options.setdefault("stop_check_iterations", self.nb)
        for knob in ("n_groups", "learning_rate", "momentum"):
            if getattr(est, knob) != "auto":
                options[knob] = getattr(est, knob)
        if self.selection_score is not None:  # probes judged on the selection part, not on their batches
            options["probe_score"] = _ReportingScore(self, self.selection_score)
        optimizer = optimizer_class(est.optimizer)(self.engine, **options)
        final: dict[str, Any] = {"session": loop}
        if loop is not None and loop.get("finished"):  # the checkpointed fit had ended
            self.net.set_params(start.params)
            config, decisions = RunConfig(**loop["config"]), pd.DataFrame(self.events)
            return {
                "state": start,
                "trace": self.full_trace(),
                "decisions": decisions,
                "config": config,
                "loop": loop,
            }

        def should_stop(state: TrainState, trace: pd.DataFrame) -> bool:
            return self.record(state, float(trace["t_end"].max()) if len(trace) else 0.0)

        def on_epoch(state: TrainState, session: dict, trace: pd.DataFrame, decisions: pd.DataFrame) -> None:
            final["session"] = session
            self.traces, self.events = [trace], decisions.to_dict("records")
            self.save(state, session)

        resume = None
        if loop is not None and not loop.get("finished"):
            resume = {**loop, "trace": self.full_trace(), "decisions": pd.DataFrame(self.events)}
        elif not self.history:  # the curve starts at the starting weights, time 0
            self.record(
                start if start is not None else TrainState.from_net(self.net),
                0.0,
                phase="start",
                event="start",
            )
        result = optimizer.optimize(
            self.net,
            self.X,
            self.y,
            batch_size=est.batch_size,
            weight_decay=float(est.weight_decay),
            seed=est.random_state,
            time_budget=est.time_budget,
            max_iterations=self.max_iterations,
            should_stop=should_stop,
            start=start,
            on_epoch=None if self.checkpoint_dir is None else on_epoch,
            resume=resume,
        )
        if not self.history or self.history[-1]["iteration"] != result.state.iterations_done:
            t_end = float(result.trace["t_end"].max()) if len(result.trace) else 0.0
            self.record(result.state, t_end, phase="end", event="end")  # the model returned, even mid-search
        session = {**(final["session"] or {"kind": "auto"}), "finished": True}
        session["config"] = asdict(result.chosen)
        self.traces, self.events = [result.trace], result.decisions.to_dict("records")
        if self.checkpoint_dir is not None:
            self.save(result.state, session)
        return {
            "state": result.state,
            "trace": result.trace,
            "decisions": result.decisions,
            "config": result.chosen,
            "loop": session,
        }


def _by_config(trace: pd.DataFrame, config: RunConfig) -> dict[RunConfig, pd.DataFrame]:
    """The fixed loop's trace rows per learning rate (a rollback changes it), keyed by RunConfig."""
    if not len(trace) or "lr" not in trace:
        return {}
    return {config.with_(lr=float(lr)): rows for lr, rows in trace.groupby("lr", sort=False)}


def runs_by_config(trace: pd.DataFrame, decisions: pd.DataFrame, seed: int) -> dict:
    """The optimizer's runs keyed (n_groups, lr, momentum, seed), the longest run for each config,
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
