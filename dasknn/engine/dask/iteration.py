"""One iteration of a compute group, written once; a transport says how the group reaches its shards
(`Inline`, `ShardActors`, `ShardTasks`: docs/architecture.md, "One iteration's data flow"; Omnivore
§III-B). On the unmerged map (Omnivore appendix C) a shard's forward, FC step and backward are one
call. `group_loop` runs the iteration until the group's iterations, its deadline or the stop
signal; these functions run on the group's lead worker.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from dasknn.engine.dask.actors import submit_pinned
from dasknn.engine.dask.batches import batch_reader
from dasknn.engine.dask.tasks import (
    FC_RECORD,
    FC_RNG_STREAM,
    STOP_CHECK_SECONDS,
    TRIM_SECONDS,
    GroupSpec,
    _actor_results,
    _backward,
    _call,
    _forward,
    _net,
    _wait,
    aggregate,
    conv_backward,
    conv_forward,
    reduce_on_servers,
    release_freed_memory,
    shard_bounds,
    sum_grads,
    whole_net_step,
)

__all__ = [
    "ConvModel",
    "ConvAndFCModels",
    "Inline",
    "ShardActors",
    "ShardTasks",
    "group_loop",
    "run_iteration",
]


# -- the models a group pulls and pushes ---------------------------------------------------------


class ConvModel:
    """The merged map's model: the conv model server (the FC model lives on the FC server).

    A push brings the model back with it (`ConvModelServer.push_pull`): the next iteration's pull
    is that reply, so a group's iteration calls the conv model server once, not twice."""

    def __init__(self, spec: GroupSpec, conv_server) -> None:
        self.spec, self.conv_server = spec, conv_server
        self._pulled: tuple | None = None

    def pull(self):
        """(version read, weights): the last push's reply, or a pull when there was none."""
        pulled, self._pulled = self._pulled, None
        return pulled if pulled is not None else _call(self.conv_server, "pull", timeout=self.spec.timeout)

    def push(self, grads, version, row: dict[str, Any]) -> dict[str, Any] | None:
        """The Trace row the conv model server logged with the update, or None once it stopped."""
        spec = self.spec
        pushed, self._pulled = _call(
            self.conv_server, "push_pull", grads, version, spec.lr, spec.momentum, row, timeout=spec.timeout
        )
        return pushed


class ConvAndFCModels:
    """The unmerged map's models: the conv and the FC model servers, each pulled and pushed, so the
    FC model is as stale as the conv model (Omnivore appendix C)."""

    def __init__(self, spec: GroupSpec, conv_server, fc_model) -> None:
        self.spec, self.conv_server, self.fc_model = spec, conv_server, fc_model
        self.fc_keys: set[str] = set()

    def pull(self):
        """((conv version, FC version), conv and FC weights in one dict)."""
        version, conv_w = _call(self.conv_server, "pull", timeout=self.spec.timeout)
        fc_version, fc_w = _call(self.fc_model, "pull", timeout=self.spec.timeout)
        self.fc_keys = set(fc_w)
        return (version, fc_version), {**conv_w, **fc_w}

    def push(self, grads, versions, row: dict[str, Any]) -> dict[str, Any] | None:
        """Push the conv and the FC gradient to their servers; the Trace row (with `fc_staleness`),
        or None once a server refused (stopped)."""
        spec, (version, fc_version) = self.spec, versions
        conv_grads = {k: g for k, g in grads.items() if k not in self.fc_keys}
        fc_grads = {k: g for k, g in grads.items() if k in self.fc_keys}
        args = (spec.lr, spec.momentum)
        pushed = _call(self.conv_server, "push", conv_grads, version, *args, timeout=spec.timeout)
        if pushed is None:
            return None
        fc_pushed = _call(self.fc_model, "push", fc_grads, fc_version, *args, timeout=spec.timeout)
        if fc_pushed is None:
            return None
        out = {"t_start": row["t_start"], "t_end": time.time(), **pushed}
        return {
            **out,
            "fc_staleness": fc_pushed["staleness"],
            **{k: v for k, v in row.items() if k != "t_start"},
        }


# -- the transports ------------------------------------------------------------------------------


