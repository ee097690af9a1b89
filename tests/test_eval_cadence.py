"""Held-out evaluations at a bounded cost (docs/architecture.md "Evaluations at a bounded cost"): a
run that asks for it (`NextRun.eval_share`, `FixedKnobs(eval_share=)`) is evaluated only while
the evaluations' measured cost stays within that share of the fit's clock; on the simulated clock
that cost is the modelled forward passes over the scored samples, charged beside the groups. Two
small simulated fits (≈ 3 s)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import RunConfig, TrainState
from dasknn.fitting import Evaluator, Loop
from dasknn.optimizer.fixed import FixedKnobs
from dasknn.policy import EVAL_SHARE
from tests.engine.simulated.test_engine import tiny_net


def bounded(config, time_budget, max_iterations):
    """Fixed knobs whose runs bound the evaluations' share of the clock, evaluated at their ends
    (not while they train: tests/test_in_run.py)."""
    return FixedKnobs(config, time_budget, max_iterations, eval_share=EVAL_SHARE, in_run=False)


def fit(policy_class):
    """Runs of 0.5 simulated s (≈ 20 iterations) for 6 s; each evaluation scores 120 samples:
    ≈ 5 iterations' forward passes, a planted slow evaluation (a quarter of a run)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((420, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64) + (X[:, 0, 3, 3] > 0)
    net = tiny_net()
    engine = SimulatedEngine(t_conv=0.02, t_fc=0.005, verbose=0)
    loop = Loop(engine, net, X[:300], y[:300], batch_size=8, time_budget=6.0,
                evaluate=Evaluator(net, X[300:], y[300:]), n_classes=3)  # fmt: skip
    policy = policy_class(RunConfig(n_groups=1, lr=0.05, momentum=0.9, batch_size=8), 6.0, None)
    policy.run_seconds = 0.5
    result = loop.run(policy, TrainState.from_net(net))
    return loop, result


@pytest.fixture(scope="module")
def fits():
    return fit(FixedKnobs), fit(bounded)


def test_a_planted_slow_evaluation_keeps_the_evaluations_share_within_five_percent(fits):
    (every, every_result), (bounded, bounded_result) = fits
    share = sum(every.cadence.seconds) / every.log.elapsed
    assert share > 4 * EVAL_SHARE  # the planted evaluation is slow: every run evaluated costs far more
    assert sum(bounded.cadence.seconds) / bounded.log.elapsed <= EVAL_SHARE
    assert len(bounded.cadence.seconds) >= 2  # still evaluated along the way, not only at the end
    # the clock charges the training alone: both fits train the same iterations in the same time
    assert bounded.log.elapsed == every.log.elapsed
    assert bounded_result.state.iterations_done == every_result.state.iterations_done
    np.testing.assert_array_equal(
        bounded_result.trace["loss"].to_numpy(), every_result.trace["loss"].to_numpy()
    )


def test_the_rows_cover_every_iteration_and_the_model_returned_is_the_one_scored(fits):
    _, (bounded, result) = fits
    history, trace = result.history, result.trace
    assert history[-1]["iteration"] == result.state.iterations_done  # the end state was scored
    rows = [h for h in history if h["phase"] == "train"]
    kept = trace[trace["kept"]]
    assert len(rows) < kept["run"].nunique()  # some runs had no evaluation of their own
    # a row's training figures are the means over every iteration since the previous row
    done = 0
    for h in rows:
        interval = kept[(kept["iteration"] > done) & (kept["iteration"] <= h["iteration"])]
        assert h["loss"] == pytest.approx(interval["loss"].mean(), rel=1e-12)
        done = h["iteration"]


@pytest.mark.slow
def test_on_dask_a_score_beside_the_next_run_is_stamped_at_its_snapshot_and_its_model_returned():
    """A LocalCluster of one worker (≈ 30 s): each evaluation scores the state a kept run left in a
    thread while the next run trains; its row carries the fit's clock at that state, and when it
    reaches the target the fit returns that state, not the one trained since."""
    from dasknn.engine.dask import DaskEngine, local_client

    rng = np.random.default_rng(0)
    X = rng.standard_normal((420, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64) + (X[:, 0, 3, 3] > 0)
    net = tiny_net()
    with local_client(n_workers=1) as client:
        engine = DaskEngine(client)
        loop = Loop(engine, net, X[:300], y[:300], batch_size=8, max_iterations=120, target_accuracy=0.5,
                    evaluate=Evaluator(net, X[300:], y[300:]), n_classes=3)  # fmt: skip
        policy = bounded(RunConfig(n_groups=1, lr=0.05, momentum=0.9, batch_size=8), None, 120)
        policy.run_seconds = 0.3
        result = loop.run(policy, TrainState.from_net(net))
        engine.close()
    trace, rows = result.trace, [h for h in result.history if h["phase"] == "train"]
    assert rows and result.stopped_by.startswith("target_accuracy")
    ends = trace.groupby("run")["t_end"].max()
    its = trace.groupby("run")["iteration"].max()
    for h in rows:  # each row is stamped with the end of the run whose state it scored
        if h["iteration"] == 0:  # a first run shorter than the start-up: no iteration, no end
            continue
        run = its[its == h["iteration"]].index[0]
        assert h["time"] == pytest.approx(ends[run])
    assert result.state.iterations_done == rows[-1]["iteration"] < trace["iteration"].max()
    np.testing.assert_array_equal(net.params["conv1.weight"], result.state.params["conv1.weight"])
