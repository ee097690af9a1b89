"""Elastic fits on a real LocalCluster: a worker retired gracefully mid-run hands its roles over and
leaves, a worker that joins is put to work (docs/architecture.md, "Elastic clusters").

Every wait is tied to the run's progress (the conv model server's version, read on the workers),
never to a guessed delay.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

import numpy as np
import pytest
from distributed.deploy.adaptive import Adaptive
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dasknn.data import load
from dasknn.engine.dask import DaskEngine, cluster_workers, elastic, local_client
from dasknn.engine.dask.replicas import AverageModel
from dasknn.engine.servers import ConvModelServer
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from tests.engine.dask.test_faults import _conv_versions, training_accuracy

CFG = RunConfig(n_groups=2, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)
ITERATIONS = 120
LEAVE_AT = 10  # conv updates before the retirement is asked for

ROLES = {
    # on 4 workers with 2 groups of 2 the first worker (by address) holds both servers and leads
    # group 0, the second holds group 0's ShardServer, the third leads group 1
    "servers": lambda p: p.fc_worker,
    "shard server": lambda p: p.groups[0][1],
    "group lead": lambda p: p.groups[1][0],
}


def _updates(client) -> int:
    versions = client.run(_conv_versions, on_error="ignore")
    return max((v for vs in versions.values() if isinstance(vs, list) for v in vs), default=0)


def _server_updates(actor) -> int | None:
    """Updates a server of the run has made: a model server's version, SMA's rounds × k."""
    if isinstance(actor, ConvModelServer):
        return actor.version
    if isinstance(actor, AverageModel):
        return actor.synced_rounds * actor.k
    return None


class HoldUntilHandOff(WorkerPlugin):
    """On the worker `address` only, dask's `actor_execute` handler holds each call that hands a
    server an update (`push`, `push_pull`, SMA's `synchronise`) once that server has made `at`
    updates, until the driver first stops a server there (a hand-off): the run cannot end before
    the driver has seen the cluster change the test makes by then. Nothing of dask is replaced:
    the call runs as always once let through. `seconds` bounds a hold for a broken run (below the
    engine's timeout, which bounds the held call, so the test's own checks report it), not a
    timing."""

    name = "dasknn-test-hold-until-hand-off"
    held_calls = ("push", "push_pull", "synchronise")

    def __init__(self, address: str, at: int, seconds: float) -> None:
        self.address, self.at, self.seconds = address, int(at), float(seconds)
        self.handed_off = False  # on the worker: once a server there was stopped, nothing is held

    def setup(self, worker) -> None:
        if worker.address != self.address:
            return
        original = worker.handlers["actor_execute"]
        actors = worker.state.actors

        def hold(key, function) -> bool:
            self.handed_off = self.handed_off or any(getattr(a, "stopped", False) for a in actors.values())
            if self.handed_off or function not in self.held_calls:
                return False
            made = _server_updates(actors.get(key))
            return made is not None and made >= self.at

        async def actor_execute(actor=None, function=None, args=(), kwargs=None):
            deadline = time.monotonic() + self.seconds
            while hold(actor, function) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return await original(actor=actor, function=function, args=args, kwargs=kwargs)

        worker.handlers["actor_execute"] = actor_execute


class ChosenVictim(Adaptive):
    """dask's Adaptive, which picks the worker to close by its own rule; here the test's worker."""

    victim_name = None

    async def workers_to_close(self, target: int) -> list:
        return [self.victim_name]


def _retire(how: str, client, victim: str) -> None:
    """Retire `victim` gracefully the way a user or a deployment does; returns once dask is done."""
    cluster = client.cluster
    name = cluster_workers(client)[victim]["name"]
    if how == "client.retire_workers":
        assert victim in client.retire_workers([victim])  # dask no longer refuses it
    elif how == "cluster.scale":
        spec = cluster.worker_spec.pop(name)  # SpecCluster.scale closes the last-named worker
        cluster.worker_spec[name] = spec
        cluster.scale(len(cluster.worker_spec) - 1)
    else:
        ChosenVictim.victim_name = name
        n = len(cluster.worker_spec) - 1
        cluster.adapt(Adaptive=ChosenVictim, minimum=n, maximum=n, interval="100ms", wait_count=1)


class Retirer(threading.Thread):
    """Once the run has written LEAVE_AT updates, retires the worker `role` names in the placement
    `how`, and records when it asked and when the worker was gone."""

    def __init__(self, client, engine, role: str, how: str) -> None:
        super().__init__(daemon=True)
        self.client, self.engine, self.role, self.how = client, engine, role, how
        self.victim = None
        self.asked = self.gone = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if self.engine.placement_ is not None and _updates(self.client) >= LEAVE_AT:
                    break
                time.sleep(0.05)
            self.victim = ROLES[self.role](self.engine.placement_)
            self.asked = time.monotonic()
            _retire(self.how, self.client, self.victim)
            while self.victim in cluster_workers(self.client) and time.monotonic() < self.asked + 60:
                time.sleep(0.05)
            if self.victim not in cluster_workers(self.client):
                self.gone = time.monotonic()
        except BaseException as err:  # reported by the test
            self.error = err


def _leave(role: str, how: str, digits, data: str = "persist"):
    X, y = digits
    with local_client(n_workers=4) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2, data=data)
        retirer = Retirer(client, engine, role, how)
        retirer.start()
        result = engine.run(zoo.lenet(seed=0), X, y, CFG, Budget(iterations=ITERATIONS))
        retirer.join(timeout=90)
        if how == "adapt":
            client.cluster._adaptive.stop()
        left = set(cluster_workers(client))
    assert retirer.error is None, retirer.error
    victim = retirer.victim
    assert retirer.gone is not None and retirer.gone - retirer.asked < 30, "the worker did not leave in 30 s"
    assert victim not in left and len(left) == 3
    trace = result.trace
    (event,) = [e for e in trace.attrs["worker_events"] if e["left"]]
    assert event["left"] == [victim] and event["version"] >= LEAVE_AT
    assert victim not in event["placement"]
    # the servers' state moved bit for bit: what the new servers hold is what the old ones had
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    # the version sequence continues, and every update pushed is one row, none lost or doubled
    assert sorted(trace["version_written"]) == list(range(1, ITERATIONS + 1))
    assert sorted(trace["iteration"]) == list(range(1, ITERATIONS + 1))
    assert result.state.iterations_done == ITERATIONS
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    after = trace[trace["version_written"] > event["version"]]
    assert len(after) > 0 and not after["workers"].str.contains(victim, regex=False).any()
    assert np.isfinite(trace["loss"]).all()
    return result, event


@pytest.mark.parametrize(
    ("role", "how"),
    [
        # `Segment.hand_off` is one path whichever role leaves (it stops every server and re-plans);
        # the trigger only changes how ElasticPlugin reads the retirement's workers. In the default
        # run: adapt here, client.retire_workers (addresses) in
        # test_a_worker_retired_between_two_runs_leaves_when_the_next_run_starts_without_it
        pytest.param("shard server", "client.retire_workers", marks=pytest.mark.slow),
        pytest.param("group lead", "cluster.scale", marks=pytest.mark.slow),
        ("servers", "adapt"),
    ],
)
def test_a_worker_retired_gracefully_hands_over_and_leaves(role, how, digits):
    _leave(role, how, digits)


@pytest.mark.slow  # covers behaviour the elastic driver already had
def test_a_streamed_fit_keeps_its_readers_position_when_a_group_lead_leaves(digits):
    """data='stream': the new segment's readers go on from the batch after the last one trained,
    not from the run's first batch; no batch is trained twice."""
    result, event = _leave("group lead", "client.retire_workers", digits, data="stream")
    trace = result.trace
    before = trace[trace["version_written"] <= event["version"]]
    after = trace[trace["version_written"] > event["version"]]
    assert trace["batch"].is_unique
    assert after["batch"].min() > before["batch"].max()
    # at most the batches in flight when the FC server stopped are skipped (one per group)
    assert after["batch"].min() - before["batch"].max() <= CFG.n_groups
    assert result.state.batches_done == trace["batch"].max() + 1


@pytest.mark.slow  # covers behaviour the elastic driver already had
def test_a_worker_with_the_fc_resource_that_joins_takes_the_fc_server():
    """A worker started with resources {"FC": 1} joins a running fit: the FC server moves to it with
    its state bit for bit (Omnivore's dedicated FC machine) and it computes no conv shard."""
    import copy

    X, y = load("digits", size=28, batch_size=64)
    with local_client(n_workers=2) as client:
        cluster = client.cluster
        engine = DaskEngine(client, timeout=30, poll=0.2)
        fc = {}

        def add_fc_worker() -> None:
            _until(lambda: engine.placement_ is not None and _updates(client) >= JOIN_AT, "training")
            before = set(cluster_workers(client))
            spec = copy.deepcopy(cluster.new_spec)
            spec["options"]["resources"] = {"FC": 1}
            cluster.worker_spec["fc-machine"] = spec
            cluster.scale(len(cluster.worker_spec))  # starts the spec'd worker
            _until(lambda: set(cluster_workers(client)) - before, "the FC worker's start")
            (fc["worker"],) = set(cluster_workers(client)) - before

        thread = threading.Thread(target=add_fc_worker, daemon=True)
        thread.start()
        config, budget = CFG.with_(n_groups=1), Budget(iterations=JOIN_ITERATIONS)
        result = engine.run(zoo.lenet(seed=0), X, y, config, budget)
        thread.join(timeout=60)
    trace, worker = result.trace, fc["worker"]
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [worker] and event["fc_state"][0] == event["fc_state"][1] != ""
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert f"'{worker}': ['FC server']" in event["placement"]
    assert not trace["workers"].str.contains(worker, regex=False).any()  # no conv work there
    assert sorted(trace["version_written"]) == list(range(1, JOIN_ITERATIONS + 1))
    assert trace.attrs["n_workers"] == 2 and event["n_workers"] == 2  # the FC machine is no conv worker


@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "how"),
    [
        ("servers", "client.retire_workers"),
        ("group lead", "client.retire_workers"),
        ("shard server", "cluster.scale"),
        ("servers", "cluster.scale"),
        ("shard server", "adapt"),
        ("group lead", "adapt"),
    ],
)
def test_every_role_leaves_gracefully_by_every_trigger(role, how, digits):
    _leave(role, how, digits)


