"""Experiment 1 at its tiny setting: lowered memory is linear in bp and matches lowered_bytes."""

import numpy as np
import pytest

from experiments.batched_lowering import measure, partitions


def test_batched_lowering_tiny(run_tiny):
    ds, out = run_tiny("batched_lowering")
    bps = ds["bp"].values
    assert list(bps) == [1, 2, 4, 8] and list(ds["part"].values) == ["gemm", "conv_forward"]
    # memory: D̂ grows linearly in bp (CcT §2.2), and what conv_forward allocates is the prediction
    assert np.array_equal(ds["lowered_bytes_measured"].values, ds["lowered_bytes"].values)
    assert np.array_equal(ds["lowered_bytes"].values, ds["lowered_bytes"].values[0] * bps)
    assert np.all(np.diff(ds["peak_bytes"].values) > 0)
    assert np.all(ds["peak_bytes"].values >= ds["lowered_bytes"].values)
    t = ds["time_s"].values
    assert np.all(np.isfinite(t)) and np.all(t > 0) and np.all(t < 5)
    assert np.allclose(ds["speedup_vs_bp1"].sel(bp=1), 1.0)
    assert np.allclose(ds["thread_speedup"].isel(threads=0), 1.0)
    assert "| threads | bp |" in (out / "table.md").read_text()


def test_partitions_and_bad_input():
    assert partitions(1) == [1] and partitions(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="unknown layer"):
        measure("no.such.layer", 4, [1], 1)
    with pytest.raises(ValueError, match="repeats"):
        measure("lenet.conv1", 4, [1], 0)
