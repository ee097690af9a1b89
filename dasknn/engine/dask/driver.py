"""DaskEngine: Omnivore's compute groups on a real dask cluster (Omnivore §III-B on Dask).

The driver persists X and y on the workers, plans the placement (the FC server's worker, the conv
model server's, each group's workers and their FLOPS-proportional shares), and starts a `Segment`:
the conv model server and the merged FC server as actors pinned to their workers, a `ShardServer`
actor on every worker of a group but its lead, and one long-running loop task per compute group on
its lead worker (`iteration.group_loop`). Each loop pulls, computes its shards (the remote ones by
direct actor calls, worker to worker), goes through the FC server and pushes ONE update per
iteration, so g groups run with no barrier and nothing per iteration passes through the client.
The driver only polls: it drains the conv model server's log of Trace rows, snapshots both
servers, checks that every worker of the placement is alive, and on a lost worker goes on from
the last snapshot on the survivors (`recovery`). Every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from dasknn.backend import cpu_cores
from dasknn.data.augment import Augment
from dasknn.data.batching import check_window
from dasknn.engine.autotune import run_auto_learners
from dasknn.engine.averaging import check_averaging
from dasknn.engine.control import RunControl
from dasknn.engine.dask import elastic, tasks
from dasknn.engine.dask.control import DaskControl
from dasknn.engine.dask.environ import local_workers, worker_environ
from dasknn.engine.dask.kept import Kept, knobs_of, release_kept, take_kept
from dasknn.engine.dask.nanny import QuietClose, TunedNanny, share_cores, unshare_cores
from dasknn.engine.dask.placement import Placement, plan, replan, worker_devices
from dasknn.engine.dask.recovery import (
    ClusterError,
    Recovery,
    is_worker_loss,
    lost_error,
    resume_batches,
)
from dasknn.engine.dask.replica_run import run_replicas
from dasknn.engine.dask.restart import run_restarting
from dasknn.engine.dask.runs import (
    Data,
    begin_run,
    cluster_workers,
    engine_client,
    forget_on_workers,
    persist_data,
    stream_data,
)
from dasknn.engine.dask.segment import Segment, SegmentFailed, await_data
from dasknn.engine.dask.shipping import ship
from dasknn.engine.dask.unmerged import run_unmerged
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace, on_run_clock
from dasknn.nn.net import Net


@contextmanager
def local_client(
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    processes: bool = True,
    security=None,
    tune_malloc: bool = True,
    quiet_diagnostics: bool = True,
    **cluster_kwargs,
) -> Iterator[Any]:
    """A LocalCluster sized to this machine and a Client on it, closed on exit (a context manager).

    Each worker process gets cores // n_workers BLAS threads, so the workers together use the
    machine's cores once (numpy's BLAS would otherwise start a thread per core in every worker),
    and workers added later by ``cluster.scale`` or ``cluster.adapt`` get the same settings; as
    workers join and leave, every worker's BLAS threads follow cores // workers.

    Parameters
    ----------
    n_workers : int, optional
        Worker processes; default one per core, at most 4.
    threads_per_worker : int, default 1
    processes : bool, default True
        Workers as processes (False: threads).
    security : distributed.security.Security, bool or None, default None
        TLS credentials: the cluster then listens on tls:// and the client connects with them.
        True makes throwaway self-signed ones (``Security.temporary()``, for a cluster on this
        machine; needs the cryptography package); None or False: plain tcp://.
    tune_malloc : bool, default True
        Start the workers with glibc's mmap and trim thresholds at 32 and 64 MiB. Dask's nanny
        sets a trim threshold of 64 KiB, which turns off glibc's dynamic mmap threshold, so every
        large temporary of a training step would be mapped and faulted in afresh.
    quiet_diagnostics : bool, default True
        Run the cluster with dask's own diagnostics at `QUIET_DIAGNOSTICS`: no statistical
        profiler (every 10 ms it walks the stack of each running task, a group's loop included,
        under the GIL), the event-loop tick and the system monitor less often. Their CPU is
        taken from the cores the groups compute on (experiments/README.md, bench_breakdown).
    **cluster_kwargs
        Passed on to ``distributed.LocalCluster``.

    Yields
    ------
    distributed.Client
        The client of the cluster; ``client.cluster`` is the cluster.

    Examples
    --------
    >>> with local_client(n_workers=2) as client:                 # doctest: +SKIP
    ...     DistributedCNN(max_epochs=1, time_budget=None).fit(X, y)
    """
    from distributed import Client

    security = _security(security)
    cores = cpu_cores()
    n_workers = local_workers(n_workers, cores)
    cluster = _start_cluster(
        n_workers,
        threads_per_worker,
        processes,
        security,
        cores,
        tune_malloc,
        quiet_diagnostics,
        cluster_kwargs,
    )
    client = Client(cluster, security=security) if security is not None else Client(cluster)
    try:
        if processes:
            share_cores(client, cores)
            client.register_plugin(QuietClose(), name=QuietClose.name)
        yield client
    finally:
        if processes:  # nothing left to tell the workers while they close
            unshare_cores(client)
        client.close()
        cluster.close()


def _security(security):
    """`local_client`'s TLS credentials: a Security, throwaway ones for True, None for None or False."""
    from distributed.security import Security

    if security is True:
        return Security.temporary()
    if security is False:
        return None
    if security is not None and not isinstance(security, Security):
        raise TypeError(f"security must be a distributed.security.Security, True or None, got {security!r}")
    return security


