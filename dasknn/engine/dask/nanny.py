"""The nanny of `local_client`'s workers and the thread count they share: `TunedNanny` starts every
worker, a later `cluster.scale(n)` or `cluster.adapt`'s included, with the BLAS and malloc settings,
and `SharedCores` keeps every worker of one machine at cores // workers BLAS/OpenMP threads as
workers join and leave (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os

import dask
from distributed import Nanny
from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from distributed.protocol import pickle

__all__ = ["QuietClose", "SharedCores", "TunedNanny", "share_cores", "unshare_cores"]

logger = logging.getLogger(__name__)


CLOSE_TIMEOUT = 15.0
"""How long a closing nanny waits for its worker process to end (dask: 5 s, 80% of which before a
kill): a worker's process ends after its interpreter's teardown (numpy, pandas, scipy, dask and
the net's modules), which can outlast dask's 4 s on a busy machine; dask kills it then, with a
warning. A close that waits is quiet, and takes no longer where the process ends at once."""


class TunedNanny(Nanny):
    """A Nanny whose worker processes start with `pre_spawn_environ` (variable → value) set and
    the dask config keys of `worker_config` ("a.b.c" → value) over the driver's.

    distributed reads `distributed.nanny.pre-spawn-environ` while a Nanny is made, lets the
    driver's own environment win over it, and writes it into the driver's `os.environ` when it
    spawns the worker, so a worker added later would get whatever the driver has (often nothing:
    BLAS then starts a thread per core in every worker). This one holds the settings itself and
    puts the driver's environment back once its concurrent spawns are all done."""

    spawning = 0  # nannies of this process starting a worker now
    driver_env: dict[str, str | None] = {}  # the driver's values, put back when none is

    def __init__(
        self,
        *args,
        pre_spawn_environ: dict[str, str] | None = None,
        worker_config: dict[str, object] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tuned = dict(pre_spawn_environ or {})
        self.pre_spawn_env.update(self.tuned)
        self.env.update(self.tuned)
        if worker_config:  # dask's merge shares nested dicts with the driver's config: copy first
            self.config = copy.deepcopy(self.config)
            dask.config.set(worker_config, config=self.config)  # "a.b.c" keys, into this copy only

    async def close(self, timeout: float = 5, reason: str = "nanny-close"):
        """Close the worker process, waiting up to `CLOSE_TIMEOUT` s for it to end by itself."""
        return await super().close(timeout=max(timeout, CLOSE_TIMEOUT), reason=reason)

    async def instantiate(self):
        """Start the worker process with the settings; once no nanny of this process is starting
        one, the driver's environment is as it was before the first of them."""
        cls = TunedNanny
        if cls.spawning == 0:
            cls.driver_env = {k: os.environ.get(k) for k in self.tuned}
        cls.spawning += 1
        try:
            return await super().instantiate()
        finally:
            cls.spawning -= 1
            if cls.spawning == 0:
                for k, v in cls.driver_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v


LEAVING = (
    Status.closing_gracefully, Status.closing, Status.closed, Status.stopping, Status.stopped, Status.failed
)  # fmt: skip
"""The statuses of a worker that is leaving the cluster (retiring or closing); a worker that has just
joined may still be starting (`init`) and stays."""


def threads_per_worker(cores: int, n_workers: int) -> int:
    """The BLAS/OpenMP threads of each of `n_workers` workers sharing `cores` cores (at least 1)."""
    return max(1, int(cores) // max(1, int(n_workers)))


class SharedCores(SchedulerPlugin):
    """Keeps every worker of a one-machine cluster at cores // workers BLAS/OpenMP threads as
    workers join and leave (`tasks.set_blas_threads`; oneDNN's calls take the BLAS pool's count).
    A worker's settings are fixed when it starts, so a second worker added to a one-worker cluster
    would start with every core, and two pools of all the cores spin at their barriers against
    each other. `threads` is the count the workers were last set to."""

    name = "dasknn-shared-cores"
    idempotent = True

    def __init__(self, cores: int) -> None:
        self.cores = int(cores)
        self.threads: int | None = None
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self._lock = asyncio.Lock()  # one change at a time, in the order the workers came and went
        await self.apply()

    def add_worker(self, scheduler, worker: str) -> None:
        scheduler._ongoing_background_tasks.call_soon(self.apply)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        scheduler._ongoing_background_tasks.call_soon(self.apply)

    async def apply(self) -> None:
        """Set the threads of every worker that stays (not retiring or closing) for their number.

        A retired worker or one of a closing cluster is left out: a cluster's close retires all
        its workers at once, then removes them one by one, and a message sent to a worker that
        is closing fails (the scheduler logs each such failure as an ERROR)."""
        from dasknn.engine.dask.tasks import set_blas_threads

        s = self.scheduler
        async with self._lock:
            staying = [w for w, ws in s.workers.items() if ws.status not in LEAVING]
            if not staying or s.status != Status.running:
                return
            n = threads_per_worker(self.cores, len(staying))
            msg = {"op": "run", "function": pickle.dumps(set_blas_threads), "args": pickle.dumps((n,))}
            await s.broadcast(msg=msg, workers=staying, on_error="ignore")
            self.threads = n


def share_cores(client, cores: int) -> None:
    """Install `SharedCores` for `cores` on the client's scheduler (`local_client` does)."""
    client.register_plugin(SharedCores(cores), name=SharedCores.name)


def unshare_cores(client) -> None:
    """Remove `SharedCores` from the client's scheduler, before its cluster closes.

    A LocalCluster's close stops its workers one by one without retiring them first, so the
    scheduler still counts the others as running while they close: the plugin would send them
    their new thread count, and each message that fails is an ERROR in the scheduler's log."""
    if client.status != "running":
        return
    try:
        client.unregister_scheduler_plugin(SharedCores.name)
    except (ValueError, OSError, TimeoutError) as err:  # gone already: the cluster is closing anyway
        logger.debug("could not remove %s: %s", SharedCores.name, err)


HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"
"""distributed's worker logs this, with a traceback, when a heartbeat is in flight as the worker
closes its own connections (`Worker.close` stops the heartbeats, then closes its connection pool,
which fails the one still waiting)."""


class QuietClose(WorkerPlugin):
    """Drops the worker's log record of a heartbeat that its own orderly close cut off.

    Only that record, and only once the worker is closing: it is dask's own race at a close that
    went as planned (a periodic heartbeat against a short close), not a failure; a heartbeat that
    fails while the worker runs is still logged."""

    name = "dasknn-quiet-close"
    idempotent = True

    def setup(self, worker) -> None:
        def keep(record: logging.LogRecord) -> bool:
            closing = worker.status in (Status.closing, Status.closed)
            return not (closing and str(record.msg).startswith(HEARTBEAT_FAILED))

        logging.getLogger("distributed.worker").addFilter(keep)
