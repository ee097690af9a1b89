"""Elastic clusters: a worker that joins a running fit is put to work, one retired gracefully hands
its roles over first. `ElasticPlugin`, the scheduler's side, wraps its `retire_workers` handler so
that a worker a run uses leaves only once the driver has re-planned without it; the driver asks at
every poll what changed (`cluster_change`) and hands the segment over to the new placement
(docs/architecture.md, "Elastic clusters").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.engine.dask.placement import Placement, plan, replan
from dasknn.engine.dask.recovery import WorkerLostError, scheduler_connected
from dasknn.engine.dask.runs import cluster_workers

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dasknn-elastic"
HANDOFF_SECONDS = 60.0
"""How long a retirement of a worker in use waits for the fit to move off it before dask's own
retirement runs anyway (and, if an actor is still there, refuses as it always did)."""

USABLE_STATUS = ("running", "paused")
"""Worker states a placement may use: a worker closing (gracefully or not) is never planned on."""

_RETIRE_OPTIONS = ("close_workers", "remove", "stimulus_id")


class ElasticPlugin(SchedulerPlugin):
    """The scheduler's side of elastic fits: which workers running fits use, and retirements of
    those workers held until the fit has moved off them (see the module docstring)."""

    name = PLUGIN_NAME
    idempotent = True  # installed once per scheduler, however many runs ask

    def __init__(self, handoff_seconds: float = HANDOFF_SECONDS) -> None:
        self.handoff_seconds = float(handoff_seconds)
        self.in_use: dict[str, set[str]] = {}  # run id → the workers its placement uses
        self.leaving: set[str] = set()
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers["retire_workers"] = self.retire_workers
        scheduler.handlers["dasknn_elastic_use"] = self.use
        scheduler.handlers["dasknn_elastic_leaving"] = self.leaving_workers

    async def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.handlers["retire_workers"] = self.scheduler.retire_workers

    def use(self, run_id: str, workers: list[str]) -> None:
        """Run `run_id` now uses `workers` (none: the run ended)."""
        if workers:
            self.in_use[run_id] = set(workers)
        else:
            self.in_use.pop(run_id, None)

    def leaving_workers(self) -> list[str]:
        """The workers whose retirement waits for a fit to move off them."""
        return sorted(self.leaving)

    def _addresses(self, workers, names, selection: dict[str, Any]) -> list[str]:
        """The addresses a retire_workers call means: `workers` (addresses, or names, as SpecCluster
        passes them), `names`, or the scheduler's own choice (`workers_to_close(**selection)`)."""
        s = self.scheduler
        if names is not None:
            wanted = {str(n) for n in names}
            return [a for a, ws in s.workers.items() if str(ws.name) in wanted]
        if workers is not None:
            by_name = {str(ws.name): a for a, ws in s.workers.items()}
            return [
                w if w in s.workers else by_name[str(w)]
                for w in workers
                if w in s.workers or str(w) in by_name
            ]
        return list(s.workers_to_close(**selection))

    async def retire_workers(self, workers=None, *, names=None, **kwargs) -> dict[str, Any]:
        """dask's `retire_workers`, first waiting for running fits to move off the workers it retires."""
        s = self.scheduler
        options = {k: kwargs.pop(k) for k in _RETIRE_OPTIONS if k in kwargs}
        if (names is not None or workers is not None) and kwargs:
            return await s.retire_workers(workers=workers, names=names, **options, **kwargs)
        addresses = self._addresses(workers, names, kwargs)
        used = set().union(*self.in_use.values()) if self.in_use else set()
        # in use by a run, or holding the servers a run left for the next one (`kept`): the next
        # run (which plans without a leaving worker) or the fit's end lets them go
        busy = [a for a in addresses if a in used or (a in s.workers and _holds_servers(s.workers[a]))]
        if not busy:
            if names is None and workers is None:
                return await s.retire_workers(workers=addresses, **options)
            return await s.retire_workers(workers=workers, names=names, **options)
        self.leaving.update(busy)
        deadline = time.monotonic() + self.handoff_seconds
        try:
            while time.monotonic() < deadline:
                used = set().union(*self.in_use.values()) if self.in_use else set()
                if not any(a in s.workers and (a in used or _holds_servers(s.workers[a])) for a in busy):
                    break
                await asyncio.sleep(0.05)
            else:
                logger.warning(
                    "a fit did not move off %s within %.0f s; retiring it anyway", busy, self.handoff_seconds
                )
        finally:
            self.leaving.difference_update(busy)
        return await s.retire_workers(workers=addresses, **options)


