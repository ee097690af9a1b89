"""The history's training figures come from the iterations themselves (the trace's batch loss and
accuracy, their running mean since the last evaluation); an evaluation scores held-out data only
(docs/architecture.md, "Every accuracy says what it is measured on")."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import RunConfig, TrainState
from dasknn.fitting import Evaluator, Loop, training_scores
from dasknn.optimizer.fixed import FixedKnobs
from dasknn.tradeoff.hardware import HEModel
from tests.planted import small_net


def _intervals(history: list[dict], trace: pd.DataFrame) -> list[pd.DataFrame]:
    """The trace rows each training row of `history` covers: the kept run that ended at its iteration."""
    kept = trace[trace["kept"] & (trace["phase"] != "rolled_back")]
    runs = [rows for _, rows in kept.groupby("run", sort=True)]
    rows = [h for h in history if h["phase"] == "train"]
    assert len(runs) == len(rows)
    done = 0
    for h, run in zip(rows, runs, strict=True):
        done += len(run)
        assert h["iteration"] == done  # each row sits at the end of its run
    return runs


@pytest.fixture(scope="module")
def fitted():
    """A fixed-knob fit of a small conv net on 8×8 digits on the simulator, runs of half an epoch,
    with 150 held-out samples scored at each evaluation; its scorer counts what it scores."""
    X, y = (np.asarray(a) for a in load("digits", size=8, batch_size=32))
    X_train, y_train, X_val, y_val = X[:1500], y[:1500], X[1500:1650], y[1500:1650]
    net = small_net()
    evaluator = Evaluator(net, X_val, y_val)
    engine = SimulatedEngine(HEModel(T_cc=0.8, T_nc=0.05, t_fc=0.005, n_workers=4), verbose=0)
    loop = Loop(engine, net, X_train, y_train, batch_size=32, time_budget=2.0, evaluate=evaluator,
                n_classes=10)  # fmt: skip
    policy = FixedKnobs(RunConfig(n_groups=2, lr=0.05, momentum=0.9, batch_size=32), 2.0, None)
    policy.run_seconds = 0.5
    result = loop.run(policy, TrainState.from_net(net))
    return result, evaluator, len(y_val)


def test_the_training_figures_are_the_running_means_of_the_iterations_since_the_last_evaluation(fitted):
    result, _, _ = fitted
    history, trace = result.history, result.trace
    assert history[0]["phase"] == "start"
    assert math.isnan(history[0]["loss"]) and math.isnan(history[0]["accuracy"])  # no iteration yet
    runs = _intervals(history, trace)
    assert len(runs) >= 3
    rows = [h for h in history if h["phase"] == "train"]
    for h, run in zip(rows, runs, strict=True):
        assert (run["n_images"] == 32).all()  # equal batches: the weighted mean is the plain one
        assert h["accuracy"] == pytest.approx(run["accuracy"].mean(), rel=1e-12)
        assert h["loss"] == pytest.approx(run["loss"].mean(), rel=1e-12)
    assert rows[-1]["accuracy"] > rows[0]["accuracy"]  # it trains: the figures follow it


def test_an_evaluation_scores_the_held_out_samples_and_no_training_sample(fitted):
    """Every history row scored the 150 held-out samples once, and nothing else was scored."""
    result, evaluator, n_val = fitted
    assert evaluator.scorer.scored == n_val * len(result.history)
    assert all(set(h) >= {"loss", "accuracy", "val_loss", "val_accuracy"} for h in result.history)
    assert all(round(h["val_accuracy"] * n_val, 9).is_integer() for h in result.history)


def test_training_scores_weight_the_batches_by_their_images():
    interval = pd.DataFrame({"loss": [1.0, 3.0], "accuracy": [0.5, 1.0], "n_images": [30, 10]})
    assert training_scores(interval) == {"loss": 1.5, "accuracy": 0.625}
    empty = training_scores(interval.iloc[:0])
    assert math.isnan(empty["loss"]) and math.isnan(empty["accuracy"])


def test_a_training_accuracy_target_is_checked_on_training_samples_before_the_fit_stops():
    """Without held-out data the target is judged on the batches' running mean; the fit stops only
    when the state also holds it on the Evaluator's training samples (the running mean averages
    weights that moved while it was taken). Planted running means, a real net and scorer."""
    X, y = (np.asarray(a) for a in load("digits", size=8, batch_size=32))
    net = small_net()
    untrained = TrainState.from_net(net)  # about one in ten right on any samples
    evaluator = Evaluator(net, confirm=(X[:200], y[:200]))
    assert evaluator.confirms and evaluator.scorer is None  # nothing scored at each evaluation
    engine = SimulatedEngine(HEModel(T_cc=0.8, T_nc=0.05, t_fc=0.005, n_workers=4), verbose=0)
    loop = Loop(engine, net, X[:300], y[:300], batch_size=32, max_iterations=10, evaluate=evaluator,
                n_classes=10, target_accuracy=0.9)  # fmt: skip
    below = loop.record(untrained, 1.0, {"loss": 0.5, "accuracy": 0.8})  # mean below: no check
    assert not below and "confirmed_accuracy" not in loop.history[-1]
    assert not loop.record(untrained, 2.0, {"loss": 0.1, "accuracy": 0.95})  # mean above, samples not
    checked = loop.history[-1]["confirmed_accuracy"]
    assert checked < 0.5 and not loop.target_reached() and not loop.stopped_by
    labels = np.argmax(net.predict_proba(X[:200]), axis=1)  # what the state predicts: all right
    loop.evaluator = Evaluator(net, confirm=(X[:200], labels))
    assert loop.record(untrained, 3.0, {"loss": 0.1, "accuracy": 0.95})
    assert loop.history[-1]["confirmed_accuracy"] == 1.0 and loop.target_reached()
    assert "1.0000 on 200 training samples" in loop.stopped_by