JOIN_AT = 5  # conv updates before the second worker is started
JOIN_ITERATIONS = 150
JOIN_LOOKS = 3  # the driver's looks at the cluster from a usable worker's join to its use
TARGET = 0.9  # training accuracy on all 1,797 digits


class DriverLooks(SchedulerPlugin):
    """Counts, on the scheduler, the driver's looks at the cluster once the first worker to join
    is usable (running): its calls of ElasticPlugin's `dasknn_elastic_leaving` handler (one at
    every poll, `elastic.cluster_change`; one at every planning on the usable workers), until
    `dasknn_elastic_use` names that worker (`used_after`: the looks by then). Nothing of dask or
    of dasknn is replaced: the handlers run as always."""

    name = "dasknn-test-driver-looks"

    def __init__(self) -> None:
        self.joined: str | None = None
        self.looks = 0
        self.used_after: int | None = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def add_worker(self, scheduler=None, worker=None) -> None:
        if self.joined is not None:
            return
        self.joined, handlers = worker, self.scheduler.handlers
        leaving, use = handlers["dasknn_elastic_leaving"], handlers["dasknn_elastic_use"]  # a run is on

        def counted_leaving(**msg):
            ws = self.scheduler.workers.get(worker)
            self.looks += ws is not None and ws.status.name in elastic.USABLE_STATUS
            return leaving(**msg)

        def noted_use(**msg):
            if self.used_after is None and worker in msg.get("workers", ()):
                self.used_after = self.looks
            return use(**msg)

        handlers["dasknn_elastic_leaving"], handlers["dasknn_elastic_use"] = counted_leaving, noted_use


