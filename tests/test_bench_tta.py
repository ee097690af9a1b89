"""experiments/bench_tta: its time-to-accuracy table, grid-cost rows and target verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments import bench_tta


def history(times, accuracies) -> pd.DataFrame:
    return pd.DataFrame({"time": times, "accuracy": accuracies, "iteration": np.arange(len(times))})


def row(run, kind, lr, hist, seconds=None):
    record = {"run": run, "kind": kind, "n_groups": 1, "lr": lr, "momentum": 0.9, "status": "budget"}
    record["train_seconds"] = float(hist["time"].max()) if seconds is None else seconds
    return bench_tta.tta_row(record, hist)


@pytest.fixture
def table():
    opt = row("optimizer", "optimizer", 0.01, history([0, 5, 10, 20], [0.1, 0.96, 0.985, 0.995]))
    fast = row("async η=0.01", "async", 0.01, history([0, 4, 9, 19], [0.1, 0.95, 0.98, 0.99]))
    slow = row("sync η=0.01", "sync", 0.01, history([0, 10, 30, 45], [0.1, 0.95, 0.98, 0.99]))
    never = row("sync η=0.003", "sync", 0.003, history([0, 30, 60], [0.1, 0.9, 0.96]))
    torch_row = row("pytorch", "pytorch", 0.01, history([0, 3, 8, 25], [0.1, 0.97, 0.985, 0.991]))
    rows = [opt, fast, slow, never, torch_row]
    rows += bench_tta.best_of([slow, never], "sync")
    return bench_tta._with_ratios(pd.DataFrame(rows))


def test_time_to_accuracy_columns_and_ratios(table):
    opt = table[table["run"] == "optimizer"].iloc[0]
    assert (opt["tta_95"], opt["tta_98"], opt["tta_99"]) == (5, 10, 20)
    never = table[table["run"] == "sync η=0.003"].iloc[0]
    assert never["tta_95"] == 60 and np.isnan(never["tta_98"]) and np.isnan(never["ratio_99"])
    assert table.set_index("run").loc["sync η=0.01", "ratio_99"] == pytest.approx(45 / 20)


def test_best_eta_rows_add_the_other_grid_runs_time(table):
    by_run = table.set_index("run")
    assert by_run.loc["sync, best η=0.01", "tta_99"] == 45
    assert by_run.loc["sync, best η + grid cost", "tta_99"] == 45 + 60
    assert by_run.loc["sync, best η + grid cost", "grid_seconds"] == 60


def test_verdicts_name_each_target_with_its_ratio(table):
    lines = bench_tta.verdicts(table)
    assert len(lines) == 4
    # 95%: optimizer 5 s, best fixed 4 s (ratio 1.25 > 1.10), worst fixed 60 s (η=0.003: 12×)
    assert "ratio 1.25" in lines[0] and "target ≤ 1.10: FAIL" in lines[0] and "→ 12.00×" in lines[0]
    # 99%: best fixed 19 s (1.05: pass); the η=0.003 run never got there: ≥ its 60 s (3.00×)
    assert "ratio 1.05" in lines[2] and "≤ 1.10: PASS" in lines[2] and "≥ 60.0 s → ≥ 3.00×" in lines[2]
    assert "PyTorch 25.0 s" in lines[3] and "PASS" in lines[3]
    text = bench_tta.markdown(table)
    assert text.splitlines()[0].startswith("| run | n_groups |") and "| — |" in text


@pytest.mark.slow
def test_a_tiny_run_writes_the_tables_and_the_plots(tmp_path):
    argv = ["--budget", "15", "--lr-grid", "0.01", "--no-torch", "--eval-size", "300", "--sim-workers", "4",
            "--sim-max-epochs", "2", "--sim-lr-grid", "0.01", "--out", str(tmp_path)]  # fmt: skip
    out = bench_tta.main(argv)
    dask_table = pd.read_csv(tmp_path / "tta.csv")
    assert {"run", "tta_95", "tta_98", "tta_99", "ratio_99", "train_seconds"} <= set(dask_table.columns)
    assert list(dask_table["run"][:4]) == [
        "optimizer", "optimizer, paper η grid", "sync g=1 η=0.01", "async g=2 η=0.01"
    ]  # fmt: skip
    assert (dask_table["train_seconds"] <= 15 + 10).all()
    assert set(out["simulated"]["kind"]) >= {"optimizer", "sync", "async"}
    for name in ("accuracy.png", "accuracy_simulated.png", "table.md", "histories.csv", "simulated.csv"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.bench  # needs torch, which only the benchmarks use: run with -m bench
def test_pytorch_reference_is_scored_at_least_once_a_pass():
    """The PyTorch loop is scored on the estimator's schedule (each pass, or every max(2, budget/20)
    s), so its time to accuracy has the same granularity as dasknn's runs. Optional: needs torch."""
    pytest.importorskip("torch")
    from dasknn.data import load
    from experiments.bench_tta_torch import caffe_lenet_loop

    X, y = load("digits", size=28, batch_size=64)
    hist = caffe_lenet_loop(X, y, budget=60.0, target=0.95, eval_size=500, seed=0, threads=1)
    per_pass = X.shape[0] // 64
    assert hist["iteration"].iloc[0] == 0 and hist["accuracy"].iloc[-1] >= 0.95
    assert (np.diff(hist["iteration"]) <= per_pass).all() and len(hist) >= 3
    assert hist["time"].is_monotonic_increasing


@pytest.mark.bench
def test_search_floor_benchmark_runs_and_reports_ratios():
    from experiments import bench_search_floor

    medians = bench_search_floor.main(["--reps", "1", "--budget", "30"])
    assert list(medians.index) == [name for name, *_ in bench_search_floor.CONFIGS]
    assert medians.loc["fixed async g=2 η=0.03", "ratio_99_vs_fixed"] == 1.0
    assert (medians["tta_99"] > 0).all()
