"""The "auto" tuner on an elastic cluster: g decided again when the number of workers changes
(`decide.regroup`, planted numbers; the simulator's worker schedule, deterministic)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.fitting import run_policy
from dasknn.optimizer.auto import AutoPolicy
from dasknn.optimizer.decide import regroup
from dasknn.tradeoff.hardware import HEModel
from tests.planted import small_net

# t_conv(k) = max(0.8 / k, 0.05 k): best at k = 4. HE(g) at N = 8: g = 1 0.405, 2 0.1025,
# 4 0.10125, 8 0.1006 (g = 2 the smallest within 10%); at N = 32: g = 4 0.10125, 8 0.0256,
# 16 0.0253, 32 0.0252 (g = 8)
TIMING = HEModel(T_cc=0.8, T_nc=0.05, t_fc=0.005, n_workers=8)


def test_regroup_takes_the_smallest_g_within_ten_percent_at_the_new_count():
    at_32 = HEModel(0.8, 0.05, 0.005, 32)
    he = {g: at_32.he(g) for g in (1, 2, 4, 8, 16, 32)}
    g, why = regroup(he, 32, 8, current=2)
    assert g == 8 and "8 -> 32 workers" in why and "2 -> 8" in why
    # the same numbers at the old count keep g
    at_8 = HEModel(0.8, 0.05, 0.005, 8)
    assert regroup({g: at_8.he(g) for g in (1, 2, 4, 8)}, 8, 4, current=2)[0] == 2


def test_regroup_keeps_a_pinned_g_and_cuts_it_only_below_one_worker_a_group():
    he = {1: 1.0, 2: 0.5, 4: 0.25}
    assert regroup(he, 4, 2, current=2, pinned=2) == (2, "2 -> 4 workers: n_groups = 2 pinned, kept (k = 2)")
    g, why = regroup(he, 1, 4, current=4, pinned=4)
    assert g == 1 and "cut to 1" in why


def test_regroup_ignores_g_above_the_workers_and_unknown_times():
    assert regroup({1: 2.0, 2: 1.0, 4: 0.1}, 2, 1, current=1)[0] == 2  # g = 4 needs 4 workers
    assert regroup({1: float("nan")}, 3, 1, current=2) == (2, "1 -> 3 workers: no HE(g) known, g = 2")


@pytest.fixture(scope="module")
def digits8():
    from dasknn.data import load

    X, y = load("digits", size=8, batch_size=32)
    return np.asarray(X), np.asarray(y)


def _elastic_fit(digits8, **settings):
    X, y = digits8
    engine = SimulatedEngine(TIMING, verbose=0, worker_schedule=((0, 8), (10, 32)))
    policy = AutoPolicy(window=16).for_fit(**settings)
    return run_policy(policy, engine, small_net(), X, y, batch_size=32, time_budget=14.0)


def test_auto_regroups_within_one_run_of_eight_workers_becoming_thirty_two(digits8):
    result = _elastic_fit(digits8)
    d, trace = result.decisions, result.trace
    assert d.iloc[0]["action"] == "start" and d.iloc[0]["n_groups"] == 2  # HE's g at 8 workers
    (row,) = d[d["action"] == "regroup"].itertuples()
    # the run that crossed t = 10 s is the first with 32 workers; the decision follows it
    changed = int(trace.loc[trace["n_workers"] == 32, "run"].min())
    assert row.run == changed and row.n_workers == 32 and row.n_groups == 8 and row.chosen
    assert "8 -> 32 workers" in row.reason and "2 -> 8" in row.reason
    before = trace[trace["run"] <= changed]
    after = trace[trace["run"] > changed]
    assert set(before["group"]) == {0, 1} and len(after) and set(after["group"]) == set(range(8))
    assert result.config.n_groups == 8  # config_ follows the last chosen decision


def test_a_pinned_n_groups_stays_pinned_when_the_cluster_grows(digits8):
    result = _elastic_fit(digits8, n_groups=2)
    d, trace = result.decisions, result.trace
    (row,) = d[d["action"] == "regroup"].itertuples()
    assert row.n_groups == 2 and row.n_workers == 32 and "pinned, kept (k = 16)" in row.reason
    assert set(trace["group"]) == {0, 1} and result.config.n_groups == 2
