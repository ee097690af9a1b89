"""Elastic runs of the unmerged map and of the replica strategies (SMA, model averaging) on a real
LocalCluster: a worker retired gracefully mid-run hands its actors' exact state over and leaves, a
worker that joins is put to work (docs/architecture.md, "Elastic clusters").

Every wait is tied to the run's progress (the model servers' versions, the average model's
rounds, read on the workers), never to a guessed delay.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dasknn.engine.dask import DaskEngine, cluster_workers, local_client
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from tests.engine.dask.test_elastic import HoldUntilHandOff, _retire
from tests.engine.dask.test_faults_restart import _updates

CFG = RunConfig(n_groups=2, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)
ITERATIONS = 120
LEAVE_AT = 10  # updates before the retirement is asked for
JOIN_AT = 5  # updates before the new worker is started
UNMERGED = Strategy(physical_map="unmerged")

UNMERGED_ROLES = {
    # on 4 workers with 2 groups of 2 the first worker (by address) holds both model servers and
    # leads group 0, the second holds group 0's ShardServer, the third leads group 1
    "servers": lambda p: p.conv_server_worker,
    "shard server": lambda p: p.groups[0][1],
    "group lead": lambda p: p.groups[1][0],
}


def _progress(client) -> int:
    versions = client.run(_updates, on_error="ignore")
    return max((v for vs in versions.values() if isinstance(vs, list) for v in vs), default=0)


def _until(condition, what: str, seconds: float = 120.0) -> None:
    """Poll `condition` until it holds (a bound for a broken run, not a timing)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:.0f} s"
        time.sleep(0.05)


class Change(threading.Thread):
    """Once the run has made `at` updates, does `act(client, engine)` (a retirement or a join) and
    records what `act` returns and when it was done; errors are reported by the test."""

    def __init__(self, client, engine, at: int, act) -> None:
        super().__init__(daemon=True)
        self.client, self.engine, self.at, self.act = client, engine, at, act
        self.out = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            engine, client = self.engine, self.client
            _until(lambda: engine.placement_ is not None and _progress(client) >= self.at, "training")
            self.out = self.act(self.client, self.engine)
        except BaseException as err:  # reported by the test
            self.error = err


def _retirement(role_of, how: str):
    """An act that retires the worker `role_of(placement)` names, `how`; returns (victim, seconds
    from asking to its absence from the scheduler)."""

    def act(client, engine):
        victim = role_of(engine.placement_)
        asked = time.monotonic()
        _retire(how, client, victim)
        _until(lambda: victim not in cluster_workers(client), f"the retirement of {victim}", 60)
        return victim, time.monotonic() - asked

    return act


def _join(client, engine):
    """An act that scales the cluster up by one worker; returns (its address, when it joined)."""
    before = set(cluster_workers(client))
    client.cluster.scale(len(before) + 1)
    _until(lambda: set(cluster_workers(client)) - before, "the new worker's start", 60)
    (worker,) = set(cluster_workers(client)) - before
    return worker, time.time()


def _unmerged_leave(role: str, how: str, digits):
    X, y = digits
    with local_client(n_workers=4) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2, strategy=UNMERGED)
        change = Change(client, engine, LEAVE_AT, _retirement(UNMERGED_ROLES[role], how))
        change.start()
        result = engine.run(zoo.lenet(seed=0), X, y, CFG, Budget(iterations=ITERATIONS))
        change.join(timeout=90)
        if how == "adapt":
            client.cluster._adaptive.stop()
        left = set(cluster_workers(client))
    assert change.error is None, change.error
    victim, seconds = change.out
    assert seconds < 30, f"the worker took {seconds:.1f} s to leave"
    assert victim not in left and len(left) == 3
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["left"] == [victim] and event["joined"] == [] and event["version"] >= LEAVE_AT
    assert victim not in event["placement"]
    # both model servers' states moved bit for bit (weights, momentum, version)
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    # the version sequence continues, every update pushed is one row, none lost or doubled
    assert sorted(trace["version_written"]) == list(range(1, ITERATIONS + 1))
    assert sorted(trace["iteration"]) == list(range(1, ITERATIONS + 1))
    assert result.state.iterations_done == ITERATIONS and trace["batch"].is_unique
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    after = trace[trace["version_written"] > event["version"]]
    assert len(after) > 0 and not after["workers"].str.contains(victim, regex=False).any()
    assert np.isfinite(trace["loss"]).all()
    return result, event, seconds


