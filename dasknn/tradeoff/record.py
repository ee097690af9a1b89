"""Experiment records: Traces of many runs as one `xarray.Dataset`, with Omnivore's penalties.

docs/architecture.md "Records"; penalties as Omnivore appendix D-D and F-C, relative to the
synchronous strategy g = 1 (S = 0): P_HE = HE(S)/HE(0) with HE = time per iteration, P_SE =
SE(S)/SE(0) with SE = iterations to the target loss ℓ_F, and P_total = P_HE · P_SE.

Each strategy (a group count g) is represented by its best (lr, momentum), the one with the lowest
final smoothed loss, as the paper grid-searches and reports the best per g (§V-B). ℓ_F, per
seed, is the lowest final loss that every strategy reached: the highest of their final losses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dasknn.engine.trace import RunConfig
from dasknn.tradeoff.hardware import time_per_iteration
from dasknn.tradeoff.statistical import (
    SMOOTHING_WINDOW,
    TARGET_LOSS_RULE,
    final_loss,
    iterations_to_target,
    smoothed_loss,
    target_loss,
)
from dasknn.version import __version__

if TYPE_CHECKING:  # xarray is imported where a record is first built or read: `import dasknn` skips it
    import xarray as xr

__all__ = ["NETCDF_ENGINE", "load", "penalties", "record_from_traces", "save", "with_decisions"]

NETCDF_ENGINE = "netcdf4"
"""netCDF-4 (HDF5) format via the netCDF4 package: int64 and unicode attrs round-trip (netCDF-3 via
scipy cannot hold int64), and its wheels bundle the C libraries. h5netcdf would need h5py to write."""

RUN_DIMS = ("groups", "lr", "momentum", "seed")
STRATEGY_DIMS = ("groups", "seed")
PER_ITERATION = ("loss", "loss_smoothed", "accuracy", "time", "staleness")


def _key(key) -> tuple[int, float, float, int]:
    if isinstance(key, RunConfig):
        return int(key.n_groups), float(key.lr), float(key.momentum), int(key.seed)
    g, lr, mu, seed = key
    return int(g), float(lr), float(mu), int(seed)


def _sorted_trace(trace: pd.DataFrame) -> pd.DataFrame:
    return trace.sort_values(["t_end", "group"], kind="stable").reset_index(drop=True)


def record_from_traces(
    traces: Mapping[Any, pd.DataFrame],
    *,
    net: str,
    dataset: str,
    batch_size: int | None = None,
    device: str | Mapping[str, Any] = "",
    window: int = SMOOTHING_WINDOW,
) -> xr.Dataset:
    """One Dataset from Traces keyed (n_groups, lr, momentum, seed) or by RunConfig (Omnivore appendix E).

    Runs are indexed by (groups, lr, momentum, seed) and their updates by `iteration` (1-based, in
    completion order); missing runs and iterations past a run's end are NaN. Traces must come from
    one engine (one time unit). `device` is a description (a dict is stored as JSON);
    `batch_size` defaults to the traces' `n_images` when they agree (else 0).
    """
    import xarray as xr

    if not traces:
        raise ValueError("record_from_traces needs at least one trace")
    runs = {_key(k): _sorted_trace(t) for k, t in traces.items()}
    if len(runs) != len(traces):
        raise ValueError("two traces have the same (n_groups, lr, momentum, seed)")
    engines = {t.attrs.get("engine", "unknown") for t in runs.values()}
    time_units = {t.attrs.get("time_unit", "s") for t in runs.values()}
    if len(engines) > 1 or len(time_units) > 1:
        raise ValueError(f"traces of different engines or time units in one record: {engines}, {time_units}")
    (engine,), (time_unit,) = engines, time_units
    coords = {dim: sorted({k[i] for k in runs}) for i, dim in enumerate(RUN_DIMS)}
    n_iter = max(len(t) for t in runs.values())
    series, scalars = _run_arrays(runs, coords, n_iter, window)
    if batch_size is None:
        sizes = {int(s) for t in runs.values() for s in t["n_images"].dropna().unique()}
        batch_size = sizes.pop() if len(sizes) == 1 else 0
    dims_it = RUN_DIMS + ("iteration",)
    data_vars = {name: (dims_it, arr) for name, arr in series.items()}
    data_vars.update({name: (RUN_DIMS, arr) for name, arr in scalars.items()})
    ds = xr.Dataset(
        data_vars,
        coords={
            **{
                d: np.asarray(v, dtype=np.int64 if d in ("groups", "seed") else np.float64)
                for d, v in coords.items()
            },
            "iteration": np.arange(1, n_iter + 1, dtype=np.int64),
        },
    )
    _describe(ds, time_unit, window)
    device = device if isinstance(device, str) else json.dumps(dict(device), sort_keys=True, default=str)
    ds.attrs = {
        "net": str(net),
        "dataset": str(dataset),
        "batch_size": int(batch_size),
        "device": device,
        "engine": str(engine),
        "time_unit": str(time_unit),
        "dasknn_version": __version__,
        "smoothing_window": int(window),
        "target_loss_rule": TARGET_LOSS_RULE,
    }
    return ds.merge(penalties(ds, window=window))


def _run_arrays(
    runs: dict[tuple, pd.DataFrame], coords: dict[str, list], n_iter: int, window: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each run's per-iteration series (`PER_ITERATION`) and its scalars, at its place on the run
    dimensions; NaN for missing runs and for iterations past a run's end."""
    shape = tuple(len(coords[d]) for d in RUN_DIMS)
    series = {name: np.full(shape + (n_iter,), np.nan) for name in PER_ITERATION}
    scalars = {name: np.full(shape, np.nan) for name in ("time_per_iter", "final_loss", "n_iterations")}
    for key, trace in runs.items():
        at = tuple(coords[d].index(v) for d, v in zip(RUN_DIMS, key, strict=True))
        n = len(trace)
        series["loss"][at][:n] = trace["loss"].to_numpy(dtype=float)
        series["loss_smoothed"][at][:n] = smoothed_loss(trace, window)
        series["accuracy"][at][:n] = trace["accuracy"].to_numpy(dtype=float)
        series["time"][at][:n] = trace["t_end"].to_numpy(dtype=float)
        series["staleness"][at][:n] = trace["staleness"].to_numpy(dtype=float)
        scalars["time_per_iter"][at] = time_per_iteration(trace)
        scalars["final_loss"][at] = final_loss(trace, window)
        scalars["n_iterations"][at] = n
    return series, scalars