class Inline:
    """A group of one worker: its one shard computed in the loop, nothing sent."""

    def __init__(self, spec: GroupSpec, template) -> None:
        self.spec, self.template = spec, template
        self._pending: tuple | None = None

    def forward(self, weights, x, b: int):
        """The conv-phase activations of batch `b` (its cache kept for `backward`)."""
        net = _net(self.spec.run_id, self.template, self.spec.devices[0])
        acts, caches = _forward(net, weights, x, self.spec.seed, b, 0)
        self._pending = (net, weights, caches)
        return acts

    def backward(self, dacts):
        """The conv gradient of the batch from d(activations)."""
        net, weights, caches = self._pending
        return _backward(net, weights, caches, dacts)

    def whole(self, weights, x, y, b: int):
        """The whole net on the batch: (gradient, loss, accuracy)."""
        spec = self.spec
        key = (spec.seed, FC_RNG_STREAM, b)
        out = whole_net_step(spec.run_id, self.template, weights, x, y, spec.devices[0], key)
        return out["grads"], out["loss"], out["accuracy"]

    def finish(self) -> None:
        """The iteration is pushed: drop what it kept."""
        self._pending = None


class ShardActors:
    """k > 1 workers with a `ShardServer` on each but the lead: the lead's shard inline, the others
    by direct actor calls (no scheduler round trip). The k − 1 remote gradients are summed by a
    reduction tree of `branching` among the servers (its root's sum comes to the lead, which adds
    its own); with k = 2 the one remote gradient comes back from the call itself. With `stream`
    (the key the servers' streams were opened under) x is the lead's own shard and each server
    reads its own."""

    def __init__(self, spec: GroupSpec, template, conv_server, shard_servers, stream: str | None = None):
        self.spec, self.template, self.conv_server = spec, template, conv_server
        self.servers, self.stream = tuple(shard_servers), stream
        self.tree = len(self.servers) > 1
        self._pending: tuple | None = None

    def forward(self, weights, x, b: int):
        spec, stream = self.spec, self.stream
        bounds = shard_bounds(spec)
        token = f"{spec.run_id}-{spec.group}-{b}"
        fwd = [
            srv.forward(
                token, weights, None if stream else x[bounds[i] : bounds[i + 1]], spec.seed, b, i, stream
            )
            for i, srv in enumerate(self.servers, 1)
        ]
        lead = _net(spec.run_id, self.template, spec.devices[0])
        acts0, caches0 = _forward(lead, weights, x if stream else x[bounds[0] : bounds[1]], spec.seed, b, 0)
        remote_acts = _actor_results(fwd, spec, self.conv_server)
        if remote_acts is None:
            return None
        self._pending = (token, bounds, lead, weights, caches0)
        return np.concatenate([acts0, *remote_acts])

    def backward(self, dacts):
        token, bounds, lead, weights, caches0 = self._pending
        bwd = [
            srv.backward(token, dacts[bounds[i] : bounds[i + 1]], self.tree)
            for i, srv in enumerate(self.servers, 1)
        ]
        total = _backward(lead, weights, caches0, dacts[bounds[0] : bounds[1]])
        return self._sum(token, total, _actor_results(bwd, self.spec, self.conv_server))

    def whole(self, weights, x, y, b: int):
        spec = self.spec
        bounds = shard_bounds(spec)
        token, key = f"{spec.run_id}-{spec.group}-{b}", (spec.seed, FC_RNG_STREAM, b)
        calls = []
        for i, srv in enumerate(self.servers, 1):
            a, z = int(bounds[i]), int(bounds[i + 1])
            calls.append(
                srv.whole_step(token, weights, x[a:z], y[a:z], key, (z - a) / spec.batch_size, self.tree)
            )
        a, z = int(bounds[0]), int(bounds[1])
        lead = whole_net_step(
            spec.run_id,
            self.template,
            weights,
            x[a:z],
            y[a:z],
            spec.devices[0],
            key,
            (z - a) / spec.batch_size,
        )
        outs = _actor_results(calls, spec, self.conv_server)
        if outs is None:
            return None
        summed = self._sum(token, lead["grads"], [o.get("grads") for o in outs])
        if summed is None:
            return None
        loss = lead["loss"] + sum(o["loss"] for o in outs)
        return summed, loss, lead["accuracy"] + sum(o["accuracy"] for o in outs)

    def _sum(self, token: str, total, parts):
        """The lead's gradient + the remote ones (by the tree among the servers when k > 2)."""
        if parts is None:
            return None
        if self.tree:
            parts = reduce_on_servers(self.servers, token, self.spec, self.conv_server)
            if parts is None:
                return None
        return sum_grads(total, *parts)

    def finish(self) -> None:
        self._pending = None