SERVER_CLASSES = ("ConvModelServer", "FCServer", "ShardServer", "AverageModel")


def _holds_servers(ws) -> bool:
    """Whether a worker (the scheduler's WorkerState) still holds an actor of dasknn's servers."""
    return any(str(getattr(ts, "key", ts)).split("-", 1)[0] in SERVER_CLASSES for ts in ws.actors)


def install(client) -> bool:
    """Install `ElasticPlugin` on the client's scheduler (once); False, with a warning, when the
    scheduler cannot load it (dasknn is not installed where the scheduler runs)."""
    try:
        client.register_plugin(ElasticPlugin(), name=PLUGIN_NAME)
        return True
    except Exception as err:  # the scheduler could not unpickle the plugin
        logger.warning("elastic fits are off: the scheduler could not install dasknn's plugin (%s)", err)
        return False


def use(client, run_id: str, workers: Iterable[str]) -> None:
    """Tell the scheduler which workers run `run_id` uses now (none: the run ended)."""
    client.sync(client.scheduler.dasknn_elastic_use, run_id=run_id, workers=sorted(workers))


def forget(client, run_id: str) -> None:
    """Tell the scheduler run `run_id` ended (nothing when the scheduler is gone: the run's own error
    says so; a client that has lost its scheduler is not asked: it would wait out its reconnection
    window)."""
    if not scheduler_connected(client):
        return
    try:
        use(client, run_id, [])
    except Exception:  # the scheduler is unreachable: nothing there to tell
        pass


def leaving(client) -> set[str]:
    """The workers whose graceful retirement waits for a fit to move off them."""
    return set(client.sync(client.scheduler.dasknn_elastic_leaving))


def usable_workers(workers: Mapping[str, Mapping[str, Any]], gone: set[str]) -> dict[str, Mapping[str, Any]]:
    """The workers a placement may use: running (or paused), and not in `gone` (leaving)."""
    return {
        a: info
        for a, info in workers.items()
        if a not in gone and info.get("status", "running") in USABLE_STATUS
    }


def usable_now(client, installed: bool = True) -> dict[str, Mapping[str, Any]]:
    """The workers a placement may use now; `installed`: whether `ElasticPlugin` is (it knows the
    workers being retired)."""
    return usable_workers(cluster_workers(client), leaving(client) if installed else set())


def conv_count(workers: Mapping[str, Mapping[str, Any]]) -> int:
    """The conv workers N among `workers` (less a dedicated FC worker): what the policies size g by
    (`trace.attrs["n_workers"]`)."""
    return len(plan(workers, 1).conv_workers) if workers else 0


def seen_by_run(start: Iterable[str], events: list[WorkerEvent], lost: Iterable[str]) -> set[str]:
    """The workers a run knew of when it ended: those at its start, with the joins and leaves it
    handed over for and less the workers it lost. A worker that came after its last look is not
    among them: the next run's start reports it (`between_runs`), and the count a policy reads
    (`trace.attrs["n_workers"]`) agrees with the events it saw."""
    seen = set(start)
    for e in events:
        seen = (seen | set(e.joined)) - set(e.left)
    return seen - set(lost)


def at_run_end(
    engine, client, start: Iterable[str], events: list[WorkerEvent], installed: bool, lost: Iterable[str] = ()
) -> dict[str, Mapping[str, Any]]:
    """The usable workers a run ended with among those it knew of (`seen_by_run`), which the engine
    remembers for its next run's `between_runs`; a run counts its `trace.attrs["n_workers"]` on them."""
    seen = seen_by_run(start, events, lost)
    engine.workers_seen_ = seen
    return {a: info for a, info in usable_now(client, installed).items() if a in seen}


