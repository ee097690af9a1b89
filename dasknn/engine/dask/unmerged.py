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
from typing import Any

from dasknn.engine.dask import iteration, tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.batches import BatchReader
from dasknn.engine.dask.placement import Placement, plan
from dasknn.engine.dask.runs import begin_run, cluster_workers, engine_client, persist_data, wait_for_loops
from dasknn.engine.servers import ConvModelServer
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace, on_run_clock
from dasknn.nn.net import Net

__all__ = ["run_unmerged", "unmerged_loop"]


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
    reader = BatchReader(client, spec)
    model = iteration.ConvAndFCModels(spec, conv_server, fc_model)
    transport = iteration.transport_for(spec, template, conv_server, shard_servers, client)
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
        row = {"t_start": time.time(), "group": spec.group, "batch": b, "n_images": int(x.shape[0])}
        row = iteration.run_iteration(spec, model, transport, x, y, row)
        if row is None:  # the driver stopped the servers
            break
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
    begun = begin_run(engine, client, net, config, start)
    state, conv_net, fc_net, run_id = begun.state, begun.conv_net, begun.fc_net, begun.run_id
    conv_keys, fc_keys = set(conv_net.params), set(fc_net.params)
    where = placement.conv_server_worker
    conv_params = {k: v for k, v in state.params.items() if k in conv_keys}
    fc_params = {k: v for k, v in state.params.items() if k in fc_keys}
    conv_future, conv_server = _model_server(client, engine, conv_params, conv_net, state, config, where)
    fc_future, fc_model = _model_server(client, engine, fc_params, fc_net, state, config, where)
    work = net.copy()
    work.set_params(state.params)
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
    loops = [
        submit_pinned(
            client, unmerged_loop, spec, template, conv_server, fc_model,
            tuple(shards[w] for w in spec.workers[1:]) if shards else None, worker=spec.workers[0],
        )
        for spec in specs
    ]  # fmt: skip
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
    return RunResult(trace=_trace(engine, rows, config, placement, fc_net), state=end_state)


def _trace(engine, rows: list[dict[str, Any]], config: RunConfig, placement: Placement, fc_net: Net):
    """The unmerged run's Trace, its attrs naming the layout."""
    return make_trace(
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
