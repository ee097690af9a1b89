"""Shared data and helpers of the strategy tests (issue #7)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dasknn.data import load


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's digits at 28×28 as dask arrays: cheap LeNet iterations for equivalence tests."""
    return load("digits", size=28, batch_size=32)


@pytest.fixture(scope="module")
def mnist():
    """The 5,000-image MNIST sample, as dask arrays and as numpy (for training accuracy)."""
    X, y = load("mnist-sample")
    return X, y, *dask.compute(X, y)


def training_accuracy(net, X: np.ndarray, y: np.ndarray) -> float:
    """Fraction of the training images the net classifies correctly (test mode)."""
    return float((net.predict_proba(X).argmax(axis=1) == y).mean())
