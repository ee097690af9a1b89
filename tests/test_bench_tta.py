"""experiments/bench_tta: misses charged the budget, medians, ratios of medians and per-run ratios."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments import bench_tta


def history(times, accuracies) -> pd.DataFrame:
    return pd.DataFrame({"time": times, "val_accuracy": accuracies, "iteration": np.arange(len(times))})


def run(name, kind, rnd, times, accuracies, budget=60.0):
    record = {"run": name, "kind": kind, "n_groups": 1, "lr": 0.01, "momentum": 0.9}
    return bench_tta._run_row(record, history(times, accuracies), rnd, budget)


@pytest.fixture
def runs():
    rows = []
    for rnd, (t_online, t_best, t_torch) in enumerate([(10, 8, 12), (12, 9, 11), (30, 10, 13)]):
        rows.append(run("optimizer=online", "online", rnd, [0, t_online], [0.1, 0.995]))
        rows.append(run("optimizer=grid", "grid", rnd, [0, 20], [0.1, 0.991]))
        rows.append(run("fixed g=2 η=0.03 µ=0.9", "fixed", rnd, [0, t_best], [0.1, 0.99]))
        rows.append(run("fixed g=1 η=0.001 µ=0.9", "fixed", rnd, [0, 60], [0.1, 0.9]))  # never: the budget
        rows.append(run("fixed g=1 η=0.01 µ=0.6", "fixed", rnd, [0, 40], [0.1, 0.99]))
        rows.append(run("pytorch (Caffe solver)", "pytorch", rnd, [0, t_torch], [0.1, 0.992]))
    return pd.DataFrame(rows)


def test_a_miss_counts_as_the_whole_budget_and_medians_are_per_contender(runs):
    table, _ = bench_tta.summarise(runs, budget=60.0)
    by_run = table.set_index("run")
    assert (
        by_run.loc["fixed g=1 η=0.001 µ=0.9", "median_s"] == 60
        and by_run.loc["fixed g=1 η=0.001 µ=0.9", "reached"] == "0/3"
    )
    assert (
        by_run.loc["optimizer=online", "median_s"] == 12
        and by_run.loc["optimizer=online", "per_run_s"] == "10.0, 12.0, 30.0"
    )
    assert by_run.loc["optimizer=grid", "ratio_to_online"] == pytest.approx(20 / 12)


def test_ratios_of_medians_and_per_run_ratios_against_the_best_fixed_and_the_others(runs):
    _, headline = bench_tta.summarise(runs, budget=60.0)
    assert headline["best_fixed"] == "fixed g=2 η=0.03 µ=0.9" and headline["best_fixed_s"] == 9
    assert headline["vs best fixed: ratio of medians"] == pytest.approx(12 / 9)
    assert headline["vs best fixed: per-run ratios"] == [1.25, 1.33, 3.0]
    assert headline["median_config_s"] == 40  # the grid's median configuration (of 9, 40, 60)
    assert headline["vs median fixed config: ratio of medians"] == pytest.approx(12 / 40)
    assert headline["vs pytorch: ratio of medians"] == pytest.approx(12 / 12)
    assert headline["vs grid optimizer: per-run ratios"] == [0.5, 0.6, 1.5]
    text = bench_tta.markdown(bench_tta.summarise(runs, 60.0)[0])
    assert text.splitlines()[0] == "| run | median_s | reached | per_run_s | ratio_to_online |"


def test_the_fixed_grid_is_the_scripts_own_and_quick_mode_says_what_it_leaves_out():
    assert len(bench_tta.FIXED_GRID) == 24
    assert {lr for _, lr, _ in bench_tta.FIXED_GRID} == {0.3, 0.1, 0.03, 0.01, 0.003, 0.001}
    args = bench_tta.parse(["--quick"])
    assert args.runs == 1 and args.momenta == (0.9,) and args.no_sim
    with pytest.raises(SystemExit):
        bench_tta.parse(["--lrs", "0.05"])  # not a part of the fixed grid


@pytest.mark.slow
def test_a_tiny_run_writes_the_tables(tmp_path):
    argv = ["--runs", "1", "--budget", "15", "--groups", "2", "--lrs", "0.03", "--momenta", "0.9",
            "--no-torch", "--eval-size", "300", "--sim-workers", "4", "--sim-budget", "5",
            "--out", str(tmp_path)]  # fmt: skip
    out = bench_tta.main(argv)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert list(runs["run"]) == ["optimizer=online", "optimizer=grid", "fixed g=2 η=0.03 µ=0.9"]
    assert (runs["seconds"] <= 15).all()
    assert set(out["simulated"]["kind"]) == {"online", "grid", "fixed"}
    for name in ("table.md", "summary.csv", "simulated.md", "simulated.csv", "tta.png"):
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


def test_main_job_benchmark_stops_on_its_rule_and_reads_both_targets_off_one_fit():
    """bench_main_job: the callback stops a fit only once the median of the last five held-out
    scores reaches 96%; one history gives 95% (first at or above) and 96% (median5), with the fit's
    wall time at each crossing, a miss charged the budget, and the spacing of evaluations."""
    from experiments import bench_main_job

    stop = bench_main_job.RuleStop(0.96, "median5")
    stop.on_fit_begin(None)
    answers = [
        stop.on_evaluation(None, {"val_accuracy": v}) for v in (0.5, 0.97, 0.94, 0.95, 0.97, 0.97, 0.90)
    ]
    assert answers == [False, False, False, False, False, True, False]  # medians .95, .97, .95
    assert not stop.on_evaluation(None, {"val_accuracy": float("nan")})
    hist = pd.DataFrame(
        {
            "time": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            "wall_time": [0.5, 1.7, 2.9, 4.1, 5.3, 6.5, 7.7],
            "iteration": [0, 30, 60, 90, 120, 150, 180],
            "val_accuracy": [0.5, 0.97, 0.94, 0.95, 0.97, 0.97, 0.90],
        }
    )
    row = bench_main_job.measured("x", "fixed", hist, budget=25.0, fit_wall=9.0, rnd=0)
    assert row["95% first s"] == 1.0 and row["95% first wall s"] == 1.7
    assert row["96% median5 s"] == 5.0 and row["96% median5 wall s"] == 6.5
    assert row["eval_every_it"] == 30.0
    miss = bench_main_job.measured("y", "fixed", hist.iloc[:3], budget=25.0, fit_wall=3.0, rnd=0)
    assert miss["96% median5 s"] == 25.0 and not miss["96% median5 reached"] and miss["95% first reached"]


def test_main_job_benchmark_rejects_points_off_the_grid():
    from experiments import bench_main_job

    with pytest.raises(SystemExit):
        bench_main_job.parse(["--lrs", "0.05"])
    with pytest.raises(SystemExit):
        bench_main_job.parse(["--chosen", "2,0.03", "1,0.01,0.9"])
    assert bench_main_job.parse(["--chosen", "2,0.03,0.9", "1,0.01,0.9"]).chosen == [
        (2, 0.03, 0.9),
        (1, 0.01, 0.9),
    ]