def _start_cluster(
    n_workers: int,
    threads_per_worker: int,
    processes: bool,
    security,
    cores: int,
    tune_malloc: bool,
    quiet_diagnostics: bool,
    cluster_kwargs: dict[str, Any],
):
    """`local_client`'s LocalCluster: its workers' BLAS threads (cores // workers), malloc settings
    and dask diagnostics, for the first workers and those the cluster adds later."""
    import dask
    from distributed import LocalCluster

    worker_env = worker_environ(n_workers, cores, tune_malloc)
    kwargs = {"dashboard_address": ":0", **cluster_kwargs}  # a free port: 8787 may be taken
    if security is not None:
        kwargs["security"] = security
        kwargs.setdefault("protocol", "tls://")
    diagnostics = QUIET_DIAGNOSTICS if quiet_diagnostics else {}
    if processes:  # the first workers and those the cluster adds later (`nanny.TunedNanny`)
        tuned = {"pre_spawn_environ": worker_env, "worker_config": diagnostics}
        kwargs = {"worker_class": TunedNanny, **tuned, **kwargs}
    with dask.config.set(diagnostics):  # the scheduler, the nannies and the first workers
        cluster = LocalCluster(
            n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes, **kwargs
        )
    return cluster


QUIET_DIAGNOSTICS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
}
"""dask's diagnostics in `local_client`'s cluster (dask's defaults: the profiler on, sampling every
10 ms; the tick every 20 ms; the system monitor every 500 ms). A late tick is still reported (dask
warns past `distributed.admin.tick.limit`, 3 s)."""


DATA_MODES = ("persist", "stream")
"""How the engine gets the training batches to the workers: persisted once, or streamed."""


class _Streamed(NamedTuple):
    """The data a DaskEngine last streamed: the X and y it was given (compared by identity), the
    batch size, and their `Data` with the source scattered (`DaskEngine._streamed`)."""

    X: Any
    y: Any
    batch_size: int
    data: Data


SHARD_READS = ("lead", "own")

CONTROL_POLL = 0.1
"""Seconds between the driver's polls of a run that has a run control (`engine.control`), at most
the engine's `poll`: the control's commands (an evaluation's snapshot, an `End` once it reached its
target) wait at most this long."""


WARM_MAX_BYTES = 16 * 2**20
"""The largest net (bytes of parameters) `DaskEngine.warm_up` sends to every worker."""


