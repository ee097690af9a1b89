"""The worker side of the Dask engine: what an iteration's transports call on the workers (a
worker's copy of the net, one shard's conv forward and backward, the unmerged map's whole-net
step), the `ShardServer` actor that serves a remote shard, the shard tasks (`conv_forward`,
`conv_backward`, `whole_net_step`) and the sum of gradients (`sum_grads`, `aggregate`,
`reduce_on_servers`); docs/architecture.md, "One iteration's data flow" and its transports.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.data.augment import Augment
from dasknn.data.stream import StreamSource
from dasknn.engine.dask.actors import submit_actor
from dasknn.engine.dask.batches import batch_reader
from dasknn.engine.dask.placement import Placement, shard_sizes
from dasknn.engine.streams import shard_rng
from dasknn.nn.device import DeviceNet

if TYPE_CHECKING:
    from dasknn.engine.dask.runs import Data
    from dasknn.engine.schedule import Schedule
    from dasknn.engine.trace import RunConfig
    from dasknn.nn.net import Net

_NETS: dict[str, DeviceNet] = {}  # run → this worker's one device copy of its net
_NETS_LOCK = threading.Lock()
_CACHES: dict[tuple[str, str, int], Any] = {}  # (run, token, shard) → a forward cache
_SOURCES: dict[str, StreamSource] = {}  # source name → the stream source this worker last read
_KEEP_SOURCES = 2
STOP_CHECK_SECONDS = 0.5
TRIM_SECONDS = 5.0
"""How often a group's loop hands freed heap memory back to the OS (`release_freed_memory`)."""


@dataclass(frozen=True)
class GroupSpec:
    """What one group's loop needs: its workers, its batches, its budget, its knobs."""

    run_id: str
    group: int
    n_groups: int
    workers: tuple[str, ...]
    shares: tuple[float, ...]
    devices: tuple[str, ...]
    template_key: str
    x_keys: tuple
    y_keys: tuple
    chunks: tuple[int, ...]
    batch_size: int
    seed: int
    first_batch: int
    iterations: int | None
    deadline: float | None
    lr: float | Schedule  # a Schedule the servers evaluate at each update
    momentum: float | Schedule
    timeout: float
    aggregation: str = "tree"
    branching: int = 2
    ps_worker: str | None = None
    source: StreamSource | None = None
    augment: Augment | None = None
    shuffle_window: int = 1
    prefetch: int = 2
    own_reads: bool = False


def group_specs(
    engine,
    placement: Placement,
    data: Data,
    config: RunConfig,
    iterations: int | None,
    first_batch: int,
    deadline: float | None,
    run_id: str,
    template_key: str,
) -> list[GroupSpec]:
    """One loop's spec per compute group of `placement`: its workers, their shares and devices, the
    data's keys, its part of `iterations` (the first groups take the remainder) and the knobs."""
    g = placement.n_groups
    specs = []
    for i, workers in enumerate(placement.groups):
        share = None if iterations is None else iterations // g + (1 if i < iterations % g else 0)
        specs.append(
            GroupSpec(
                run_id=run_id,
                group=i,
                n_groups=g,
                workers=tuple(workers),
                shares=tuple(placement.shares[w] for w in workers),
                devices=tuple(placement.devices[w] for w in workers),
                template_key=template_key,
                x_keys=data.x_keys,
                y_keys=data.y_keys,
                chunks=data.chunks,
                batch_size=config.batch_size,
                seed=config.seed,
                first_batch=first_batch,
                iterations=share,
                deadline=deadline,
                lr=config.lr,
                momentum=config.momentum,
                timeout=engine.timeout,
                aggregation=engine.strategy.aggregation,
                branching=int(engine.strategy.branching),
                ps_worker=placement.conv_server_worker,
                source=data.source,
                augment=engine.augment,
                shuffle_window=engine.shuffle_window,
                prefetch=engine.prefetch,
                own_reads=engine.shard_reads == "own",
            )
        )
    return specs


