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

from dasknn.engine.dask import elastic, iteration, tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.batches import BatchReader
from dasknn.engine.dask.placement import Placement, plan
from dasknn.engine.dask.runs import begin_run, engine_client, forget_on_workers, persist_data, wait_for_loops
from dasknn.engine.dask.segment import await_data
from dasknn.engine.dask.shipping import ship
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


def _model_server(client, engine, params, net: Net, config: RunConfig, worker: str):
    """A ConvModelServer actor on `worker` for `params` (their state set by the caller)."""
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
    return fut, fut.result(timeout=engine.timeout)


def _start_state(params: dict, state: TrainState) -> dict[str, Any]:
    """A model server's state for `params` with their momentum from `state`, at version 0."""
    history = {k: v for k, v in state.momentum.items() if k in params}
    return {"params": params, "solver": {"iter": state.iterations_done, "history": history}, "version": 0}


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
    Elastic as the merged map (docs/architecture.md, "Elastic clusters"): a worker that joins or is
    retired gracefully ends the segment (`_UnmergedRun.hand_off`) and the next one goes on from the
    two model servers' exact states on the new placement.
    """
    run = _UnmergedRun(engine, net, X, y, config, budget, start)
    return run.result(net, run.train())


class _UnmergedRun:
    """One run of the unmerged map, segment after segment: a segment is the two model servers, the
    groups' shard servers and loops of one placement; a cluster change (`elastic.cluster_change`)
    hands the servers' exact states to the next segment's servers on the new placement."""

    def __init__(
        self, engine, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None
    ) -> None:
        client = self.client = engine_client(engine)
        self.engine, self.config, self.budget = engine, config, budget
        self.data = persist_data(engine, client, X, y, config)
        self.elastic_on = elastic.install(client)
        usable = elastic.usable_now(client, self.elastic_on)
        before = engine.placement_.n_groups if engine.placement_ is not None else config.n_groups
        self.placement = plan(usable, config.n_groups, engine._throughput(client))
        self.first_placement = str(_roles(self.placement))
        self.started_on = set(usable)
        self.events = elastic.between_runs(
            engine.workers_seen_, usable, self.placement, before, roles=_roles(self.placement)
        )
        begun = begin_run(engine, client, net, config, start)
        self.state, self.conv_net, self.fc_net = begun.state, begun.conv_net, begun.fc_net
        self.run_id = begun.run_id
        conv_keys = set(self.conv_net.params)
        params = self.state.params
        self.server_states = (  # the conv and FC model servers' states the next segment starts from
            _start_state({k: v for k, v in params.items() if k in conv_keys}, self.state),
            _start_state({k: v for k, v in params.items() if k not in conv_keys}, self.state),
        )
        self.work = net.copy()  # the template every worker's loops copy (sent again after a wait)
        self.work.set_params(params)
        self.template = ship(client, self.work, broadcast=True, installed=self.elastic_on)
        self.t0 = time.time()
        self.deadline = None if budget.seconds is None else self.t0 + budget.seconds
        self.rows: list[dict[str, Any]] = []
        self.version, self.first_batch, self.t_change = 0, self.state.batches_done, self.t0
        self.futures: list = []
        self.servers: tuple = ()
        self.moved = False  # whether `server_states` were read at a hand-off
        self.loops: list = []

    def train(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run segments until the budget is spent; the two model servers' end states."""
        try:
            while True:
                end = self._segment()
                if end is not None:
                    return end
        except BaseException:
            if self.servers:
                try:
                    self.servers[0].stop()
                except Exception:  # its worker is gone: the loops end on their own errors
                    pass
            raise
        finally:
            self._release()
            forget_on_workers(self.client, self.run_id)
            if self.elastic_on:
                elastic.forget(self.client, self.run_id)

    def _segment(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """One segment on the current placement: the servers' end states, or None after a hand-off."""
        engine, client, p = self.engine, self.client, self.placement
        engine.placement_ = p
        left = None if self.budget.iterations is None else self.budget.iterations - self.version
        if (left is not None and left <= 0) or (self.deadline is not None and time.time() >= self.deadline):
            return self.server_states
        digests = self._start_servers()
        conv_server, fc_model = self.servers
        shard_futures = {}
        if tasks.uses_shard_servers(engine):
            shard_futures = tasks.submit_shard_servers(client, p.groups, p.devices, self.template)
        self.futures.extend(shard_futures.values())
        shards = {w: f.result(timeout=engine.timeout) for w, f in shard_futures.items()}
        config = self.config.with_(n_groups=p.n_groups)
        specs = tasks.group_specs(
            engine, p, self.data, config, left, self.first_batch, self.deadline, self.run_id,
            self.template.key,
        )  # fmt: skip
        self.loops = [
            submit_pinned(
                client, unmerged_loop, spec, self.template, conv_server, fc_model,
                tuple(shards[w] for w in spec.workers[1:]) if shards else None, worker=spec.workers[0],
            )
            for spec in specs
        ]  # fmt: skip
        if self.elastic_on:
            elastic.use(client, self.run_id, p.roles())
        if digests is not None:
            self.events[-1].seconds = time.time() - self.t_change
            self.events[-1].conv_state, self.events[-1].fc_state = digests
        try:
            rows = wait_for_loops(
                engine, client, self.loops, _roles(p), self.budget, self.t0,
                progress=lambda: conv_server.progress().result(timeout=engine.timeout)[0],
                check=self._cluster_change if self.elastic_on else None,
            )  # fmt: skip
        except elastic.ClusterChange as change:  # a worker joined or is being retired
            self.hand_off(change)
            return None
        self._keep(rows)
        return self._read_states()

    def _start_servers(self) -> tuple[tuple[str, str], tuple[str, str]] | None:
        """The conv and FC model servers on the placement's conv server worker, set to the states
        the segment starts from; after a hand-off, the digests of the states read and set."""
        engine, client, where = self.engine, self.client, self.placement.conv_server_worker
        conv_state, fc_state = self.server_states
        made = [
            _model_server(client, engine, s["params"], net, self.config, where)
            for s, net in ((conv_state, self.conv_net), (fc_state, self.fc_net))
        ]
        self.futures = [f for f, _ in made]
        self.servers = tuple(server for _, server in made)
        for server, s in zip(self.servers, self.server_states, strict=True):
            server.set_state(s).result(timeout=engine.timeout)
        if not self.moved:
            return None  # the run's start, not a hand-off
        self.moved = False
        now = [server.get_state().result(timeout=engine.timeout) for server in self.servers]
        pairs = zip(self.server_states, now, strict=True)
        return tuple((elastic.state_digest(s), elastic.state_digest(n)) for s, n in pairs)

    def _cluster_change(self) -> None:
        engine, client = self.engine, self.client
        park = engine._worker_wait(client) > 0  # every worker retired: wait for one (`_await_workers`)
        elastic.cluster_change(client, self.placement, self.config.n_groups, engine._throughput, park)

    def hand_off(self, change: elastic.ClusterChange) -> None:
        """End the segment with no update lost and move the model servers' exact states to the
        placement `change` plans: the conv model server stops first, so a group whose conv push
        was applied also pushes its FC gradient, and every other group stops at its conv push;
        once the loops have returned, both servers' states are read."""
        self.t_change = time.time()
        engine, client = self.engine, self.client
        self.servers[0].stop().result(timeout=engine.timeout)
        rows = wait_for_loops(engine, client, self.loops, _roles(self.placement), self.budget, self.t0)
        self._keep(rows)
        self.server_states, self.moved = self._read_states(), True
        self._release()
        elastic.go_on(self, change, version=self.version, roles=_roles)

    def _await_workers(self, change: elastic.ClusterChange) -> elastic.ClusterChange:
        """Wait for a worker to join (`elastic.await_return`), recompute the persisted chunks and
        send the template there; the change to the placement on it."""
        engine, client = self.engine, self.client
        workers = elastic.await_return(engine, client, self.run_id, change.leaving, self.elastic_on)
        await_data(engine, client, self.data.X, self.data.y)
        self.template = ship(client, self.work, broadcast=True, installed=self.elastic_on)
        placement = plan(workers, self.config.n_groups, engine._throughput(client))
        return elastic.ClusterChange(placement, sorted(workers), change.leaving, elastic.conv_count(workers))

    def _keep(self, rows: list[dict[str, Any]]) -> None:
        """The segment's rows joined to the run's (with the workers of their group); the next
        segment's first batch and version."""
        for row in rows:
            row["workers"] = ",".join(self.placement.groups[row["group"]])
        self.rows.extend(rows)
        self.first_batch = max([self.first_batch, *(r["batch"] + 1 for r in rows)])
        self.version = max([self.version, *(r["version_written"] for r in rows)])

    def _read_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return tuple(s.get_state().result(timeout=self.engine.timeout) for s in self.servers)

    def _release(self) -> None:
        """Let the segment's loops and actors go."""
        if self.loops or self.futures:
            self.client.cancel([*self.loops, *self.futures])
        self.loops, self.futures, self.servers = [], [], ()

    def result(self, net: Net, end: tuple[dict[str, Any], dict[str, Any]]) -> RunResult:
        """Set the run's final weights on `net`; the RunResult with the run's Trace."""
        conv, fc = end
        state, rows = self.state, self.rows
        end_state = TrainState(
            params={**conv["params"], **fc["params"]},
            momentum={**conv["solver"]["history"], **fc["solver"]["history"]},
            batches_done=max([state.batches_done, *(r["batch"] + 1 for r in rows)]),
            iterations_done=state.iterations_done + len(rows),
            extra=dict(state.extra),
        )
        net.set_params(end_state.params)
        on_run_clock(rows, self.t0, self.config, self.data.X.shape[0])
        for row in rows:
            row["iteration"] = state.iterations_done + row["version_written"]
        usable = elastic.at_run_end(self.engine, self.client, self.started_on, self.events, self.elastic_on)
        trace = make_trace(
            rows,
            "dask",
            n_groups=self.config.n_groups,
            placement=self.first_placement,
            batch_size=self.config.batch_size,
            strategy=self.engine.strategy.name,
            aggregation=self.engine.strategy.aggregation,
            split=self.fc_net.layers[0].name,
            physical_map="unmerged",
            worker_events=[e.as_dict() for e in self.events],
            n_workers=elastic.conv_count(usable),
            started=self.t0,
        )
        return RunResult(trace=trace, state=end_state)
