"""The messages one group's iteration sends, counted (never timed) on a real LocalCluster: every
request a worker answers (`engine.dask.messages`), over two runs of different lengths, so that a
run's own setup cancels out. If an iteration starts sending more, these fail."""

from __future__ import annotations

from collections import Counter

import pytest

from dasknn.engine.dask import DaskEngine
from dasknn.engine.dask.messages import TIME_DRIVEN, count_requests, request_counts
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

SHORT, LONG = 4, 8


def _counted(client) -> Counter:
    total: Counter = Counter()
    for counts in client.run(request_counts).values():
        total.update(counts)
    return total


def per_iteration(client, X, y, g: int) -> dict[str, float]:
    """Requests per iteration (all workers, time-driven ones left out) of runs at g groups."""
    client.run(count_requests)
    engine = DaskEngine(client)
    config = RunConfig(n_groups=g, lr=0.01, momentum=0.9, batch_size=64)
    engine.run(zoo.lenet(seed=0), X, y, config, Budget(iterations=2))  # servers and nets made
    runs = []
    for n in (SHORT, LONG):
        before = _counted(client)
        engine.run(zoo.lenet(seed=0), X, y, config, Budget(iterations=n))
        runs.append(_counted(client) - before)
    extra = runs[1]
    extra.subtract(runs[0])
    # a run's lead gathers the data's one chunk (X and y) from either worker that holds it: at
    # most 2 requests a run, never one an iteration
    assert abs(extra.pop("get_data", 0)) <= 2
    return {k: v / (LONG - SHORT) for k, v in extra.items() if v and k not in TIME_DRIVEN}


@pytest.fixture(scope="module")
def one_chunk(client2, digits):
    """The digits in ONE chunk, on both workers: a lead reads it once per run, whatever the run's
    length."""
    from distributed import futures_of, wait

    X, y = client2.persist([digits[0].rechunk(digits[0].shape[0]), digits[1].rechunk(digits[1].shape[0])])
    wait([X, y])
    client2.replicate(futures_of(X) + futures_of(y))
    return X, y


def test_a_group_of_two_sends_only_the_remote_shards_forward_and_backward(client2, one_chunk):
    # g = 1, k = 2: the conv model and FC servers sit on the lead's worker (called in-process)
    assert per_iteration(client2, *one_chunk, g=1) == {
        "actor_execute:forward": 1.0,
        "actor_execute:backward": 1.0,
    }


def test_a_group_away_from_the_servers_calls_the_fc_server_and_the_model_server_once(client2, one_chunk):
    # g = 2: group 0 shares the servers' worker, group 1 (half the iterations) sends its FC step
    # and one push that brings the next model back (no pull of its own)
    assert per_iteration(client2, *one_chunk, g=2) == {
        "actor_execute:step": 0.5,
        "actor_execute:push_pull": 0.5,
    }
