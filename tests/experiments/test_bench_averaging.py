"""bench_averaging's own logic: its six contenders on the suite's workloads, and the table's ratios,
medians and spread on planted runs."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import bench_averaging as bench
from experiments import bench_suite


def test_six_contenders_each_with_and_without_the_average():
    w = bench_suite.workloads("full")["sim_lenet128"]
    named = dict(bench.contenders(w, bench.BEST["sim_lenet128"]))
    assert list(named) == ["solver", "solver + ema", "best fixed", "best fixed + ema", "auto", "auto + ema"]
    assert named["solver"] == {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9, "averaging": None}
    assert named["best fixed + ema"] == {
        "n_groups": 2,
        "learning_rate": 0.03,
        "momentum": 0.9,
        "averaging": "ema",
    }
    assert named["auto + ema"]["averaging"] == "ema" and "tuner" in named["auto + ema"]
    assert set(bench.BEST) == set(bench.WORKLOADS) <= set(bench_suite.workloads("full"))


def test_the_table_gives_ratios_medians_and_spread():
    names = ["solver", "solver + ema", "best fixed", "best fixed + ema", "auto", "auto + ema"]
    seconds = {0: [10, 8, 4, 4, 6, 3], 1: [12, 6, 5, 10, 6, 6], 2: [20, 10, 4, 2, 9, 9]}
    runs = pd.DataFrame(
        [
            {
                "workload": "w",
                "seed": seed,
                "contender": c,
                "seconds": s,
                "reached": not (seed == 2 and c == "solver"),
            }
            for seed, row in seconds.items()
            for c, s in zip(names, row, strict=True)
        ]
    )
    table = bench.summarise(runs).set_index("seed")
    assert table.loc["0", "solver: ema ÷ plain"] == pytest.approx(0.8)
    assert table.loc["1", "best fixed: ema ÷ plain"] == pytest.approx(2.0)
    assert table.loc["0", "auto + ema ÷ solver"] == pytest.approx(0.3)
    assert table.loc["2", "missed"] == "solver" and table.loc["0", "missed"] == "none"
    assert table.loc["median", "auto: ema ÷ plain"] == pytest.approx(1.0)  # 0.5, 1, 1
    assert table.loc["median", "solver s"] == 12
    assert table.loc["spread (max − min)", "best fixed: ema ÷ plain"] == pytest.approx(2.0 - 0.5)
