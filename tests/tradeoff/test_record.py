"""Experiment records: variables, dims and attrs, Omnivore's penalties on a planted example, and an
identical netCDF round-trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig, make_trace
from dasknn.nn.layers import Convolution, InnerProduct, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff import record
from dasknn.tradeoff.hardware import HEModel
from dasknn.tradeoff.record import load, record_from_traces, save


def planted(group_ends: list[list[float]], losses: list[float]):
    """A simulated trace whose groups end updates at the given times, with these losses in order."""
    rows = [{"group": g, "t_start": t - 1.0, "t_end": t} for g, ends in enumerate(group_ends) for t in ends]
    rows.sort(key=lambda r: (r["t_end"], r["group"]))
    for row, loss in zip(rows, losses, strict=True):
        row.update(loss=loss, accuracy=0.5, staleness=len(group_ends) - 1, n_images=8)
    return make_trace(rows, "simulated")


@pytest.fixture
def planted_record():
    traces = {
        (1, 0.1, 0.9, 0): planted([[2, 4, 6, 8]], [4, 3, 2, 1]),  # HE 2, final 1
        (1, 0.01, 0.9, 0): planted([[2, 4, 6, 8]], [4, 3.5, 3, 2.5]),  # worse: not the best at g = 1
        (2, 0.1, 0.9, 0): planted(
            [[1, 2, 3], [1.5, 2.5, 3.5]], [4, 3.5, 3, 2.5, 2, 1.5]
        ),  # HE 0.5, final 1.5
        (2, 0.01, 0.9, 0): planted([[1, 2], [1.5]], [4, float("nan"), float("nan")]),  # diverged
    }
    return record_from_traces(traces, net="planted", dataset="none", device={"kind": "cpu"}, window=1)


def test_penalties_by_hand(planted_record):
    ds = planted_record
    # l_F = max(best final at g=1: 1, at g=2: 1.5) = 1.5; SE(1) = 4 (loss 1 <= 1.5), SE(2) = 6.
    assert float(ds["target_loss"].sel(seed=0)) == 1.5
    assert ds["best_lr"].sel(seed=0).values.tolist() == [0.1, 0.1]
    assert ds["HE"].sel(seed=0).values.tolist() == [2.0, 0.5]
    assert ds["SE"].sel(seed=0).values.tolist() == [4.0, 6.0]
    assert ds["P_HE"].sel(seed=0).values.tolist() == [1.0, 0.25]
    assert ds["P_SE"].sel(seed=0).values.tolist() == [1.0, 1.5]
    assert ds["P_total"].sel(seed=0).values.tolist() == [1.0, 0.375]
    its = ds["iters_to_target"].sel(seed=0, momentum=0.9)
    assert np.isnan(its.sel(groups=1, lr=0.01)) and np.isnan(its.sel(groups=2, lr=0.01))


def test_record_layout_units_and_attrs(planted_record):
    ds = planted_record
    assert dict(ds.sizes) == {"groups": 2, "lr": 2, "momentum": 1, "seed": 1, "iteration": 6}
    for name in ("loss", "loss_smoothed", "accuracy", "time", "staleness"):
        assert ds[name].dims == ("groups", "lr", "momentum", "seed", "iteration")
    for name in ("P_HE", "P_SE", "P_total", "HE", "SE", "best_lr", "best_momentum"):
        assert ds[name].dims == ("groups", "seed")
    assert ds["time_per_iter"].attrs["units"] == "simulated s per iteration"
    assert ds["time"].attrs["units"] == "simulated s" and ds["iters_to_target"].attrs["units"] == "iterations"
    assert all("units" in ds[v].attrs for v in ds.variables)
    assert ds.attrs["engine"] == "simulated" and ds.attrs["batch_size"] == 8
    assert json.loads(ds.attrs["device"]) == {"kind": "cpu"}
    assert {"net", "dataset", "dasknn_version", "target_loss_rule", "time_unit"} <= set(ds.attrs)
    assert np.isnan(ds["loss"].sel(groups=1, lr=0.1, momentum=0.9, seed=0, iteration=5))  # past the run's end


def test_record_of_simulator_traces_round_trips_through_netcdf(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64)
    he = HEModel(T_cc=2.0, T_nc=0.05, t_fc=0.4, n_workers=4)
    traces = {}
    for g in (1, 2, 4):
        for seed in (0, 1):
            net = Net(
                [Convolution("conv1", 2, 3), ReLU("relu1"), InnerProduct("ip1", 2)], (1, 6, 6), seed=seed
            )
            cfg = RunConfig(n_groups=g, lr=0.05, momentum=0.5, batch_size=16, seed=seed)
            traces[cfg] = SimulatedEngine(he, verbose=0).run(net, X, y, cfg, Budget(iterations=24)).trace
    ds = record_from_traces(traces, net="tiny", dataset="synthetic", device="test cpu")
    assert ds["groups"].values.tolist() == [1, 2, 4] and ds["seed"].values.tolist() == [0, 1]
    assert ds["time_per_iter"].squeeze().values[:, 0] == pytest.approx([he.he(g) for g in (1, 2, 4)])
    assert (ds["staleness"].sel(groups=4).isel(iteration=slice(4, None)) == 3).all()
    assert ds["P_HE"].sel(groups=4).values == pytest.approx(he.he(4) / he.he(1))
    assert (ds["P_HE"].sel(groups=1) == 1).all() and (ds["P_SE"].sel(groups=1) == 1).all()
    path = save(ds, tmp_path / "sub" / "record.nc")
    back = load(path)
    xr.testing.assert_identical(ds, back)
    assert back["groups"].dtype == np.int64 and back["iteration"].dtype == np.int64


def test_traces_of_different_engines_cannot_share_a_record():
    a = planted([[1, 2]], [1.0, 0.5])
    b = planted([[1, 2]], [1.0, 0.5])
    b.attrs["engine"], b.attrs["time_unit"] = "dask", "s"
    with pytest.raises(ValueError, match="different engines"):
        record_from_traces({(1, 0.1, 0.0, 0): a, (2, 0.1, 0.0, 0): b}, net="n", dataset="d")


def test_a_record_is_written_under_a_local_lock_while_a_dask_client_is_the_default(tmp_path):
    # xarray locks a file through the scheduler of the default client; a record is in memory, and a
    # cluster closing after a fit failed that lock's release and with it the finished fit's write
    from distributed import Client, LocalCluster
    from distributed.lock import Lock as ClusterLock
    from xarray.backends.locks import get_write_lock

    ds = xr.Dataset({"a": (("x",), np.arange(3.0))})
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster):
        assert isinstance(get_write_lock("k"), ClusterLock)  # the premise
        with record.local_writes():
            assert not isinstance(get_write_lock("k"), ClusterLock)
        path = record.save(ds, tmp_path / "r.nc")
    xr.testing.assert_identical(record.load(path), ds)