def _driver_looks(dask_scheduler) -> tuple[str | None, int | None]:
    """DriverLooks' joined worker and the looks before its use (run on the scheduler)."""
    plugin = dask_scheduler.plugins[DriverLooks.name]
    return plugin.joined, plugin.used_after


class Joiner(threading.Thread):
    """Once the run has written JOIN_AT updates, scales the cluster up by one worker and records
    its address once the scheduler has it."""

    def __init__(self, client, engine) -> None:
        super().__init__(daemon=True)
        self.client, self.engine = client, engine
        self.worker = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if self.engine.placement_ is not None and _updates(self.client) >= JOIN_AT:
                    break
                time.sleep(0.05)
            before = set(cluster_workers(self.client))
            self.client.cluster.scale(len(before) + 1)
            while time.monotonic() < deadline:
                new = set(cluster_workers(self.client)) - before
                if new:
                    (self.worker,) = new
                    return
                time.sleep(0.05)
        except BaseException as err:  # reported by the test
            self.error = err


def test_a_worker_that_joins_a_running_fit_is_used_from_the_drivers_next_poll(digits):
    _join(digits, "persist")


@pytest.mark.slow
def test_a_worker_that_joins_a_streamed_fit_is_used(digits):
    _join(digits, "stream")


def _join(digits, data: str) -> None:
    """The worker that joins trains from the first update after the hand-off, which the driver
    begins at its first poll once the worker is usable (within JOIN_LOOKS looks at the cluster,
    `DriverLooks`), however long the worker took to start and the machine takes per update."""
    X, y = digits
    config = CFG.with_(n_groups=1)  # pinned: the new worker joins the group as a shard
    with local_client(n_workers=1) as client:
        client.register_plugin(DriverLooks())
        engine = DaskEngine(client, timeout=30, poll=0.2, data=data)
        joiner = Joiner(client, engine)
        joiner.start()
        net = zoo.lenet(seed=0)
        result = engine.run(net, X, y, config, Budget(iterations=JOIN_ITERATIONS))
        joiner.join(timeout=60)
        looks_seen = client.run_on_scheduler(_driver_looks)
    assert joiner.error is None, joiner.error
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [joiner.worker] and event["left"] == []
    assert event["n_groups_before"] == event["n_groups_after"] == 1
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    on_new = trace[trace["workers"].str.contains(joiner.worker, regex=False)]
    assert len(on_new) > 0 and on_new["version_written"].min() == event["version"] + 1
    joined, looks = looks_seen
    assert joined == joiner.worker and looks is not None and looks <= JOIN_LOOKS, f"used after {looks} looks"
    assert (on_new["workers"].str.count(",") == 1).all()  # one group of two workers
    assert sorted(trace["version_written"]) == list(range(1, JOIN_ITERATIONS + 1))
    assert trace.attrs["recoveries"] == []
    assert training_accuracy(net, X, y) >= TARGET


