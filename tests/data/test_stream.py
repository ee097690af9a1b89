"""Streaming batches from a zarr store on disk: the window shuffle's order, the reader's batches,
its read-ahead and its counts (one read of every sample and of every chunk per epoch)."""

from __future__ import annotations

import time

import dask.array as da
import numpy as np
import pytest

from dasknn.data.batching import BatchOrder, epoch_indices, window_indices
from dasknn.data.stream import StreamReader, StreamSource, reset_stream_reads, stream_reads


@pytest.fixture
def store(tmp_path):
    """A uint8 zarr store of 640 samples (1×4×4, sample i filled with i % 251) in chunks of 64."""
    n = 640
    x = (np.arange(n) % 251).astype(np.uint8)[:, None, None, None] * np.ones((1, 1, 4, 4), np.uint8)
    da.to_zarr(da.from_array(x, chunks=(64, 1, 4, 4)), str(tmp_path / "x.zarr"))
    return da.from_zarr(str(tmp_path / "x.zarr")), x, (np.arange(n) % 10).astype(np.int64)


@pytest.mark.parametrize("window", [1, 2, 3, 10])
def test_the_window_shuffle_is_a_permutation_that_mixes_window_chunks(window):
    chunks = (64,) * 9 + (40,)
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    order = window_indices(chunks, epoch=3, seed=7, window=window)
    assert sorted(order.tolist()) == list(range(sum(chunks)))
    np.testing.assert_array_equal(order, window_indices(chunks, epoch=3, seed=7, window=window))
    assert not np.array_equal(order, window_indices(chunks, epoch=4, seed=7, window=window))
    owner = np.searchsorted(starts, order, side="right") - 1
    pos = 0
    perm = np.random.default_rng([7, 3]).permutation(len(chunks))
    for w in range(0, len(chunks), window):
        members = perm[w : w + window]
        size = sum(chunks[c] for c in members)
        assert set(owner[pos : pos + size].tolist()) == set(members.tolist())  # only its window's chunks
        pos += size


def test_window_one_is_the_chunk_shuffle_of_iterate_batches():
    chunks = (64, 64, 30)
    for epoch in range(3):
        np.testing.assert_array_equal(
            window_indices(chunks, epoch=epoch, seed=2), epoch_indices(chunks, epoch=epoch, seed=2)
        )
    with pytest.raises(ValueError, match="shuffle window must be an integer >= 1"):
        window_indices(chunks, window=0)


def test_the_reader_gives_the_batches_of_the_order_in_the_stores_dtype(store):
    X, x, y = store
    source = StreamSource(X, y)
    order = BatchOrder(source.chunks, 32, 5, 2)
    wanted = [0, 3, 6, 19, 20, 21, 40]  # across an epoch boundary (20 batches an epoch)
    reader = StreamReader(source, 32, 5, wanted, window=2, prefetch=2)
    try:
        for b in wanted:
            xb, yb = reader.get(b)
            assert xb.dtype == np.uint8
            np.testing.assert_array_equal(xb, x[order.indices(b)])
            np.testing.assert_array_equal(yb, y[order.indices(b)])
    finally:
        reader.close()


def test_prepare_runs_in_the_reading_thread_and_converts(store):
    X, x, y = store
    reader = StreamReader(StreamSource(X, y), 32, 0, [0, 1], prepare=lambda xb, b: xb.astype(np.float32) + b)
    try:
        xb, _ = reader.get(0)
        assert xb.dtype == np.float32
        xb1, _ = reader.get(1)
        order = BatchOrder(reader.source.chunks, 32, 0)
        np.testing.assert_array_equal(xb1, x[order.indices(1)].astype(np.float32) + 1)
    finally:
        reader.close()


@pytest.mark.parametrize("window", [1, 3])
def test_one_epoch_reads_every_sample_and_every_chunk_once(store, window):
    X, _, y = store
    reset_stream_reads()
    source = StreamSource(X, y)
    reader = StreamReader(source, 32, 1, range(20), window=window, prefetch=3)
    try:
        for b in range(20):
            reader.get(b)
    finally:
        reader.close()
    counts = stream_reads(source.name)[source.name]
    np.testing.assert_array_equal(counts["samples"], np.ones(640, dtype=np.int64))
    np.testing.assert_array_equal(counts["chunks"], np.ones(10, dtype=np.int64))


def test_the_reader_reads_ahead_only_prefetch_batches(store):
    X, _, y = store
    reset_stream_reads()
    source = StreamSource(X, y)
    reader = StreamReader(source, 32, 0, range(20), prefetch=2)
    try:
        deadline = time.monotonic() + 30
        while stream_reads(source.name).get(source.name, {"samples": np.zeros(1)})["samples"].sum() < 96:
            assert time.monotonic() < deadline, "the reader did not read ahead"
            time.sleep(0.05)
        time.sleep(0.3)
        # two batches queued and a third read, waiting for room: never the whole epoch
        assert stream_reads(source.name)[source.name]["samples"].sum() == 3 * 32
    finally:
        reader.close()
    assert not reader._thread.is_alive()


def test_a_read_error_reaches_the_loop_and_bad_sources_are_named(store):
    X, _, y = store

    def lose_a_chunk(block):
        if block[0, 0, 0, 0] == 128:  # the chunk of samples 128..191
            raise OSError("the storage is gone")
        return block

    broken = X.map_blocks(lose_a_chunk, dtype=X.dtype, meta=np.empty((0, 0, 0, 0), np.uint8))
    reader = StreamReader(StreamSource(broken, y), 64, 0, range(10), window=10)
    try:
        with pytest.raises(OSError, match="the storage is gone"):
            for b in range(10):
                reader.get(b)
    finally:
        reader.close()
    with pytest.raises(ValueError, match="X has 640 samples but y has shape"):
        StreamSource(X, y[:10])
    with pytest.raises(ValueError, match="needs X as a dask array"):
        StreamSource(np.zeros((4, 1, 2, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="prefetch must be an integer >= 1"):
        StreamReader(StreamSource(X, y), 32, 0, [0], prefetch=0)


def write_jpegs(root, n_per_class=24, size=20):
    """Two class folders of generated JPEGs: class 0 dark, class 1 bright, with noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, base in enumerate((40, 200)):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(n_per_class):
            pixels = np.clip(base + rng.normal(0, 20, size=(size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)


def test_an_imagefolder_streams_decoded_uint8_batches_once_an_epoch(tmp_path):
    from dasknn.data.images import imagefolder

    write_jpegs(tmp_path)
    X, y = imagefolder(tmp_path, size=16, batch_size=8)
    assert X.dtype == np.uint8 and X.shape == (48, 3, 16, 16)
    source = StreamSource(X, y.compute())
    everything = X.compute()
    reset_stream_reads()
    order = BatchOrder(source.chunks, 8, 4, 2)
    reader = StreamReader(source, 8, 4, range(6), window=2)
    try:
        for b in range(6):
            xb, yb = reader.get(b)
            assert xb.dtype == np.uint8
            np.testing.assert_array_equal(xb, everything[order.indices(b)])
            assert set(np.unique(yb)) <= {0, 1}
    finally:
        reader.close()
    counts = stream_reads(source.name)[source.name]
    np.testing.assert_array_equal(counts["samples"], np.ones(48, dtype=np.int64))
    assert counts["chunks"].tolist() == [1] * len(source.chunks)