class ShardTasks:
    """k > 1 workers, each remote shard a pinned task through the scheduler (two hops per remote
    shard and step); the sum by `tasks.aggregate`. On the merged map the lead's shard runs inline
    and the tasks keep their forward caches in their worker process for `conv_backward`; on the
    unmerged map every shard, the lead's too, is a task. Every scattered future stays referenced
    until the push (`finish`): a dropped one could be released before the scheduler has registered
    it, and its task would lose a dependency."""

    def __init__(self, client, spec: GroupSpec, template, conv_server) -> None:
        from distributed import Future

        self.client, self.spec, self.template, self.conv_server = client, spec, template, conv_server
        self.template_future = Future(spec.template_key, client, state="memory")
        self.remote = list(zip(range(1, len(spec.workers)), spec.workers[1:], spec.devices[1:], strict=True))
        self._pending: dict[str, Any] = {}

    def _scatter(self, value, worker: str):
        return self.client.scatter(value, workers=[worker], direct=True, hash=False)

    def forward(self, weights, x, b: int):
        spec, client = self.spec, self.client
        bounds = shard_bounds(spec)
        w_futures = {i: self._scatter([weights], w)[0] for i, w, _ in self.remote}
        shards = {i: self._scatter(x[bounds[i] : bounds[i + 1]], w) for i, w, _ in self.remote}
        token = f"{spec.group}-{b}"
        fwd = {
            i: submit_pinned(
                client, conv_forward, spec.run_id, token, i, self.template_future, w_futures[i], shards[i],
                device, (spec.seed, b), worker=w,
            )
            for i, w, device in self.remote
        }  # fmt: skip
        lead = _net(spec.run_id, self.template, spec.devices[0])
        acts0, caches0 = _forward(lead, weights, x[bounds[0] : bounds[1]], spec.seed, b, 0)
        self._pending = {"keep": (w_futures, shards, fwd), "lead": (token, bounds, lead, weights, caches0)}
        if not _wait(list(fwd.values()), spec, self.conv_server):
            return None
        return np.concatenate([acts0, *client.gather([fwd[i] for i, _, _ in self.remote])])

    def backward(self, dacts):
        spec, client = self.spec, self.client
        w_futures, _, fwd = self._pending["keep"]
        token, bounds, lead, weights, caches0 = self._pending["lead"]
        d = {i: self._scatter(dacts[bounds[i] : bounds[i + 1]], w) for i, w, _ in self.remote}
        self._pending["dacts"] = d
        tf = self.template_future
        grads = [
            submit_pinned(
                client, conv_backward, spec.run_id, token, i, tf, w_futures[i], fwd[i], d[i], device, worker=w
            )
            for i, w, device in self.remote
        ]
        grads0 = _backward(lead, weights, caches0, dacts[bounds[0] : bounds[1]])
        summed, total = aggregate(
            client, grads, spec.aggregation, spec.branching, spec.ps_worker, local=grads0
        )
        if summed is not None:
            if not _wait([summed], spec, self.conv_server):
                return None
            part = summed.result(timeout=spec.timeout)
            total = part if total is None else sum_grads(total, part)
        return total

    def whole(self, weights, x, y, b: int):
        spec, client = self.spec, self.client
        bounds = shard_bounds(spec)
        scattered, outs, grads, metrics = [], [], [], []
        for i, (w, device) in enumerate(zip(spec.workers, spec.devices, strict=True)):
            a, z = int(bounds[i]), int(bounds[i + 1])
            parts = client.scatter([weights, x[a:z], y[a:z]], workers=[w], direct=True, hash=False)
            scattered.append(parts)
            out = submit_pinned(
                client, whole_net_step, spec.run_id, self.template_future, *parts, device,
                (spec.seed, FC_RNG_STREAM, b), (z - a) / spec.batch_size, worker=w,
            )  # fmt: skip
            outs.append(out)
            grads.append(client.submit(_grads_of, out, workers=[w], pure=False))
            metrics.append(client.submit(_metrics_of, out, workers=[w], pure=False))
        self._pending = {"keep": (scattered, outs, grads)}
        total, _ = aggregate(client, grads, spec.aggregation, spec.branching, spec.ps_worker)
        summed = total.result(timeout=spec.timeout)
        loss, acc = (float(sum(v)) for v in zip(*client.gather(metrics), strict=True))
        return summed, loss, acc

    def finish(self) -> None:
        self._pending = {}


def _grads_of(out: dict[str, Any]) -> dict[str, np.ndarray]:
    return out["grads"]


def _metrics_of(out: dict[str, Any]) -> tuple[float, float]:
    return out["loss"], out["accuracy"]


# -- the iteration and the loop around it --------------------------------------------------------


