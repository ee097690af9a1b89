"""A 20 GB synthetic dataset is iterated batch by batch in bounded memory."""

from __future__ import annotations

import gc
import resource
import tracemalloc

import numpy as np
import pytest

from dasknn.data import compute_batch, iterate_batches, load, n_batches


@pytest.mark.slow  # the streamed path stays in the default run: tests/data/test_stream.py, engine/dask
def test_20_gb_synthetic_iterates_in_bounded_memory():
    shape = (3, 64, 64)
    n_samples = -(-20 * 10**9 // (4 * 3 * 64 * 64))
    X, y = load("synthetic", n_samples=n_samples, shape=shape, n_classes=100, batch_size=64)
    assert X.nbytes >= 20e9 and X.numblocks[0] > 6000
    assert n_batches(X, 64) == n_samples // 64
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    labels = []
    batches = iterate_batches(X, y, 64, seed=0, epoch=0)
    for _, (Xb, yb) in zip(range(25), batches, strict=False):
        xn, yn = compute_batch(Xb, yb)
        assert xn.shape == (64, *shape) and 0.0 <= xn.min() and xn.max() <= 1.0
        labels.append(yn)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert peak < 100 * 2**20, f"traced peak {peak / 2**20:.0f} MiB"
    assert rss_growth < 300 * 2**20, f"peak RSS grew {rss_growth / 2**20:.0f} MiB"
    assert len(np.unique(np.concatenate(labels))) > 50