def between_runs(
    before: set[str] | None, workers: Mapping[str, Mapping[str, Any]], placement: Placement, n_groups: int,
    *, roles: dict | None = None, count=conv_count,
) -> list[WorkerEvent]:  # fmt: skip
    """The change since the engine's last run ended on the workers `before` (None: no such run), as
    an event at the new run's start: workers that joined or left while no run was going on.
    `roles`: the placement's workers and what each does (default `placement.roles()`: each map names
    its own); `count`: the workers N the run counts (default `conv_count`)."""
    if before is None or set(workers) == before:
        return []
    return [
        WorkerEvent(
            time=0.0,
            joined=sorted(set(workers) - before),
            left=sorted(before - set(workers)),
            version=0,
            n_groups_before=n_groups,
            n_groups_after=placement.n_groups,
            placement=str(placement.roles() if roles is None else roles),
            n_workers=count(workers),
        )
    ]


def adapts_to_zero(client) -> bool:
    """Whether the client's cluster object scales itself and may go down to no worker (a running
    `cluster.adapt(minimum=0, ...)`): a fit then waits for workers rather than failing."""
    adaptive = getattr(getattr(client, "cluster", None), "_adaptive", None)
    return adaptive is not None and adaptive.state in ("starting", "running") and adaptive.minimum == 0


def _wanted() -> None:
    """The task a fit waiting for workers submits: pending with no worker, it is the work that makes
    an adaptive cluster start one (`Scheduler.adaptive_target` counts unrunnable tasks)."""


def await_workers(
    client, seconds: float, poll: float, installed: bool = True
) -> dict[str, Mapping[str, Any]]:
    """The usable workers, once there is one: waits up to `seconds` (polling every `poll` s) while
    the cluster has none, with a task pending so that an adaptive cluster starts one; {} when none
    came (the caller raises). Logged when the wait begins and ends."""
    workers = usable_now(client, installed)
    if workers or not seconds > 0:
        return workers
    logger.warning(
        "the cluster has no workers: the fit waits up to %.0f s for one to join (cluster.adapt(minimum=0) "
        "starts one for the task it leaves pending)",
        seconds,
    )
    t0 = time.monotonic()
    demand = client.submit(_wanted, pure=False, key=f"dasknn-wants-a-worker-{uuid.uuid4().hex}")
    try:
        while time.monotonic() < t0 + seconds:
            time.sleep(poll)
            workers = usable_now(client, installed)
            if workers:
                logger.warning("%s joined after %.1f s: the fit goes on", ", ".join(sorted(workers)),
                               time.monotonic() - t0)  # fmt: skip
                return workers
    finally:
        demand.cancel()
    return {}


def await_return(
    engine, client, run_id: str, leaving: list[str], installed: bool
) -> dict[str, Mapping[str, Any]]:
    """After every worker of run `run_id` was retired (`ClusterChange` with no placement), its
    servers' states held by the driver and its actors let go: release the workers (dask then
    retires them) and wait for one to join (`await_workers`, up to the engine's `worker_wait`);
    the usable workers, or WorkerLostError when none joined in time. Every map goes on this way."""
    if installed:
        use(client, run_id, [])  # nothing of the run is on them any more
    seconds = engine._worker_wait(client)
    workers = await_workers(client, seconds, engine.poll, installed)
    if not workers:
        gone = ", ".join(leaving)
        raise WorkerLostError(f"every worker was retired ({gone}) and none joined within {seconds:.0f} s")
    return workers


def go_on(run, change: ClusterChange, *, version: int, roles, joined=None) -> ClusterChange:
    """The step every map takes after it handed its state over at `change`: wait for a worker when
    every one was retired (`run._await_workers`, each map's own re-planning), record the change in
    `run.events` (`WorkerEvent.of_change`, at `run.t_change`; `roles(placement)`: the map's names of
    its roles; `joined(change)`: the joined workers to record, default all) and take the new
    placement (`run.placement`). Returns the change gone on with."""
    if change.placement is None:  # every worker is being retired: the states wait here
        change = run._await_workers(change)
    recorded = None if joined is None else joined(change)
    run.events.append(
        WorkerEvent.of_change(
            change,
            run.placement,
            time=run.t_change - run.t0,
            version=version,
            roles=roles(change.placement),
            joined=recorded,
        )
    )
    run.placement = change.placement
    return change


def same_placement(a: Placement, b: Placement) -> bool:
    """Whether two placements put every role (servers, groups and their workers) in the same place."""
    return (a.fc_worker, a.conv_server_worker, a.groups) == (b.fc_worker, b.conv_server_worker, b.groups)