@pytest.mark.parametrize(
    ("role", "how"),
    # the unmerged hand-off is one path whichever role leaves; the shard server's is slow
    [
        # slow: the merged map's hand-over (test_elastic) and the unmerged map's wait for a worker
        # (below) stay in the default run
        pytest.param("servers", "client.retire_workers", marks=pytest.mark.slow),
        pytest.param("shard server", "cluster.scale", marks=pytest.mark.slow),
    ],
)
def test_the_unmerged_map_hands_over_when_a_worker_is_retired_gracefully(role, how, digits):
    _unmerged_leave(role, how, digits)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "how"),
    [
        ("servers", "cluster.scale"),
        ("servers", "adapt"),
        ("group lead", "client.retire_workers"),
        ("group lead", "adapt"),
        ("shard server", "client.retire_workers"),
        ("shard server", "adapt"),
    ],
)
def test_the_unmerged_map_hands_over_for_every_role_and_trigger(role, how, digits):
    _unmerged_leave(role, how, digits)


@pytest.mark.slow
def test_a_worker_that_joins_an_unmerged_run_becomes_a_shard_of_its_group(digits):
    """n_groups=1 pinned on one worker: the worker that joins is planned as the group's second
    shard and trains within 10 s of its join, from the model servers' exact states."""
    X, y = digits
    iterations = 80
    with local_client(n_workers=1) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2, strategy=UNMERGED)
        change = Change(client, engine, JOIN_AT, _join)
        change.start()
        result = engine.run(zoo.lenet(seed=0), X, y, CFG.with_(n_groups=1), Budget(iterations=iterations))
        change.join(timeout=60)
    assert change.error is None, change.error
    worker, joined = change.out
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [worker] and event["left"] == []
    assert event["n_groups_before"] == event["n_groups_after"] == 1
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    on_new = trace[trace["workers"].str.contains(worker, regex=False)]
    assert len(on_new) > 0 and trace.attrs["started"] + on_new["t_start"].min() - joined < 10
    assert (on_new["workers"].str.count(",") == 1).all()  # one group of two workers
    assert sorted(trace["version_written"]) == list(range(1, iterations + 1))
    assert trace.attrs["recoveries"] == [] and trace.attrs["n_workers"] == 2


SMA = Strategy(name="sma")
SMA_CFG = CFG.with_(lr=0.05)
SMA_ROLES = {
    # on 3 workers with k = 2 learners the first worker (by address) holds the average model z and
    # learner 0, the second learner 1; the third is idle
    "average model": lambda p: p.conv_server_worker,
    "learner": lambda p: p.groups[1][0],
}


def _rounds_continue(trace) -> None:
    """Every learner's rounds follow on, none skipped or repeated, and the batches are 0, 1, ..."""
    for _, rows in trace.groupby("group"):
        rounds = sorted(rows["version_read"])
        assert rounds == list(range(rounds[0], rounds[0] + len(rounds)))
        assert (rows["version_written"] == rows["version_read"] + 1).all()
    assert sorted(trace["batch"]) == list(range(len(trace)))


def _sma_leave(role: str, how: str, digits, strategy: Strategy = SMA):
    X, y = digits
    with local_client(n_workers=3) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2, strategy=strategy)
        change = Change(client, engine, LEAVE_AT, _retirement(SMA_ROLES[role], how))
        change.start()
        result = engine.run(zoo.lenet(seed=0), X, y, SMA_CFG, Budget(iterations=ITERATIONS))
        change.join(timeout=90)
        if how == "adapt":
            client.cluster._adaptive.stop()
        left = set(cluster_workers(client))
    assert change.error is None, change.error
    victim, seconds = change.out
    assert seconds < 30, f"the worker took {seconds:.1f} s to leave"
    assert victim not in left and len(left) == 2
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["left"] == [victim] and event["joined"] == [] and event["n_groups_after"] == 2
    assert victim not in event["placement"] and event["version"] >= LEAVE_AT // 2
    # z (with z_prev and the rounds) and each learner's replica moved bit for bit
    states = event["states"]
    assert set(states) == {"average model", "learner 0", "learner 1"}
    assert all(read == moved != "" for read, moved in states.values())
    assert len(trace) == ITERATIONS and result.state.iterations_done == ITERATIONS
    _rounds_continue(trace)
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    after = trace[trace["version_read"] >= event["version"]]
    assert len(after) > 0 and not (after["workers"] == victim).any()
    assert np.isfinite(trace["loss"]).all()
    return result, event, seconds


