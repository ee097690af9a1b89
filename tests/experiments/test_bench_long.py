"""bench_long's own logic: the workload's inputs, the contenders' knobs, the select phase's choice
and the measure table's medians and ratios (on planted runs), and one tiny end-to-end run (slow)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments import bench_long


def test_workload_is_caffe_scaled_and_centred_per_channel():
    X, y = bench_long.workload(n_samples=300)
    X, y = np.asarray(X), np.asarray(y)
    assert X.shape == (300, *bench_long.SHAPE) and X.dtype == np.float32
    np.testing.assert_allclose(X.mean(axis=(0, 2, 3)), 0.0, atol=1e-3)
    assert X.max() - X.min() > 200  # × 255, as Caffe's CIFAR-10 example feeds its net
    assert set(np.unique(y)) <= set(range(bench_long.N_CLASSES))


def test_knobs_of_contenders():
    assert bench_long.knobs_of("auto") == {"tuner": "auto"}
    assert bench_long.knobs_of("2,0.004,0.9") == {"n_groups": 2, "learning_rate": 0.004, "momentum": 0.9}
    with pytest.raises(ValueError):
        bench_long.knobs_of("1,0.001")


def planted_runs() -> pd.DataFrame:
    rows = []
    select = {"1,0.001,0.9": [90.0, 100.0, 95.0], "1,0.002,0.9": [70.0, 150.0, 80.0]}
    for name, times in select.items():
        rows += [{"phase": "select", "round": r, "contender": name, "time_to_target": t, "reached": True,
                  "iterations_to_target": 10 * t, "fit_wall": 1.5 * t, "process_wall": 1.5 * t + 5}
                 for r, t in enumerate(times)]  # fmt: skip
    measure = {
        "auto": [60.0, 66.0, 63.0],
        "1,0.002,0.9": [75.0, 70.0, 72.0],
        bench_long.SOLVER: [99.0, 90.0, 93.0],
    }
    for name, times in measure.items():
        rows += [{"phase": "measure", "round": r, "contender": name, "time_to_target": t, "reached": True,
                  "iterations_to_target": 10 * t, "fit_wall": 2 * t, "process_wall": 2 * t + 5}
                 for r, t in enumerate(times)]  # fmt: skip
    return pd.DataFrame(rows)


def test_select_takes_the_smallest_median_not_the_smallest_time():
    table, chosen = bench_long.select_table(planted_runs())
    assert chosen == "1,0.002,0.9"  # median 80 < 95, although 1,0.001 never took 150
    assert "1,0.001,0.9" in table


def test_measure_table_ratios_are_ratios_of_medians_of_the_measure_rounds():
    text, headline = bench_long.summarise(planted_runs(), "1,0.002,0.9", 0.78)
    assert math.isclose(headline["auto ÷ best fixed (clock)"], 63.0 / 72.0)
    assert math.isclose(headline["solver ÷ auto (clock)"], 93.0 / 63.0)
    assert math.isclose(headline["solver ÷ auto (fit wall)"], 186.0 / 126.0)
    assert "round 0: auto ÷ best 0.80, solver ÷ auto 1.65" in text


def test_clock_budget_stops_at_the_first_evaluation_past_it():
    budget = bench_long.ClockBudget(10.0)
    assert not budget.on_evaluation(None, {"time": 9.99})
    assert budget.on_evaluation(None, {"time": 10.0})


@pytest.mark.slow
def test_tiny_measure_run_end_to_end(tmp_path, monkeypatch):
    """Three fits, each its own process and LocalCluster, with a 2 s budget and an unreachable
    target: every one misses and counts as the budget; the table is written."""
    monkeypatch.setattr(bench_long, "RESULTS", tmp_path)
    out = bench_long.main(["--chosen", "1,0.002,0.9", "--rounds", "1", "--budget", "2", "--target", "0.999"])
    runs = out["runs"]
    assert list(runs["contender"]) == ["auto", "1,0.002,0.9", bench_long.SOLVER]
    assert (runs["exit"] == 0).all() and not runs["reached"].any()
    assert (runs["time_to_target"] == 2.0).all()
    assert (runs["clock_end"] >= 2.0).all()
    assert math.isclose(out["solver ÷ auto (clock)"], 1.0)
    (table,) = tmp_path.glob("*/table.md")
    assert "auto ÷ best fixed" in table.read_text()
