"""Callbacks of `DistributedCNN.fit`: hooks at the start, at every evaluation and at the end of a fit.

A callback is any object with some of these methods (`Callback` has them all, doing nothing):

- `on_fit_begin(est)`: before the first evaluation;
- `on_evaluation(est, record)`: after each evaluation, with its history row (`time`, `iteration`,
  `epoch`, `loss`, `accuracy`, and with validation data `val_loss`, `val_accuracy`; `phase`,
  `lr`, `event`); returning True stops the fit cleanly after this evaluation;
- `on_evaluated_state(est, record, state)`: after `on_evaluation`, with the evaluated `TrainState`
  (EarlyStopping keeps its best one);
- `on_progress(est, info)`: while the tuner searches (no evaluation then), with `time`,
  `epoch` and `phase`, so that progress shows between evaluations;
- `on_cluster_change(est, change)`: after an engine run during which workers joined, left
  (retired gracefully) or were lost, once per change, with `time` (the fit's clock), `action`
  ("join", "leave", "lost"), `workers`, `n_workers` (the conv workers after it) and `run`;
- `on_fit_end(est)`: after the last evaluation, also when the fit raised.

Shipped: `EarlyStopping` (sklearn's `n_iter_no_change` / `tol`, restoring the best model),
`ModelCheckpoint` (the best model, or every N evaluations, saved with `DistributedCNN.save`),
`ProgressBar` (tqdm) and `CSVLogger`. The same conventions as Keras' and skorch's callbacks.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "CSVLogger",
    "Callback",
    "EarlyStopping",
    "ModelCheckpoint",
    "ProgressBar",
    "call",
    "stop_requests",
]


class Callback:
    """A callback that does nothing: subclass it and override the hooks you need.

    Examples
    --------
    >>> from dasknn.callbacks import Callback
    >>> class PrintAccuracy(Callback):
    ...     def on_evaluation(self, est, record):
    ...         print(record["iteration"], record["accuracy"])
    ...         return record["accuracy"] > 0.99          # True stops the fit
    >>> est = DistributedCNN(callbacks=[PrintAccuracy()])   # doctest: +SKIP
    """

    def on_fit_begin(self, est) -> None:
        """Before the first evaluation of a fit."""

    def on_evaluation(self, est, record: dict[str, Any]) -> bool | None:
        """After each evaluation; True stops the fit."""
        return None

    def on_progress(self, est, info: dict[str, Any]) -> None:
        """Between evaluations, while the tuner searches."""

    def on_cluster_change(self, est, change: dict[str, Any]) -> None:
        """After a run in which workers joined, left or were lost: one call per change."""

    def on_fit_end(self, est) -> None:
        """After the fit's last evaluation (also when it raised)."""


def call(callbacks, hook: str, *args) -> bool:
    """Call `hook` on every callback that has it; True when any returned True (a stop request)."""
    stop = False
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            stop = bool(method(*args)) or stop
    return stop


def stop_requests(callbacks, est, record: dict[str, Any]) -> str:
    """Call every callback's `on_evaluation`; the first one that asked to stop, described by its
    `stop_reason`, or as "callback <class> returned True"; "" when none did."""
    reason = ""
    for cb in callbacks:
        method = getattr(cb, "on_evaluation", None)
        if method is not None and method(est, record) and not reason:
            reason = getattr(cb, "stop_reason", None) or f"callback {type(cb).__name__} returned True"
    return reason


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


