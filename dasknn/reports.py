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


def _evaluations(history) -> pd.DataFrame:
    df = history if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    missing = {"time", "accuracy"} - set(df.columns)
    if missing:
        raise ValueError(f"history needs columns 'time' and 'accuracy'; missing {sorted(missing)}")
    return df.dropna(subset=["accuracy"]).sort_values("time").reset_index(drop=True)


def time_to_accuracy(
    history, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, rule: str = "first", run: str = "run"
) -> pd.DataFrame:
    """One row per threshold: seconds, iterations and epochs until the run reached it (NaN if never).

    `history` is a DataFrame or a list of dicts with at least `time` and `accuracy` (one row per
    evaluation); `iteration` and `epoch` columns are reported when present.
    """
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    ev = _evaluations(history)
    acc = ev["accuracy"].to_numpy(dtype=float)
    score = acc if rule == "first" else ev["accuracy"].rolling(5, min_periods=5).median().to_numpy()
    rows = []
    for x in thresholds:
        hits = np.flatnonzero(score >= x)
        row = {"run": run, "threshold": float(x), "rule": rule, "reached": bool(hits.size)}
        first = ev.iloc[hits[0]] if hits.size else None
        for col in ("time", "iteration", "epoch"):
            value = np.nan
            if first is not None and col in ev.columns:
                value = first[col]
            row["seconds" if col == "time" else col + "s"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def compare_runs(
    histories: Mapping[str, object],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    rule: str = "first",
    baseline: str | None = None,
) -> pd.DataFrame:
    """Time to accuracy of several runs side by side, with the speedup over `baseline` (a run name)."""
    table = pd.concat(
        [time_to_accuracy(h, thresholds, rule, run=name) for name, h in histories.items()], ignore_index=True
    )
    if baseline is not None:
        if baseline not in histories:
            raise ValueError(f"baseline {baseline!r} is not one of the runs {list(histories)}")
        base = table[table["run"] == baseline].set_index("threshold")["seconds"]
        table["speedup"] = table["threshold"].map(base) / table["seconds"]
    return table


def plot_accuracy(
    histories: Mapping[str, object],
    path: str | Path | None = None,
    title: str = "Accuracy over time",
    simulated: bool = False,
):
    """Accuracy vs seconds for each run; saved to `path` as PNG when given. Returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, history in histories.items():
        ev = _evaluations(history)
        ax.plot(ev["time"], ev["accuracy"], label=name, marker=".", markersize=3)
    ax.set_xlabel("simulated seconds" if simulated else "seconds")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def format_table(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A plain-text table for terminals (no extra dependency)."""
    view = df if columns is None else df[list(columns)]
    return view.to_string(index=False, float_format=lambda v: f"{v:.4g}")


DECISION_VIEW = ("phase", "action", "n_groups", "lr", "momentum", "score", "iterations", "time", "chosen")
"""The columns of the optimizer's decisions `decisions_table` shows (then the reason)."""


def decisions_table(decisions: pd.DataFrame, reason_width: int = 90) -> str:
    """The optimizer's decisions for a terminal: the main columns and the reason, left-aligned and
    cut to `reason_width` characters (the full record is the DataFrame / decisions.csv)."""
    view = decisions[[c for c in DECISION_VIEW if c in decisions]].copy()
    if "reason" in decisions and len(decisions):
        reasons = decisions["reason"].fillna("").astype(str)
        long = reasons.str.len() > reason_width
        cut = reasons.where(~long, reasons.str.slice(0, reason_width - 1) + "…")
        width = int(cut.str.len().max())
        # left-aligned, its header too (to_string right-aligns text)
        view["reason".ljust(width)] = cut.str.ljust(width)
    return format_table(view)
