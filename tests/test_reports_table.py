"""reports.decisions_table: the optimizer's decisions for a terminal."""

from __future__ import annotations

import pandas as pd

from dasknn.reports import DECISION_VIEW, decisions_table


def test_decisions_table_keeps_the_main_columns_and_cuts_long_reasons():
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
    lines = decisions_table(decisions, reason_width=40).splitlines()
    assert lines[0].split() == [*DECISION_VIEW, "reason"]
    assert "abc123" not in "".join(lines) and len(lines) == 3
    assert lines[2].rstrip().endswith("x" * 39 + "…") and "x" * 40 not in lines[2]
    assert lines[1].rstrip().endswith("short")
