"""ResNet-20 (He et al. 2016) trains on the Dask engine with Omnivore's optimizer choosing
n_groups, learning rate and momentum, and beats Caffe's CIFAR-10 quick net on the same data and
budget, on held-out images (slow: minutes on two cores)."""

from __future__ import annotations

import dask.array as da
import pytest

from dasknn import DistributedCNN
from dasknn.data import load
from dasknn.optimizer import GridPolicy

HELD_OUT = 297
TRAIN = 640


def cifar_shaped_digits():
    """scikit-learn's bundled digits at 32×32 (each pixel 4×4) repeated over 3 channels: CIFAR-10's
    (3, 32, 32) input shape from a dataset that ships with the dependencies; the last 297 images
    are held out (never trained on), the first 640 are trained on (two cores must train ResNet-20
    for 30 epochs within minutes)."""
    X, y = load("digits", size=32, batch_size=32)
    X = da.concatenate([X, X, X], axis=1).rechunk({1: -1})
    n = X.shape[0] - HELD_OUT
    return (X[:TRAIN], y[:TRAIN]), (X[n:], y[n:])


@pytest.mark.slow
def test_resnet20_beats_cifar10_quick_on_the_same_data_and_budget():
    (X, y), (X_test, y_test) = cifar_shaped_digits()
    scores = {}
    for net in ("cifar10_quick", "resnet20"):
        est = DistributedCNN(
            net=net,
            batch_size=32,
            time_budget=None,
            max_epochs=30,
            engine="dask",
            n_workers=2,
            random_state=0,
            tuner=GridPolicy(probe_iterations=5),
        )
        est.fit(X, y)
        scores[net] = est.score(X_test, y_test)
    print(scores)
    # ResNet-20's held-out score in four runs on two machines: 0.906, 0.896, 0.899, 0.886 (CIFAR-10
    # quick: 0.825, 0.838, 0.795, 0.879); asynchronous groups follow real timing, so the floor
    # leaves room under the lowest
    assert scores["resnet20"] > max(scores["cifar10_quick"], 0.85)