@pytest.mark.slow
def test_a_dask_worker_process_started_mid_fit_is_used(tmp_path):
    """`dask scheduler` and two `dask worker` processes as a user starts them; a third `dask worker`
    started once the run has written JOIN_AT updates trains in the same run."""
    from distributed import Client

    from tests.engine.dask.test_deploy import REPO, STARTUP_TIMEOUT, dask_command, read_scheduler_file, stop

    X, y = load("digits", size=28, batch_size=64)
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    scheduler_file = tmp_path / "s.json"
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> None:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [*dask_command(), *args], cwd=tmp_path, env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip

    def worker(i: int) -> None:
        start(
            f"worker{i}",
            ["worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--no-dashboard"]
            + ["--host", "127.0.0.1", "--death-timeout", "30", "--local-directory", str(tmp_path / f"w{i}")],
        )

    try:
        start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file",
                            str(scheduler_file), "--no-dashboard"])  # fmt: skip
        read_scheduler_file(scheduler_file, STARTUP_TIMEOUT)
        worker(0)
        worker(1)
        with Client(scheduler_file=str(scheduler_file), timeout=STARTUP_TIMEOUT) as client:
            client.wait_for_workers(2, timeout=STARTUP_TIMEOUT)
            engine = DaskEngine(client, timeout=30, poll=0.2)
            before = set(cluster_workers(client))

            def third() -> None:
                while engine.placement_ is None or _updates(client) < JOIN_AT:
                    time.sleep(0.05)
                worker(2)

            starter = threading.Thread(target=third, daemon=True)
            starter.start()
            result = engine.run(
                zoo.lenet(seed=0), X, y, CFG.with_(n_groups=1), Budget(iterations=JOIN_ITERATIONS)
            )
            starter.join(timeout=30)
            (new,) = set(cluster_workers(client)) - before
    finally:
        stop(procs)
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [new] and event["conv_state"][0] == event["conv_state"][1]
    assert trace["workers"].str.contains(new, regex=False).any()
    assert sorted(trace["version_written"]) == list(range(1, JOIN_ITERATIONS + 1))


