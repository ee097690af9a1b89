"""The driver's run of the replica strategies, SMA and model averaging (Crossbow §3.2, SparkNet):
the average model's actor and the learners' loops (`replicas`), segment after segment.

A run is one segment while the cluster stays as it is. It is elastic as the merged map is
(docs/architecture.md, "Elastic clusters"), on the same scheduler plugin and `elastic.cluster_change`,
with the learners' own planner (`replan_learners`): when a worker of the run is retired gracefully
or one joins, the average model is told to make the next synchronisation the last of the segment
(`AverageModel.stop(hand_off=True)`); every learner finishes that round and hands its replica in;
the average model's exact state (`AverageModel.snapshot`) and each replica go to the next segment's
actor and learners on the new placement. The rounds count on, so the batch order and the versions
continue; nothing is redone and no recovery is recorded.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from dasknn.engine.dask import elastic, tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.placement import Placement, worker_devices
from dasknn.engine.dask.replicas import AverageModel, LearnerSpec, learner_loop, learner_workers
from dasknn.engine.dask.runs import engine_client, persist_data, wait_for_loops
from dasknn.engine.dask.segment import await_data
from dasknn.engine.dask.shipping import ship
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace, on_run_clock
from dasknn.nn.net import Net

__all__ = ["replan_learners", "run_replicas"]


def run_replicas(
    engine,
    net: Net,
    X,
    y,
    config: RunConfig,
    budget: Budget,
    start: TrainState | None = None,
    strategy: Strategy | None = None,
) -> RunResult:
    """DaskEngine.run for 'sma' and 'model_averaging': k = n_groups learners, z in an actor.

    Crossbow §3.2 / SparkNet. An iterations budget runs ⌈iterations / k⌉ rounds (every learner
    takes a batch per round); a seconds budget ends at the first synchronisation after the deadline
    (for model averaging the replicas always end averaged). Sets z as the final weights on `net`.
    The k learners follow the workers and k stays (`replan_learners`): those of a worker retired
    gracefully move, with their replicas, to the workers left; a worker that joins takes learners,
    with their replicas, from the workers holding more than their share (none when every worker
    holds at most one: it waits for the next run, whose k is the caller's `config.n_groups`).
    """
    strategy = strategy if strategy is not None else engine.strategy
    if not strategy.synchronous:
        raise ValueError(f"run_replicas runs 'sma' or 'model_averaging', got {strategy.name!r}")
    run = _ReplicasRun(engine, net, X, y, config, budget, start, strategy)
    return run.result(net, run.train())


def replan_learners(workers: Mapping[str, Mapping[str, Any]], previous: Placement) -> Placement:
    """The learners' placement on `workers` (the usable ones) after `previous`: the k learners follow
    the workers, k stays (Crossbow §3.2: k is the statistical knob, α = 1/k; docs/architecture.md,
    "Elastic clusters"). A learner stays on its worker while it is there; one whose worker left goes
    to the worker holding the fewest; then, while two workers' learners differ by more than one, the
    last learner of the worker holding the most moves to the one holding the fewest (a worker that
    joined takes its share). z stays where it is while it can (else on the first worker)."""
    if not workers:
        raise RuntimeError("the cluster has no workers; start some with `dask worker <scheduler-address>`")
    addrs = sorted(workers)
    load = dict.fromkeys(addrs, 0)
    placed = [group[0] if group[0] in load else None for group in previous.groups]
    for w in placed:
        if w is not None:
            load[w] += 1

    def fewest() -> str:
        return min(addrs, key=lambda a: load[a])

    for j, w in enumerate(placed):
        if w is None:
            placed[j] = fewest()
            load[placed[j]] += 1
    while True:
        most, least = max(addrs, key=lambda a: load[a]), fewest()
        if load[most] - load[least] <= 1:
            break
        j = max(i for i, w in enumerate(placed) if w == most)
        placed[j] = least
        load[most], load[least] = load[most] - 1, load[least] + 1
    home = previous.conv_server_worker if previous.conv_server_worker in load else addrs[0]
    return learners_placement(workers, placed, home)


def learners_placement(workers: Mapping[str, Mapping[str, Any]], where: list[str], home: str) -> Placement:
    """The run's placement: learner j alone in group j on worker `where[j]`, z on `home`; its
    `devices` name every worker the run knows of (a worker not among them has joined since)."""
    return Placement(
        fc_worker=home,
        conv_server_worker=home,
        groups=[[w] for w in where],
        shares={w: 1.0 for w in where},
        devices=worker_devices(workers),
        oversubscribed=len(where) > len(workers),
    )


def _roles(placement: Placement) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {placement.conv_server_worker: ["average model z"]}
    for j, group in enumerate(placement.groups):
        roles.setdefault(group[0], []).append(f"learner {j}")
    return roles


class _ReplicasRun:
    """One run of k learners and the average model, segment after segment (module docstring)."""

    def __init__(
        self, engine, net: Net, X, y, config: RunConfig, budget: Budget, start: TrainState | None,
        strategy: Strategy,
    ) -> None:  # fmt: skip
        client = self.client = engine_client(engine)
        self.engine, self.net, self.config, self.budget, self.strategy = engine, net, config, budget, strategy
        self.data = persist_data(engine, client, X, y, config)
        self.elastic_on = elastic.install(client)
        workers = elastic.usable_now(client, self.elastic_on)
        where = learner_workers(workers, int(config.n_groups))
        before = engine.placement_.n_groups if engine.placement_ is not None else config.n_groups
        self.placement = learners_placement(workers, where, sorted(workers)[0])
        self.first = (_roles(self.placement), where, self._alpha(len(where)))
        self.started_on = set(workers)
        self.events = elastic.between_runs(
            engine.workers_seen_, workers, self.placement, before, roles=_roles(self.placement), count=len
        )
        client.run(tasks.prepare_worker, engine.blas_threads)
        self.state = start.copy() if start is not None else TrainState.from_net(net)
        z = {key: np.asarray(v) for key, v in self.state.params.items()}
        momentum = self.state.momentum
        self.held = {  # the average model's exact state (`AverageModel.snapshot`)
            "z": z,
            "z_prev": {key: z[key] - momentum[key] if key in momentum else z[key] for key in z},
            "history": {},
            "synced_rounds": 0,
        }
        self.replicas: dict[int, dict[str, Any]] = {}  # learner → the replica it goes on from
        self.moved: dict[str, str] = {}  # what a hand-off read: name → digest
        self.run_id = uuid.uuid4().hex
        self.t0 = time.time()
        self.deadline = None if budget.seconds is None else self.t0 + budget.seconds
        self.rows: list[dict[str, Any]] = []
        self.t_change = self.t0
        self.round = 0  # the learners' next round (SMA synchronises every round, averaging every τ)
        self.end: dict[str, Any] | None = None

    def _alpha(self, k: int) -> float:
        return self.strategy.alpha if self.strategy.alpha is not None else 1.0 / k

    def train(self) -> dict[str, Any]:
        """Run segments until the budget is spent; the average model's end state (`get_state`)."""
        try:
            while self.end is None:
                self._segment()
            return self.end
        finally:
            if self.elastic_on:
                elastic.forget(self.client, self.run_id)

    def _segment(self) -> None:
        """One segment on the current placement; sets `end` when the run is over."""
        engine, client, p, held = self.engine, self.client, self.placement, self.held
        engine.placement_ = p
        k, done = p.n_groups, len(self.rows)
        left = None if self.budget.iterations is None else int(self.budget.iterations) - done
        if (left is not None and left <= 0) or (self.deadline is not None and time.time() >= self.deadline):
            self.end = self._end_state()
            return
        rounds = None if left is None else self.round + -(-left // k)
        alpha = self._alpha(k)
        future = submit_actor(
            client, AverageModel, held["z"], held["z_prev"], k, self.strategy.name, alpha,
            self.config.momentum, rounds, self.deadline, engine.timeout, worker=p.conv_server_worker,
        )  # fmt: skip
        average = future.result(timeout=engine.timeout)
        loops: list = []
        handed = bool(self.moved)  # the segment goes on from a hand-off
        try:
            if handed:
                self._restore(average)
            work = self.net.copy()
            work.set_params(held["z"])
            template = ship(client, work, broadcast=True, installed=self.elastic_on)
            specs = self._specs(p, alpha, rounds)
            loops = [
                submit_pinned(client, learner_loop, spec, template, average, worker=spec.worker)
                for spec in specs
            ]
            if self.elastic_on:
                elastic.use(client, self.run_id, p.roles())
            if handed:
                self.events[-1].seconds = time.time() - self.t_change
            try:
                rows = wait_for_loops(
                    engine, client, loops, _roles(p), self.budget, self.t0,
                    progress=lambda: k * average.progress().result(timeout=engine.timeout),
                    check=self._cluster_change if self.elastic_on else None,
                )  # fmt: skip
            except elastic.ClusterChange as change:  # a worker joined or is being retired
                self._hand_off(average, future, loops, change)
                return
            self._keep(average, rows)
            self.end = average.get_state().result(timeout=engine.timeout)
        except BaseException as err:
            try:
                average.abort(f"{type(err).__name__}: {err}").result(timeout=engine.timeout)
            except Exception:  # its worker is gone: the learners end on their own errors
                pass
            raise
        finally:
            client.cancel([*loops, future])

    def _specs(self, p: Placement, alpha: float, rounds: int | None) -> list[LearnerSpec]:
        """What each learner's loop needs: its worker, the batches from where the run is, the
        rounds counted on from the last segment, the replica it goes on from."""
        data, config, strategy, engine = self.data, self.config, self.strategy, self.engine
        return [
            LearnerSpec(
                run_id=self.run_id,
                learner=j,
                n_learners=p.n_groups,
                worker=group[0],
                device=p.devices[group[0]],
                x_keys=data.x_keys,
                y_keys=data.y_keys,
                chunks=data.chunks,
                batch_size=config.batch_size,
                seed=config.seed,
                first_batch=self.state.batches_done + len(self.rows),
                rounds=rounds,
                name=strategy.name,
                alpha=alpha,
                tau=int(strategy.tau),
                lr=config.lr,
                momentum=config.momentum,
                weight_decay=config.weight_decay,
                timeout=engine.timeout,
                first_round=self.round,
                replica=self.replicas.get(j),
            )
            for j, group in enumerate(p.groups)
        ]

    def _restore(self, average) -> None:
        """Set the new average model to the state handed over; record both digests."""
        timeout = self.engine.timeout
        average.restore(self.held).result(timeout=timeout)
        now = average.snapshot().result(timeout=timeout)
        self.events[-1].states["average model"] = (self.moved.pop("average model"), elastic.state_digest(now))

    def _cluster_change(self) -> None:
        planner = lambda workers: replan_learners(workers, self.placement)  # noqa: E731
        park = self.engine._worker_wait(self.client) > 0  # every worker retired: wait for one
        elastic.cluster_change(self.client, self.placement, self.placement.n_groups, None, park, planner)

    def _keep(self, average, rows: list[dict[str, Any]]) -> None:
        """The segment's rows joined to the run's; the digests of the replicas its learners started
        from recorded beside those read at the hand-off before it."""
        for row in rows:
            row["workers"] = self.placement.groups[row["group"]][0]
        self.rows.extend(rows)
        self.round = max([self.round, *(r["version_written"] for r in rows)])
        loaded = average.loaded_digests().result(timeout=self.engine.timeout)
        for j, digest in loaded.items():
            name = f"learner {j}"
            self.events[-1].states[name] = (self.moved.pop(name), digest)

    def _hand_off(self, average, actor, loops: list, change: elastic.ClusterChange) -> None:
        """End the segment at the next synchronisation and take the average model's exact state and
        every learner's replica to the placement `change` plans (`actor`: the average model's
        future, let go before a wait for workers)."""
        self.t_change = time.time()
        engine, timeout = self.engine, self.engine.timeout
        average.stop(hand_off=True).result(timeout=timeout)
        rows = wait_for_loops(engine, self.client, loops, _roles(self.placement), self.budget, self.t0)
        self._keep(average, rows)
        self.held = average.snapshot().result(timeout=timeout)
        handed = average.replicas().result(timeout=timeout)
        self.replicas = {j: replica for j, (replica, _) in handed.items()}
        self.moved = {"average model": elastic.state_digest(self.held)}
        self.moved.update({f"learner {j}": digest for j, (_, digest) in handed.items()})
        if change.placement is None:  # every worker is being retired: nothing of the run stays on them
            self.client.cancel([*loops, actor])
        before = self.placement.devices
        elastic.go_on(
            self,
            change,
            version=self.round,
            roles=_roles,
            joined=lambda c: [w for w in c.joined if w not in before],  # not idle ones
        )

    def _await_workers(self, change: elastic.ClusterChange) -> elastic.ClusterChange:
        """Wait for a worker to join (`elastic.await_return`) and recompute the persisted chunks
        there; the change to the learners' placement on it."""
        engine, client = self.engine, self.client
        workers = elastic.await_return(engine, client, self.run_id, change.leaving, self.elastic_on)
        await_data(engine, client, self.data.X, self.data.y)
        placement = replan_learners(workers, self.placement)
        return elastic.ClusterChange(placement, sorted(workers), change.leaving, len(workers))

    def _end_state(self) -> dict[str, Any]:
        """The average model's state (`AverageModel.get_state`) from the state held between segments."""
        z, held = self.held["z"], self.held
        if self.strategy.name == "model_averaging":
            momentum = {k: v.copy() for k, v in held["history"].items()}
        else:
            momentum = {k: z[k] - held["z_prev"][k] for k in z}
        return {"params": {k: v.copy() for k, v in z.items()}, "momentum": momentum}

    def result(self, net: Net, end: dict[str, Any]) -> RunResult:
        """Set z as the run's final weights on `net`; the RunResult with the run's Trace."""
        rows, state = self.rows, self.state
        rows.sort(key=lambda row: (row["version_read"], row["group"]))
        end_state = TrainState(
            params=end["params"],
            momentum=end["momentum"],
            batches_done=state.batches_done + len(rows),
            iterations_done=state.iterations_done + len(rows),
            extra=dict(state.extra),
        )
        net.set_params(end_state.params)
        on_run_clock(rows, self.t0, self.config, self.data.X.shape[0])
        for i, row in enumerate(rows):
            row["iteration"] = state.iterations_done + i + 1
        roles, where, alpha = self.first
        usable = elastic.at_run_end(self.engine, self.client, self.started_on, self.events, self.elastic_on)
        trace = make_trace(
            rows,
            "dask",
            n_groups=len(where),
            placement=str(roles),
            batch_size=self.config.batch_size,
            strategy=self.strategy.name,
            learners_per_worker=max(where.count(w) for w in set(where)),
            alpha=alpha,
            tau=int(self.strategy.tau),
            diverged=not all(math.isfinite(row["loss"]) for row in rows),
            worker_events=[e.as_dict() for e in self.events],
            n_workers=len(usable),
            started=self.t0,
        )
        return RunResult(trace=trace, state=end_state)
