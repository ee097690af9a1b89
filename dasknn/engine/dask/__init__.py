"""The Dask engine: Omnivore's compute groups on a real dask cluster (Omnivore §III-B on Dask).

`driver.py` holds `DaskEngine` and `local_client`; `tasks.py` the worker side (each group's loop
task and the `ShardServer` actors); `actors.py` how servers become actors pinned to workers;
`placement.py` which worker does what; `segment.py` and `recovery.py` a run's stretches on one
placement and what happens when a worker is lost; `runs.py` the driver-side helpers every Dask run
shares; `elastic.py` workers that join and leave a fit, `shipping.py` what the driver sends them;
`unmerged.py` and `replicas.py` the other papers' layouts on the cluster.
"""

import importlib

__all__ = ["DaskEngine", "WorkerLostError", "cluster_workers", "local_client"]

_HOMES = {
    "DaskEngine": "driver",
    "local_client": "driver",
    "WorkerLostError": "recovery",
    "cluster_workers": "runs",
}


def __getattr__(name: str):
    # The workers import this package for the worker-side modules (tasks, actors, iteration); the
    # driver's modules, with dask.array and pandas behind them, load only where they are used.
    if name in _HOMES:
        return getattr(importlib.import_module(f"dasknn.engine.dask.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
