"""SimulatedEngine on an elastic cluster: a schedule of worker counts over simulated time re-plans
the groups at each change, deterministically (docs/architecture.md, "Elastic clusters")."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig
from tests.engine.simulated.test_engine import tiny_net

T_FC = 0.01


def t_conv(k: int) -> float:
    """Conv time of a group of k workers: the work splits over its k workers."""
    return 0.8 / k


def test_eight_then_thirty_two_workers_regroup_at_ten_seconds(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=t_conv, t_fc=T_FC, verbose=0, worker_schedule=((0, 8), (10, 32)))
    config = RunConfig(n_groups=8, batch_size=16)
    result = engine.run(tiny_net(), X, y, config, Budget(seconds=20))
    trace = result.trace
    before, after = trace[trace["t_start"] < 10], trace[trace["t_start"] >= 10]
    assert set(before["n_workers"]) == {8} and set(after["n_workers"]) == {32}
    (event,) = trace.attrs["worker_events"]
    assert event == {"time": 10.0, "n_workers": 32, "n_workers_before": 8, "n_groups": 8,
                     "group_size": 4, "iterations_done": len(before)}  # fmt: skip
    # deterministic times: 8 groups of 1 worker push every 0.8 s + the FC step, groups of 4 every
    # 0.2 s + the FC step; the versions go on without a gap across the change
    assert len(before) == 8 * 12 and len(after) > 3 * len(before)
    assert np.diff(after["t_end"].to_numpy()).min() >= 0 and after["t_start"].min() == 10.0
    assert trace["version_written"].tolist() == list(range(1, len(trace) + 1))
    assert trace.attrs["n_workers"] == 32 and trace.attrs["group_size"] == 4


def test_fewer_workers_than_groups_mean_fewer_groups(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=t_conv, t_fc=T_FC, verbose=0, worker_schedule=((0, 4), (5, 2)))
    result = engine.run(tiny_net(), X, y, RunConfig(n_groups=4, batch_size=16), Budget(seconds=10))
    (event,) = result.trace.attrs["worker_events"]
    assert (event["n_workers"], event["n_groups"], event["group_size"]) == (2, 2, 1)
    assert set(result.trace[result.trace["t_start"] >= 5]["group"]) == {0, 1}


def test_a_change_at_the_boundary_of_two_runs_is_an_event_of_the_second(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=t_conv, t_fc=T_FC, verbose=0, worker_schedule=((0, 2), (3, 4)))
    config = RunConfig(n_groups=2, batch_size=16)
    first = engine.run(tiny_net(), X, y, config, Budget(seconds=3))
    second = engine.run(tiny_net(), X, y, config, Budget(seconds=2), start=first.state)
    assert first.trace.attrs["worker_events"] == []
    (event,) = second.trace.attrs["worker_events"]
    assert (event["time"], event["n_workers_before"], event["n_workers"]) == (3.0, 2, 4)


def test_a_schedule_goes_on_across_runs(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=t_conv, t_fc=T_FC, verbose=0, worker_schedule=((0, 2), (3, 4)))
    config = RunConfig(n_groups=2, batch_size=16)
    first = engine.run(tiny_net(), X, y, config, Budget(seconds=2))
    second = engine.run(tiny_net(), X, y, config, Budget(seconds=4), start=first.state)
    assert set(first.trace["n_workers"]) == {2} and second.trace.attrs["worker_events"][0]["time"] == 3.0
    assert set(second.trace[second.trace["t_start"] >= 3]["n_workers"]) == {4}


@pytest.mark.parametrize(
    "schedule",
    [(), ((1, 8),), ((0, 8), (0, 4)), ((0, 0),), ((0, 8), (5, "x"))],
)
def test_a_bad_schedule_is_refused_before_any_work(schedule):
    with pytest.raises(ValueError, match="worker_schedule"):
        SimulatedEngine(t_conv=1.0, t_fc=0.1, worker_schedule=schedule)
