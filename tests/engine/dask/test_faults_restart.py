"""The unmerged map and SMA survive a lost worker (`engine.dask.restart`): real worker processes
are killed with SIGKILL once the run has done a set number of updates (its own progress, not a
guessed delay), and the run re-plans onto the workers left, trains again from its start state and
reaches its target."""

from __future__ import annotations

import time

import pytest

from dasknn.engine.dask import DaskEngine, WorkerLostError, cluster_workers, local_client
from dasknn.engine.dask.replicas import AverageModel
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, worker_changes
from dasknn.nn import zoo
from tests.engine.dask.test_faults import Killer, _conv_versions, training_accuracy

CFG = RunConfig(n_groups=2, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)
ITERATIONS = 100
TARGET = 0.9  # training accuracy on all 1,797 digits after ITERATIONS updates


def _updates(dask_worker) -> list[int]:
    """Updates the run's servers on this worker have seen: conv model versions, SMA rounds × k."""
    actors = getattr(getattr(dask_worker, "state", None), "actors", {})
    rounds = [a.synced_rounds * a.k for a in actors.values() if isinstance(a, AverageModel)]
    return _conv_versions(dask_worker) + rounds


def _not_home(p) -> list[str]:
    """A worker that holds no server (the unmerged map's model servers, SMA's average): a learner."""
    return [w for group in p.groups for w in group if w != p.conv_server_worker][:1]


@pytest.mark.parametrize(
    "strategy, kept_groups, lr",
    [
        # one restart loop (`restart.run_restarting`) for both maps; the unmerged map's loss is named
        # in the default run by test_with_recovery_off_the_unmerged_map_raises_worker_lost_naming_the_worker
        pytest.param(Strategy(physical_map="unmerged"), 1, 0.01, id="unmerged", marks=pytest.mark.slow),
        pytest.param(Strategy(name="sma"), 2, 0.05, id="sma"),
    ],
)
def test_a_lost_worker_is_recovered_by_replanning_and_reaches_the_target(digits, strategy, kept_groups, lr):
    X, y = digits
    with local_client(n_workers=2) as client:
        engine = DaskEngine(client, timeout=20, poll=0.2, strategy=strategy)
        net = zoo.lenet(seed=0)
        # a run before: the engine knows the workers, so the lost one could also read as "left"
        first = engine.run(net, X, y, CFG.with_(lr=lr), Budget(iterations=4))
        deadline = time.monotonic() + 60  # a bound, not a timing: until its servers are let go
        while any(client.run(_updates, on_error="ignore").values()):
            assert time.monotonic() < deadline, "the first run's servers were not let go"
            time.sleep(0.05)
        killer = Killer(client, engine, _not_home, at=15, machine=True, probe=_updates)
        killer.start()
        started = time.time()
        result = engine.run(
            net, X, y, CFG.with_(lr=lr), Budget(seconds=600, iterations=ITERATIONS), start=first.state
        )
        killer.join(timeout=5)
        survivors = set(cluster_workers(client))
    (victim,) = killer.victims
    assert victim not in survivors
    (rec,) = result.trace.attrs["recoveries"]
    assert rec["worker"] == victim and rec["from_snapshot"] and rec["snapshot_version"] == 0
    assert rec["iterations_redone"] >= 0  # the updates seen before the loss, trained again
    assert rec["n_groups_before"] == 2 and rec["n_groups_after"] == kept_groups
    assert started + rec["time"] - killer.killed_at < 30  # noticed by polling, not after a timeout
    assert victim not in rec["placement"]
    trace = result.trace
    assert [c["action"] for c in worker_changes(trace)] == ["lost"]  # once, as lost
    assert trace.attrs["n_workers"] == 1
    assert len(trace) >= ITERATIONS - 1 and trace["recovered"].all()
    assert result.state.iterations_done == len(trace) + 4
    acc = training_accuracy(net, X, y)
    assert acc >= TARGET, f"training accuracy {acc:.3f} after losing a worker ({strategy.name})"


def test_with_recovery_off_the_unmerged_map_raises_worker_lost_naming_the_worker(digits):
    X, y = digits
    with local_client(n_workers=2) as client:
        unmerged = Strategy(physical_map="unmerged")
        engine = DaskEngine(client, timeout=20, poll=0.2, strategy=unmerged, max_recoveries=0)
        killer = Killer(client, engine, lambda p: [p.conv_server_worker], at=10, machine=True)
        killer.start()
        with pytest.raises(WorkerLostError, match="recovery is off") as err:
            engine.run(zoo.lenet(seed=0), X, y, CFG, Budget(seconds=600))
        killer.join(timeout=5)
    assert killer.victims[0] in str(err.value) and "conv model server" in str(err.value)
    assert "Worker holding Actor" not in str(err.value).split(";")[0]
