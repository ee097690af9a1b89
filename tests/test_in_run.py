"""Evaluations while a run trains (`dasknn.in_run`, docs/architecture.md "Evaluations at a bounded
cost"): on the Dask engine, fixed knobs train in one run and the loop scores snapshots fetched from
the servers beside the running groups; the row of each is stamped with the fit's clock at its
snapshot, a score that reaches the target ends the run and is the model returned, and a run that
blows up is ended at once. One LocalCluster of one worker for the module (≈ 10 s); the cadence's
rules on a loop whose clock the test sets (< 1 s)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.engine.trace import RunConfig, TrainState
from dasknn.fitting import Evaluator, Loop
from dasknn.optimizer.fixed import FixedKnobs
from tests.engine.simulated.test_engine import tiny_net


def task():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((420, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64) + (X[:, 0, 3, 3] > 0)
    return X, y


def one_fit(client, lr: float, target: float | None, max_iterations: int = 600, time_budget=None):
    from dasknn.engine.dask import DaskEngine

    X, y = task()
    net = tiny_net()
    engine = DaskEngine(client)
    try:
        loop = Loop(engine, net, X[:300], y[:300], batch_size=8, max_iterations=max_iterations,
                    time_budget=time_budget, target_accuracy=target,
                    evaluate=Evaluator(net, X[300:], y[300:]), n_classes=3)  # fmt: skip
        config = RunConfig(n_groups=1, lr=lr, momentum=0.9, batch_size=8)
        policy = FixedKnobs(config, time_budget, max_iterations)
        result = loop.run(policy, TrainState.from_net(net))
    finally:
        engine.close()
    return loop, net, result, (X[300:], y[300:])


@pytest.fixture(scope="module")
def fits():
    from dasknn.engine.dask import local_client

    with local_client(n_workers=1) as client:
        # the blow-up's iteration budget is far beyond what any machine trains before the next
        # poll (the run's length measures the control, not speed); 3 s of training bound the fit
        yield one_fit(client, 0.05, 0.6), one_fit(client, 100.0, None, max_iterations=5000, time_budget=3.0)


def test_the_fit_trains_in_one_run_evaluated_from_snapshots_and_returns_the_state_it_scored(fits):
    (loop, net, result, (Xv, yv)), _ = fits
    trace, rows = result.trace, [h for h in result.history if h["phase"] == "train"]
    assert result.stopped_by.startswith("target_accuracy=0.6 reached")
    # the start row, scored while the run trained, comes first, stamped at the fit's start
    assert result.history[0]["phase"] == "start" and result.history[0]["time"] == 0.0
    # no run boundary to evaluate; how many evaluations came before the target depends on the
    # machine's speed (the cadence is on the clock: cadence_at below checks its rules)
    assert trace["run"].nunique() == 1 and len(rows) >= 1
    applied = loop.log.traces[0].attrs["control"]
    fetched = [a["iteration"] for a in applied if a["command"] == "TakeSnapshot" and a.get("fetch")]
    assert [h["iteration"] for h in rows] == fetched  # each row scored one fetched snapshot
    assert applied[-1]["command"] == "End"
    # the model returned is the one scored, not the iterations trained while it was scored
    assert result.state.iterations_done == rows[-1]["iteration"] < trace["iteration"].max()
    np.testing.assert_array_equal(net.params["conv1.weight"], result.state.params["conv1.weight"])
    again = Evaluator(net, Xv, yv)(result.state)
    assert again["val_accuracy"] == rows[-1]["val_accuracy"] >= 0.6
    # stamped with the fit's clock at the snapshot: within the run, in order, before its end
    times = [h["time"] for h in rows]
    assert times == sorted(times) and 0 < times[-1] < trace["t_end"].max() + 1e-9
    # training figures: the running means over the iterations since the previous row
    done = 0
    for h in rows:
        interval = trace[(trace["iteration"] > done) & (trace["iteration"] <= h["iteration"])]
        assert h["loss"] == pytest.approx(interval["loss"].mean(), rel=1e-9)
        done = h["iteration"]


def test_the_evaluations_cost_a_bounded_share_and_stay_beside_the_groups(fits):
    (loop, _, result, _), _ = fits
    # every score was timed; none stopped the groups: the fit's clock is the run's wall alone
    assert len(loop.cadence.seconds) == len([h for h in result.history if h["phase"] == "train"])
    assert result.history[-1]["time"] <= loop.log.elapsed


def test_a_run_that_blows_up_is_ended_at_once_and_rolled_back(fits):
    _, (loop, _, result, _) = fits
    first = loop.log.traces[0]
    assert first.attrs["control"][-1]["command"] == "End"
    assert first.attrs["control"][-1]["reason"] == "diverged"
    assert len(first) < 5000  # its budget was 5,000 iterations: ended as soon as the losses blew up
    assert (first["phase"] == "rolled_back").all()
    rollbacks = result.decisions[result.decisions["action"] == "rollback"]
    assert len(rollbacks) >= 1 and math.isclose(rollbacks["lr"].iloc[0], 10.0)


def cadence_at(now: float, last: float, cost: float, accuracy: float, target: float | None = 0.9) -> bool:
    """Whether `InRunEvaluations.due()` asks for a snapshot when the fit's clock reads `now`, the last
    evaluation was at `last` and cost `cost` s, and the last 32 iterations' training accuracy is
    `accuracy` (a real loop on the simulated engine; the control's clock set, not waited for)."""
    import time

    from dasknn.engine.simulated import SimulatedEngine
    from dasknn.engine.trace import Budget
    from dasknn.in_run import InRunEvaluations
    from dasknn.policy import EVAL_SHARE, NextRun

    X, y = task()
    net = tiny_net()
    loop = Loop(SimulatedEngine(t_conv=0.02, t_fc=0.005, verbose=0), net, X[:300], y[:300], batch_size=8,
                max_iterations=10, target_accuracy=target, evaluate=Evaluator(net, X[300:], y[300:]),
                n_classes=3)  # fmt: skip
    loop.history = [{"time": last}]
    loop.cadence.seconds = loop.cadence.bounded = [cost]
    step = NextRun(RunConfig(n_groups=1, lr=0.05, batch_size=8), Budget(iterations=10), eval_share=EVAL_SHARE)
    watch = InRunEvaluations(loop, step, clock0=now, wall0=time.perf_counter(), fields={})
    watch.recent.extend([(1.0, accuracy)] * 32)
    return watch.due()


def test_the_cadence_follows_the_cost_the_clock_and_the_training_accuracy():
    # far from the target: a gap of cost / 5% (0.2 s → 4 s), or the clock grown by half
    assert not cadence_at(now=10.0, last=9.0, cost=0.2, accuracy=0.5)
    assert cadence_at(now=13.2, last=9.0, cost=0.2, accuracy=0.5)  # 4.2 s after: the share allows it
    assert cadence_at(now=3.1, last=2.0, cost=0.2, accuracy=0.5)  # +55%: never later than 1.5× the clock
    assert not cadence_at(now=2.9, last=2.0, cost=0.2, accuracy=0.5)
    # within 2 points of the target by the training batches: a gap of cost / 25% (0.8 s)
    assert cadence_at(now=9.9, last=9.0, cost=0.2, accuracy=0.89)
    assert not cadence_at(now=9.6, last=9.0, cost=0.2, accuracy=0.89)
    assert not cadence_at(now=9.9, last=9.0, cost=0.2, accuracy=0.89, target=None)  # no target: the share
    # a slow evaluation comes less often (1 s → 20 s apart by the share), but by 1.5× the clock at the latest
    assert not cadence_at(now=13.0, last=9.0, cost=1.0, accuracy=0.5)
    assert cadence_at(now=13.6, last=9.0, cost=1.0, accuracy=0.5)


def test_an_in_run_evaluation_scores_the_held_out_data_alone():
    """The "auto" tuner's own samples are scored at its runs' ends, not at the evaluations taken
    while a run trains; the cadence's share counts the evaluations taken under a share."""
    X, y = task()
    net = tiny_net()
    evaluator = Evaluator(net, X[300:], y[300:], tuner=(X[:200], y[:200]))
    state = TrainState.from_net(net)
    assert set(evaluator(state)) == {"val_loss", "val_accuracy", "tuner_loss", "tuner_accuracy"}
    held = evaluator(state, held_out=True)
    assert (
        set(held) == {"val_loss", "val_accuracy"} and held["val_accuracy"] == evaluator(state)["val_accuracy"]
    )
    assert evaluator.held_scorer.scored == 120 and evaluator.scorer.scored == 2 * 320
    plain = Evaluator(net, X[300:], y[300:])  # no tuner samples: one scorer for both
    assert plain.held_scorer is plain.scorer


def test_the_fixed_knobs_evaluations_all_count_in_the_share(fits):
    (loop, _, _, _), _ = fits
    assert loop.cadence.bounded == loop.cadence.seconds and loop.cadence.bounded


def test_auto_trains_after_its_ramp_in_runs_evaluated_while_they_train():
    """On Dask "auto"'s training runs after the ramp are watched (`auto.watched_run`): longer
    than its windows, and evaluated from snapshots beside the groups (rows inside a run)."""
    from dasknn.engine.dask import local_client
    from dasknn.estimator import DistributedCNN

    X, y = task()
    with local_client(n_workers=1) as client:
        est = DistributedCNN(net=tiny_net(), scheduler=client.scheduler.address, n_workers=1, batch_size=8,
                             time_budget=None, max_epochs=12, validation_fraction=0.2, verbose=0)  # fmt: skip
        est.fit(X, y)
    decisions = est.decisions_
    assert ((decisions["phase"] == "ramp") & (decisions["action"] == "end")).any()
    trace = est.trace_
    after = trace[(trace["phase"] == "train") & (trace["run"] > decisions["run"].max())]
    ends = set(after.groupby("run")["iteration"].max())
    assert after.groupby("run").size().max() > 32  # longer than a window
    inside = [h["iteration"] for h in est.history_ if h["phase"] == "train" and h["iteration"] not in ends]
    assert any(after["iteration"].min() <= i < after["iteration"].max() for i in inside)
