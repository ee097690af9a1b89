"""One stretch of a Dask-engine run on one placement: its two servers (and the groups' shard
servers), its group loops, their watch.

A run is one segment when no worker fails. The driver watches a segment (polls the loops, checks
that every worker of the placement is alive, drains the conv model server's log of Trace rows and
snapshots both servers every `snapshot_every` updates); when a worker is lost it stops the segment
and starts the next one on the surviving workers (`driver.DaskEngine.run`, `recovery`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import numpy as np

from dasknn.engine.dask import iteration, tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.placement import Placement
from dasknn.engine.dask.recovery import (
    Snapshot,
    WorkerLostError,
    conv_server_state,
    fc_server_state,
    is_worker_loss,
    lost_workers,
    state_of,
)
from dasknn.engine.dask.runs import cluster_workers
from dasknn.engine.servers import ConvModelServer, FCServer
from dasknn.engine.trace import RunConfig, TrainState
from dasknn.nn.net import Net

#: how long the driver waits for the scheduler to notice a worker it could not reach (s)
LOSS_GRACE_SECONDS = 10.0


def await_data(engine, client, X, y) -> bool:
    """Wait (at most `engine.timeout` s) until the persisted data is in memory again (the chunks of
    a lost worker are recomputed); False as soon as no worker is left."""
    from distributed import wait

    deadline = time.monotonic() + engine.timeout
    while cluster_workers(client):
        try:
            wait([X, y], timeout=engine.poll)
            return True
        except TimeoutError:
            if time.monotonic() > deadline:
                raise WorkerLostError(
                    f"the data's chunks on lost workers were not recomputed within {engine.timeout:.0f} s"
                ) from None
    return False


class SegmentFailed(Exception):
    """Workers of the segment's placement left the cluster; `lost` maps each to its roles."""

    def __init__(self, lost: dict[str, list[str]], cause: BaseException | None = None) -> None:
        self.lost, self.cause = lost, cause
        what = "; ".join(f"{w} ({', '.join(r)})" for w, r in lost.items())
        super().__init__(f"lost {what}" + (f": {cause}" if cause is not None else ""))


@dataclass
class Servers:
    """A finished segment's actors, kept running for the next run (`Segment.keep`): the conv model
    and FC servers, the shard servers by worker, the workers of the two servers, and a copy of the
    state they hold. A run that differs only in η or µ (arguments of every push and FC step), or in
    g with the two servers on the same workers, starts on them without a restart
    (docs/architecture.md, "The loop and its policies")."""

    conv_future: Any
    conv_server: Any
    fc_future: Any
    fc_server: Any
    shard_futures: dict[str, Any]
    shard_actors: dict[str, Any]
    conv_worker: str
    fc_worker: str
    holds: TrainState

    def futures(self) -> list:
        return [self.conv_future, self.fc_future, *self.shard_futures.values()]


def same_state(a: TrainState, b: TrainState) -> bool:
    """Whether two states hold the same weights, momentum, iteration count, FC dropout stream and
    weight average (so servers holding `b` need no state set to continue from `a`)."""
    if a.iterations_done != b.iterations_done or a.params.keys() != b.params.keys():
        return False
    if a.momentum.keys() != b.momentum.keys() or a.extra.get("fc_rng") != b.extra.get("fc_rng"):
        return False
    kept_a, kept_b = a.extra.get("averaging"), b.extra.get("averaging")
    if (kept_a is None) != (kept_b is None):
        return False
    pairs = [(a.params[k], b.params[k]) for k in a.params] + [
        (a.momentum[k], b.momentum[k]) for k in a.momentum
    ]
    if kept_a is not None:
        if (kept_a["conv_count"], kept_a["fc_count"]) != (kept_b["conv_count"], kept_b["fc_count"]):
            return False
        pairs += [(kept_a["weights"][k], kept_b["weights"].get(k)) for k in kept_a["weights"]]
    return all(np.array_equal(x, y) for x, y in pairs)