def _describe(ds: xr.Dataset, time_unit: str, window: int) -> None:
    """Units and a description on every variable and coordinate of a record (in their attrs)."""
    units = {
        "loss": "1",
        "loss_smoothed": "1",
        "accuracy": "1",
        "time": time_unit,
        "staleness": "updates",
        "time_per_iter": f"{time_unit} per iteration",
        "final_loss": "1",
        "n_iterations": "iterations",
    }
    about = {
        "loss": "training loss of the batch of each update (SoftmaxWithLoss, nats)",
        "loss_smoothed": f"trailing mean of the last {window} losses",
        "accuracy": "batch accuracy of each update",
        "time": "end time of each update (t_end)",
        "staleness": "updates written by other groups between this update's read and write (S = v' - v - 1)",
        "time_per_iter": "measured time per iteration, all groups together (HE, Omnivore §IV-B)",
        "final_loss": "smoothed loss at the end of the run",
        "n_iterations": "updates in the run",
    }
    for name in ds.data_vars:
        ds[name].attrs = {"units": units[name], "description": about[name]}
    ds["groups"].attrs = {"units": "1", "description": "n_groups, the number of compute groups (S = g - 1)"}
    ds["lr"].attrs = {"units": "1", "description": "learning rate (eta)"}
    ds["momentum"].attrs = {"units": "1", "description": "explicit momentum (mu)"}
    ds["seed"].attrs = {"units": "1", "description": "seed of the data order and initialisation"}
    ds["iteration"].attrs = {"units": "1", "description": "update number in completion order, 1-based"}


