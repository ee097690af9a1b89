"""reports.decisions_table: the optimizer's decisions for a terminal."""

from __future__ import annotations

import pandas as pd

from dasknn.reports import DECISION_VIEW, decisions_table


def test_decisions_table_keeps_the_main_columns_and_whole_reasons():
    decisions = pd.DataFrame(
        {
            "phase": ["cold_start", "train"],
            "action": ["probe", "stop"],
            "n_groups": [1, 2],
            "lr": [0.1, 0.01],
            "momentum": [0.9, 0.9],
            "score": [1.5, float("nan")],
            "iterations": [20, None],
            "time": [0.5, 9.0],
            "chosen": [False, False],
            "start_hash": ["abc123", ""],
            "reason": ["short", "x" * 300],
        }
    )
    lines = decisions_table(decisions).splitlines()
    assert lines[0].split() == [*DECISION_VIEW, "reason"]
    assert "abc123" not in "".join(lines) and len(lines) == 3
    assert lines[2].rstrip().endswith(" " + "x" * 300) and "…" not in lines[2]
    assert lines[1].rstrip().endswith("short")


def test_decisions_table_leaves_out_a_column_empty_in_every_row():
    decisions = pd.DataFrame(
        {"phase": ["train"] * 2, "action": ["rollback", "choose_lr"], "lr": [0.01, 0.001],
         "score": [float("nan")] * 2, "reason": ["diverged", "after a rollback"]}
    )  # fmt: skip
    lines = decisions_table(decisions).splitlines()
    assert lines[0].split() == ["phase", "action", "lr", "reason"]
    assert "NaN" not in "\n".join(lines)
