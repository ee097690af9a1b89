"""The unmerged physical map on a Dask cluster (Omnivore appendix C, Fig. 18).

The MXNet/SINGA layout: there is no FC compute server. Every compute group runs the whole net, conv
AND FC phase, on its own workers; the FC model sits on a model server actor next to the conv model
server and is pulled and pushed like the conv model, so the FC model is as stale as the conv model.
Each iteration of a group: pull the conv weights (version v) and the FC weights (version f); forward
and backward of the whole net (each worker of a group of k > 1 on its shard, the k gradients summed
by the strategy's aggregation); push the conv gradient (staleness v' − v − 1) and the FC gradient
(`fc_staleness` f' − f − 1). The Trace has the merged engine's columns plus `fc_staleness`.
A group of k > 1 workers computes its lead's shard in its loop and the others on ShardServer actors
(`whole_step`, direct worker-to-worker calls), as the merged engine does; with
`shard_calls="tasks"` or aggregation 'ps', every shard is a task through the scheduler.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from dasknn.engine.dask import tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.batches import BatchReader
from dasknn.engine.dask.placement import Placement, plan, shard_sizes
from dasknn.engine.dask.runs import cluster_workers, engine_client, persist_data, wait_for_loops
from dasknn.engine.servers import ConvModelServer
from dasknn.engine.strategy import split_layer
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace, on_run_clock
from dasknn.nn.net import Net

__all__ = ["run_unmerged", "unmerged_loop", "whole_net_step"]

FC_RNG_STREAM = 5  # the dropout stream of a batch's FC phase, as UnmergedSimulation draws it


def whole_net_step(run_id: str, template, weights, x, y, device: str, rng_key, weight: float = 1.0):
    """Forward and backward of the whole net (conv + FC) on one shard, FC computed on this worker.

    Returns {"grads", "loss", "accuracy"}, each multiplied by `weight` (the shard's n_i / B), so the
    k shards' results sum to the full batch's (SoftmaxWithLoss averages over the shard).
    """
    return tasks._whole_net(tasks._net(run_id, template, device), weights, x, y, rng_key, weight)


def _grads_of(out: dict[str, Any]) -> dict[str, np.ndarray]:
    return out["grads"]


def _metrics_of(out: dict[str, Any]) -> tuple[float, float]:
    return out["loss"], out["accuracy"]


def _pull_both(spec, conv_server, fc_model):
    version, conv_w = tasks._call(conv_server, "pull", timeout=spec.timeout)
    fc_version, fc_w = tasks._call(fc_model, "pull", timeout=spec.timeout)
    return version, fc_version, conv_w, fc_w


def _push_both(spec, conv_server, fc_model, grads, version, fc_version, fc_keys) -> dict[str, Any] | None:
    """Push the conv and the FC gradient to their servers; None if a server refused (stopped)."""
    conv_grads = {k: g for k, g in grads.items() if k not in fc_keys}
    fc_grads = {k: g for k, g in grads.items() if k in fc_keys}
    args = (spec.lr, spec.momentum)
    pushed = tasks._call(conv_server, "push", conv_grads, version, *args, timeout=spec.timeout)
    if pushed is None:
        return None
    fc_pushed = tasks._call(fc_model, "push", fc_grads, fc_version, *args, timeout=spec.timeout)
    if fc_pushed is None:
        return None
    return {**pushed, "fc_staleness": fc_pushed["staleness"]}


def _one_worker_iteration(spec, template, conv_server, fc_model, x, y, b) -> dict[str, Any] | None:
    t_start = time.time()
    version, fc_version, conv_w, fc_w = _pull_both(spec, conv_server, fc_model)
    out = whole_net_step(
        spec.run_id, template, {**conv_w, **fc_w}, x, y, spec.devices[0], (spec.seed, FC_RNG_STREAM, b)
    )
    pushed = _push_both(spec, conv_server, fc_model, out["grads"], version, fc_version, set(fc_w))
    if pushed is None:
        return None
    return {
        "t_start": t_start,
        "t_end": time.time(),
        **pushed,
        "loss": out["loss"],
        "accuracy": out["accuracy"],
    }


def _sharded_iteration(client, spec, template, conv_server, fc_model, x, y, b) -> dict[str, Any] | None:
    """k > 1 workers: each runs the whole net on its shard; the gradients are aggregated, pushed once."""
    t_start = time.time()
    version, fc_version, conv_w, fc_w = _pull_both(spec, conv_server, fc_model)
    weights = {**conv_w, **fc_w}
    bounds = np.cumsum([0, *shard_sizes(spec.batch_size, spec.shares)])
    # the scattered futures stay referenced until the push (see tasks._sharded_iteration)
    scattered, outs, grads, metrics = [], [], [], []
    for i, (w, device) in enumerate(zip(spec.workers, spec.devices, strict=True)):
        a, z = int(bounds[i]), int(bounds[i + 1])
        parts = client.scatter([weights, x[a:z], y[a:z]], workers=[w], direct=True, hash=False)
        scattered.append(parts)
        out = submit_pinned(
            client,
            whole_net_step,
            spec.run_id,
            template,
            *parts,
            device,
            (spec.seed, FC_RNG_STREAM, b),
            (z - a) / spec.batch_size,
            worker=w,
        )
        outs.append(out)
        grads.append(client.submit(_grads_of, out, workers=[w], pure=False))
        metrics.append(client.submit(_metrics_of, out, workers=[w], pure=False))
    total, _ = tasks.aggregate(client, grads, spec.aggregation, spec.branching, spec.ps_worker)
    summed = total.result(timeout=spec.timeout)
    loss, acc = (float(sum(v)) for v in zip(*client.gather(metrics), strict=True))
    pushed = _push_both(spec, conv_server, fc_model, summed, version, fc_version, set(fc_w))
    del scattered, outs, grads
    if pushed is None:
        return None
    return {"t_start": t_start, "t_end": time.time(), **pushed, "loss": loss, "accuracy": acc}


def _actor_sharded_iteration(spec, template, conv_server, fc_model, shard_servers, x, y, b):
    """k > 1 workers with a ShardServer on each but the lead: the lead's shard inline, the others by
    direct actor calls (`whole_step`), the k − 1 remote gradients summed by a tree among them."""
    t_start = time.time()
    version, fc_version, conv_w, fc_w = _pull_both(spec, conv_server, fc_model)
    weights = {**conv_w, **fc_w}
    bounds = np.cumsum([0, *shard_sizes(spec.batch_size, spec.shares)])
    token, key = f"{spec.run_id}-{spec.group}-{b}", (spec.seed, FC_RNG_STREAM, b)
    tree = len(shard_servers) > 1
    calls = []
    for i, srv in enumerate(shard_servers, 1):
        a, z = int(bounds[i]), int(bounds[i + 1])
        calls.append(srv.whole_step(token, weights, x[a:z], y[a:z], key, (z - a) / spec.batch_size, tree))
    a, z = int(bounds[0]), int(bounds[1])
    lead = whole_net_step(
        spec.run_id, template, weights, x[a:z], y[a:z], spec.devices[0], key, (z - a) / spec.batch_size
    )
    outs = tasks._actor_results(calls, spec, conv_server)
    if outs is None:
        return None
    parts = tasks.reduce_on_servers(shard_servers, token, spec, conv_server) if tree else [outs[0]["grads"]]
    if parts is None:
        return None
    summed = tasks.sum_grads(lead["grads"], *parts)
    loss = lead["loss"] + sum(o["loss"] for o in outs)
    acc = lead["accuracy"] + sum(o["accuracy"] for o in outs)
    pushed = _push_both(spec, conv_server, fc_model, summed, version, fc_version, set(fc_w))
    if pushed is None:
        return None
    return {"t_start": t_start, "t_end": time.time(), **pushed, "loss": loss, "accuracy": acc}


def unmerged_loop(
    spec: tasks.GroupSpec, template, conv_server, fc_model, shard_servers=None
) -> list[dict[str, Any]]:
    """One compute group of the unmerged map until its iterations, its deadline or the stop signal.

    Runs as a long-running task on the group's lead worker; returns its Trace rows (absolute times).
    `shard_servers`: ShardServer actors (of the whole net) on `spec.workers[1:]`, or None: every
    shard a task (the engine's `shard_calls="tasks"`, or aggregation 'ps').
    """
    from distributed import get_client, secede

    client = get_client()
    secede()
    template_future = None
    if len(spec.workers) > 1:
        from distributed import Future

        template_future = Future(spec.template_key, client, state="memory")
    reader = BatchReader(client, spec)
    rows: list[dict[str, Any]] = []
    next_check, i = 0.0, 0
    while spec.iterations is None or i < spec.iterations:
        now = time.time()
        if spec.deadline is not None and now >= spec.deadline:
            break
        if now >= next_check:
            _, stopped = tasks._call(conv_server, "progress", timeout=spec.timeout)
            if stopped:
                break
            next_check = now + tasks.STOP_CHECK_SECONDS
        b = spec.first_batch + spec.group + spec.n_groups * i
        x, y = reader.get(b)
        if len(spec.workers) == 1:
            row = _one_worker_iteration(spec, template, conv_server, fc_model, x, y, b)
        elif shard_servers:
            row = _actor_sharded_iteration(spec, template, conv_server, fc_model, shard_servers, x, y, b)
        else:
            row = _sharded_iteration(client, spec, template_future, conv_server, fc_model, x, y, b)
        if row is None:  # the driver stopped the servers
            break
        row.update(group=spec.group, batch=b, n_images=int(x.shape[0]))
        rows.append(row)
        i += 1
    return rows


def _model_server(client, engine, params, net: Net, state: TrainState, config: RunConfig, worker: str):
    """A ConvModelServer actor on `worker` holding `params` with their momentum from `state`."""
    fut = submit_actor(
        client,
        ConvModelServer,
        params,
        net.lr_mult,
        net.decay_mult,
        config.weight_decay,
        net.statistics,
        worker=worker,
    )
    server = fut.result(timeout=engine.timeout)
    history = {k: v for k, v in state.momentum.items() if k in params}
    server.set_state(
        {"params": params, "solver": {"iter": state.iterations_done, "history": history}, "version": 0}
    ).result(timeout=engine.timeout)
    return fut, server


def _roles(placement: Placement) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {placement.conv_server_worker: ["conv model server", "FC model server"]}
    for i, group in enumerate(placement.groups):
        for w in group:
            roles.setdefault(w, []).append(f"conv+FC group {i}")
    return roles


def run_unmerged(
    engine, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None
) -> RunResult:
    """DaskEngine.run for physical_map='unmerged': g groups computing FC themselves, FC model stale.

    Omnivore appendix C. Sets the final weights on `net`; the Trace rows gain `fc_staleness`.
    """
    client = engine_client(engine)
    data = persist_data(engine, client, X, y, config)
    placement = plan(cluster_workers(client), config.n_groups, getattr(engine, "throughput_", None))
    engine.placement_ = placement
    client.run(tasks.prepare_worker, engine.blas_threads)
    state = start.copy() if start is not None else TrainState.from_net(net)
    conv_net, fc_net = net.split_phases(at=split_layer(net, engine.strategy, config.batch_size))
    if fc_net is None:
        raise ValueError(f"net {net.name!r} has no FC phase (no InnerProduct layer) for the FC model server")
    conv_keys, fc_keys = set(conv_net.params), set(fc_net.params)
    where = placement.conv_server_worker
    conv_params = {k: v for k, v in state.params.items() if k in conv_keys}
    fc_params = {k: v for k, v in state.params.items() if k in fc_keys}
    conv_future, conv_server = _model_server(client, engine, conv_params, conv_net, state, config, where)
    fc_future, fc_model = _model_server(client, engine, fc_params, fc_net, state, config, where)
    work = net.copy()
    work.set_params(state.params)
    run_id = uuid.uuid4().hex
    template = client.scatter(work, broadcast=True, hash=False)
    shard_futures = {}
    if tasks.uses_shard_servers(engine):
        shard_futures = tasks.submit_shard_servers(client, placement.groups, placement.devices, template)
    shards = {w: f.result(timeout=engine.timeout) for w, f in shard_futures.items()}
    t0 = time.time()
    deadline = None if budget.seconds is None else t0 + budget.seconds
    specs = tasks.group_specs(
        engine, placement, data, config, budget.iterations, state.batches_done, deadline, run_id, template.key
    )
    loops = []
    for spec in specs:
        workers = spec.workers
        loops.append(
            submit_pinned(
                client,
                unmerged_loop,
                spec,
                template,
                conv_server,
                fc_model,
                tuple(shards[w] for w in workers[1:]) if shards else None,
                worker=workers[0],
            )
        )
    try:
        rows = wait_for_loops(
            engine,
            client,
            loops,
            _roles(placement),
            budget,
            t0,
            progress=lambda: conv_server.progress().result(timeout=engine.timeout)[0],
        )
        conv = conv_server.get_state().result(timeout=engine.timeout)
        fc = fc_model.get_state().result(timeout=engine.timeout)
    except BaseException:
        conv_server.stop()
        raise
    finally:
        client.cancel([*loops, *shard_futures.values()])
        client.run(tasks.forget_run, run_id, on_error="ignore")
    end_state = TrainState(
        params={**conv["params"], **fc["params"]},
        momentum={**conv["solver"]["history"], **fc["solver"]["history"]},
        batches_done=max([state.batches_done, *(r["batch"] + 1 for r in rows)]),
        iterations_done=state.iterations_done + len(rows),
        extra=dict(state.extra),
    )
    net.set_params(end_state.params)
    on_run_clock(rows, t0, config, data.X.shape[0])
    for row in rows:
        row["iteration"] = state.iterations_done + row["version_written"]
    trace = make_trace(
        rows,
        "dask",
        n_groups=config.n_groups,
        placement=str(_roles(placement)),
        batch_size=config.batch_size,
        strategy=engine.strategy.name,
        aggregation=engine.strategy.aggregation,
        split=fc_net.layers[0].name,
        physical_map="unmerged",
    )
    return RunResult(trace=trace, state=end_state)
