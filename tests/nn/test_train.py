"""In-process training really learns: LeNet on scikit-learn's digits reaches >= 97% training accuracy."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.nn import zoo
from dasknn.nn.solver import SGD
from dasknn.nn.train import EVAL_BATCH_BYTES, evaluate, scoring_batch_size, shuffled_batches, train_arrays


def digits_28():
    """The 1,797 8×8 digits, upsampled ×3 and zero-padded to LeNet's 28×28, scaled to [0, 1]."""
    d = load_digits()
    x = np.kron(d.images / 16.0, np.ones((3, 3)))
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)))[:, None].astype(np.float32)
    return x, d.target.astype(np.int64)


def lenet_solver(net):
    return SGD.for_net(
        net, base_lr=0.01, momentum=0.9, weight_decay=5e-4, lr_policy="inv", gamma=1e-4, power=0.75
    )


def test_lenet_reaches_97_percent_on_digits():
    X, y = digits_28()
    net = zoo.lenet(seed=0)
    _, acc0 = evaluate(net, X, y)
    history = train_arrays(net, lenet_solver(net), X, y, batch_size=64, iterations=200, seed=0)
    loss, acc = evaluate(net, X, y)
    assert acc0 < 0.3
    assert acc >= 0.97, f"training accuracy {acc:.3f} after 200 iterations"
    assert history[-1]["iteration"] == 200 and history[0]["loss"] > 2 * loss


def test_training_is_deterministic_for_a_seed():
    X, y = digits_28()
    nets = [zoo.lenet(seed=1) for _ in range(2)]
    for net in nets:
        train_arrays(net, lenet_solver(net), X[:256], y[:256], batch_size=32, iterations=5, seed=3)
    for k in nets[0].params:
        np.testing.assert_array_equal(nets[0].params[k], nets[1].params[k])


def test_shuffled_batches_cover_each_epoch_once():
    batches = shuffled_batches(10, 3, seed=0)
    epoch0 = [next(batches) for _ in range(3)]
    seen = np.concatenate([idx for _, idx in epoch0])
    assert len(set(seen.tolist())) == 9 and {e for e, _ in epoch0} == {0}
    assert next(batches)[0] == 1
    with pytest.raises(ValueError, match="batch_size 11 is larger than the 10 samples"):
        next(shuffled_batches(10, 11))


def test_divergence_is_reported_not_silently_trained_on():
    X, y = digits_28()
    net = zoo.lenet(seed=0)
    solver = SGD.for_net(net, base_lr=50.0, momentum=0.99)
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        with np.errstate(all="ignore"):
            train_arrays(net, solver, X, y, batch_size=64, iterations=100, seed=0)


def test_a_small_net_is_scored_in_large_batches_with_the_same_scores():
    """Scoring batches hold EVAL_BATCH_BYTES of blobs: LeNet's 1,661 images, a big net's floor of
    256; the batch only groups the work, so loss and accuracy are the ones of 256-image batches."""
    lenet = zoo.lenet(seed=0)
    assert scoring_batch_size(lenet) == EVAL_BATCH_BYTES // (4 * 20194) == 1661
    assert scoring_batch_size(zoo.caffenet(num_classes=10)) == 256
    X, y = (a[:700] for a in digits_28())
    loss, acc = evaluate(lenet, X, y, scoring_batch_size(lenet))
    ref_loss, ref_acc = evaluate(lenet, X, y, 256)
    assert acc == ref_acc and loss == pytest.approx(ref_loss, rel=1e-5)
