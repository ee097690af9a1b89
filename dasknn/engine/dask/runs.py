"""Driver-side helpers every Dask run shares: the cluster's workers, the data, the waits.

The merged engine (`driver.DaskEngine`), the unmerged physical map (`unmerged`) and the replica
strategies (`replicas`) keep the same habits: X and y are persisted on the workers and read there
by key (or, on the merged engine with `data="stream"`, streamed from their source by each group's
lead worker: `stream_data`), every wait is bounded, the driver checks that the workers of the run
are alive while the long-running loop tasks work.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from dasknn.data.stream import StreamSource
from dasknn.engine.dask.recovery import SchedulerError, WorkerLostError, scheduler_connected
from dasknn.engine.strategy import split_layer
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn.net import Net

__all__ = [
    "Data",
    "as_dask",
    "check_alive",
    "chunk_futures",
    "cluster_transfers",
    "cluster_workers",
    "data_mode",
    "engine_client",
    "forget_on_workers",
    "loop_result",
    "persist_data",
    "stream_data",
    "total_memory_limit",
    "wait_for_loops",
]


def as_dask(X, y, batch_size: int):
    """X and y as dask arrays chunked alike along samples (numpy inputs are wrapped)."""
    if not isinstance(X, da.Array):
        X = da.from_array(np.asarray(X), chunks=(max(batch_size, 1024),) + tuple(np.shape(X)[1:]))
    if not isinstance(y, da.Array):
        y = da.from_array(np.asarray(y), chunks=(X.chunks[0],))
    elif y.chunks[0] != X.chunks[0]:
        y = y.rechunk({0: X.chunks[0]})
    if len(X.chunks) > 1 and any(len(c) > 1 for c in X.chunks[1:]):
        X = X.rechunk({i: -1 for i in range(1, X.ndim)})
    return X, y


def chunk_futures(arr) -> list:
    """The futures of a persisted array's blocks along samples, in order (one block per sample chunk)."""
    from distributed import futures_of

    by_key = {f.key: f for f in futures_of(arr)}
    out = []
    for key in arr.__dask_keys__():
        while isinstance(key, list):
            key = key[0]
        out.append(by_key[key])
    return out


def cluster_transfers(client) -> dict[str, int]:
    """Host↔device copies and bytes made so far by all the client's workers together (the sum of
    `backend.transfer_counts()` in each worker process); two readings around a run give its traffic."""
    from dasknn.backend import transfer_counts

    total: dict[str, int] = {}
    for counts in client.run(transfer_counts).values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def cluster_workers(client) -> dict[str, dict[str, Any]]:
    """address → scheduler info (resources, nthreads) of every worker of the client's cluster.

    Asks the scheduler directly. `client.scheduler_info()` returns the client's shared cache, which
    a periodic callback on the client's event loop rewrites with no per-worker entries
    (n_workers=0): read just after such a rewrite, or after a failed fetch it swallows, it shows
    an empty cluster, and a run would take its live workers for lost. A client that has lost its
    scheduler raises SchedulerError at once: asked, it would wait out its whole reconnection window
    (`distributed.comm.timeouts.connect`) before failing, and the run's error with it.
    """
    if not scheduler_connected(client):
        raise SchedulerError(f"the connection to the scheduler is closed (client status {client.status!r})")
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1)
    except TypeError:  # distributed < 2025: identity() takes no n_workers and lists every worker
        info = client.sync(client.scheduler.identity)
    return dict(info["workers"])


def forget_on_workers(client, run_id: str) -> None:
    """Let the workers drop run `run_id`'s cached nets (`tasks.forget_run`); nothing when the client
    has lost its scheduler (it would hold the call for its whole reconnection window)."""
    from dasknn.engine.dask.tasks import forget_run

    if scheduler_connected(client):
        client.run(forget_run, run_id, on_error="ignore")


@dataclass(frozen=True)
class Data:
    """The training data as the worker loops read it: persisted (chunk keys and chunk sizes) or,
    with `source`, streamed from storage (no keys); `shipped` is then the source scattered to the
    cluster (a Future), which the loops receive instead of X's graph in every task."""

    X: Any
    y: Any
    x_keys: tuple
    y_keys: tuple
    chunks: tuple[int, ...]
    source: StreamSource | None = None
    shipped: Any = None


def engine_client(engine):
    """The engine's client, or the default client of this process."""
    if engine.client is not None:
        return engine.client
    from distributed import default_client

    return default_client()


@dataclass
class RunStart:
    """What a run on either physical map begins with: its start state, the net's conv and FC
    phases, and a fresh run id (which names the workers' cached nets and forward caches)."""

    state: TrainState
    conv_net: Net
    fc_net: Net
    run_id: str


def begin_run(engine, client, net: Net, config: RunConfig, start: TrainState | None) -> RunStart:
    """The prelude of a merged or unmerged run: the workers prepared (`tasks.prepare_worker`: BLAS
    threads limited when the engine says, numpy's warnings filtered), the start state (a copy of
    `start`, or the net's own weights), the net split at the strategy's split into its conv and FC
    phases (Omnivore §II-B), a run id."""
    from dasknn.engine.dask.tasks import prepare_worker

    client.run(prepare_worker, engine.blas_threads)
    state = start.copy() if start is not None else TrainState.from_net(net)
    conv_net, fc_net = net.split_phases(at=split_layer(net, engine.strategy, config.batch_size))
    if fc_net is None:
        raise ValueError(f"net {net.name!r} has no FC phase (no InnerProduct layer) for an FC server")
    return RunStart(state, conv_net, fc_net, uuid.uuid4().hex)


