"""Time-to-accuracy reports as pandas DataFrames, and the plots that go with them.

Two rules for when a run "reached" an accuracy x:
- "first": the first evaluation at or above x (DAWNBench's rule);
- "median5": the first evaluation at which the median of the last 5 evaluations is at or above x
  (Crossbow's TTA(x), Koliousis et al. §5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

RULES = ("first", "median5")
DEFAULT_THRESHOLDS = (0.9, 0.95, 0.98, 0.99)


METRICS = ("val_accuracy", "accuracy")
"""Held-out accuracy (validation data, never trained on) and training accuracy (training samples)."""
METRIC_LABELS = {"val_accuracy": "held-out accuracy", "accuracy": "training accuracy"}


def _evaluations(history, metric: str = "accuracy") -> pd.DataFrame:
    df = history if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    missing = {"time", metric} - set(df.columns)
    if missing:
        raise ValueError(f"history needs columns 'time' and {metric!r}; missing {sorted(missing)}")
    return df.dropna(subset=[metric]).sort_values("time", kind="stable").reset_index(drop=True)


def time_to_accuracy(
    history,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    rule: str = "first",
    run: str = "run",
    metric: str = "accuracy",
) -> pd.DataFrame:
    """The time a run took to reach each accuracy, from its history.

    Parameters
    ----------
    history : pandas.DataFrame or list of dict
        One row per evaluation, with at least ``time`` and the ``metric`` column, as a fit's
        ``history_``; ``iteration`` and ``epoch`` are reported when present.
    thresholds : sequence of float, default (0.9, 0.95, 0.98, 0.99)
        The accuracies.
    rule : {"first", "median5"}, default "first"
        Reached at the first evaluation at or above (DAWNBench), or when the median of the last
        five is (Crossbow).
    run : str, default "run"
        The run's name in the table.
    metric : {"accuracy", "val_accuracy"}, default "accuracy"
        Training or held-out accuracy.

    Returns
    -------
    pandas.DataFrame
        One row per threshold: ``run``, ``metric``, ``threshold``, ``rule``, ``reached``, and
        the ``seconds``, ``iterations`` and ``epochs`` it took (NaN when never reached).

    Examples
    --------
    >>> from dasknn.reports import time_to_accuracy
    >>> history = [{"time": 1.0, "accuracy": 0.8}, {"time": 2.0, "accuracy": 0.93}]
    >>> time_to_accuracy(history, [0.9, 0.99])[["threshold", "reached", "seconds"]]
       threshold  reached  seconds
    0       0.90     True      2.0
    1       0.99    False      NaN
    """
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    ev = _evaluations(history, metric)
    acc = ev[metric].to_numpy(dtype=float)
    score = acc if rule == "first" else ev[metric].rolling(5, min_periods=5).median().to_numpy()
    rows = []
    for x in thresholds:
        hits = np.flatnonzero(score >= x)
        row = {"run": run, "metric": metric, "threshold": float(x), "rule": rule, "reached": bool(hits.size)}
        first = ev.iloc[hits[0]] if hits.size else None
        for col in ("time", "iteration", "epoch"):
            value = np.nan
            if first is not None and col in ev.columns:
                value = first[col]
            row["seconds" if col == "time" else col + "s"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def fit_report(
    history,
    thresholds: Iterable[float] | None,
    rule: str,
    target_accuracy: float | None,
    run: str,
    time_unit: str,
) -> pd.DataFrame:
    """Time to accuracy of one fit: held-out rows (when it had validation data), then training.

    `thresholds` None: `DEFAULT_THRESHOLDS` and `target_accuracy`; `time_unit` ("s" or "simulated
    s") goes to `attrs["time_unit"]`."""
    if thresholds is None:
        extra = [target_accuracy] if target_accuracy else []
        thresholds = sorted({*DEFAULT_THRESHOLDS, *extra})
    history = pd.DataFrame(history)
    metrics = ["accuracy"]
    if "val_accuracy" in history and history["val_accuracy"].notna().any():
        metrics.insert(0, "val_accuracy")
    tables = [time_to_accuracy(history, thresholds, rule, run=run, metric=m) for m in metrics]
    report = pd.concat(tables, ignore_index=True)
    report.attrs["time_unit"] = time_unit
    return report


def compare_runs(
    histories: Mapping[str, object],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    rule: str = "first",
    baseline: str | None = None,
    metric: str = "accuracy",
) -> pd.DataFrame:
    """Time to accuracy of several runs side by side, with the speedup over `baseline` (a run name)."""
    table = pd.concat(
        [time_to_accuracy(h, thresholds, rule, run=name, metric=metric) for name, h in histories.items()],
        ignore_index=True,
    )
    if baseline is not None:
        if baseline not in histories:
            raise ValueError(f"baseline {baseline!r} is not one of the runs {list(histories)}")
        base = table[table["run"] == baseline].set_index("threshold")["seconds"]
        table["speedup"] = table["threshold"].map(base) / table["seconds"]
    return table


def search_spans(
    trace: pd.DataFrame | None, decisions: pd.DataFrame | None = None
) -> list[tuple[float, float]]:
    """The tuner's search phases as (start, end) times on the trace's clock.

    A search is a stretch of probe runs (the runs that `decisions` rows "probe" and "extend" name,
    or else the trace's rows of phase "search") with no training run between them; the time spent
    scoring probes between its runs belongs to it.
    """
    if trace is None or not len(trace) or "run" not in trace:
        return []
    runs = trace.groupby("run").agg(start=("t_start", "min"), end=("t_end", "max")).sort_values("start")
    if decisions is not None and len(decisions) and {"run", "action"} <= set(decisions.columns):
        probing = decisions[decisions["action"].isin(["probe", "extend"])]["run"].dropna()
        searched = set(probing.astype(int))
    elif "phase" in trace:
        searched = set(trace.loc[trace["phase"] == "search", "run"].astype(int))
    else:
        return []
    spans: list[tuple[float, float]] = []
    previous = False
    for run_id, row in runs.iterrows():
        searching = int(run_id) in searched
        if searching and previous:
            spans[-1] = (spans[-1][0], float(row["end"]))
        elif searching:
            spans.append((float(row["start"]), float(row["end"])))
        previous = searching
    return spans


def broken_line(times, values, spans: Sequence[tuple[float, float]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The points of a curve through evaluations, with NaN between two that a span separates.

    A line is then drawn only between consecutive evaluations with no search between them, never
    across a stretch where nothing was evaluated because the tuner was searching."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    xs, ys = [], []
    for i in range(len(t)):
        if i and any(a < t[i] and b > t[i - 1] for a, b in spans):
            xs.append(np.nan)
            ys.append(np.nan)
        xs.append(t[i])
        ys.append(v[i])
    return np.asarray(xs), np.asarray(ys)


def _figure(for_file: bool, rows: int = 1):
    """(figure, its axes, one per row, sharing x): for a file a bare matplotlib Figure (no pyplot,
    no backend chosen, nothing left open); else a pyplot figure in the process's backend."""
    size = (6.4, 4.0 if rows == 1 else 6.4)
    if for_file:
        from matplotlib.figure import Figure

        fig = Figure(figsize=size)
        axes = fig.subplots(rows, 1, sharex=True, squeeze=False)
    else:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(rows, 1, sharex=True, squeeze=False, figsize=size)
    return fig, list(axes[:, 0])


def plot_accuracy(
    histories: Mapping[str, object],
    path: str | Path | None = None,
    title: str = "Accuracy over time",
    simulated: bool = False,
    metric: str | None = None,
    target: float | None = None,
    search: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    decisions: Mapping[str, pd.DataFrame] | None = None,
):
    """Plot accuracy over time for each run, and below it the training loss (``dasknn train``'s
    plot): a marker per evaluation, each change of η and each rollback marked.

    Parameters
    ----------
    histories : mapping of str to history
        Each run's name and its history (a fit's ``history_``, or a DataFrame of it).
    path : str or path, optional
        Save the figure there as PNG, drawn without pyplot: the process's backend (a notebook's
        inline one) is left as it is and no figure stays open. Without it, a pyplot figure in the
        current backend, which a notebook shows.
    title : str, default "Accuracy over time"
    simulated : bool, default False
        The times are simulated seconds (the axis says so).
    metric : {"val_accuracy", "accuracy"}, optional
        Held-out or training accuracy; default held-out when every run has it.
    target : float, optional
        A target accuracy, drawn as a dashed line.
    search, decisions : mapping of run name, optional
        Each run's search spans (shaded) and ``decisions_`` (whose rollbacks are marked).

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> from dasknn.reports import plot_accuracy
    >>> plot_accuracy({"lenet": est.history_}, "accuracy.png", simulated=True)   # doctest: +SKIP
    """
    frames = {
        name: h if isinstance(h, pd.DataFrame) else pd.DataFrame(list(h)) for name, h in histories.items()
    }
    if metric is None:
        held_out = all("val_accuracy" in f and f["val_accuracy"].notna().any() for f in frames.values())
        metric = "val_accuracy" if frames and held_out else "accuracy"
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    with_loss = any("loss" in f and f["loss"].notna().any() for f in frames.values())
    fig, axes = _figure(for_file=path is not None, rows=2 if with_loss else 1)
    ax = axes[0]
    search = search or {}
    labelled = False
    for i, (name, frame) in enumerate(frames.items()):
        color = f"C{i % 10}"
        spans = list(search.get(name, ()))
        for a, b in spans:
            label = None if labelled else "tuner search (no evaluation)"
            for axis in axes:  # labelled in the accuracy panel's legend
                shade = color if len(frames) > 1 else "0.6"
                axis.axvspan(a, b, color=shade, alpha=0.15, lw=0, label=label if axis is ax else None)
            labelled = True
        ev = _evaluations(frame, metric)
        x, y = broken_line(ev["time"], ev[metric] * 100, spans)
        ax.plot(x, y, color=color, lw=1.2, label=name)
        ax.plot(ev["time"], ev[metric] * 100, color=color, ls="none", marker="o", markersize=3.5)
    if target is not None:
        ax.axhline(target * 100, color="k", ls="--", lw=0.9, label=f"target {target:.1%}")
    axes[-1].set_xlabel("simulated seconds" if simulated else "seconds (search included)")
    where = "validation data" if metric == "val_accuracy" else "training samples"
    ax.set_ylabel(f"{METRIC_LABELS[metric]} (%, {where})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if with_loss:
        _plot_loss(axes[1], frames, search, decisions or {})
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def lr_changes(
    history: pd.DataFrame, decisions: pd.DataFrame | None = None
) -> list[tuple[float, float, float]]:
    """(time, η before, η after) at each change of the learning rate: between two evaluations of
    the history (its `lr`, fixed knobs), else at the tuner's chosen decisions (η before NaN at its
    first choice)."""
    if "lr" in history and history["lr"].notna().any():
        rows, first = history.dropna(subset=["lr"]), 1
    elif decisions is not None and len(decisions) and {"chosen", "lr", "time"} <= set(decisions.columns):
        rows, first = decisions[decisions["chosen"].fillna(False).astype(bool)].dropna(subset=["lr"]), 0
    else:
        return []
    lr, t = rows["lr"].to_numpy(dtype=float), rows["time"].to_numpy(dtype=float)
    before = np.concatenate([[np.nan], lr[:-1]])
    return [(t[i], before[i], lr[i]) for i in range(first, len(lr)) if not np.isclose(lr[i], before[i])]


def _plot_loss(ax, frames: Mapping[str, pd.DataFrame], search, decisions) -> None:
    """The training loss of each run at its evaluations, its η changes and its rollbacks marked."""
    marked: set[str] = set()

    def once(label: str) -> str | None:
        seen = label in marked
        marked.add(label)
        return None if seen else label

    losses = []
    for i, (name, frame) in enumerate(frames.items()):
        color = f"C{i % 10}"
        if "loss" not in frame:
            continue
        ev = frame.dropna(subset=["loss"])
        losses.extend(ev["loss"].tolist())
        x, y = broken_line(ev["time"], ev["loss"], list(search.get(name, ())))
        ax.plot(x, y, color=color, lw=1.2)
        ax.plot(ev["time"], ev["loss"], color=color, ls="none", marker="o", markersize=3.0)
        d = decisions.get(name)
        for t, before, after in lr_changes(frame, d):  # rows without a training figure too
            ax.axvline(t, color=color, ls=":", lw=1.0, label=once("η changed"))
            text = f"η→{after:.2g}" if np.isnan(before) else f"η {before:.2g}→{after:.2g}"
            ax.annotate(text, (t, 0.02), xycoords=("data", "axes fraction"),
                        rotation=90, va="bottom", ha="right", fontsize=7, color=color)  # fmt: skip
        if d is not None and len(d) and {"action", "time"} <= set(d.columns):
            for t in d.loc[d["action"] == "rollback", "time"].dropna():
                ax.axvline(float(t), color="C3", ls="--", lw=1.0, label=once("rollback (η lowered)"))
    positive = [v for v in losses if np.isfinite(v) and v > 0]
    if positive and max(positive) / min(positive) > 30:
        ax.set_yscale("log")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    if marked:
        ax.legend(loc="best", fontsize=8)


def format_table(df: pd.DataFrame, columns: Iterable[str] | None = None, na_rep: str = "NaN") -> str:
    """A plain-text table for terminals (no extra dependency); missing values shown as `na_rep`."""
    view = df if columns is None else df[list(columns)]
    return view.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep=na_rep)


DECISION_VIEW = ("phase", "action", "n_groups", "lr", "momentum", "score", "iterations", "time", "chosen")
"""The columns of the tuner's decisions `decisions_table` shows (then the reason)."""


def decisions_table(decisions: pd.DataFrame) -> str:
    """The tuner's decisions for a terminal: the main columns that hold a value (a column empty
    in every row is left out, an empty cell is blank) and the whole reason, left-aligned (every
    column is in the DataFrame / decisions.csv)."""
    view = decisions[[c for c in DECISION_VIEW if c in decisions]].copy()
    view = view.loc[:, view.notna().any()] if len(view) else view
    if "reason" in decisions and len(decisions):
        reasons = decisions["reason"].fillna("").astype(str)
        width = int(reasons.str.len().max())
        # left-aligned, its header too (to_string right-aligns text)
        view["reason".ljust(width)] = reasons.str.ljust(width)
    return format_table(view, na_rep="")
