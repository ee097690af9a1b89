"""bench_suite's own logic: the workloads and grids fixed before any "auto" run, the table's ratios
and geometric mean on planted runs, and the tiny setting end to end (real simulated fits)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments import bench_suite as suite


def test_the_full_suite_fixes_seven_workloads_with_their_grid_and_solver_point():
    workloads = suite.workloads("full")
    assert set(workloads) == {
        "main_job", "long", "sim32", "sim_lenet128", "sim_cifar10_quick", "resnet20", "lenet128",
    }  # fmt: skip
    assert set(suite.workloads("quick")) == set(workloads) - {"resnet20"}  # out of its budgets' reach
    for w in workloads.values():
        assert max(w.lrs) / min(w.lrs) >= 100, f"{w.name}: η over at least two decades"
        assert set(w.momenta) == {0.6, 0.9}
        assert w.groups == ((1, 4, 8, 32) if w.name == "sim32" else (1, 2))
        assert w.solver[0] == 1 and w.rule in ("first", "median5") and 0 < w.target < 1
        assert len(w.grid()) == len(w.groups) * len(w.lrs) * 2
    assert workloads["main_job"].rule == "median5" and workloads["main_job"].target == 0.96
    assert workloads["resnet20"].solver == (1, 0.1, 0.9)  # He et al.'s CIFAR-10 settings


def test_the_quick_and_tiny_grids_keep_the_ends_of_g_and_eta():
    w = suite.workloads("full")["sim32"]
    quick = suite.grid_at(w, "quick")
    assert {g for g, _, _ in quick} == {1, 32} and {lr for _, lr, _ in quick} == {0.003, 0.03, 0.3}
    assert {mu for _, _, mu in quick} == {0.9}
    assert suite.grid_at(w, "tiny") == [(1, 0.03, 0.9), (32, 0.03, 0.9)]
    assert suite.grid_at(w, "full") == w.grid()


def planted_runs(times: dict[str, dict[str, list[float]]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"workload": w, "contender": c, "seed": s, "seconds": t}
            for w, by in times.items()
            for c, ts in by.items()
            for s, t in enumerate(ts)
        ]
    )


def test_the_table_gives_ratios_per_seed_their_medians_and_the_geometric_mean():
    times = {
        "a": {"auto": [2.0, 4.0, 3.0], "auto range": [1.0, 1.0, 1.0], "best fixed (x)": [1.0, 2.0, 1.0],
              "solver (y)": [4.0, 4.0, 4.0]},
        "b": {"auto": [8.0, 8.0, 8.0], "auto range": [2.0, 2.0, 2.0], "best fixed (x)": [2.0, 2.0, 2.0],
              "solver (y)": [4.0, 8.0, 16.0]},
    }  # fmt: skip
    table, geo = suite.summarise(planted_runs(times))
    per_seed = table[table["seed"] != "median"].set_index(["workload", "seed"])
    assert per_seed.loc[("a", "1"), "auto ÷ best"] == 2.0 and per_seed.loc[("a", "2"), "auto ÷ best"] == 3.0
    assert per_seed.loc[("b", "2"), "auto ÷ solver"] == 0.5
    medians = table[table["seed"] == "median"].set_index("workload")
    assert medians.loc["a", "auto ÷ best"] == 2.0 and medians.loc["b", "auto ÷ best"] == 4.0
    assert medians.loc["b", "auto range ÷ best"] == 1.0
    assert math.isclose(geo["auto"], math.sqrt(2.0 * 4.0))
    assert math.isclose(geo["auto range"], 1.0)


def test_the_tiny_suite_selects_then_measures_every_contender_and_writes_its_table(tmp_path):
    out = tmp_path / "suite"
    result = suite.main(["--tiny", "--out", str(out)])
    for name in ("select.csv", "runs.csv", "table.csv", "table.md"):
        assert (out / name).stat().st_size > 0
    select = pd.read_csv(out / "select.csv")
    assert list(select["contender"]) == ["g=1 η=0.03 µ=0.9", "g=32 η=0.03 µ=0.9"]
    assert (select["seed"] == suite.SELECT_SEED).all()
    best = select.loc[select["seconds"].idxmin(), "contender"]
    assert result["chosen"] == {"sim32": best}
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["contender"]) == [
        "auto",
        "auto range",
        f"best fixed ({best})",
        "solver (g=1 η=0.01 µ=0.9)",
    ]
    assert (runs["seconds"] > 0).all() and (runs["seconds"] <= 2.0).all()
    row = result["table"].iloc[0]
    t = dict(zip(runs["contender"], runs["seconds"], strict=True))
    assert row["auto ÷ best"] == pytest.approx(t["auto"] / t[f"best fixed ({best})"])
    assert result["geomean"]["auto"] == pytest.approx(np.exp(np.log(row["auto ÷ best"])))
    assert "geometric mean of auto ÷ best fixed over 1 workloads" in (out / "table.md").read_text()


def test_an_unknown_workload_is_named_before_any_fit(capsys):
    with pytest.raises(SystemExit):
        suite.main(["--tiny", "--workloads", "nope"])
    assert "unknown workload(s) ['nope']" in capsys.readouterr().err


def test_the_table_names_the_contenders_that_missed_and_keeps_them_out_of_the_medians_text():
    times = {
        "a": {"auto": [2.0], "auto range": [3.0], "best fixed (x)": [1.0], "solver (g=1 η=0.01 µ=0.9)": [9.0]}
    }
    runs = planted_runs(times)
    runs["reached"] = runs["contender"] != "solver (g=1 η=0.01 µ=0.9)"
    table, _ = suite.summarise(runs)
    assert table["missed"].fillna("").tolist() == ["solver", ""]  # the median row names none
    assert table.loc[table["seed"] == "median", "auto ÷ solver"].item() == pytest.approx(2.0 / 9.0)