class DaskEngine:
    """Runs g compute groups on a dask cluster; `run(...)` follows the Engine contract (`engine.trace`).

    `blas_threads` limits BLAS threads per worker process (None: leave the workers as they are);
    `timeout` bounds every wait on a server or a task (seconds); `verbose` > 0 shows a progress
    bar; `poll` is how often (s) the driver checks the groups and the workers.

    Fault tolerance: every `snapshot_every` conv updates (checked each `poll`) the driver
    snapshots both servers. When a worker of the placement dies, the run continues on the surviving
    workers (`recovery`): up to `max_recoveries` times, then (or with no worker left) it raises
    WorkerLostError; `max_recoveries=0` raises at the first loss.

    `worker_wait` (seconds): when the cluster has no worker at a run's start, or every worker of a
    run is retired gracefully (the servers' state then waits in the driver) or lost (the recovery
    from the last snapshot then waits), wait this long for one to join, with a task pending so
    that an adaptive cluster starts one (`elastic.await_workers`), rather than raise
    WorkerLostError. None (default): `timeout` when the client's cluster adapts
    down to zero workers (`cluster.adapt(minimum=0)`), else 0 (no wait).

    `strategy` (`engine.strategy.Strategy`): on this engine, `aggregation` ('tree' with `branching`, or
    'ps': summed on the conv model server's worker, FireCaffe §6) and `split` (None, 'auto' for
    RALP's rule, or a layer name). SMA and model averaging run in `replica_run` (learners='auto':
    `engine.autotune` first), the unmerged map in `unmerged`; both are elastic as the merged map
    is, and recover from a lost worker by running again from the run's start state on the workers
    left (`restart`).

    `throughput` (worker address → GFLOP/s) sets the FLOPS-proportional shard sizes by hand
    (Caffe con Troll §2.3), overriding `calibrate()`; a worker left out counts as the median one.

    `shard_calls`: how a group of k > 1 workers reaches its remote shards. 'actors' (default): a
    `tasks.ShardServer` actor on each of its workers but the lead, called directly worker to worker
    (~1 ms a call on a local cluster), gradients summed by a reduction tree among them; 'tasks':
    one pinned task per shard and step, through the scheduler (~13 ms a hop), summed by
    `tasks.aggregate`. Strategy(aggregation='ps') always uses tasks (its sum runs on the conv model
    server's worker). The unmerged map follows the same rule (its shards run the whole net).

    `data`: 'persist' (X and y persisted on the workers once per run, each group cutting its
    batches from the chunks) or 'stream' (nothing persisted: each group's lead worker reads its
    batches from X's source, `prefetch` batches ahead, holding at most 2·`shuffle_window` chunks;
    `dasknn.data.stream`), on the merged map only. `shuffle_window`: chunks shuffled together
    (`dasknn.data.batching.window_indices`); the batch order is the same in both modes.
    `augment` (`dasknn.data.augment.Augment`): what the lead worker does to each batch before
    it is sharded, drawn from (seed, batch). `shard_reads` (streamed data, groups of k > 1 on shard
    server actors): 'lead' (default) — the lead worker reads each whole batch and sends the other
    workers their shards; 'own' — every worker reads its own shard from the source (augmented with
    its rows' draws of the batch), so no batch crosses between workers, but each worker loads every
    chunk its rows lie in: a compressed store's chunks are read and decoded k times an epoch, not
    once. 'own' pays where storage is fast and the network between workers is not.

    `keep_servers`: a run that ends normally leaves its servers running (the conv model server,
    the FC server, the shard servers, the workers' copies of the net), and the next run of the same
    net starts on them when their two workers are still in its placement: η and µ travel with every
    push and FC step, so a new η or µ, or a new g, restarts nothing, and the servers' state is set
    only when the run starts from another state than the one they hold (a window undone). False:
    every run starts new ones (experiments/bench_run_boundary.py compares the two). `close()` lets
    them go.

    `averaging` ("ema"; Omnivore's compute groups on the merged map): both servers keep an
    exponential moving average of their weights (`engine.averaging`), carried by their snapshots,
    the hand-offs and the kept servers; a run's state and every snapshot a run control fetches
    have the average as `params` (what a fit scores, returns and saves) and the weights training
    goes on from, with the averages' counts, in `extra["averaging"]`, as the simulated engine's.
    A run from such a state continues the average exactly; a recovery from a lost server worker
    continues it from the last snapshot, as it does the weights.
    """

    def __init__(
        self,
        client=None,
        *,
        blas_threads: int | None = None,
        timeout: float = 120.0,
        verbose: int = 0,
        poll: float = 1.0,
        strategy: Strategy | None = None,
        snapshot_every: int = 20,
        max_recoveries: int = 3,
        throughput: dict[str, float] | None = None,
        shard_calls: str = "actors",
        data: str = "persist",
        augment: Augment | None = None,
        shuffle_window: int = 1,
        prefetch: int = 2,
        shard_reads: str = "lead",
        keep_servers: bool = True,
        worker_wait: float | None = None,
        averaging: str | None = None,
    ) -> None:
        strategy = strategy if strategy is not None else Strategy()
        self.averaging = check_averaging(averaging, strategy)
        if shard_reads not in SHARD_READS:
            raise ValueError(f"shard_reads must be one of {SHARD_READS}, got {shard_reads!r}")
        self.shard_reads = shard_reads
        if data not in DATA_MODES:
            raise ValueError(f"data must be one of {DATA_MODES}, got {data!r}")
        if data == "stream" and (strategy.synchronous or strategy.physical_map == "unmerged"):
            raise ValueError(
                f"data='stream' runs on the merged map with Omnivore's groups; strategy {strategy.name!r} "
                f"with physical_map {strategy.physical_map!r} reads persisted data (use data='persist')"
            )
        if augment is not None and not isinstance(augment, Augment):
            raise ValueError(f"augment must be None or a dasknn.data.augment.Augment, got {augment!r}")
        if augment is not None and (strategy.synchronous or strategy.physical_map == "unmerged"):
            raise ValueError(
                f"augment runs on the merged map with Omnivore's groups, not with strategy {strategy.name!r} "
                f"and physical_map {strategy.physical_map!r}"
            )
        self.data, self.augment = data, augment
        self.shuffle_window = check_window(shuffle_window)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1 (batches), got {prefetch!r}")
        self.prefetch = prefetch
        if shard_calls not in ("actors", "tasks"):
            raise ValueError(f"shard_calls must be 'actors' or 'tasks', got {shard_calls!r}")
        self.shard_calls = shard_calls
        if throughput is not None:
            bad = {w: v for w, v in throughput.items() if not (isinstance(v, int | float) and v > 0)}
            if bad:
                raise ValueError(f"throughput must map worker addresses to GFLOP/s > 0; got {bad}")
            self.throughput_ = {str(w): float(v) for w, v in throughput.items()}
        if int(snapshot_every) < 1:
            raise ValueError(f"snapshot_every must be >= 1 update, got {snapshot_every}")
        if worker_wait is not None and not (isinstance(worker_wait, int | float) and worker_wait >= 0):
            raise ValueError(f"worker_wait must be None or a number of seconds >= 0, got {worker_wait!r}")
        self.worker_wait = worker_wait
        if int(max_recoveries) < 0:
            raise ValueError(f"max_recoveries must be >= 0, got {max_recoveries}")
        self.strategy = strategy
        self.client = client
        self.blas_threads = blas_threads
        self.timeout = float(timeout)
        self.verbose = verbose
        self.poll = float(poll)
        self.snapshot_every = int(snapshot_every)
        self.max_recoveries = int(max_recoveries)
        self._stream_cache: _Streamed | None = None
        self._kept: Kept | None = None
        self._warm: list = []  # the workers' warm-up tasks (`warm_up`), held until the fit ends
        self.keep_servers = bool(keep_servers)
        self.placement_: Placement | None = None
        self.workers_seen_: set[str] | None = None  # the usable workers when the last run ended

    def conv_worker_count(self) -> int:
        """The conv devices N the placement would use now: the workers, less a dedicated FC one."""
        return len(plan(cluster_workers(engine_client(self)), 1).conv_workers)

    @property
    def takes_control(self) -> bool:
        """Whether a run accepts a run control (`run(..., control=)`): Omnivore's compute groups on
        the merged map."""
        return not (self.strategy.synchronous or self.strategy.physical_map == "unmerged")

    def run(
        self,
        net: Net,
        X,
        y,
        config: RunConfig,
        budget: Budget,
        start: TrainState | None = None,
        control: RunControl | None = None,
    ) -> RunResult:
        """Train `net` for `budget` with `config.n_groups` groups; sets the final weights on `net`.

        `control` (`engine.control.RunControl`) is polled at every `poll` of the driver and its
        commands applied to the running servers (Omnivore's groups on the merged map).

        Survives lost workers as the class docstring says; `trace.attrs["recoveries"]` lists each
        recovery (recovery.Recovery) and the `recovered` column marks rows trained after one.
        When every worker is gone, whatever dask call noticed it first (a scatter's "No valid
        workers found", a placement over an empty cluster), the run raises WorkerLostError.
        """
        self.strategy.check_knobs(config.lr, config.momentum)
        if control is not None and not self.takes_control:
            raise ValueError(
                f"a run control needs Omnivore's compute groups on the merged map, not strategy "
                f"{self.strategy.name!r} on the {self.strategy.physical_map} map"
            )
        done, client = (0 if start is None else start.iterations_done), engine_client(self)
        if not cluster_workers(client):
            waited = elastic.await_workers(client, self._worker_wait(client), self.poll, installed=False)
            if not waited and self.placement_ is not None:
                raise lost_error({}, 0, 0, self.max_recoveries, {}, self.placement_, done)
        try:
            return self._run(net, X, y, config, budget, start, control)
        except ClusterError:
            raise
        except Exception as err:
            if not (
                is_worker_loss(err) or "no valid workers" in str(err).lower() or "has no workers" in str(err)
            ):
                raise
            try:
                alive = _settled_workers(engine_client(self))
            except Exception:  # the scheduler is gone too: the caller names that
                raise err from None
            if alive or self.placement_ is None:
                raise
            raise lost_error({}, 0, 0, self.max_recoveries, alive, self.placement_, done) from err

    def _streamed(self, client, X, y, config: RunConfig, installed: bool = False) -> Data:
        """`stream_data` once per (X, y, batch size) this engine trains on, its source scattered once.

        A fit runs the engine many times (a run between two evaluations); each run's loops get the
        scattered source (a Future: a few bytes) rather than X's whole graph (megabytes for a store
        of many chunks, unpickled by the scheduler every time), and the labels are not read again.
        The source is scattered again when its worker was lost. `installed`: whether
        `elastic.ElasticPlugin` is (the source then goes to no worker being retired)."""
        cached = self._stream_cache
        if cached is not None and cached.X is X and cached.y is y and cached.batch_size == config.batch_size:
            if cached.data.shipped.status == "finished":
                return cached.data
            return self._reship(client, installed)
        self._stream_cache = _Streamed(X, y, config.batch_size, stream_data(X, y, config))
        return self._reship(client, installed)

    def _reship(self, client, installed: bool = False) -> Data:
        """Scatter the cached stream source (again, when its worker was lost) to a usable worker
        (`shipping.ship`) and return its Data."""
        data = self._stream_cache.data
        data = replace(data, shipped=ship(client, data.source, installed=installed))
        self._stream_cache = self._stream_cache._replace(data=data)
        return data

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stream_cache"] = state["_kept"] = None  # a Future of this process's client
        state["_warm"] = []
        return state

    def warm_up(self, net: Net, batch_size: int) -> None:
        """Have every worker run `net`'s forward and backward once at the batch sizes a fit of
        `batch_size` meets (`tasks.warm_kernels`) without waiting for it: the kernels' first calls
        then overlap the driver's set-up of the fit instead of slowing its first run's first
        iterations (a worker's run tasks queue behind its warm-up). Skipped for nets over
        `WARM_MAX_BYTES` of parameters (their iterations are long beside a first call's cost, and
        the net travels to every worker) and when the cluster cannot be asked; a warm-up that fails
        changes nothing."""
        if sum(int(v.nbytes) for v in net.params.values()) > WARM_MAX_BYTES:
            return
        try:
            client = engine_client(self)
            workers = cluster_workers(client)
            devices = worker_devices(workers)
            sizes = tasks.warm_sizes(batch_size, len(workers))
            self._warm = [
                client.submit(tasks.warm_kernels, net, sizes, devices[w], workers=[w], pure=False)
                for w in sorted(workers)
            ]
        except Exception:  # a cluster that cannot be asked now: the first run pays the first calls
            self._warm = []

    def close(self) -> None:
        """Let the servers kept between runs go (`release_kept`); the estimator calls it when a fit ends."""
        release_kept(self._kept)
        self._kept = None
        self._warm = []

    def _run(
        self, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None, control=None
    ) -> RunResult:
        if self.strategy.synchronous:  # SMA (Crossbow §3.2) or model averaging (SparkNet)
            # Crossbow §3.4 with learners='auto': tune the learners, then train
            runner = run_auto_learners if self.strategy.learners == "auto" else run_replicas
            return run_restarting(self, runner, net, X, y, config, budget, start, keep_groups=True)
        if self.strategy.physical_map == "unmerged":  # Omnivore appendix C
            return run_restarting(self, run_unmerged, net, X, y, config, budget, start, keep_groups=False)
        run = _GroupsRun(self, net, X, y, config, budget, start, control)
        return run.result(net, run.train())

    def _worker_wait(self, client) -> float:
        """Seconds a run waits for a worker when it has none (`worker_wait`, class docstring)."""
        if self.worker_wait is not None:
            return float(self.worker_wait)
        return self.timeout if elastic.adapts_to_zero(client) else 0.0

    def _throughput(self, client) -> dict[str, float] | None:
        """GFLOP/s of each worker's device (calibrated or given); unnamed workers count as the median."""
        known = getattr(self, "throughput_", None)
        if not known:
            return None
        typical = float(np.median(list(known.values())))
        return {w: known.get(w, typical) for w in cluster_workers(client)}

    def calibrate(self) -> dict[str, float]:
        """Measure every worker's SGEMM GFLOP/s (its device's) for FLOPS-proportional shares."""
        from dasknn.backend import sgemm_gflops

        client = engine_client(self)
        workers = cluster_workers(client)
        out = {}
        devices = worker_devices(workers)
        for addr in workers:
            out[addr] = client.submit(sgemm_gflops, devices[addr], workers=[addr], pure=False).result(
                timeout=self.timeout
            )
        self.throughput_ = out
        return out

    def _progress(self, budget: Budget):
        if not self.verbose:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=budget.iterations, unit="it", desc="dask engine", dynamic_ncols=True)


