"""The epoch iterator visits each sample once, in an order fixed by (seed, epoch), 1-2 chunks a batch."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from dasknn.data import Transform, compute_batch, epoch_indices, iterate_batches, load, n_batches


def _indexed(n: int, chunk: int):
    """X whose sample i is filled with i, y = arange(n), both chunked by `chunk`."""
    X = da.arange(n, chunks=chunk, dtype=np.float32)[:, None, None, None] * da.ones(
        (1, 2, 3, 3), dtype=np.float32
    )
    return X.rechunk({0: chunk}), da.arange(n, chunks=chunk)


class _CountingSource:
    """A real chunked dataset (sample i filled with i) that records which chunks get computed."""

    def __init__(self, n: int, chunk: int):
        self.calls: list[int] = []
        self.X = da.map_blocks(
            self._chunk,
            chunks=((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()), (1,), (1,), (1,)),
            dtype=np.float32,
            meta=np.empty((0, 0, 0, 0), dtype=np.float32),
        )

    def _chunk(self, block_info=None):
        start, stop = block_info[None]["array-location"][0]
        self.calls.append(block_info[None]["chunk-location"][0])
        return np.arange(start, stop, dtype=np.float32).reshape(-1, 1, 1, 1)


def _visited(X, y, batch_size, **kwargs):
    seen = []
    for Xb, yb in iterate_batches(X, y, batch_size, **kwargs):
        xn, yn = compute_batch(Xb, yb)
        assert Xb.numblocks[0] == 1 and xn.shape[1:] == (2, 3, 3)
        np.testing.assert_array_equal(xn[:, 0, 0, 0], yn)
        seen.append(yn)
    return seen


@pytest.mark.parametrize(
    ("n", "chunk", "batch_size"), [(103, 20, 8), (100, 25, 10), (64, 64, 64), (50, 7, 9)]
)
def test_drop_last_false_visits_every_sample_exactly_once(n, chunk, batch_size):
    X, y = _indexed(n, chunk)
    seen = _visited(X, y, batch_size, drop_last=False, seed=3, epoch=2)
    assert len(seen) == n_batches(n, batch_size, drop_last=False) == -(-n // batch_size)
    assert all(len(b) == batch_size for b in seen[:-1])
    assert sorted(np.concatenate(seen).tolist()) == list(range(n))


def test_drop_last_true_yields_exactly_the_full_batches():
    X, y = _indexed(103, 20)
    seen = _visited(X, y, 8, drop_last=True, seed=1)
    order = epoch_indices(X.chunks[0], seed=1)
    assert len(seen) == n_batches(X, 8) == 12
    assert all(len(b) == 8 for b in seen)
    np.testing.assert_array_equal(np.concatenate(seen), order[:96])
    assert len(set(np.concatenate(seen).tolist())) == 96


def test_order_is_a_function_of_seed_and_epoch():
    X, y = _indexed(120, 30)
    a = np.concatenate(_visited(X, y, 10, seed=0, epoch=0))
    assert np.array_equal(a, np.concatenate(_visited(X, y, 10, seed=0, epoch=0)))
    assert not np.array_equal(a, np.concatenate(_visited(X, y, 10, seed=1, epoch=0)))
    assert not np.array_equal(a, np.concatenate(_visited(X, y, 10, seed=0, epoch=1)))
    assert not np.array_equal(a, np.arange(120))
    np.testing.assert_array_equal(np.concatenate(_visited(X, y, 10, shuffle=False)), np.arange(120))
    with pytest.raises(ValueError, match="epoch must be a non-negative integer; got -1"):
        iterate_batches(X, y, 10, epoch=-1)  # checked at the call, not at the first batch


def test_each_batch_reads_at_most_two_chunks():
    source = _CountingSource(100, 15)
    batches = list(iterate_batches(source.X, None, 8, seed=4, drop_last=False))
    assert len(batches) == 13
    spans = []
    for Xb, _ in batches:
        source.calls.clear()
        xb, _ = compute_batch(Xb)
        assert sorted(set(source.calls)) == sorted(set(xb[:, 0, 0, 0].astype(int) // 15))
        spans.append(len(source.calls))
    assert max(spans) == 2 and min(spans) == 1


def test_batches_of_one_chunk_computed_together_read_it_once():
    source = _CountingSource(64, 32)
    batches = [Xb for Xb, _ in iterate_batches(source.X, None, 8, seed=0)]
    source.calls.clear()
    first_four = dask.compute(*batches[:4])
    assert len(source.calls) == 1
    assert len(np.unique(np.concatenate(first_four)[:, 0, 0, 0] // 32)) == 1


def test_numpy_inputs_and_misaligned_label_chunks_are_accepted():
    Xn = np.arange(40, dtype=np.float32).reshape(40, 1, 1, 1)
    y = da.arange(40, chunks=13)
    seen = [compute_batch(Xb, yb) for Xb, yb in iterate_batches(Xn, y, 5, seed=2)]
    for xb, yb in seen:
        np.testing.assert_array_equal(xb[:, 0, 0, 0], yb)
    assert sorted(np.concatenate([s[1] for s in seen]).tolist()) == list(range(40))
    Xb, yb = next(iterate_batches(Xn, None, 5))
    assert yb is None and compute_batch(Xb)[0].shape == (5, 1, 1, 1)
    with pytest.raises(ValueError, match="X has 40 samples but y has shape"):
        iterate_batches(Xn, np.arange(39), 5)


def test_transform_is_applied_lazily_to_each_batch():
    X, y = load("digits", raw=True, batch_size=16)
    transform = Transform(scale=0.5, mean_value=8.0)
    Xb, yb = next(iterate_batches(X, y, 16, seed=0, transform=transform))
    Xr, yr = next(iterate_batches(X, y, 16, seed=0))
    np.testing.assert_array_equal(Xb.compute(), (Xr.compute() - 8.0) * 0.5)
    np.testing.assert_array_equal(yb.compute(), yr.compute())


def test_transform_subtracts_mean_per_channel_then_scales_like_caffe():
    x = np.arange(2 * 3 * 2 * 2, dtype=np.uint8).reshape(2, 3, 2, 2)
    t = Transform(scale=0.00390625, mean_value=[104, 117, 123])
    expected = (x.astype(np.float32) - np.float32([104, 117, 123]).reshape(1, 3, 1, 1)) * np.float32(
        0.00390625
    )
    out = t(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    lazy = t(da.from_array(x, chunks=1))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), expected)
    assert out[0, 0, 0, 0] == pytest.approx(-104 / 256)  # mean first: (0 - 104) / 256, not 0 / 256 - 104
    np.testing.assert_array_equal(Transform()(x), x.astype(np.float32))


def test_transform_rejects_mismatched_means():
    with pytest.raises(ValueError, match="mean_value has 2 values; the input has 3 channels"):
        Transform(mean_value=[1, 2])(np.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError, match="mean_value must be a finite number"):
        Transform(mean_value=[float("nan")])
    with pytest.raises(ValueError, match="Transform expects 4-D"):
        Transform()(np.zeros((3, 2, 2)))