@pytest.mark.parametrize(
    ("role", "how"),
    # SMA's hand-off (the average model stops, every learner hands its replica in) is one path
    # whichever role leaves; the learner's is slow
    [
        # slow: SMA's wait for a worker when every worker is retired (below) stays in the default run
        pytest.param("average model", "client.retire_workers", marks=pytest.mark.slow),
        pytest.param("learner", "cluster.scale", marks=pytest.mark.slow),
    ],
)
def test_sma_hands_its_average_model_and_learners_over_when_a_worker_is_retired(role, how, digits):
    _sma_leave(role, how, digits)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "how"),
    [
        ("average model", "cluster.scale"),
        ("average model", "adapt"),
        ("learner", "client.retire_workers"),
        ("learner", "adapt"),
    ],
)
def test_sma_hands_over_for_every_role_and_trigger(role, how, digits):
    _sma_leave(role, how, digits)


@pytest.mark.slow
def test_model_averaging_hands_over_when_the_average_models_worker_is_retired(digits):
    _sma_leave("average model", "client.retire_workers", digits, Strategy(name="model_averaging", tau=2))


@pytest.mark.slow
def test_a_worker_that_joins_an_sma_run_takes_a_learner_and_k_stays(digits):
    """k = 2 learners on one worker: the worker that joins takes learner 1 with its replica, moved
    bit for bit, and trains within 10 s of its join; k stays 2 (Crossbow's statistical knob, α = 1/2)
    in that run and in the next one, which spreads the learners over both workers from its start."""
    from dasknn.engine.dask.replica_run import learners_placement, replan_learners

    def where(workers: str, learners: str, now: str) -> str:
        """The learners' workers after `workers` (one letter each) become `now`."""
        before = learners_placement(dict.fromkeys(workers, {}), list(learners), learners[0])
        return "".join(g[0] for g in replan_learners(dict.fromkeys(now, {}), before).groups)

    assert where("a", "aaaa", "abcd") == "adcb"  # three joins: each takes one learner
    assert where("ab", "ababa", "abc") == "ababc"  # the worker holding the most gives one
    assert where("ab", "ab", "abc") == "ab"  # at most one each: the new worker waits
    assert where("abc", "ab", "bc") == "cb"  # a leaving worker's learner goes to the idle one
    X, y = digits
    iterations = 80
    with local_client(n_workers=1) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2, strategy=SMA)
        change = Change(client, engine, JOIN_AT, _join)
        change.start()
        net = zoo.lenet(seed=0)
        result = engine.run(net, X, y, SMA_CFG, Budget(iterations=iterations))
        change.join(timeout=60)
        nxt = engine.run(net, X, y, SMA_CFG, Budget(iterations=20), start=result.state)
    assert change.error is None, change.error
    worker, joined = change.out
    trace = result.trace
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [worker] and event["left"] == []
    assert event["n_groups_before"] == event["n_groups_after"] == 2
    assert set(event["states"]) == {"average model", "learner 0", "learner 1"}
    assert all(read == moved != "" for read, moved in event["states"].values())
    moved = trace[(trace["group"] == 1) & (trace["version_read"] >= event["version"])]
    assert len(moved) > 0 and (moved["workers"] == worker).all()
    assert (trace.loc[trace["group"] == 0, "workers"] != worker).all()  # learner 0 stays
    assert trace.attrs["started"] + moved["t_start"].min() - joined < 10
    assert len(trace) == iterations and set(trace["group"]) == {0, 1}  # k = 2 throughout
    _rounds_continue(trace)
    assert trace.attrs["recoveries"] == [] and trace.attrs["n_workers"] == 2
    # the next run: the caller's k, one learner on each worker, no change to report
    later = nxt.trace
    assert later.attrs["worker_events"] == [] and later.attrs["n_workers"] == 2
    assert later.attrs["n_groups"] == 2 and later.attrs["alpha"] == trace.attrs["alpha"] == 0.5
    assert later.groupby("group")["workers"].nunique().eq(1).all() and later["workers"].nunique() == 2


