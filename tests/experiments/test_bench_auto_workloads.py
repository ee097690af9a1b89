"""bench_auto_workloads' own logic: the CIFAR-10 quick workload's inputs (Caffe's scale), the
contenders (the solver's point named in the grid) and the table's medians and ratios on planted runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from experiments import bench_auto_workloads as bench


def test_cifar10_quick_data_is_caffe_scaled_and_centred_per_channel():
    X, y = bench.WORKLOADS["cifar10_quick"].data()
    assert X.shape == (bench.SYNTHETIC_SAMPLES, 3, 32, 32) and X.dtype == np.float32
    np.testing.assert_allclose(X.mean(axis=(0, 2, 3)), 0.0, atol=1e-2)
    assert X.max() - X.min() > 200  # × 255, as Caffe's CIFAR-10 example feeds its net
    assert set(np.unique(y)) == set(range(10))


def test_contenders_name_the_solver_point_of_the_grid():
    w = bench.WORKLOADS["cifar10_quick"]
    assert w.solver == (0.001, 0.9)  # CIFAR-10 quick's Caffe solver file
    names = list(bench.contenders(w))
    assert names[0] == "auto" and len(names) == 1 + 2 * len(w.lrs)
    assert [n for n in names if n.endswith("(solver)")] == ["g=1 η=0.001 (solver)"]
    assert list(bench.contenders(w, solver_only=True)) == ["auto", "g=1 η=0.001 (solver)"]


def test_summary_ratios_are_ratios_of_medians_over_seeds():
    times = {"auto": [30.0, 40.0], "g=1 η=0.001 (solver)": [50.0, 70.0], "g=1 η=0.003": [20.0, 60.0]}
    runs = pd.DataFrame(
        [{"workload": "w", "run": run, "seed": s, "seconds": t, "iterations": int(10 * t), "reached": True,
          "wall_seconds": 1.0} for run, ts in times.items() for s, t in enumerate(ts)]
    )  # fmt: skip
    table = bench.summarise(runs).set_index("contender")
    assert math.isclose(table.loc["g=1 η=0.003 ← best of grid", "auto ÷ it"], 35.0 / 40.0)
    assert math.isclose(table.loc["g=1 η=0.001 (solver)", "auto ÷ it"], 35.0 / 60.0)


def test_its_engine_keeps_the_average_the_fit_resolved():
    """The estimator's "auto" (the default) reaches the benchmark's engine as the EMA, None as None."""
    w = bench.WORKLOADS["lenet128"]
    X, y = w.data()
    for averaging, kept in (("auto", "ema"), (None, None)):
        est = bench.estimator(w, 0, {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9})
        est.set_params(averaging=averaging, max_epochs=1, time_budget=None, target_accuracy=None)
        est.fit(X[:512], y[:512])
        assert est.averaging_ == kept
        assert ("averaging" in est.state_.extra) is (kept is not None)