class EarlyStopping(Callback):
    """Stop a fit when a metric has stopped improving, and keep its best weights.

    scikit-learn's ``MLPClassifier(early_stopping=True)`` rule, counted in evaluations;
    ``DistributedCNN(early_stopping=True)`` adds one on the held-out loss.

    Parameters
    ----------
    monitor : {"val_loss", "val_accuracy", "loss", "accuracy"}, default "val_loss"
        The history column watched: a loss is better lower, an accuracy higher.
    n_iter_no_change : int, default 10
        Evaluations without an improvement before the fit stops.
    tol : float, default 1e-4
        The least change that counts as an improvement.
    restore_best : bool, default True
        End the fit with the weights of the best evaluation (skorch's ``load_best``).

    Attributes
    ----------
    best : float or None
        The best value of ``monitor`` in this fit.
    best_iteration : int or None
        The iteration of that evaluation.
    stopped_iteration : int or None
        The iteration at which this callback stopped the fit (None: it did not).

    Examples
    --------
    >>> from dasknn.callbacks import EarlyStopping
    >>> stop = EarlyStopping(monitor="val_accuracy", n_iter_no_change=5)
    >>> est = DistributedCNN(validation_fraction=0.2, callbacks=[stop])   # doctest: +SKIP
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        n_iter_no_change: int = 10,
        tol: float = 1e-4,
        restore_best: bool = True,
    ) -> None:
        if monitor not in ("val_loss", "val_accuracy", "loss", "accuracy"):
            raise ValueError(
                f"EarlyStopping: monitor must be val_loss, val_accuracy, loss or accuracy, got {monitor!r}"
            )
        if not (isinstance(n_iter_no_change, int) and n_iter_no_change >= 1):
            raise ValueError(f"n_iter_no_change must be an integer >= 1, got {n_iter_no_change!r}")
        if not (isinstance(tol, (int, float)) and tol >= 0):
            raise ValueError(f"tol must be a number >= 0, got {tol!r}")
        self.monitor, self.n_iter_no_change, self.tol = monitor, n_iter_no_change, float(tol)
        self.restore_best = restore_best
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None
        self.best_iteration: int | None = None
        self.no_change = 0
        self.stopped_iteration: int | None = None
        self.best_state = None  # with restore_best: the state of the best evaluation

    def on_fit_begin(self, est) -> None:
        self._reset()

    @property
    def stop_reason(self) -> str:
        """Why this callback stopped the fit (for `stopped_by_`)."""
        return (
            f"EarlyStopping: {self.monitor} did not improve by more than tol={self.tol:g} in "
            f"{self.n_iter_no_change} evaluations"
        )

    def improved(self, value: float) -> bool:
        """Whether `value` beats the best so far by more than tol."""
        if self.best is None:
            return True
        if self.monitor.endswith("loss"):
            return value < self.best - self.tol
        return value > self.best + self.tol

    def on_evaluation(self, est, record: dict[str, Any]) -> bool:
        value = record.get(self.monitor)
        if not _finite(value):
            return False
        if self.improved(value):
            self.best, self.best_iteration, self.no_change = float(value), int(record["iteration"]), 0
            return False
        self.no_change += 1
        if self.no_change >= self.n_iter_no_change:
            self.stopped_iteration = int(record["iteration"])
            return True
        return False

    def on_evaluated_state(self, est, record: dict[str, Any], state) -> None:
        """Keep the evaluated state when it is the best so far (`restore_best`; skorch's `load_best`)."""
        if self.restore_best and self.no_change == 0 and self.best_iteration == record["iteration"]:
            self.best_state = state.copy()


class ProgressBar(Callback):
    """A progress bar over the fit's budgets, the one ``verbose=1`` shows.

    A tqdm bar (a widget in notebooks) over the time budget and ``max_epochs``, whichever ends the
    fit first. On ``engine="simulated"`` it says so and counts simulated seconds ("sim s"). It
    moves at every evaluation and while the tuner searches; its postfix shows the phase, the
    training loss and the held-out accuracy (the training accuracy without validation data), and,
    once the cluster has changed under the fit, the workers there are now; each change (a worker
    joined, left or was lost) is also written above the bar. When ``file`` is not a terminal
    (output redirected to a file or a log) there is no bar but one line per evaluation, at most
    one every ``LOG_INTERVAL`` seconds, and the last one at the end.

    Parameters
    ----------
    file : file object, optional
        Where to draw; default ``sys.stderr``.

    Examples
    --------
    >>> from dasknn.callbacks import ProgressBar
    >>> est = DistributedCNN(callbacks=[ProgressBar()])   # doctest: +SKIP
    """

    LOG_INTERVAL = 10.0

    def __init__(self, file=None) -> None:
        self.file = file
        self.bar = None
        self.workers: int | None = None

    def on_fit_begin(self, est) -> None:
        from tqdm.auto import tqdm

        self.close()
        simulated = getattr(est, "engine", "dask") == "simulated"
        self.limits: dict[str, tuple[float, str]] = {}
        if getattr(est, "max_epochs", None) is not None or est.time_budget is None:
            self.limits["epoch"] = (float(getattr(est, "max_epochs", None) or 1.0), "epoch")
        if est.time_budget is not None:
            self.limits["time"] = (float(est.time_budget), "sim s" if simulated else "s")
        self.origin: dict[str, float] = {}
        self.done = dict.fromkeys(self.limits, 0.0)
        self.workers = None
        file = self.file if self.file is not None else sys.stderr
        desc = "dasknn (simulated)" if simulated else "dasknn"
        if not (_is_terminal(file) or _in_notebook()):
            self.bar = _LogLines(file, desc, self.LOG_INTERVAL)
            return
        self.bar = tqdm(
            total=1.0,
            unit=self._amounts(),
            desc=desc,
            file=file,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {unit} [{elapsed}{postfix}]",
            dynamic_ncols=True,
            leave=True,
        )

    def _amounts(self) -> str:
        """What each budget has done: "0.5/2 epoch, 3.1/60 s"."""
        return ", ".join(f"{self.done[k]:.1f}/{total:g} {unit}" for k, (total, unit) in self.limits.items())

    def _show(self, postfix: str, values: dict[str, Any], evaluation: bool = False) -> None:
        """The postfix and the budgets' progress drawn at once: one write."""
        if self.bar is None:
            return
        for key in self.limits:
            value = values.get(key)
            if _finite(value):
                origin = self.origin.setdefault(key, float(value))
                self.done[key] = max(self.done[key], float(value) - origin)
        fraction = min(1.0, max(self.done[k] / total for k, (total, _) in self.limits.items()))
        self.bar.unit = self._amounts()
        self.bar.set_postfix_str(postfix, refresh=False)
        if isinstance(self.bar, _LogLines):
            self.bar.n = fraction
            if evaluation:
                self.bar.line()
        elif fraction > self.bar.n:
            self.bar.update(fraction - self.bar.n)  # draws, when its interval has passed
        else:
            self.bar.refresh()

    def on_progress(self, est, info: dict[str, Any]) -> None:
        self._show(f"phase={info.get('phase', 'search')}", info)

    def on_evaluation(self, est, record: dict[str, Any]) -> bool:
        parts = [f"phase={record.get('phase', 'train')}", f"loss={record['loss']:.3f}"]
        if _finite(record.get("val_accuracy")):
            parts.append(f"val_acc={record['val_accuracy']:.2%}")
        else:
            parts.append(f"acc={record['accuracy']:.2%}")
        if self.workers is not None:
            parts.append(f"workers={self.workers}")
        self._show(", ".join(parts), record, evaluation=True)
        return False

    def on_cluster_change(self, est, change: dict[str, Any]) -> None:
        if self.bar is None:
            return
        verb = {"join": "joined", "leave": "left", "lost": "lost"}.get(change["action"], change["action"])
        self.workers = change["n_workers"] if change["n_workers"] >= 0 else self.workers
        self.bar.write(
            f"t={change['time']:.1f}: worker {change['workers']} {verb}; {change['n_workers']} workers",
            file=self.file if self.file is not None else sys.stderr,
        )
        self.bar.set_postfix_str(f"workers={self.workers}, {verb} {change['workers']}", refresh=True)

    def on_fit_end(self, est) -> None:
        self.close()

    def close(self) -> None:
        """The bar drawn as it ends (the fraction of the budgets done: 100% when one ran out), closed."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _LogLines:
    """ProgressBar's output where there is no terminal: a line per evaluation, at most one every
    `interval` seconds, the last one at `close` unless already written; never a line twice."""

    def __init__(self, file, desc: str, interval: float) -> None:
        self.file, self.desc, self.interval = file, desc, interval
        self.n, self.unit, self.postfix = 0.0, "", ""
        self.started = time.monotonic()
        self.written_at: float | None = None
        self.pending = False

    def set_postfix_str(self, postfix: str, refresh: bool = False) -> None:
        self.postfix = postfix

    def line(self, force: bool = False) -> None:
        """The evaluation just shown, written when the interval since the last line has passed."""
        now = time.monotonic()
        self.pending = True
        if force or self.written_at is None or now - self.written_at >= self.interval:
            from tqdm.std import tqdm

            elapsed = tqdm.format_interval(now - self.started)
            self.file.write(f"{self.desc}: {self.n:4.0%} {self.unit} [{elapsed}, {self.postfix}]\n")
            self.file.flush()
            self.written_at, self.pending = now, False

    def write(self, text: str, file=None) -> None:
        self.file.write(text + "\n")

    def close(self) -> None:
        if self.pending:
            self.line(force=True)


def _is_terminal(file) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (OSError, ValueError):
        return False


def _in_notebook() -> bool:
    """tqdm.auto draws a widget (a Jupyter notebook), whose updates cost no log lines."""
    import warnings

    from tqdm.std import tqdm as plain

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tqdm.autonotebook import tqdm as auto
    return auto is not plain


class CSVLogger(Callback):
    """Write each evaluation's history row to a CSV file as it happens.

    The columns are fixed (``COLUMNS``; empty where a fit has no such value), so the file can be
    read while the fit runs.

    Parameters
    ----------
    path : str or path
        The CSV file.
    append : bool, default False
        Add to the file (warm starts) instead of writing it afresh at each fit.

    Examples
    --------
    >>> from dasknn.callbacks import CSVLogger
    >>> est = DistributedCNN(callbacks=[CSVLogger("evaluations.csv")])   # doctest: +SKIP
    """

    COLUMNS = ("time", "wall_time", "iteration", "epoch", "phase", "loss", "accuracy", "val_loss",
               "val_accuracy", "lr", "event")  # fmt: skip

    def __init__(self, path, append: bool = False) -> None:
        self.path, self.append = Path(path), append
        self._file = None

    def on_fit_begin(self, est) -> None:
        self.on_fit_end(est)
        fresh = not self.append or not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "w" if not self.append else "a", newline="")  # noqa: SIM115
        self._writer = csv.DictWriter(self._file, fieldnames=self.COLUMNS, extrasaction="ignore")
        if fresh:
            self._writer.writeheader()

    def on_evaluation(self, est, record: dict[str, Any]) -> bool:
        if self._file is not None:
            self._writer.writerow({k: record.get(k, "") for k in self.COLUMNS})
            self._file.flush()
        return False

    def on_fit_end(self, est) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


LOWER_IS_BETTER = ("loss", "val_loss")
"""History columns where a lower value is better (the others: higher)."""


class ModelCheckpoint(Callback):
    """Save the model during a fit: the best by a metric, or every N evaluations.

    Keras' ``ModelCheckpoint`` and skorch's ``Checkpoint``. Each save is ``DistributedCNN.save``
    of the evaluated state, a folder that ``DistributedCNN.load`` reads, replacing the folder it
    writes. The saved models hold no callbacks, security or validation data.

    Parameters
    ----------
    path : str or path
        The folder to save to. It may name the history row's fields, e.g.
        ``"models/it{iteration}"``, so that each save goes to its own folder.
    monitor : {"val_loss", "val_accuracy", "loss", "accuracy"}, default "val_loss"
        Save when this history column is the best so far (a loss lower, an accuracy higher).
    every : int, optional
        Save every this many evaluations instead (``monitor`` is then not used).

    Attributes
    ----------
    best : float or None
        The best value of `monitor` seen in this fit.
    best_iteration : int or None
        The iteration of that evaluation.
    saved : list of Path
        Each folder written in this fit, in order.

    Examples
    --------
    >>> from dasknn.callbacks import ModelCheckpoint
    >>> best = ModelCheckpoint("best-model", monitor="val_accuracy")
    >>> est = DistributedCNN(validation_fraction=0.2, callbacks=[best])   # doctest: +SKIP
    >>> est.fit(X, y)                                                     # doctest: +SKIP
    >>> model = DistributedCNN.load("best-model")                         # doctest: +SKIP
    """

    def __init__(self, path, monitor: str = "val_loss", every: int | None = None) -> None:
        if monitor not in ("val_loss", "val_accuracy", "loss", "accuracy"):
            raise ValueError(
                f"ModelCheckpoint: monitor must be val_loss, val_accuracy, loss or accuracy, got {monitor!r}"
            )
        if every is not None and not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
            raise ValueError(f"ModelCheckpoint: every must be None or an integer >= 1, got {every!r}")
        self.path, self.monitor, self.every = path, monitor, every
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None
        self.best_iteration: int | None = None
        self.saved: list[Path] = []
        self.evaluations = 0

    def on_fit_begin(self, est) -> None:
        self._reset()

    def _due(self, record: dict[str, Any]) -> bool:
        if self.every is not None:
            return self.evaluations % self.every == 0
        if self.monitor not in record:
            raise ValueError(
                f"ModelCheckpoint: the history has no {self.monitor} (it has {sorted(record)}); give "
                "validation data or monitor='loss' or 'accuracy'"
            )
        value = record[self.monitor]
        if not _finite(value):
            return False
        lower = self.monitor in LOWER_IS_BETTER
        if self.best is not None and not (value < self.best if lower else value > self.best):
            return False
        self.best, self.best_iteration = float(value), int(record["iteration"])
        return True

    def on_evaluation(self, est, record: dict[str, Any]) -> bool:
        from dasknn.saving import save

        self.evaluations += 1
        if self._due(record):
            path = Path(str(self.path).format(**record))
            self.saved.append(save(est, path, overwrite=True, warn=False))
        return False
