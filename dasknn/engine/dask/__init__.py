"""The Dask engine: Omnivore's compute groups on a real dask cluster (Omnivore §III-B on Dask).

`driver.py` holds `DaskEngine` and `local_client`; `tasks.py` the worker side (each group's loop
task and the `ShardServer` actors); `actors.py` how servers become actors pinned to workers;
`placement.py` which worker does what; `segment.py` and `recovery.py` a run's stretches on one
placement and what happens when a worker is lost; `runs.py` the driver-side helpers every Dask run
shares; `elastic.py` workers that join and leave a fit, `shipping.py` what the driver sends them;
`unmerged.py` and `replicas.py` the other papers' layouts on the cluster.
"""

from dasknn.engine.dask.driver import DaskEngine, local_client
from dasknn.engine.dask.recovery import WorkerLostError
from dasknn.engine.dask.runs import cluster_workers

__all__ = ["DaskEngine", "WorkerLostError", "cluster_workers", "local_client"]