@pytest.mark.slow
def test_the_unmerged_map_and_sma_report_workers_that_changed_between_runs(digits):
    """A worker that joins and one that is retired while no run is going on: the next run of the
    unmerged map and of SMA reports both at its start (`elastic.between_runs`), as the merged map
    does, and counts `n_workers` on the workers it knew of; the loop reads them as a join and a leave."""
    from dasknn.engine.trace import worker_changes

    X, y = digits
    net = zoo.lenet(seed=0)
    with local_client(n_workers=2) as client:
        engines = {
            "unmerged": (DaskEngine(client, timeout=30, poll=0.2, strategy=UNMERGED), CFG.with_(n_groups=1)),
            "sma": (DaskEngine(client, timeout=30, poll=0.2, strategy=SMA), SMA_CFG),
        }
        firsts = {k: e.run(net, X, y, c, Budget(iterations=8)) for k, (e, c) in engines.items()}
        before = set(cluster_workers(client))
        client.cluster.scale(3)
        _until(lambda: len(cluster_workers(client)) == 3, "the new worker's start", 60)
        (joined,) = set(cluster_workers(client)) - before
        left = sorted(before)[0]
        _retire("client.retire_workers", client, left)
        again = {k: e.run(net, X, y, c, Budget(iterations=8), start=firsts[k].state) for k, (e, c) in
                 engines.items()}  # fmt: skip
    for name, first in firsts.items():
        assert first.trace.attrs["worker_events"] == [] and first.trace.attrs["n_workers"] == 2, name
        trace = again[name].trace
        (event,) = trace.attrs["worker_events"]
        assert event["time"] == 0.0 and event["joined"] == [joined] and event["left"] == [left], name
        assert event["n_workers"] == 2 and trace.attrs["n_workers"] == 2, name
        assert left not in event["placement"], name
        assert not trace["workers"].str.contains(left, regex=False).any(), name
        changes = [(c["action"], c["workers"], c["n_workers"]) for c in worker_changes(trace)]
        assert changes == [("join", joined, 2), ("leave", left, 2)], name


def _scale_to_zero_and_back(client, engine) -> str:
    """An act that retires every worker (`cluster.scale(0)`, as an adapt(minimum=0) scale-down does),
    then starts one; returns the worker that left."""
    cluster = client.cluster
    (worker,) = cluster_workers(client)
    cluster.scale(0)
    _until(lambda: not cluster_workers(client), "the retirement of the last worker", 60)
    cluster.scale(1)
    return worker


@pytest.mark.parametrize(
    "name",
    ["sma", pytest.param("unmerged", marks=pytest.mark.slow)],  # the same path (`await_return`)
)
def test_the_unmerged_map_and_sma_wait_for_a_worker_when_every_worker_is_retired(name, digits):
    """worker_wait and cluster.scale(0) mid-run, then a new worker: the unmerged map's model servers'
    and SMA's average model's and replicas' exact states wait in the driver while dask retires the
    worker, and the run goes on from them on the new one (the merged map's path): the versions or
    rounds continue, nothing is redone, no recovery. The run's updates past LEAVE_AT wait on the
    retired worker until the driver has stopped its servers there (`HoldUntilHandOff`), so the run
    cannot end before the retirement is seen."""
    X, y = digits
    iterations = 40
    strategy, config = {"unmerged": (UNMERGED, CFG.with_(n_groups=1)), "sma": (SMA, SMA_CFG)}[name]
    with local_client(n_workers=1) as client:
        (first,) = cluster_workers(client)
        client.register_plugin(HoldUntilHandOff(first, at=LEAVE_AT, seconds=100))
        engine = DaskEngine(client, timeout=120, poll=0.2, strategy=strategy, worker_wait=60)
        change = Change(client, engine, LEAVE_AT, _scale_to_zero_and_back)
        change.start()
        result = engine.run(zoo.lenet(seed=0), X, y, config, Budget(iterations=iterations))
        change.join(timeout=60)
        (now,) = cluster_workers(client)
    assert change.error is None, change.error
    trace, left = result.trace, change.out
    (event,) = trace.attrs["worker_events"]
    assert event["left"] == [left] and event["joined"] == [now] != [left]
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    assert np.isfinite(trace["loss"]).all()
    if name == "unmerged":
        assert event["version"] >= LEAVE_AT and event["conv_state"][0] == event["conv_state"][1] != ""
        assert event["fc_state"][0] == event["fc_state"][1] != ""
        assert sorted(trace["version_written"]) == list(range(1, iterations + 1))
        assert (trace.loc[trace["version_written"] > event["version"], "workers"] == now).all()
    else:
        assert set(event["states"]) == {"average model", "learner 0", "learner 1"}
        assert all(read == moved != "" for read, moved in event["states"].values())
        assert len(trace) == iterations and event["n_groups_after"] == 2
        _rounds_continue(trace)
        after = trace[trace["version_read"] >= event["version"]]
        assert len(after) and (after["workers"] == now).all()