def _this_worker():
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def _call(actor, method: str, *args, timeout: float = 120.0):
    """Call a server method: directly if its actor lives in this worker, else as an actor call."""
    worker = _this_worker()
    if worker is not None and getattr(actor, "_address", None) == worker.address:
        server = getattr(getattr(worker, "state", None), "actors", {}).get(actor.key)
        if server is not None:
            return getattr(server, method)(*args)
    try:
        return getattr(actor, method)(*args).result(timeout=timeout)
    except OSError as err:
        raise ConnectionError(
            f"the worker holding the {getattr(actor, '_cls', type(actor)).__name__} "
            f"{getattr(actor, '_address', '?')} cannot be reached: {err}"
        ) from err


def _net(run_id: str, template, device: str) -> DeviceNet:
    """This worker's one copy of a run's net (conv phase, or whole net unmerged) on its device,
    shared by the worker's threads."""
    with _NETS_LOCK:
        net = _NETS.get(run_id)
        if net is None:
            net = _NETS[run_id] = DeviceNet(template, device)
    return net


def forget_run(run_id: str) -> int:
    """Drop a finished run's cached nets and forward caches from this worker process; returns how
    many nets."""
    with _NETS_LOCK:
        dropped = int(_NETS.pop(run_id, None) is not None)
        for k in [k for k in _CACHES if k[0] == run_id]:
            del _CACHES[k]
    return dropped


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the heap memory this process has freed to the OS (glibc `malloc_trim(0)`); False
    where that is not available.

    A group's loop frees a batch, its activations and its gradients every iteration, across the
    reading, compute and actor threads; glibc keeps much of that freed memory in its per-thread
    arenas, so the lead worker's resident memory grew by ~300 MB over 1,200 iterations of a
    streamed run (dask counts it as unmanaged memory and pauses, then restarts, the worker)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def set_blas_threads(n: int) -> int:
    """Limit this worker's BLAS/OpenMP threads."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=int(n))
    return int(n)


DIVERGENCE_WARNINGS = r"(overflow|invalid value|divide by zero) encountered"


def prepare_worker(blas_threads: int | None) -> None:
    """Set up a worker for training: its BLAS threads (when given), and numpy's overflow, invalid-value
    and divide-by-zero RuntimeWarnings from dasknn's and numpy's own code filtered out in this
    process, where they would print on the worker's stderr, the user's console for a LocalCluster.
    A diverging run is the fit's to report (a rollback in `decisions_`, a FloatingPointError when
    every rate diverges): the loop checks each run's loss and weights, not numpy's warnings."""
    import warnings

    if blas_threads:
        set_blas_threads(blas_threads)
    warnings.filterwarnings(
        "ignore", message=DIVERGENCE_WARNINGS, category=RuntimeWarning, module=r"(dasknn|numpy)\."
    )


def _forward(net: DeviceNet, weights, x, seed: int, batch: int, shard: int):
    """One shard's conv forward: (host activations, caches), its dropout drawn from the run's
    stream for (batch, shard) (`streams.shard_rng`), so a run is reproducible from its seed."""
    return net.forward(weights, x, shard_rng(seed, batch, shard))


def _backward(net: DeviceNet, weights, caches, dacts) -> dict[str, np.ndarray]:
    """One shard's conv backward from its forward's caches (which hold the lowered weights)."""
    return net.backward(weights, caches, dacts)


def _whole_net(net: DeviceNet, weights, x, y, rng_key, weight: float = 1.0) -> dict[str, Any]:
    """Forward and backward of a whole net (conv + FC) on one shard: {"grads", "loss", "accuracy"},
    each × `weight` (the shard's n_i / B), so k shards' results sum to the full batch's."""
    loss, acc, grads = net.loss_and_grads(weights, x, y, np.random.default_rng(list(rng_key)))
    if weight != 1.0:
        w = np.float32(weight)
        grads = {k: g * w for k, g in grads.items()}
    return {"grads": grads, "loss": float(loss) * weight, "accuracy": float(acc) * weight}


FC_RNG_STREAM = 5
"""The dropout stream of a batch's FC phase on the unmerged map, as UnmergedSimulation draws it."""


def whole_net_step(run_id: str, template, weights, x, y, device: str, rng_key, weight: float = 1.0):
    """Forward and backward of the whole net (conv + FC) on one shard, FC computed on this worker
    (the unmerged map's shard step, as a task or inline).

    Returns {"grads", "loss", "accuracy"}, each multiplied by `weight` (the shard's n_i / B), so the
    k shards' results sum to the full batch's (SoftmaxWithLoss averages over the shard).
    """
    return _whole_net(_net(run_id, template, device), weights, x, y, rng_key, weight)


FC_RECORD = ("loss", "main_loss", "accuracy", "grad_sq", "grad_sq_half")
"""What a Trace row takes from the FC server's step: the weighted total loss, the main head's loss
and accuracy, and the squared gradient norms the noise scale is estimated from."""


def _until_stopped(ready, spec: GroupSpec, conv_server, what: str) -> bool:
    """Call `ready(timeout)` (raises TimeoutError while not done) every STOP_CHECK_SECONDS, at most
    `spec.timeout` s in all; False as soon as the conv model server stops.

    A shard on a worker that died never answers; the driver then stops the server, and the loop
    must notice that rather than wait for the shard."""
    deadline = time.monotonic() + spec.timeout
    while True:
        try:
            ready(STOP_CHECK_SECONDS)
            return True
        except TimeoutError:
            if _call(conv_server, "progress", timeout=spec.timeout)[1]:
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {spec.group}: {what} silent for {spec.timeout:.0f} s") from None


def _wait(futures: list, spec: GroupSpec, conv_server) -> bool:
    """Wait for shard tasks (see `_until_stopped`)."""
    from distributed import wait

    return _until_stopped(
        lambda t: wait(futures, timeout=t), spec, conv_server, f"shard tasks on {', '.join(spec.workers)}"
    )


class ShardServer:
    """The conv shard of one (non-lead) worker of a group, served as a dask actor on that worker.

    `forward(token, weights, x, seed, batch, shard)` runs the shard's conv forward with batched
    lowering, its dropout drawn from the run's stream for (batch, shard), and keeps its cache (and
    the weights it used) under `token`; `backward(token, dacts)` runs the conv backward
    from that cache and returns the weight gradient, or with `keep=True` keeps it for a reduction
    tree: `absorb(token, *servers)` adds the kept gradients of other ShardServers (fetched from
    their workers with `take`) to this one's. Its methods are coroutines that compute in the
    server's own thread: dask runs a worker's blocking actor methods on ONE thread, which the conv
    model and FC servers on the same worker also use, and a shard's compute must not queue them.

    With streamed data, `open_stream` starts a reader of this worker's rows of each of the group's
    batches straight from the source (read ahead in its own thread), and `forward` with x None
    takes its shard from there: the lead worker then reads only its own shard.
    """

    def __init__(self, template, device: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.device = device
        self.net = DeviceNet(template, device)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dasknn-shard")
        self._caches: dict[str, Any] = {}
        self._grads: dict[str, dict[str, np.ndarray]] = {}
        self._streams: dict[str, Any] = {}

    async def open_stream(
        self, key: str, spec: GroupSpec, rows: tuple[int, int], name: str, source: StreamSource | None = None
    ) -> bool:
        """Read rows lo:hi of each of `spec`'s batches from the source named `name` under `key`;
        False (nothing started) when this worker has not seen that source and `source` is None."""
        source = source if source is not None else _SOURCES.get(name)
        if source is None:
            return False
        _SOURCES[name] = source
        while len(_SOURCES) > _KEEP_SOURCES:
            _SOURCES.pop(next(iter(_SOURCES)))
        await self.close_stream(key)  # joins its thread: off the worker's event loop
        self._streams[key] = batch_reader(None, replace(spec, source=source), rows=rows)
        return True

    async def close_stream(self, key: str) -> None:
        """Stop the reader opened under `key` (a no-op when there is none)."""
        reader = self._streams.pop(key, None)
        if reader is not None:
            await self._compute(reader.close)

    async def _compute(self, fn, *args):
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _forward(self, token: str, weights, x, seed: int, batch: int, shard: int, stream: str | None = None):
        if x is None:  # this worker's rows, from its own stream
            x, _ = self._streams[stream].get(batch)
        acts, caches = _forward(self.net, weights, x, seed, batch, shard)
        self._caches[token] = (weights, caches)
        return acts

    def _backward(self, token: str, dacts, keep: bool):
        cached = self._caches.pop(token, None)
        if cached is None:
            raise RuntimeError(f"no forward cache for {token} on this shard server")
        grads = _backward(self.net, cached[0], cached[1], dacts)
        if keep:
            self._grads[token] = grads
            return None
        return grads

    async def forward(
        self, token: str, weights, x, seed: int, batch: int, shard: int, stream: str | None = None
    ) -> np.ndarray:
        """The shard's activations; x None: read from the stream opened under `stream`."""
        return await self._compute(self._forward, token, weights, x, seed, batch, shard, stream)

    async def backward(self, token: str, dacts, keep: bool = False) -> dict[str, np.ndarray] | None:
        return await self._compute(self._backward, token, dacts, keep)

    def _whole(self, token: str, weights, x, y, rng_key, weight: float, keep: bool):
        out = _whole_net(self.net, weights, x, y, rng_key, weight)
        if keep:
            self._grads[token] = out.pop("grads")
        return out

    async def whole_step(
        self, token: str, weights, x, y, rng_key, weight: float = 1.0, keep: bool = False
    ) -> dict[str, Any]:
        """The unmerged map's shard step: the whole net (conv + FC) on this worker's shard
        (`template` is then the whole net); with `keep`, its gradient stays for the tree."""
        return await self._compute(self._whole, token, weights, x, y, rng_key, weight, keep)

    async def take(self, token: str) -> dict[str, np.ndarray]:
        return self._grads.pop(token)

    async def absorb(self, token: str, *servers) -> None:
        """One node of the reduction tree: this server's kept gradient += the others' (taken)."""
        import asyncio

        parts = await asyncio.gather(*(srv.take(token) for srv in servers))
        self._grads[token] = await self._compute(sum_grads, self._grads[token], *parts)

    async def held(self) -> int:
        """Forward caches and kept gradients held (0 between iterations: nothing leaks)."""
        return len(self._caches) + len(self._grads)


def uses_shard_servers(engine) -> bool:
    """Whether `engine`'s groups of k > 1 reach their remote shards through ShardServer actors
    (`DaskEngine(shard_calls="actors")`, except with aggregation 'ps', which sums with tasks)."""
    return engine.shard_calls == "actors" and engine.strategy.aggregation != "ps"


def submit_shard_servers(client, groups, devices: dict[str, str], template) -> dict[str, Any]:
    """A ShardServer actor (of `template` on its device) on every worker of `groups` but each
    group's lead: worker → the actor's future."""
    return {
        w: submit_actor(client, ShardServer, template, devices[w], worker=w)
        for group in groups
        for w in group[1:]
    }


def _actor_results(futures: list, spec, conv_server) -> list | None:
    """The results of actor calls (see `_until_stopped`); None once the conv model server stops."""
    what = f"shard servers on {', '.join(spec.workers[1:])}"
    out = []
    for fut in futures:
        try:
            if not _until_stopped(lambda t, f=fut: f.result(timeout=t), spec, conv_server, what):
                return None
            out.append(fut.result())  # done: returns at once
        except TimeoutError:  # a subclass of OSError: the deadline, not a lost connection
            raise
        except OSError as err:
            raise ConnectionError(f"group {spec.group}: a shard server cannot be reached: {err}") from err
    return out


def reduce_on_servers(shard_servers, token: str, spec, conv_server) -> list | None:
    """The sum of the gradients the shard servers keep under `token`, by a reduction tree of
    `spec.branching` among them (each node `absorb`s its children's), as [sum] at the caller; None
    once the conv model server stops."""
    level, b = list(shard_servers), max(2, int(spec.branching))
    while len(level) > 1:
        heads = [level[i : i + b] for i in range(0, len(level), b)]
        calls = [h[0].absorb(token, *h[1:]) for h in heads if len(h) > 1]
        if _actor_results(calls, spec, conv_server) is None:
            return None
        level = [h[0] for h in heads]
    return _actor_results([level[0].take(token)], spec, conv_server)


def shard_bounds(spec) -> np.ndarray:
    """Where each worker's shard of a group's batch starts and ends: k + 1 offsets, from 0 to B."""
    return np.cumsum([0, *shard_sizes(spec.batch_size, spec.shares)])


def warm_kernels(net: Net, sizes: tuple[int, ...], device: str) -> float:
    """One forward and backward of the whole net at each batch size in `sizes`, on zeros, in this
    worker process: the kernels' first calls (oneDNN's primitives for each shape, BLAS's buffers,
    first-touch of the activations' memory) are paid here, while the driver sets a fit up, and not
    by a run's first iterations. Nothing of it is kept but those process-wide caches; returns its
    seconds."""
    t0 = time.perf_counter()
    dnet = DeviceNet(net, device)
    weights = net.get_params()
    for b in sizes:
        x = np.zeros((int(b), *net.input_shape), dtype=np.float32)
        dnet.loss_and_grads(weights, x, np.zeros(int(b), dtype=np.int64), np.random.default_rng(0))
    return time.perf_counter() - t0


def warm_sizes(batch_size: int, n_workers: int, most: int = 4) -> tuple[int, ...]:
    """The batch sizes a worker's kernels meet in a fit of `batch_size` on `n_workers` workers: the
    batch (the FC server, groups of one) and the shards of groups of k = 2 .. `most` workers that
    divide the workers, split evenly (the groups a tuner tries first)."""
    sizes = {int(batch_size)}
    for k in range(2, min(int(n_workers), most, int(batch_size)) + 1):
        if n_workers % k == 0:
            sizes.update(shard_sizes(int(batch_size), [1.0] * k))
    return tuple(sorted(sizes, reverse=True))


# -- the shard tasks of a group of k > 1 workers -------------------------------------------------


def conv_forward(run_id, token, shard, template, weights, x, device, iteration_key) -> np.ndarray:
    """One shard's conv forward with batched lowering; returns the activations and keeps the cache
    in this worker process for the shard's `conv_backward` (same run, token and shard).
    `iteration_key`: (seed, batch), whose stream for this shard the forward draws from."""
    net = _net(run_id, template, device)
    acts, caches = _forward(net, weights, x, *iteration_key, shard)
    with _NETS_LOCK:
        _CACHES[(run_id, token, shard)] = caches
    return acts


def conv_backward(run_id, token, shard, template, weights, fwd_done, dacts, device) -> dict[str, np.ndarray]:
    """One shard's conv backward on the worker that holds its forward cache (`fwd_done`, the forward
    task's result, makes this task wait for it)."""
    with _NETS_LOCK:
        caches = _CACHES.pop((run_id, token, shard), None)
    if caches is None:
        raise RuntimeError(f"no forward cache for shard {shard} of {token} in run {run_id} on this worker")
    net = _net(run_id, template, device)
    return _backward(net, weights, caches, dacts)


def sum_grads(*grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One node of a reduction tree, or the parameter server's sum: the sum of gradient dicts."""
    return {k: sum(g[k] for g in grads[1:]) + grads[0][k] for k in grads[0]}


def aggregate(
    client,
    grads: list,
    aggregation: str = "tree",
    branching: int = 2,
    ps_worker: str | None = None,
    local: dict[str, np.ndarray] | None = None,
) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The sum of k gradients, as FireCaffe §6 compares, as (future, local): the sum is
    the future's value plus `local` (either may be None).

    `grads`: futures of gradients on workers; `local`: the calling (lead) worker's own gradient, or
    None. 'tree': a reduction tree, each task summing up to `branching` results, ceil(log_b k)
    levels (b = 2: pairwise sums); the lead's gradient joins at the root, on the lead. 'ps':
    parameter-server style, all k gradients summed by one task on `ps_worker` (the conv model
    server's worker); the lead's gradient is sent there, unless the lead is that worker.
    """
    if aggregation not in ("tree", "ps"):
        raise ValueError(f"aggregation must be 'tree' or 'ps', got {aggregation!r}")
    if aggregation == "ps":
        here = _this_worker()
        if local is not None and ps_worker and (here is None or here.address != ps_worker):
            grads, local = [client.scatter(local, workers=[ps_worker], direct=True, hash=False), *grads], None
        where = {"workers": [ps_worker], "allow_other_workers": False} if ps_worker else {}
        total = client.submit(sum_grads, *grads, pure=False, **where) if len(grads) > 1 else None
        return (total if total is not None else (grads[0] if grads else None)), local
    b = int(branching)
    while len(grads) > 1:
        grads = [
            client.submit(sum_grads, *grads[i : i + b], pure=False) if len(grads[i : i + b]) > 1 else grads[i]
            for i in range(0, len(grads), b)
        ]
    return (grads[0] if grads else None), local
