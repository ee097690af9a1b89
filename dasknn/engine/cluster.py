"""DaskEngine: Omnivore's compute groups on a real dask cluster (Omnivore §III-B on Dask).

The conv model server and the merged FC server are dask actors pinned to workers; each compute
group's iterations are a chain of tasks (an iteration's first task depends on the group's previous
iteration), so a group runs without waiting for the client and g groups run with no barrier
between them. Arrays move worker to worker; the client only submits tasks and collects the small
Trace rows. The driver keeps a few iterations per group in flight, checks that every worker of
the plan is alive, and never waits without a bound.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask.array as da
import numpy as np

from dasknn.data.batching import n_batches
from dasknn.engine import tasks
from dasknn.engine.placement import Placement, plan
from dasknn.engine.servers import ConvModelServer, FCServer
from dasknn.engine.strategies import split_layer
from dasknn.engine.trace import Budget, RunConfig, RunResult, Strategy, TrainState, make_trace
from dasknn.nn.net import Net


def _as_dask(X, y, batch_size: int):
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


def _chunk_futures(arr) -> list:
    """The futures of a persisted array's blocks along samples, in order (one block per sample chunk)."""
    from distributed import futures_of

    by_key = {f.key: f for f in futures_of(arr)}
    out = []
    for key in arr.__dask_keys__():
        while isinstance(key, list):
            key = key[0]
        out.append(by_key[key])
    return out


class WorkerLostError(RuntimeError):
    """A worker the run depends on left the cluster (or stopped answering)."""