def penalties(ds: xr.Dataset, window: int = SMOOTHING_WINDOW) -> xr.Dataset:
    """ℓ_F, iterations to it, and P_HE, P_SE, P_total per (groups, seed) (Omnivore appendix E, Eqs. 8-10).

    Needs `loss`, `final_loss` and `time_per_iter` as `record_from_traces` builds them. Runs whose
    final loss is not finite (diverged) never reach ℓ_F: their iters_to_target is NaN. Without a
    g = 1 run the penalties are NaN (they are defined relative to S = 0).
    """
    import xarray as xr

    final = ds["final_loss"].transpose(*RUN_DIMS).to_numpy()
    losses = ds["loss"].transpose(*RUN_DIMS, "iteration").to_numpy()
    tpi = ds["time_per_iter"].transpose(*RUN_DIMS).to_numpy()
    G, L, M, S = final.shape
    best: dict[tuple[int, int], tuple[int, int]] = {}
    for gi, si in np.ndindex(G, S):
        sub = np.where(np.isfinite(final[gi, :, :, si]), final[gi, :, :, si], np.inf)
        if np.isfinite(sub).any():
            best[gi, si] = np.unravel_index(int(np.argmin(sub)), (L, M))
    ell = np.array(
        [
            target_loss([final[gi, li, mi, si] for (gi, s), (li, mi) in best.items() if s == si])
            for si in range(S)
        ]
    )
    iters = np.full((G, L, M, S), np.nan)
    for idx in np.ndindex(G, L, M, S):
        if np.isfinite(final[idx]):
            run = losses[idx]
            iters[idx] = iterations_to_target(run[~np.isnan(run)], ell[idx[3]], window)
    he, se, best_lr, best_mu = (np.full((G, S), np.nan) for _ in range(4))
    for (gi, si), (li, mi) in best.items():
        he[gi, si], se[gi, si] = tpi[gi, li, mi, si], iters[gi, li, mi, si]
        best_lr[gi, si], best_mu[gi, si] = ds["lr"].values[li], ds["momentum"].values[mi]
    groups = ds["groups"].to_numpy()
    p_he, p_se = np.full((G, S), np.nan), np.full((G, S), np.nan)
    if 1 in groups:
        sync = int(np.flatnonzero(groups == 1)[0])
        p_he, p_se = he / he[sync], se / se[sync]
    per_iter = f"{ds.attrs.get('time_unit', 's')} per iteration"
    variables = {
        "target_loss": (("seed",), ell, "1", "l_F: the lowest final smoothed loss every strategy reached"),
        "iters_to_target": (RUN_DIMS, iters, "iterations", "SE: updates until the smoothed loss <= l_F"),
        "best_lr": (STRATEGY_DIMS, best_lr, "1", "lr of the lowest final loss at this g"),
        "best_momentum": (STRATEGY_DIMS, best_mu, "1", "momentum of the lowest final loss at this g"),
        "HE": (STRATEGY_DIMS, he, per_iter, "time per iteration at the best (lr, momentum)"),
        "SE": (STRATEGY_DIMS, se, "iterations", "iterations to l_F at the best (lr, momentum)"),
        "P_HE": (STRATEGY_DIMS, p_he, "1", "HE(S) / HE(0), Omnivore appendix Eq. 9"),
        "P_SE": (STRATEGY_DIMS, p_se, "1", "SE(S) / SE(0), Omnivore appendix Eq. 8"),
        "P_total": (STRATEGY_DIMS, p_he * p_se, "1", "P_HE * P_SE, Omnivore appendix Eq. 10"),
    }
    return xr.Dataset(
        {name: (dims, arr, {"units": u, "description": d}) for name, (dims, arr, u, d) in variables.items()},
        coords={d: ds[d] for d in RUN_DIMS},
    )


def with_decisions(ds: xr.Dataset, decisions: pd.DataFrame) -> xr.Dataset:
    """The record with the tuner's decisions along a `decision` dimension, one variable per
    column prefixed `decision_` (numbers as float, text as str), so the measured numbers that drove
    each decision travel with the record."""
    if not len(decisions):
        return ds
    out = ds.copy()
    for column in decisions.columns:
        values = decisions[column]
        numeric = pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)
        data = values.to_numpy(dtype=float) if numeric else values.fillna("").astype(str).to_numpy()
        out[f"decision_{column}"] = (("decision",), data)
    return out.assign_coords(decision=np.arange(len(decisions)))


def save(ds: xr.Dataset, path: str | Path) -> Path:
    """Write a record as a netCDF-4 file (engine `NETCDF_ENGINE`); `load` reads it back identically.

    The write takes a local lock (`local_writes`), never the cluster's: with a Dask client as the
    default, xarray locks the file through the scheduler, and a cluster closing after a fit (the
    CLI writes the record then) failed the write of a finished fit ("ConnectionPool is closed")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with local_writes():
        ds.to_netcdf(path, engine=NETCDF_ENGINE)
    return path


def local_writes():
    """A context in which xarray writes with a process-local lock: dask's synchronous scheduler
    (a record's arrays are in memory, so nothing is computed on it)."""
    import dask

    return dask.config.set(scheduler="synchronous")


def load(path: str | Path) -> xr.Dataset:
    """Read a record written by `save` (fully into memory; the file is closed on return)."""
    import xarray as xr

    with xr.open_dataset(path, engine=NETCDF_ENGINE) as ds:
        return ds.load()
