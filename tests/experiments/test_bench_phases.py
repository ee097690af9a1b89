"""The in-process phase timers of bench_overhead and he_check run the engine's own shard and server
code (tasks.conv_forward/conv_backward, ConvModelServer, FCServer) outside a cluster. They are the
benchmarks' only callers of that code path, so a change of its signatures must fail here, not in a
user's benchmark run (f56430a changed them and both benchmarks broke unnoticed)."""

from __future__ import annotations

import numpy as np

from dasknn.engine.dask import tasks
from experiments import bench_overhead, he_check


def digits_arrays(case, n: int):
    X, y = case.data()
    return np.asarray(X[:n].compute()), np.asarray(y[:n].compute())


def test_bench_overhead_phase_times_run_the_engine_shard_code():
    case = bench_overhead.CASES[0]
    X, y = digits_arrays(case, 3 * case.batch_size)
    batches = [np.arange(i * case.batch_size, (i + 1) * case.batch_size) for i in range(3)]
    times = bench_overhead.phase_times(case, X, y, batches, threads=1)
    assert set(times) == set(bench_overhead.PHASES)
    assert all(np.isfinite(v) and v >= 0 for v in times.values())
    assert times["conv_forward"] > 0 and times["fc_step"] > 0 and times["conv_backward"] > 0
    assert not any(k[0].startswith("bench-overhead-") for k in tasks._CACHES), "forward caches leaked"


def test_he_check_phase_seconds_measure_t_conv_and_t_fc():
    case = he_check.CASES[True][0]
    X, y = digits_arrays(case, 3 * case.batch_size)
    seconds = he_check.phase_seconds(case, X, y, threads=1)
    assert set(seconds) == {"t_conv_1", "t_fc", "cpu_work"}
    assert seconds["t_conv_1"] > 0 and seconds["t_fc"] > 0 and seconds["cpu_work"] > 0
    # LeNet's conv phase holds most of its FLOPs: t_conv(1) exceeds the FC server's step
    assert seconds["t_conv_1"] > seconds["t_fc"]


def test_he_check_splits_the_per_batch_conv_cost_from_two_shard_sizes():
    # t(b) = 10, t(b/2) = 6: 6 = (10 − c)/2 + c gives c = 2; held within [0, T_cc]
    assert he_check.conv_fixed(10.0, 6.0, 2) == 2.0
    assert he_check.conv_fixed(10.0, 4.0, 2) == 0.0  # faster than linear: no per-batch part
    assert he_check.conv_fixed(10.0, 11.0, 2) == 10.0  # a shard slower than the batch: all of it
    assert he_check.conv_fixed(12.0, 4.5, 4) == 2.0  # (4·4.5 − 12) / 3