def cluster_workers(client) -> dict[str, dict[str, Any]]:
    """address → scheduler info (resources, nthreads) of every worker of the client's cluster."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed < 2025: no n_workers argument, all workers returned
        info = client.scheduler_info()
    return dict(info["workers"])


@contextmanager
def local_client(
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    processes: bool = True,
    security=None,
    tune_malloc: bool = True,
    **cluster_kwargs,
) -> Iterator[Any]:
    """A LocalCluster sized to this machine and a Client on it, closed on exit.

    Each worker process gets cores // n_workers BLAS threads, so the workers together use the
    machine's cores once (numpy's BLAS would otherwise start a thread per core in every worker).
    `tune_malloc`: dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which turns off
    glibc's dynamic mmap threshold, so every large temporary (lowered matrices, activations) is
    mapped and faulted in afresh each iteration; raising the mmap and trim thresholds to 32/64 MiB
    makes a worker's training step as fast as in-process (experiments/bench_overhead.py measures it).
    """
    import dask
    from distributed import Client, LocalCluster

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_workers = n_workers or max(1, min(cores, 4))
    blas = str(max(1, cores // n_workers))
    environ = {
        f"distributed.nanny.pre-spawn-environ.{k}": blas
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    }
    if tune_malloc:
        environ["distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"] = str(32 * 2**20)
        environ["distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"] = str(64 * 2**20)
    kwargs = {"dashboard_address": None, **cluster_kwargs}
    if security is not None:
        kwargs["security"] = security
        kwargs.setdefault("protocol", "tls://")
    # the nanny lets the driver's os.environ win over its config (and writes its values back into
    # os.environ), so the variables are set there too while the workers start, then restored
    worker_env = {key.rsplit(".", 1)[1]: value for key, value in environ.items()}
    saved = {k: os.environ.get(k) for k in worker_env}
    os.environ.update(worker_env)
    try:
        with dask.config.set(environ):
            cluster = LocalCluster(
                n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes, **kwargs
            )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    client = Client(cluster, security=security) if security is not None else Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


class DaskEngine:
    """Runs g compute groups on a dask cluster; `run(...)` follows the Engine contract (trace.py).

    `blas_threads` limits BLAS threads per worker process (None: leave the workers as they are);
    `timeout` bounds every wait on a server or a task (seconds); `window` is how many iterations
    each group keeps submitted ahead; `verbose` > 0 shows a progress bar.

    `strategy` (trace.Strategy, issue #7): on this engine, `aggregation` ('tree' with `branching`, or
    'ps': summed on the conv model server's worker, FireCaffe §6) and `split` (None, 'auto' for
    RALP's rule, or a layer name). SMA, model averaging and the unmerged map run on the
    SimulatedEngine only.
    """

    def __init__(
        self,
        client=None,
        *,
        blas_threads: int | None = None,
        timeout: float = 120.0,
        window: int = 2,
        verbose: int = 0,
        poll: float = 1.0,
        strategy: Strategy | None = None,
    ) -> None:
        strategy = strategy if strategy is not None else Strategy()
        if strategy.synchronous or strategy.physical_map != "merged":
            raise ValueError(
                f"DaskEngine runs Omnivore's merged layout; strategy {strategy.name!r} with physical_map "
                f"{strategy.physical_map!r} runs on the SimulatedEngine"
            )
        self.strategy = strategy
        self.client = client
        self.blas_threads = blas_threads
        self.timeout = float(timeout)
        self.window = max(1, int(window))
        self.verbose = verbose
        self.poll = float(poll)
        self.placement_: Placement | None = None

    def _client(self):
        if self.client is not None:
            return self.client
        from distributed import default_client

        return default_client()

    # -- setup -----------------------------------------------------------------------------------
    def _servers(
        self, client, conv_net: Net, fc_net: Net, state: TrainState, config: RunConfig, placement: Placement
    ):
        conv_keys = set(conv_net.params)
        conv_state = {
            "params": {k: v for k, v in state.params.items() if k in conv_keys},
            "solver": {
                "iter": state.iterations_done,
                "history": {k: v for k, v in state.momentum.items() if k in conv_keys},
            },
            "version": 0,
        }
        fc_net = fc_net.copy()
        fc_net.set_params({k: v for k, v in state.params.items() if k not in conv_keys})
        conv_future = client.submit(
            ConvModelServer,
            conv_state["params"],
            conv_net.lr_mult,
            conv_net.decay_mult,
            config.weight_decay,
            actor=True,
            workers=[placement.conv_server_worker],
            allow_other_workers=False,
            pure=False,
        )
        fc_future = client.submit(
            FCServer,
            fc_net,
            config.weight_decay,
            config.seed,
            actor=True,
            workers=[placement.fc_worker],
            allow_other_workers=False,
            pure=False,
        )
        conv_server, fc_server = (
            conv_future.result(timeout=self.timeout),
            fc_future.result(timeout=self.timeout),
        )
        conv_server.set_state(conv_state).result(timeout=self.timeout)
        fc_history = {k: v for k, v in state.momentum.items() if k not in conv_keys}
        if fc_history or "fc_rng" in state.extra:
            fc_state = fc_server.get_state().result(timeout=self.timeout)
            fc_state["solver"] = {"iter": state.iterations_done, "history": fc_history}
            fc_state["rng"] = state.extra.get("fc_rng", fc_state["rng"])
            fc_server.set_state(fc_state).result(timeout=self.timeout)
        return (conv_future, conv_server), (fc_future, fc_server)

    # -- the run ---------------------------------------------------------------------------------
    def _check_alive(self, client, placement: Placement, done: int) -> None:
        alive = set(cluster_workers(client))
        for worker, roles in placement.roles().items():
            if worker not in alive:
                raise WorkerLostError(
                    f"worker {worker} ({', '.join(roles)}) left the cluster after {done} iterations; "
                    "the run cannot continue on this placement"
                )

    def _specs(
        self,
        X,
        y,
        placement: Placement,
        config: RunConfig,
        budget: Budget,
        state: TrainState,
        run_id: str,
        template_key: str,
        t0: float,
    ) -> list[tasks.GroupSpec]:
        g = placement.n_groups
        x_keys = tuple(f.key for f in _chunk_futures(X))
        y_keys = tuple(f.key for f in _chunk_futures(y))
        specs = []
        for i, workers in enumerate(placement.groups):
            iterations = None
            if budget.iterations is not None:
                iterations = budget.iterations // g + (1 if i < budget.iterations % g else 0)
            specs.append(
                tasks.GroupSpec(
                    run_id=run_id,
                    group=i,
                    n_groups=g,
                    workers=tuple(workers),
                    shares=tuple(placement.shares[w] for w in workers),
                    devices=tuple(placement.devices[w] for w in workers),
                    template_key=template_key,
                    x_keys=x_keys,
                    y_keys=y_keys,
                    chunks=tuple(int(c) for c in X.chunks[0]),
                    batch_size=config.batch_size,
                    seed=config.seed,
                    first_batch=state.batches_done,
                    iterations=iterations,
                    deadline=None if budget.seconds is None else t0 + budget.seconds,
                    lr=config.lr,
                    momentum=config.momentum,
                    timeout=self.timeout,
                    aggregation=self.strategy.aggregation,
                    branching=int(self.strategy.branching),
                    ps_worker=placement.conv_server_worker,
                )
            )
        return specs

    def run(
        self, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None
    ) -> RunResult:
        """Train `net` for `budget` with `config.n_groups` groups; sets the final weights on `net`."""
        from distributed import wait

        client = self._client()
        X, y = _as_dask(X, y, config.batch_size)
        if X.shape[0] < config.batch_size:
            raise ValueError(f"{X.shape[0]} samples are fewer than one batch of {config.batch_size}")
        X, y = client.persist([X, y])
        wait([X, y], timeout=self.timeout)
        placement = plan(cluster_workers(client), config.n_groups, self._throughput(client))
        self.placement_ = placement
        if self.blas_threads:
            client.run(tasks.set_blas_threads, self.blas_threads)
        state = start.copy() if start is not None else TrainState.from_net(net)
        conv_net, fc_net = net.split_phases(at=split_layer(net, self.strategy, config.batch_size))
        if fc_net is None:
            raise ValueError(f"net {net.name!r} has no FC phase (no InnerProduct layer) for the FC server")
        (conv_future, conv_server), (fc_future, fc_server) = self._servers(
            client, conv_net, fc_net, state, config, placement
        )
        run_id = uuid.uuid4().hex
        template = client.scatter(conv_net.copy(), broadcast=True, hash=False)
        t0 = time.time()
        specs = self._specs(X, y, placement, config, budget, state, run_id, template.key, t0)
        loops = [
            client.submit(
                tasks.group_loop,
                spec,
                template,
                conv_server,
                fc_server,
                workers=[spec.workers[0]],
                allow_other_workers=False,
                pure=False,
            )
            for spec in specs
        ]
        bar, shown = self._progress(budget), 0
        try:
            while True:
                try:
                    wait(loops, timeout=self.poll)
                    break
                except TimeoutError:
                    pass
                errored = [f for f in loops if f.status == "error"]
                if errored:
                    break
                self._check_alive(client, placement, shown)
                if bar is not None:
                    done, _ = conv_server.progress().result(timeout=self.timeout)
                    bar.update(done - shown)
                    shown = done
                if budget.seconds is not None and time.time() - t0 > budget.seconds + self.timeout:
                    raise TimeoutError(f"the run is {self.timeout:.0f} s past its budget; a group is stuck")
            rows = []
            for f in loops:
                rows.extend(self._result(f, client, placement, shown))
            end_state = self._final_state(conv_server, fc_server, state, len(rows))
        except BaseException:
            conv_server.stop()
            raise
        finally:
            if bar is not None:
                bar.close()
            client.cancel(loops)
            client.run(tasks.forget_run, run_id, on_error="ignore")
            del conv_server, fc_server, conv_future, fc_future, template
        net.set_params(end_state.params)
        nb = n_batches(X.shape[0], config.batch_size)
        end_state.batches_done = max([state.batches_done, *(r["batch"] + 1 for r in rows)])
        for row in rows:
            row.update(
                t_start=row["t_start"] - t0,
                t_end=row["t_end"] - t0,
                lr=config.lr,
                momentum=config.momentum,
                epoch=row["batch"] / nb,
                iteration=state.iterations_done + row["version_written"],
            )
        trace = make_trace(
            rows,
            "dask",
            n_groups=config.n_groups,
            placement=str(placement.roles()),
            batch_size=config.batch_size,
            strategy=self.strategy.name,
            aggregation=self.strategy.aggregation,
            split=fc_net.layers[0].name,
        )
        return RunResult(trace=trace, state=end_state)

    def _result(self, fut, client, placement, done) -> list[dict[str, Any]]:
        try:
            return list(fut.result(timeout=self.timeout))
        except ConnectionError as err:
            self._check_alive(client, placement, done)
            raise WorkerLostError(str(err)) from err
        except Exception as err:
            if "Worker holding Actor was lost" in str(err) or type(err).__name__ in (
                "KilledWorker",
                "CancelledError",
            ):
                self._check_alive(client, placement, done)
                raise WorkerLostError(f"a worker of the run was lost after {done} iterations: {err}") from err
            raise

    def _final_state(self, conv_server, fc_server, state: TrainState, n_done: int) -> TrainState:
        conv = conv_server.get_state().result(timeout=self.timeout)
        fc = fc_server.get_state().result(timeout=self.timeout)
        return TrainState(
            params={**conv["params"], **fc["params"]},
            momentum={**conv["solver"]["history"], **fc["solver"]["history"]},
            batches_done=state.batches_done,
            iterations_done=state.iterations_done + n_done,
            extra={**state.extra, "fc_rng": fc["rng"]},
        )

    def _throughput(self, client) -> dict[str, float] | None:
        """Measured GFLOP/s of each worker's device (the FLOPS calibration, cached per worker)."""
        return getattr(self, "throughput_", None)

    def calibrate(self) -> dict[str, float]:
        """Measure every worker's SGEMM GFLOP/s (its device's) for FLOPS-proportional shares."""
        from dasknn.backend import sgemm_gflops

        client = self._client()
        workers = cluster_workers(client)
        out = {}
        for addr, info in workers.items():
            device = "gpu" if float(info.get("resources", {}).get("GPU", 0)) > 0 else "cpu"
            out[addr] = client.submit(sgemm_gflops, device, workers=[addr], pure=False).result(
                timeout=self.timeout
            )
        self.throughput_ = out
        return out

    def _progress(self, budget: Budget):
        if not self.verbose:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=budget.iterations, unit="it", desc="dask engine", dynamic_ncols=True)