class _GroupsRun:
    """One run of Omnivore's g groups on the merged map, segment after segment (module docstring).

    It holds what passes from one segment to the next: the placement, the state to start from, the
    trace rows kept so far, the recoveries from lost workers (`recovery.Recovery`) and the workers
    that joined or left (`elastic.WorkerEvent`). `train()` runs the segments; `result()` sets the
    final weights on the net and makes the run's Trace.
    """

    def __init__(
        self,
        engine: DaskEngine,
        net: Net,
        X,
        y,
        config: RunConfig,
        budget: Budget,
        start: TrainState | None,
        control: RunControl | None = None,
    ) -> None:
        client = engine_client(engine)
        self.elastic_on = elastic.install(client)
        if engine.data == "stream":
            data = engine._streamed(client, X, y, config, self.elastic_on)
        else:
            data = persist_data(engine, client, X, y, config)
        self.engine, self.client, self.config, self.budget = engine, client, config, budget
        self.data, self.X, self.y = data, data.X, data.y
        usable = elastic.usable_now(client, self.elastic_on)
        self.placement = plan(usable, config.n_groups, engine._throughput(client))
        before = engine.placement_.n_groups if engine.placement_ is not None else config.n_groups
        self.first_placement = str(self.placement.roles())
        self.net, self.kept = net, False
        self.reuse = take_kept(engine._kept, client, net, config, self.placement)
        engine._kept = None
        if self.reuse is not None:  # the last run's servers, workers' nets and template: no restart
            self.state = start.copy() if start is not None else TrainState.from_net(net)
            self.conv_net, self.fc_net = self.reuse.conv_net, self.reuse.fc_net
            self.run_id, self.template = self.reuse.run_id, self.reuse.template
        else:
            begun = begin_run(engine, client, net, config, start)
            self.state, self.conv_net, self.fc_net = begun.state, begun.conv_net, begun.fc_net
            self.run_id = begun.run_id
            self.template = ship(client, self.conv_net.copy(), broadcast=True, installed=self.elastic_on)
        self.t0 = time.time()
        self.control = None if control is None else DaskControl(control, config, self.t0)
        self.deadline = None if budget.seconds is None else self.t0 + budget.seconds
        self.bar = engine._progress(budget)
        self.rows: list[dict[str, Any]] = []
        self.recoveries: list[Recovery] = []
        self.events = elastic.between_runs(engine.workers_seen_, usable, self.placement, before)
        self.started_on = set(usable)
        self.moved, self.t_change = None, self.t0  # the servers' states a hand-off moves to the next segment
        self.seg_state, self.version, self.seg, self.t_lost = self.state, 0, None, self.t0
        self.lost_all: dict[str, list[str]] = {}

    def train(self) -> TrainState:
        """Run segments until the budget is spent; the state the run ended in."""
        deadline = self.deadline
        try:
            while True:
                left = None if self.budget.iterations is None else self.budget.iterations - self.version
                if (left is not None and left <= 0) or (deadline is not None and time.time() >= deadline):
                    return self.seg_state  # a loss at the very end: the state recovered is the result
                end_state = self._segment(left)
                if end_state is not None:
                    return end_state
        except BaseException:
            if self.seg is not None:
                self.seg.stop()
            raise
        finally:
            if self.seg is not None:
                self.seg.release()
            if self.bar is not None:
                self.bar.close()
            if not self.kept:  # no later run uses the workers' copies of its net
                forget_on_workers(self.client, self.run_id)
            if self.elastic_on:
                elastic.forget(self.client, self.run_id)
            self.template = self.seg = None

    def _cluster_change(self) -> None:
        engine, park = self.engine, self.engine._worker_wait(self.client) > 0
        elastic.cluster_change(self.client, self.placement, self.config.n_groups, engine._throughput, park)

    def _segment(self, left: int | None) -> TrainState | None:
        """One segment on the current placement: its end state, or None when the run goes on in
        another segment (after a worker joined or left, or was lost)."""
        engine, client, config, bar = self.engine, self.client, self.config, self.bar
        servers, self.reuse = (None if self.reuse is None else self.reuse.servers), None  # the first only
        seg = self.seg = Segment(
            engine, client, self.placement, self.seg_state, self.version, self.state.iterations_done,
            self.moved, servers,
        )  # fmt: skip
        engine.placement_ = self.placement
        try:
            specs = tasks.group_specs(
                engine, self.placement, self.data, config.with_(n_groups=self.placement.n_groups), left,
                self.seg_state.batches_done, self.deadline, self.run_id, self.template.key,
            )  # fmt: skip
            seg.start(self.conv_net, self.fc_net, config, specs, self.template, self.data.shipped)
            if self.control is not None:
                self.control.start(seg)
            if self.elastic_on:
                elastic.use(client, self.run_id, self.placement.roles())
            if self.recoveries:
                self.recoveries[-1].seconds = time.time() - self.t_lost
            if self.moved is not None:
                self.events[-1].seconds = time.time() - self.t_change
                self.events[-1].conv_state, self.events[-1].fc_state = seg.state_digests
                self.moved = None
            try:
                seg.watch(
                    self.deadline,
                    None if bar is None else lambda v: bar.update(max(0, v - bar.n)),
                    self._check(seg),
                    None if self.control is None else min(engine.poll, CONTROL_POLL),
                )
            except elastic.ClusterChange as change:  # a worker joined or is being retired
                self._hand_off(seg, change)
                return None
            end_state = seg.finish()
            self.rows.extend(dict(r, recovered=bool(self.recoveries)) for r in seg.rows)
            if engine.keep_servers:  # for the next run (`kept`)
                if self.control is not None:
                    self.control.finish(seg)
                parts = (self.run_id, self.conv_net, self.fc_net, self.template)
                servers, self.kept = seg.keep(end_state.copy()), True
                engine._kept = Kept(servers, self.net, client, knobs_of(config), *parts)
            return end_state
        except SegmentFailed as failure:
            self._recover(seg, failure)
            return None

    def _control(self, seg: Segment) -> None:
        """Poll the run control; an actor call it made to a worker that is gone is a lost worker."""
        try:
            self.control.poll(seg)
        except SegmentFailed:
            raise
        except Exception as err:
            seg._failed(err)

    def _check(self, seg: Segment) -> Callable[[], None] | None:
        """What the watch calls at every poll: the cluster's changes, then the run control."""
        checks = [self._cluster_change] if self.elastic_on else []
        if self.control is not None:
            checks.append(lambda: self._control(seg))
        if not checks:
            return None

        def check() -> None:
            for each in checks:
                each()

        return check

    def _hand_off(self, seg: Segment, change: elastic.ClusterChange) -> None:
        """End `seg` where it is and move its servers' states to the placement `change` plans."""
        self.t_change = time.time()
        self.seg_state = seg.hand_off()
        seg.stop()
        self.version, self.moved = seg.version, seg.last_states
        self.rows.extend(dict(r, recovered=bool(self.recoveries)) for r in seg.rows)
        self.seg_state.batches_done = resume_batches(self.seg_state, seg.rows)
        seg.release()
        elastic.go_on(self, change, version=self.version, roles=Placement.roles)

    def _await_workers(self, change: elastic.ClusterChange) -> elastic.ClusterChange:
        """Let the retiring workers go, wait for one to join (`elastic.await_workers`), and return
        the change to its placement; WorkerLostError when none joins in time."""
        engine, client = self.engine, self.client
        workers = elastic.await_return(engine, client, self.run_id, change.leaving, self.elastic_on)
        if self.data.source is None:
            await_data(engine, client, self.X, self.y)  # the persisted chunks, recomputed there
        elif self.data.shipped.status != "finished":
            self.data = engine._reship(client, self.elastic_on)
        self.template = ship(client, self.conv_net.copy(), broadcast=True, installed=self.elastic_on)
        placement = plan(workers, self.config.n_groups, engine._throughput(client))
        return elastic.ClusterChange(placement, sorted(workers), change.leaving, elastic.conv_count(workers))

    def _recover(self, seg: Segment, failure: SegmentFailed) -> None:
        """After a lost worker: go on from `seg`'s last snapshot on the workers left, or raise
        WorkerLostError when the recoveries are used up or no worker (or no data) is left."""
        engine, client = self.engine, self.client
        self.t_lost = time.time()
        self.lost_all.update(failure.lost)
        seg.stop()
        if not cluster_workers(client):  # every worker lost: wait for one when the cluster may start one
            elastic.await_workers(client, engine._worker_wait(client), engine.poll, self.elastic_on)
        streamed = self.data.source is not None  # nothing persisted to recompute
        data_back = bool(cluster_workers(client)) if streamed else await_data(engine, client, self.X, self.y)
        if len(self.recoveries) >= engine.max_recoveries or not data_back:
            raise self._lost(seg, cluster_workers(client)) from failure
        self.seg_state, self.version, kept, redone = seg.resume_point(failure)
        seg.release()
        self.rows.extend(dict(r, recovered=bool(self.recoveries)) for r in kept)
        self.seg_state.batches_done = resume_batches(self.seg_state, kept)
        before = self.placement.n_groups
        alive = cluster_workers(client)
        if not alive:
            raise self._lost(seg, alive) from failure
        # the conv-phase template again: its copies may all have been on lost workers
        self.template = ship(client, self.conv_net.copy(), broadcast=True, installed=self.elastic_on)
        if streamed and self.data.shipped.status != "finished":  # its worker was lost
            self.data = engine._reship(client, self.elastic_on)
        self.placement = replan(alive, self.placement, engine._throughput(client))
        self.recoveries.append(
            Recovery(
                time=self.t_lost - self.t0,
                worker=", ".join(failure.lost),
                roles=sorted({r for roles in failure.lost.values() for r in roles}),
                iterations_redone=redone or 0,
                n_groups_before=before,
                n_groups_after=self.placement.n_groups,
                from_snapshot=redone is not None,
                snapshot_version=self.version,
                placement=str(self.placement.roles()),
                n_workers=len(plan(alive, 1).conv_workers),
            )
        )

    def _lost(self, seg: Segment, alive: dict[str, Any]) -> Exception:
        """The WorkerLostError that ends the run after `seg` lost workers, `alive` the workers left."""
        return lost_error(
            self.lost_all, seg.version, len(self.recoveries), self.engine.max_recoveries, alive,
            self.placement, self.state.iterations_done,
        )  # fmt: skip

    def result(self, net: Net, end_state: TrainState) -> RunResult:
        """Set the run's final weights on `net`; the RunResult with the run's Trace."""
        net.set_params(end_state.params)
        end_state.batches_done = max([self.state.batches_done, *(r["batch"] + 1 for r in self.rows)])
        on_run_clock(self.rows, self.t0, self.config, self.X.shape[0])
        usable = elastic.at_run_end(
            self.engine, self.client, self.started_on, self.events, self.elastic_on, self.lost_all
        )
        trace = make_trace(
            self.rows,
            "dask",
            n_groups=self.config.n_groups,
            placement=self.first_placement,
            batch_size=self.config.batch_size,
            strategy=self.engine.strategy.name,
            aggregation=self.engine.strategy.aggregation,
            split=self.fc_net.layers[0].name,
            recoveries=[r.as_dict() for r in self.recoveries],
            worker_events=[e.as_dict() for e in self.events],
            n_workers=elastic.conv_count(usable),
            started=self.t0,
            **({} if self.control is None else {"control": [a.as_dict() for a in self.control.applied]}),
        )
        return RunResult(trace=trace, state=end_state)


LOSS_NOTICE_SECONDS = 10.0
"""How long a run that failed on a lost connection waits for the scheduler to notice which workers
are gone (a killed worker's connection can close on the client before the scheduler removes it)."""


def _settled_workers(client) -> dict[str, Any]:
    """The cluster's workers once the scheduler has caught up with a loss the client saw first:
    polled until none is left or LOSS_NOTICE_SECONDS have passed."""
    deadline = time.monotonic() + LOSS_NOTICE_SECONDS
    alive = cluster_workers(client)
    while alive and time.monotonic() < deadline:
        time.sleep(0.25)
        alive = cluster_workers(client)
    return alive