class Segment:
    """The servers and group loops of one placement, from `state` at conv version `version`.

    `engine` gives timeout, poll, snapshot_every and strategy; `iterations0` is the run's first
    iteration number minus one (row iteration = iterations0 + version_written). `servers`: a
    previous run's kept actors (`Servers`) to start on instead of new ones; their state is set
    only when it is not `state` already.
    """

    def __init__(
        self,
        engine,
        client,
        placement: Placement,
        state: TrainState,
        version: int,
        iterations0: int,
        server_states: tuple[dict[str, Any], dict[str, Any]] | None = None,
        servers: Servers | None = None,
    ):
        self.engine, self.client, self.placement = engine, client, placement
        # the conv model and FC servers' exact get_state()s a hand-off moves (`hand_off`); None:
        # the servers start from `state`
        self.server_states = server_states
        self.state_digests: tuple[tuple[str, str], tuple[str, str]] | None = None
        self.last_states: tuple[dict[str, Any], dict[str, Any]] | None = None  # read by `_read`
        self.iterations0 = iterations0
        self.version = version
        self.rows: list[dict[str, Any]] = []
        self.snapshot = Snapshot(state.copy(), version)
        self.loops: list = []
        self.conv_future = self.conv_server = self.fc_future = self.fc_server = None
        self.shard_futures: dict[str, Any] = {}  # worker → its ShardServer's actor future
        self.shard_actors: dict[str, Any] = {}  # worker → its ShardServer actor
        self.kept = servers
        self.reused = False  # whether the segment started on kept servers
        self.rewound = 0  # iterations a run control's restores went back (`control.DaskControl`)

    # -- start -------------------------------------------------------------------------------------
    def start(
        self,
        conv_net: Net,
        fc_net: Net,
        config: RunConfig,
        specs: list[tasks.GroupSpec],
        template,
        source=None,
    ) -> None:
        """Create both servers from the snapshot on their workers (and, with the engine's
        `shard_calls="actors"`, a ShardServer on every worker of a group but its lead) and submit
        the group loops. `source`: the streamed data's source scattered to the cluster (a Future),
        sent to the loops in place of each spec's own copy."""
        try:
            if self.kept is not None:
                self._adopt(set(conv_net.params))
            else:
                self._servers(conv_net, fc_net, config)
            shards = self._shard_servers(specs, template)
            self.loops = [
                submit_pinned(
                    self.client,
                    iteration.group_loop,
                    spec if source is None else replace(spec, source=None),
                    template,
                    self.conv_server,
                    self.fc_server,
                    shards.get(spec.group),
                    source,
                    worker=spec.workers[0],
                )
                for spec in specs
            ]
        except SegmentFailed:
            raise
        except Exception as err:
            self._failed(err)

    def _servers(self, conv_net: Net, fc_net: Net, config: RunConfig) -> None:
        client, p = self.client, self.placement
        state, conv_keys = self.snapshot.state, set(conv_net.params)
        fc_net = fc_net.copy()
        fc_net.set_params({k: v for k, v in state.params.items() if k not in conv_keys})
        self.conv_future = submit_actor(
            client,
            ConvModelServer,
            {k: v for k, v in state.params.items() if k in conv_keys},
            conv_net.lr_mult,
            conv_net.decay_mult,
            config.weight_decay,
            conv_net.statistics,
            worker=p.conv_server_worker,
        )
        self.fc_future = submit_actor(
            client,
            FCServer,
            fc_net,
            config.weight_decay,
            config.seed,
            p.devices.get(p.fc_worker, "cpu"),
            worker=p.fc_worker,
        )
        self.conv_server = self._await(self.conv_future, p.conv_server_worker)
        self.fc_server = self._await(self.fc_future, p.fc_worker)
        if self.server_states is not None:
            self._move_states(*self.server_states)
            return
        averaging = self.engine.averaging is not None
        conv_state = conv_server_state(state, conv_keys, self.version, averaging)
        self._await(self.conv_server.set_state(conv_state), p.conv_server_worker)
        fc_history = {k for k in state.momentum if k not in conv_keys}
        # iter: the schedules' index; averaging: the weights are not the state's params
        if fc_history or "fc_rng" in state.extra or state.iterations_done or averaging:
            fc_state = self._await(self.fc_server.get_state(), p.fc_worker)
            fc_state = fc_server_state(state, fc_state, conv_keys, averaging)
            self._await(self.fc_server.set_state(fc_state), p.fc_worker)

    def _adopt(self, conv_keys: set[str]) -> None:
        """Start on the kept servers: a new run on the conv model server (pushes accepted, version
        0), and both servers' states set from the snapshot only when they hold another state (a
        window undone, a restored snapshot)."""
        kept, p, state = self.kept, self.placement, self.snapshot.state
        self.kept = None
        self.conv_future, self.conv_server = kept.conv_future, kept.conv_server
        self.fc_future, self.fc_server = kept.fc_future, kept.fc_server
        self.shard_futures, self.shard_actors = dict(kept.shard_futures), dict(kept.shard_actors)
        self.reused = True
        self._await(self.conv_server.new_run(self.version), p.conv_server_worker)
        if same_state(state, kept.holds):
            return
        averaging = self.engine.averaging is not None
        self._await(
            self.conv_server.set_state(conv_server_state(state, conv_keys, self.version, averaging)),
            p.conv_server_worker,
        )
        fc_state = self._await(self.fc_server.get_state(), p.fc_worker)
        fc_state = fc_server_state(state, fc_state, conv_keys, averaging)
        self._await(self.fc_server.set_state(fc_state), p.fc_worker)

    def keep(self, holds: TrainState) -> Servers:
        """Hand this finished segment's actors to the next run (`Servers`); `release` then lets none go."""
        kept = Servers(
            self.conv_future, self.conv_server, self.fc_future, self.fc_server,
            dict(self.shard_futures), dict(self.shard_actors),
            self.placement.conv_server_worker, self.placement.fc_worker, holds,
        )  # fmt: skip
        self.conv_future = self.conv_server = self.fc_future = self.fc_server = None
        self.shard_futures, self.shard_actors = {}, {}
        return kept

    def _move_states(self, conv: dict[str, Any], fc: dict[str, Any]) -> None:
        """Set both new servers to the old ones' exact states, and record the digests of what was
        read at the hand-off and of what the new servers hold (equal: moved bit for bit)."""
        from dasknn.engine.dask.elastic import state_digest

        p = self.placement
        self._await(self.conv_server.set_state(conv), p.conv_server_worker)
        self._await(self.fc_server.set_state(fc), p.fc_worker)
        conv_now = self._await(self.conv_server.get_state(), p.conv_server_worker)
        fc_now = self._await(self.fc_server.get_state(), p.fc_worker)
        self.state_digests = (
            (state_digest(conv), state_digest(conv_now)),
            (state_digest(fc), state_digest(fc_now)),
        )

    def _shard_servers(self, specs: list[tasks.GroupSpec], template) -> dict[int, tuple]:
        """group → the ShardServer actors of its workers but the lead (none with shard tasks)."""
        if not tasks.uses_shard_servers(self.engine):
            return {}
        unused = [w for w in self.shard_actors if w not in self.placement.conv_workers]
        if unused:  # kept on a worker this placement leaves out (one being retired): let it go
            self.client.cancel([self.shard_futures.pop(w) for w in unused])
            for w in unused:
                del self.shard_actors[w]
        have = self.shard_actors  # kept from an earlier run: a ShardServer serves any group's shards
        groups = [[spec.workers[0], *(w for w in spec.workers[1:] if w not in have)] for spec in specs]
        new = tasks.submit_shard_servers(self.client, groups, self.placement.devices, template)
        self.shard_futures.update(new)
        self.shard_actors.update({w: self._await(f, w) for w, f in new.items()})
        actors = self.shard_actors
        return {s.group: tuple(actors[w] for w in s.workers[1:]) for s in specs if len(s.workers) > 1}

    def _await(self, future, worker: str):
        """A task's or an actor call's result within `timeout` s; SegmentFailed as soon as `worker`
        (where it runs) is lost: a task pinned to a lost worker would wait for it forever, and a
        call in flight to a worker that died may wait for its answer until the timeout."""
        deadline = time.monotonic() + self.engine.timeout
        while True:
            try:
                return future.result(timeout=self.engine.poll)
            except TimeoutError:
                lost = self.lost()
                if worker in lost:
                    raise SegmentFailed(lost) from None
                if time.monotonic() > deadline:
                    raise

    # -- watch -------------------------------------------------------------------------------------
    def lost(self) -> dict[str, list[str]]:
        """The workers of the placement that left the cluster, with their roles."""
        return lost_workers(self.placement, cluster_workers(self.client))

    def _failed(self, err: BaseException) -> NoReturn:
        """Raise SegmentFailed if a worker of the placement is gone (waiting a bounded grace for the
        scheduler to notice one the driver could not reach), else re-raise `err`."""
        if not is_worker_loss(err):
            raise err
        deadline = time.monotonic() + min(self.engine.timeout, LOSS_GRACE_SECONDS)
        while True:
            lost = self.lost()
            if lost:
                raise SegmentFailed(lost, err) from err
            if time.monotonic() >= deadline:
                raise err
            time.sleep(0.2)

    def _read(self, with_state: bool) -> TrainState | None:
        """Drain the conv model server's log of rows; with `with_state`, also both servers' state
        (the conv state read with the log, so the rows kept and the weights agree)."""
        out = self._await(self.conv_server.drain(with_state), self.placement.conv_server_worker)
        for row in out["rows"]:
            row["iteration"] = self.iterations0 + row["version_written"]
            row["workers"] = ",".join(self.placement.groups[row["group"]])
        self.rows.extend(out["rows"])
        self.version = max(self.version, out["version"])
        if not with_state:
            return None
        fc = self._await(self.fc_server.get_state(), self.placement.fc_worker)
        self.last_states = (out["state"], fc)
        return state_of(out["state"], fc, self.snapshot.state, self.iterations0 - self.rewound)

    def drain(self) -> None:
        """Move the logged rows to the driver; snapshot both servers every `snapshot_every` updates."""
        self._read(False)
        if self.version - self.snapshot.version >= self.engine.snapshot_every:
            state = self._read(True)
            self.snapshot = Snapshot(state, self.version)

    def live_state(self) -> TrainState:
        """Both servers' current state, and the rows logged until it."""
        return self._read(True)

    def watch(
        self,
        deadline: float | None,
        progress: Callable[[int], None] | None = None,
        check: Callable[[], None] | None = None,
        poll: float | None = None,
    ) -> None:
        """Until every loop has returned; raises SegmentFailed as soon as a worker is lost. `check`,
        called at every poll (every `poll` seconds, else the engine's) while the loops run, may
        raise to end the watch (a cluster change, `elastic.cluster_change`)."""
        from distributed import wait

        engine = self.engine
        while True:
            try:
                wait(self.loops, timeout=engine.poll if poll is None else poll)
                finished = True
            except TimeoutError:
                finished = False
            except (Exception, asyncio.CancelledError) as err:  # a loop's task was cancelled or forgotten
                self._failed(err)
            lost = self.lost()
            if lost:
                raise SegmentFailed(lost)
            errored = [f for f in self.loops if f.status == "error"]
            try:
                if errored:
                    raise errored[0].exception(timeout=engine.timeout)
                self.drain()
            except Exception as err:
                self._failed(err)
            if progress is not None:
                progress(self.version)
            if finished:
                return
            if check is not None:
                check()
            if deadline is not None and time.time() > deadline + engine.timeout:
                raise TimeoutError(f"the run is {engine.timeout:.0f} s past its budget; a group is stuck")

    def finish(self) -> TrainState:
        """The state the servers ended in, after the last rows are drained."""
        try:
            return self.live_state()
        except Exception as err:
            self._failed(err)
            raise  # _failed always raises

    def hand_off(self) -> TrainState:
        """End the segment with no update lost, for a re-planned one to continue from its servers'
        state (`elastic`): the FC server stops first, so every group either finishes the iteration
        it has passed the FC step in (its push is applied) or stops at the FC step; once the loops
        have returned (the shard servers are idle) the conv model server stops and both servers'
        exact states are read (`last_states`). Raises SegmentFailed if a worker is lost meanwhile."""
        self.stop_groups()
        try:
            return self.live_state()
        except SegmentFailed:
            raise
        except Exception as err:
            self._failed(err)
            raise  # _failed always raises

    def stop_groups(self) -> None:
        """Stop the groups with no update lost (`hand_off`, a run control's `End`): the FC server
        first, then, once the loops have returned, the conv model server. Raises SegmentFailed if
        a worker is lost meanwhile."""
        from distributed import wait

        p = self.placement
        try:
            self._await(self.fc_server.stop(), p.fc_worker)
            deadline = time.monotonic() + self.engine.timeout
            while True:  # a loop stuck past the deadline: the conv model server's stop ends it
                try:
                    wait(self.loops, timeout=self.engine.poll)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        break
                lost = self.lost()
                if lost:  # an abrupt loss meanwhile: the recovery path, not a hand-off
                    raise SegmentFailed(lost)
            lost = self.lost()
            if lost:
                raise SegmentFailed(lost)
            errored = [f for f in self.loops if f.status == "error"]
            if errored:
                raise errored[0].exception(timeout=self.engine.timeout)
            self._await(self.conv_server.stop(), p.conv_server_worker)
        except SegmentFailed:
            raise
        except Exception as err:
            self._failed(err)
            raise  # _failed always raises

    # -- stop --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the servers that are still reachable (groups then return) and cancel the loops.
        Every wait is bounded; a server on a lost worker is skipped."""
        try:
            alive = set(cluster_workers(self.client))
        except Exception:
            alive = set()
        for server, where in (
            (self.conv_server, self.placement.conv_server_worker),
            (self.fc_server, self.placement.fc_worker),
        ):
            if server is not None and where in alive:
                try:
                    server.stop().result(timeout=min(self.engine.timeout, 10.0))
                except Exception:  # the worker went away meanwhile: nothing left to stop
                    pass
        if self.loops:
            self.client.cancel(self.loops)

    def release(self) -> None:
        """Let the servers' actors go (after their state has been read, or when the run ends)."""
        futures = [self.conv_future, self.fc_future, *self.shard_futures.values()]
        futures = [f for f in futures if f is not None]
        if futures:
            self.client.cancel(futures)
        self.conv_future = self.conv_server = self.fc_future = self.fc_server = None
        self.shard_futures, self.shard_actors = {}, {}
        if self.kept is not None:  # a segment that failed before it adopted the kept servers
            self.client.cancel([f for f in self.kept.futures() if f is not None])
            self.kept = None

    def resume_point(
        self, failure: SegmentFailed
    ) -> tuple[TrainState, int, list[dict[str, Any]], int | None]:
        """(state, version, rows kept, iterations redone or None) to continue from after `failure`.

        With both servers alive: their state now, every row kept, nothing redone (None). Otherwise
        (or when the segment failed before its servers were up) the latest snapshot, the rows up to
        its version, and as redone the updates after it that the driver had seen (a lower bound:
        those written since its last poll are lost unseen).
        Call after `stop()`, so the servers no longer change.
        """
        p = self.placement
        servers_up = self.conv_server is not None and self.fc_server is not None
        if servers_up and p.fc_worker not in failure.lost and p.conv_server_worker not in failure.lost:
            try:
                state = self.live_state()
                return state, self.version, list(self.rows), None
            except Exception as err:
                if not (isinstance(err, SegmentFailed) or is_worker_loss(err)):
                    raise
        snap = self.snapshot
        kept = [r for r in self.rows if r["version_written"] <= snap.version]
        return snap.state.copy(), snap.version, kept, self.version - snap.version