def persist_data(engine, client, X, y, config: RunConfig) -> Data:
    """X and y persisted on the workers (numpy inputs wrapped), checked to hold one batch."""
    from distributed import wait

    X, y = as_dask(X, y, config.batch_size)
    if X.shape[0] < config.batch_size:
        raise ValueError(f"{X.shape[0]} samples are fewer than one batch of {config.batch_size}")
    X, y = client.persist([X, y])
    wait([X, y], timeout=engine.timeout)
    return Data(
        X=X,
        y=y,
        x_keys=tuple(f.key for f in chunk_futures(X)),
        y_keys=tuple(f.key for f in chunk_futures(y)),
        chunks=tuple(int(c) for c in X.chunks[0]),
    )


def stream_data(X, y, config: RunConfig) -> Data:
    """X left where it is (its graph reads the source) and y computed to memory (one int a sample):
    the groups' lead workers stream their batches (`dasknn.data.stream`). Nothing is persisted."""
    X, y = as_dask(X, y, config.batch_size)
    if X.shape[0] < config.batch_size:
        raise ValueError(f"{X.shape[0]} samples are fewer than one batch of {config.batch_size}")
    # the labels (8 bytes a sample) read here, so that no task of the cluster holds a chunk
    source = StreamSource(X, np.asarray(y.compute(scheduler="sync")))
    return Data(X=X, y=y, x_keys=(), y_keys=(), chunks=source.chunks, source=source)


STREAM_FRACTION = 0.5
"""`data="auto"` streams when X (as float32, as persisted) takes more than this fraction of the
workers' summed memory limits: the rest holds the nets, activations, servers and dask's own."""


def data_mode(requested: str, nbytes: int, memory_limit: int | None) -> str:
    """'persist' or 'stream' for `requested` ('auto', 'persist', 'stream'): 'auto' persists when X's
    `nbytes` fit in STREAM_FRACTION of `memory_limit` (the workers' total; None: unlimited)."""
    if requested != "auto":
        return requested
    if memory_limit is None:
        return "persist"
    return "stream" if nbytes > STREAM_FRACTION * memory_limit else "persist"


def total_memory_limit(client) -> int | None:
    """The sum of the workers' memory limits in bytes; None when any worker has none (unlimited)."""
    limits = [info.get("memory_limit") for info in cluster_workers(client).values()]
    if not limits or any(not v for v in limits):
        return None
    return int(sum(limits))


def check_alive(client, roles: Mapping[str, Sequence[str]], done: int) -> None:
    """Raise WorkerLostError if a worker that has a role in the run left the cluster."""
    alive = set(cluster_workers(client))
    for worker, what in roles.items():
        if worker not in alive:
            err = WorkerLostError(
                f"worker {worker} ({', '.join(what)}) left the cluster after at least {done} updates "
                "of this run; the run cannot continue on this placement"
            )
            err.updates = done
            raise err


def wait_for_loops(
    engine,
    client,
    loops: list,
    roles: Mapping[str, Sequence[str]],
    budget: Budget,
    t0: float,
    progress: Callable[[], int] | None = None,
    check: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Wait for the loop tasks, polling every `engine.poll` s; returns all their Trace rows.

    Raises the first loop's error (WorkerLostError when a worker of the run is gone), or a
    TimeoutError when the run is `engine.timeout` seconds past a seconds budget. `check`, called at
    every poll while the loops run, may raise to end the wait with the loops still running (a
    cluster change, `elastic.cluster_change`).
    """
    from distributed import wait

    bar = None
    if engine.verbose and budget.iterations is not None and progress is not None:
        from tqdm.auto import tqdm

        bar = tqdm(total=budget.iterations, unit="it", desc="dask engine", dynamic_ncols=True)
    shown = 0
    try:
        while True:
            try:
                wait(loops, timeout=engine.poll)
                break
            except TimeoutError:
                pass
            if any(f.status == "error" for f in loops):
                break
            check_alive(client, roles, shown)
            if progress is not None:  # every poll: a loss message counts the updates done so far
                try:
                    done = progress()
                except Exception:  # its server's worker is going: the next check names it
                    done = shown
                if bar is not None:
                    bar.update(done - shown)
                shown = done
            if check is not None:
                check()
            if budget.seconds is not None and time.time() - t0 > budget.seconds + engine.timeout:
                raise TimeoutError(f"the run is {engine.timeout:.0f} s past its budget; a loop is stuck")
        rows: list[dict[str, Any]] = []
        for f in sorted(loops, key=lambda f: f.status != "error"):
            rows.extend(loop_result(engine, f, client, roles, shown))
        return rows
    finally:
        if bar is not None:
            bar.close()


def loop_result(engine, fut, client, roles, done: int) -> list[dict[str, Any]]:
    """One loop task's rows; a lost worker becomes WorkerLostError."""
    try:
        return list(fut.result(timeout=engine.timeout))
    except ConnectionError as err:
        check_alive(client, roles, done)
        raise WorkerLostError(str(err)) from err
    except Exception as err:
        if "Worker holding Actor was lost" in str(err) or type(err).__name__ in (
            "KilledWorker",
            "CancelledError",
        ):
            check_alive(client, roles, done)
            lost = WorkerLostError(f"a worker of the run was lost after at least {done} updates: {err}")
            lost.updates = done
            raise lost from err
        raise