class ClusterChange(Exception):
    """The cluster changed under a segment: `placement` is the one to go on with (None: every worker
    is being retired, none is left to go on with); `joined` and `leaving` name the workers that came
    and that are being retired; `n_workers`: the conv workers N after the change (`conv_count`)."""

    def __init__(
        self, placement: Placement | None, joined: list[str], leaving: list[str], n_workers: int
    ) -> None:
        self.placement, self.joined, self.leaving, self.n_workers = placement, joined, leaving, n_workers
        super().__init__(f"workers joined {joined}, leaving {leaving}")


def cluster_change(
    client, placement: Placement, n_groups: int, throughput, park: bool = False, planner=None
) -> None:
    """Raise ClusterChange when a worker of `placement` is being retired, or when the placement a run
    would get now (`n_groups` groups on the usable workers) differs from it (a worker joined).

    `throughput`: a function of the client giving the engine's worker GFLOP/s (or None). `park`:
    when every worker is being retired, raise a ClusterChange with no placement (the servers' state
    then waits in the driver for a worker to join) rather than leave the fit to the recovery path.
    `planner`: the placement a run would get now as a function of the usable workers, for runs
    not planned by `plan` (the replica strategies' learners, `replica_run.replan_learners`)."""
    gone = leaving(client)
    present = cluster_workers(client)
    workers = usable_workers(present, gone)
    used = set(placement.roles())
    if park and not workers and used & gone and used <= set(present):
        raise ClusterChange(None, [], sorted(used & gone), 0)
    if not workers or not used <= set(present):
        return  # nothing to move to, or an abrupt loss: the recovery path (`recovery`) takes it
    if planner is not None:
        target = planner(workers)
    else:
        target = plan(workers, n_groups, throughput(client))
        if target.oversubscribed and not placement.oversubscribed:
            # a lost machine meant fewer groups (`placement.replan`); groups come back with machines
            target = replan(workers, placement, throughput(client))
    if same_placement(target, placement) and not (used & gone):
        return
    n_conv = len(plan(workers, 1).conv_workers)
    raise ClusterChange(target, sorted(set(workers) - used), sorted(used & gone), n_conv)


def state_digest(state: Mapping[str, Any]) -> str:
    """A digest of a server's `get_state()` (every array's dtype, shape and bytes, and every other
    value), so two states can be compared bit for bit without shipping them."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, Mapping):
            for k in sorted(value, key=str):
                h.update(repr(k).encode())
                feed(value[k])
        elif isinstance(value, np.ndarray) or hasattr(value, "__array__"):
            arr = np.ascontiguousarray(np.asarray(value))
            h.update(f"{arr.dtype}{arr.shape}".encode())
            h.update(arr.tobytes())
        else:
            h.update(repr(value).encode())

    feed(state)
    return h.hexdigest()


@dataclass
class WorkerEvent:
    """One change of the cluster under a run, as the Trace records it (`trace.attrs["worker_events"]`).

    time: seconds since the run started when the driver saw it; joined / left: the workers; version:
    the conv model version the next segment continues from; seconds: from seeing the change to the
    groups running again; conv_state / fc_state: digests of the servers' state read at the hand-off
    and of the new servers' state once set (equal: moved bit for bit); n_workers: the conv workers
    N after the change; states: the same digests for the replica strategies' average model and
    learners (name → (read, set))."""

    time: float
    joined: list[str]
    left: list[str]
    version: int
    n_groups_before: int
    n_groups_after: int
    placement: str
    n_workers: int = -1
    seconds: float = float("nan")
    conv_state: tuple[str, str] = ("", "")
    fc_state: tuple[str, str] = ("", "")
    states: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def of_change(
        cls, change: ClusterChange, before, *, time: float, version: int, roles: dict, joined=None
    ) -> WorkerEvent:
        """The event of `change` seen `time` s into a run whose placement was `before`; `roles`:
        the new placement's workers and what each does (each map names its own roles); `joined`:
        the joined workers to record (default all of `change.joined`)."""
        return cls(
            time=time,
            joined=list(change.joined if joined is None else joined),
            left=change.leaving,
            version=version,
            n_groups_before=before.n_groups,
            n_groups_after=change.placement.n_groups,
            placement=str(roles),
            n_workers=change.n_workers,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
