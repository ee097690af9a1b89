"""Stores read through fsspec URLs: a `file://` URL gives the same lazy arrays as the local path,
and such an array, shipped to another process as a worker gets it, reads its chunks there."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest

from dasknn.data import load
from dasknn.data.store import is_url, read_store, write_store
from dasknn.data.stream import StreamReader, StreamSource


@pytest.fixture
def store(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, size=(200, 1, 6, 6)).astype(np.uint8)
    y = np.arange(200) % 4
    path = write_store(da.from_array(x, chunks=50), da.from_array(y, chunks=50), tmp_path / "s.zarr",
                       attrs={"unit_max": 255.0})  # fmt: skip
    return path, x, y


def test_a_file_url_reads_what_the_local_path_reads(store):
    path, x, y = store
    url = path.resolve().as_uri()
    assert url.startswith("file:///") and is_url(url) and not is_url(str(path))
    X_url, y_url, attrs = read_store(url, batch_size=32)
    X_path, _, _ = read_store(path, batch_size=32)
    assert X_url.dtype == np.uint8 and X_url.chunks == X_path.chunks and attrs["unit_max"] == 255.0
    np.testing.assert_array_equal(X_url.compute(), x)
    np.testing.assert_array_equal(y_url.compute(), y)
    X_loaded, _ = load("zarr", path=url, batch_size=32)
    np.testing.assert_allclose(X_loaded.compute(), x / np.float32(255), rtol=1e-6)


def test_a_url_backed_array_streams_after_a_trip_through_pickle(store):
    path, x, y = store
    X, y_lazy, _ = read_store(path.resolve().as_uri(), batch_size=25)
    shipped = pickle.loads(pickle.dumps(StreamSource(X, y_lazy.compute())))  # as a task argument travels
    reader = StreamReader(shipped, 25, 0, range(8))
    try:
        seen = np.concatenate([reader.get(b)[1] for b in range(8)])
    finally:
        reader.close()
    assert sorted(seen.tolist()) == sorted(y.tolist())


def test_a_missing_url_store_is_named(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="nothing.zarr"):
        read_store((tmp_path / "nothing.zarr").as_uri())