@pytest.mark.slow
def test_a_checkpoint_resumes_on_a_cluster_of_another_size(tmp_path):
    """A fit checkpointed on two workers resumes on one: the state is the model's, not the placement's."""
    from dasknn.engine import checkpoint
    from dasknn.estimator import DistributedCNN

    X, y = load("digits", size=28)
    params = {"engine": "dask", "time_budget": None, "max_epochs": 4, "n_groups": 1,
              "learning_rate": 0.01, "momentum": 0.9}  # fmt: skip
    with local_client(n_workers=2) as client:
        address = client.scheduler.address
        whole = DistributedCNN(**params, scheduler=address, checkpoint_dir=tmp_path / "a").fit(X, y)
    assert (whole.trace_["workers"].str.count(",") == 1).all()  # one group of both workers
    first = checkpoint.list_checkpoints(tmp_path / "a")[0]
    (tmp_path / "b").mkdir()
    first.rename(tmp_path / "b" / first.name)  # as if the fit had stopped after its first checkpoint
    done = checkpoint.latest(tmp_path / "b").state.iterations_done
    assert 0 < done < whole.n_iter_
    with local_client(n_workers=1) as client:
        resumed = DistributedCNN(
            **params, scheduler=client.scheduler.address, checkpoint_dir=tmp_path / "b", resume=True
        ).fit(X, y)
    after = resumed.trace_[resumed.trace_["iteration"] > done]
    assert len(after) > 0 and (after["workers"].str.count(",") == 0).all()  # one worker now
    assert resumed.n_iter_ == whole.n_iter_ and resumed.score(X, y) >= 0.9


@pytest.mark.slow
def test_the_auto_tuner_decides_g_again_after_a_worker_joins():
    """The "auto" tuner on a DaskEngine learns the new worker count from the run the join happened
    in (`trace.attrs["n_workers"]`) and decides g again at the next run boundary."""
    from dasknn.fitting import run_policy
    from dasknn.optimizer.auto import AutoPolicy
    from tests.planted import small_net

    X, y = load("digits", size=8, batch_size=32)
    policy = AutoPolicy(window=16)

    def after_the_regroup(state, trace) -> bool:  # the fit ends one run after the decision
        rows = [r for r in policy.fit.log.rows if r["action"] == "regroup"]
        return bool(rows) and int(trace["run"].max()) > rows[0]["run"]

    with local_client(n_workers=1) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2)
        joiner = Joiner(client, engine)
        joiner.start()
        result = run_policy(
            policy, engine, small_net(), X, y, batch_size=32, max_iterations=20_000,
            should_stop=after_the_regroup,
        )  # fmt: skip
        joiner.join(timeout=60)
    assert joiner.error is None, joiner.error
    d, trace = result.decisions, result.trace
    assert d.iloc[0]["action"] == "start" and d.iloc[0]["n_groups"] == 1
    (row,) = d[d["action"] == "regroup"].itertuples()
    assert row.n_workers == 2 and row.chosen and "1 -> 2 workers" in row.reason
    # the join itself is a "cluster" row (inside a run, or at the start of the next one)
    (join,) = d[(d["phase"] == "cluster") & (d["action"] == "join")].itertuples()
    assert join.workers == joiner.worker and join.n_workers == 2 and join.run == row.run
    # decided at the end of the first run that ended with two workers: no later than the first
    # run that trained on the new one; every run after it has the new g and uses the new worker
    on_new = trace["workers"].str.contains(joiner.worker, regex=False)
    assert row.run <= int(trace.loc[on_new, "run"].min())
    after = trace[trace["run"] > row.run]
    assert len(after) and set(after["group"]) == set(range(row.n_groups))
    assert all(on_new[after.index].groupby(after["run"]).any())


