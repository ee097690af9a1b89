"""Scoring batches side by side on threads gives the scores of scoring them one after another."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import blas_threads
from dasknn.engine.trace import TrainState
from dasknn.fitting import Evaluator
from dasknn.nn import zoo
from dasknn.nn.scoring import Scorer, threads_per_batch
from dasknn.nn.train import evaluate


def lenet_and_sets():
    """LeNet with weights moved off their initial values (so the scores are not trivial), and a
    training and a held-out set of random images whose batches of 256 do not divide them evenly."""
    rng = np.random.default_rng(3)
    net = zoo.lenet(seed=0)
    net.set_params({k: v + rng.normal(0, 0.05, v.shape).astype(v.dtype) for k, v in net.params.items()})
    X = rng.random((700, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 700)
    return net, (X[:500], y[:500]), (X[500:], y[500:])


def test_batches_side_by_side_give_the_scores_of_one_after_another_bit_for_bit():
    """Three training batches and one held-out batch on two threads of one BLAS/OpenMP thread each:
    the same (loss, accuracy) as `evaluate` batch by batch with one thread, to the last bit."""
    net, train, val = lenet_and_sets()
    scorer = Scorer(net, {"train": train, "val": val}, batch_size=256, threads=2)
    assert (scorer.side_by_side, scorer.threads_each) == (2, 1)
    got = scorer(net.params)
    with blas_threads(1):
        want = {"train": evaluate(net, *train, 256), "val": evaluate(net, *val, 256)}
    assert got == want
    assert scorer(net.params) == want  # the pool's threads and net copies serve the next call too
    assert 0.0 < got["train"][0] and 0.0 <= got["val"][1] <= 1.0


def test_one_thread_scores_in_the_calling_thread_as_evaluate_does():
    """A process limited to one BLAS thread (a Dask worker's setup) scores one batch after another."""
    net, train, val = lenet_and_sets()
    with blas_threads(1):
        scorer = Scorer(net, {"train": train}, batch_size=256)
        assert (scorer.side_by_side, scorer.threads_each) == (1, 1)
        assert scorer(net.params) == {"train": evaluate(net, *train, 256)}


def test_threads_are_shared_out_over_the_batches():
    assert threads_per_batch(2, 3) == (2, 1)
    assert threads_per_batch(16, 3) == (3, 5)
    assert threads_per_batch(1, 3) == (1, 1)
    assert threads_per_batch(4, 1) == (1, 4)


def test_the_evaluator_scores_only_the_held_out_data_of_the_state_given():
    """The Evaluator's scores: val_loss and val_accuracy on the held-out data, nothing without any
    (the training figures come from the trace); its scorer counts the samples it scored."""
    net, _, val = lenet_and_sets()
    evaluator = Evaluator(net, *val)
    state = TrainState.from_net(net)
    scores = evaluator(state)
    assert list(scores) == ["val_loss", "val_accuracy"]
    assert scores == {"val_loss": pytest.approx(evaluate(net, *val, 256)[0]),
                      "val_accuracy": pytest.approx(evaluate(net, *val, 256)[1])}  # fmt: skip
    trained = zoo.lenet(seed=1)
    other = evaluator(TrainState.from_net(trained))
    assert other != scores
    assert evaluator.scorer.scored == 2 * len(val[1])
    assert Evaluator(net)(state) == {}
