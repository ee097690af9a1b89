"""Fixtures of the engine tests: a real LocalCluster (worker processes) shared by a module's tests,
the digits, and a tiny seeded 6×6 dataset for the engines' tiny nets."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.data import load
from dasknn.engine.dask import local_client


@pytest.fixture(scope="module")
def client2():
    """Two worker processes with two threads each (groups may share a worker and still overlap)."""
    with local_client(n_workers=2, threads_per_worker=2) as client:
        yield client


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's digits at 28×28 as dask arrays (X float32 in [0, 1], y int64)."""
    return load("digits", size=28, batch_size=64)


@pytest.fixture(scope="module")
def tiny_data():
    """300 seeded 1×6×6 samples of 3 classes, for the tiny nets of the engine tests."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 1, 6, 6)).astype(np.float32)
    y = (X[:, 0, 2, 2] > 0).astype(np.int64) + (X[:, 0, 3, 3] > 0)
    return X, y