def _until(condition, what: str, seconds: float = 60.0) -> None:
    """Poll `condition` until it holds (a bound for a broken run, not a timing: it returns as soon
    as the cluster has done what the test waits for)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_on_an_adaptive_cluster_at_zero_workers_waits_for_one(digits):
    """cluster.adapt(minimum=0): a run that finds no worker waits with a task pending, the
    Adaptive starts a worker for it, and the run trains there instead of raising WorkerLostError."""
    X, y = digits
    with local_client(n_workers=1) as client:
        cluster = client.cluster
        cluster.scale(0)
        _until(lambda: not cluster_workers(client), "the scale-down to zero workers")
        # scales up at once for pending work; never down within the test (1,000 idle checks)
        cluster.adapt(minimum=0, maximum=1, interval="100ms", wait_count=1000)
        engine = DaskEngine(client, timeout=30, poll=0.2)
        assert engine._worker_wait(client) == 30.0
        result = engine.run(zoo.lenet(seed=0), X, y, CFG.with_(n_groups=1), Budget(iterations=20))
        cluster._adaptive.stop()
    trace = result.trace
    assert sorted(trace["version_written"]) == list(range(1, 21)) and trace.attrs["recoveries"] == []
    assert trace["workers"].nunique() == 1 and trace.attrs["n_workers"] == 1


@pytest.mark.slow
def test_when_every_worker_is_retired_the_state_waits_for_a_new_one(digits):
    """cluster.scale(0) mid-run (what an adapt(minimum=0) scale-down does): the servers' exact state
    waits in the driver, dask retires the worker, and when a worker joins the run goes on from that
    state: the versions continue, nothing is redone, no recovery."""
    X, y = digits
    with local_client(n_workers=1) as client:
        cluster = client.cluster
        engine = DaskEngine(client, timeout=30, poll=0.2, worker_wait=60)
        first = {}

        def scale_to_zero_and_back() -> None:
            _until(lambda: engine.placement_ is not None and _updates(client) >= LEAVE_AT, "training")
            (first["worker"],) = cluster_workers(client)
            cluster.scale(0)
            _until(lambda: not cluster_workers(client), "the retirement of the last worker")
            cluster.scale(1)

        thread = threading.Thread(target=scale_to_zero_and_back, daemon=True)
        thread.start()
        result = engine.run(zoo.lenet(seed=0), X, y, CFG.with_(n_groups=1), Budget(iterations=ITERATIONS))
        thread.join(timeout=60)
        (now,) = cluster_workers(client)
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["left"] == [first["worker"]] and event["joined"] == [now] != [first["worker"]]
    assert event["version"] >= LEAVE_AT and event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    assert sorted(trace["version_written"]) == list(range(1, ITERATIONS + 1))
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    after = trace[trace["version_written"] > event["version"]]
    assert len(after) and (after["workers"] == now).all()


def test_a_worker_retired_between_two_runs_leaves_when_the_next_run_starts_without_it(digits):
    """Between runs the engine keeps its servers (a shard server here) on the workers: a retirement
    then waits (dask alone would refuse a worker holding an actor) until the next run, which plans
    without the leaving worker and lets its kept shard server go; the run reports the leave."""
    X, y = digits
    with local_client(n_workers=3) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2)
        net = zoo.lenet(seed=0)
        config = CFG.with_(n_groups=1)
        first = engine.run(net, X, y, config, Budget(iterations=10))
        victim = engine.placement_.groups[0][-1]  # holds a kept ShardServer
        retired = {}

        def retire() -> None:
            retired["workers"] = client.retire_workers([victim])

        thread = threading.Thread(target=retire, daemon=True)
        thread.start()
        _until(lambda: victim in elastic.leaving(client), "the announced retirement")
        second = engine.run(net, X, y, config, Budget(iterations=10), start=first.state)
        thread.join(timeout=30)
        left = set(cluster_workers(client))
        engine.close()
    assert victim in retired.get("workers", {}) and victim not in left  # dask did not refuse it
    (event,) = second.trace.attrs["worker_events"]
    assert event["left"] == [victim] and event["time"] == 0.0 and event["n_workers"] == 2
    assert not second.trace["workers"].str.contains(victim, regex=False).any()
    assert second.trace["version_written"].tolist() == list(range(1, 11))


@pytest.mark.slow
def test_when_every_worker_is_lost_abruptly_the_run_waits_and_recovers_on_a_new_one(digits):
    """With worker_wait, an abrupt loss of the only worker is not the end: the run waits for a
    worker (the test starts one once the loss is seen) and recovers there from the last snapshot."""
    from tests.engine.dask.test_faults import Killer

    X, y = digits
    with local_client(n_workers=1) as client:
        cluster = client.cluster
        engine = DaskEngine(client, timeout=30, poll=0.2, worker_wait=60, snapshot_every=5)
        killer = Killer(client, engine, lambda p: [p.fc_worker], at=LEAVE_AT, machine=True)
        killer.start()

        def start_another() -> None:
            _until(lambda: killer.killed_at is not None and not cluster_workers(client), "the loss")
            cluster.scale(len(cluster.worker_spec) + 1)

        thread = threading.Thread(target=start_another, daemon=True)
        thread.start()
        result = engine.run(zoo.lenet(seed=0), X, y, CFG.with_(n_groups=1), Budget(iterations=40))
        thread.join(timeout=60)
        (now,) = cluster_workers(client)
    trace = result.trace
    (recovery,) = trace.attrs["recoveries"]
    assert recovery["worker"] == killer.victims[0] and recovery["from_snapshot"]
    assert recovery["n_workers"] == 1
    assert sorted(trace["version_written"]) == list(range(1, 41)) and result.state.iterations_done == 40
    assert (trace.loc[trace["recovered"], "workers"] == now).all() and trace["recovered"].any()
