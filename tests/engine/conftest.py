"""A real LocalCluster (worker processes) shared by the engine tests of a module."""

from __future__ import annotations

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
