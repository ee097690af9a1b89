"""Experiment 3 at its tiny setting: conv throughput as % of SGEMM per layer; GPU rows only with a GPU."""

import numpy as np
import pytest

from dasknn.backend import cupy_available
from experiments.flops_proportionality import ALL, make_nets


def test_flops_proportionality_tiny(run_tiny):
    ds, out = run_tiny("flops_proportionality")
    assert list(ds["layer"].values) == ["conv1", "conv2", ALL]
    cpu = ds.sel(device="cpu")
    assert float(ds["sgemm_gflops"].sel(device="cpu")) > 1
    pct = cpu["pct_sgemm"].values
    assert np.all(np.isfinite(pct)) and np.all(pct > 0) and np.all(pct < 150)
    # the "all conv" entry sums the layers
    assert np.isclose(float(ds["gflop"].sel(groups=1, layer=ALL)), float(ds["gflop"].sel(groups=1).sum()) / 2)
    assert np.allclose(cpu["time_s"].sel(layer=ALL), cpu["time_s"].drop_sel(layer=ALL).sum("layer"))
    gpu_measured = np.isfinite(ds["time_s"].sel(device="gpu").values).any()
    assert gpu_measured == cupy_available()
    if not gpu_measured:
        assert "not measured: no CuPy + CUDA GPU here" in (out / "table.md").read_text()


def test_groups_need_caffenet():
    with pytest.raises(ValueError, match="no grouped convolutions"):
        make_nets("lenet", (1, 2))