def run_iteration(spec: GroupSpec, model, transport, x, y, row: dict[str, Any], fc_server=None):
    """One iteration: pull, forward, FC step, backward, sum, push (Omnivore §III-B).

    `fc_server`: the merged map's FC server, which takes the k shards' activations and returns
    d(activations); None on the unmerged map, where each shard's forward, FC step and backward are
    one call (`transport.whole`). Returns the Trace row of the push, or None once a server stopped.
    """
    version, weights = model.pull()
    b = row["batch"]
    if fc_server is None:
        done = transport.whole(weights, x, y, b)
        record = None if done is None else {"loss": done[1], "accuracy": done[2]}
    else:
        done = record = None
        acts = transport.forward(weights, x, b)
        knobs = (spec.lr, spec.momentum)
        fc = None if acts is None else _call(fc_server, "step", acts, y, *knobs, timeout=spec.timeout)
        grads = None if fc is None else transport.backward(fc["dacts"])
        if grads is not None:
            done, record = (grads,), {k: fc[k] for k in FC_RECORD}
    if done is None:
        transport.finish()
        return None
    row.update(record)
    pushed = model.push(done[0], version, row)
    transport.finish()
    return pushed


def transport_for(spec: GroupSpec, template, conv_server, shard_servers, client, stream: str | None = None):
    """The transport of a group: inline for one worker, shard-server actors when the group has
    them, else shard tasks."""
    if len(spec.workers) == 1:
        return Inline(spec, template)
    if shard_servers:
        return ShardActors(spec, template, conv_server, shard_servers, stream)
    return ShardTasks(client, spec, template, conv_server)


def group_loop(spec: GroupSpec, template, conv_server, fc_server, shard_servers=None, source=None) -> int:
    """Run one compute group of the merged map until its iterations are done, its deadline passes,
    the conv model server says stop, or a loss is not finite (then it stops the server, so that no
    group spends the rest of a diverged run); returns the number of iterations it pushed.

    The Trace rows (times absolute, seconds since the epoch) go to the conv model server's log with
    each push. `shard_servers`: the ShardServer actors of `spec.workers[1:]` (None: shard tasks).
    `source`: the streamed data's StreamSource, when the driver sent it apart from the spec.
    A second run of the same group's task (dask may run a task again after a worker
    failure) finds the group claimed and returns at once, so a group never runs twice."""
    from distributed import get_client, secede

    if source is not None:
        spec = replace(spec, source=source)
    client = get_client()
    secede()  # a long-running task: free the worker's thread for the group's shard tasks
    if not _call(conv_server, "claim", spec.group, timeout=spec.timeout):
        return 0
    stream = None
    if spec.source is not None and shard_servers and spec.own_reads:  # every worker reads its own shard
        stream = f"{spec.run_id}-{spec.group}"
        open_shard_streams(spec, shard_servers, stream)
        reader = batch_reader(client, spec, rows=tuple(shard_bounds(spec)[:2]))
    else:
        reader = batch_reader(client, spec)
    model = ConvModel(spec, conv_server)
    transport = transport_for(spec, template, conv_server, shard_servers, client, stream)
    next_check = 0.0
    next_trim = time.time() + TRIM_SECONDS
    i = 0
    try:
        while spec.iterations is None or i < spec.iterations:
            now = time.time()
            if spec.deadline is not None and now >= spec.deadline:
                break
            if now >= next_trim:
                release_freed_memory()
                next_trim = now + TRIM_SECONDS
            if now >= next_check:
                _, stopped = _call(conv_server, "progress", timeout=spec.timeout)
                if stopped:
                    break
                next_check = now + STOP_CHECK_SECONDS
            b = spec.first_batch + spec.group + spec.n_groups * i
            x, y = reader.get(b)
            row = {"t_start": time.time(), "group": spec.group, "batch": b, "n_images": int(len(y))}
            pushed = run_iteration(spec, model, transport, x, y, row, fc_server)
            if pushed is None:
                break
            i += 1
            if not np.isfinite(pushed.get("loss", 0.0)):  # diverged: the fit rolls the run back, so
                _call(conv_server, "stop", timeout=spec.timeout)  # every group ends it here
                break
    finally:
        reader.close()
        if stream is not None:
            for srv in shard_servers:
                try:
                    srv.close_stream(stream).result(timeout=spec.timeout)
                except Exception:  # a lost worker's reader went with it
                    pass
    return i


def open_shard_streams(spec: GroupSpec, shard_servers, key: str) -> None:
    """Start each shard server's stream of its rows of the group's batches (`ShardServer.open_stream`);
    the source itself is sent only to a worker that has not streamed from it yet."""
    bounds, bare = shard_bounds(spec), replace(spec, source=None)
    name = spec.source.name
    for i, srv in enumerate(shard_servers, 1):
        rows = (int(bounds[i]), int(bounds[i + 1]))
        if not srv.open_stream(key, bare, rows, name).result(timeout=spec.timeout):
            srv.open_stream(key, bare, rows, name, spec.source).result(timeout=spec.timeout)
