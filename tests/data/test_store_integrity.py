"""A converted store is complete and decodable, or it is refused naming the store and the chunk.

zarr reads an absent chunk as its fill value (zeros), so a deleted chunk file would train on blank
images or relabel samples as class 0 without a word. These tests damage real stores on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dasknn.data import convert, load
from dasknn.data.store import write_store
from dasknn.data.stream import StreamSource
from tests.test_bad_input import cli

CHUNK = 300  # samples per chunk on disk: digits' 1797 samples make 6 chunks of X and of y


def digits_store(path: Path) -> Path:
    """The digits (uint8, 28×28, for LeNet) as a store of 6 chunks, written as `convert` writes stores."""
    X, y = load("digits", size=28, raw=True, from_store=False)
    X = X.astype(np.uint8).rechunk({0: CHUNK})
    return write_store(X, y.rechunk(CHUNK), path, attrs={"dataset": "digits", "unit_max": 16.0})


def chunk_file(store: Path, array: str, c: int) -> Path:
    """The file of chunk c (along samples) of `array` in a zarr 3 store."""
    ndim = 4 if array == "X" else 1
    return store.joinpath(array, "c", str(c), *["0"] * (ndim - 1))


TRAIN = ["--engine", "simulated", "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9"]
TRAIN += ["--time-budget", "3", "--eval-size", "100", "-q"]


def train_on(store: Path, tmp_path: Path) -> tuple[int, list[str]]:
    """`dasknn train` on the store: (exit code, stderr's non-empty lines)."""
    code, err = cli(
        "train", "--dataset", "zarr", "--data-dir", str(store), *TRAIN, "--output", str(tmp_path / "out")
    )
    return code, [line for line in err.splitlines() if line.strip()]


def test_a_missing_X_chunk_is_refused_naming_the_store_and_chunk(tmp_path):
    store = digits_store(tmp_path / "digits.zarr")
    chunk_file(store, "X", 2).unlink()
    with pytest.raises(ValueError, match=r"missing chunk X/c/2/0/0/0"):
        load("zarr", path=store)
    code, lines = train_on(store, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert str(store) in lines[0] and "X/c/2/0/0/0" in lines[0]


def test_a_missing_y_chunk_is_refused_naming_the_store_and_chunk(tmp_path):
    store = digits_store(tmp_path / "digits.zarr")
    chunk_file(store, "y", 3).unlink()
    chunk_file(store, "y", 5).unlink()
    code, lines = train_on(store, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert str(store) in lines[0] and "missing chunk y/c/3" in lines[0]  # the first one


def test_convert_records_its_chunk_index_and_a_changed_chunk_file_is_refused_before_reading(tmp_path):
    store = convert("digits", size=28, batch_size=16, out=tmp_path / "d.zarr")
    index = dict(load_attrs(store)["index"])
    X, _ = load("zarr", path=store)
    assert index["chunks"] == {"X": X.numblocks[0], "y": X.numblocks[0]} and len(index["sha256"]) == 64
    victim = chunk_file(store, "X", 0)
    victim.write_bytes(victim.read_bytes()[:-7])  # truncated: the listing's sizes no longer match
    with pytest.raises(ValueError, match=r"changed since it was written") as err:
        load("zarr", path=store)
    assert str(store) in str(err.value)


def load_attrs(store: Path) -> dict:
    import zarr

    return dict(zarr.open_group(str(store), mode="r").attrs)


def test_a_streamed_read_of_a_chunk_gone_after_loading_is_refused(tmp_path):
    store = digits_store(tmp_path / "digits.zarr")
    X, y = load("zarr", path=store)
    source = StreamSource(X, y.compute())
    last = len(source.chunks) - 1  # the dask chunk holding the store's last chunk
    assert source.read_chunk(last).shape[0] == source.chunks[last]
    chunk_file(store, "X", 5).unlink()
    with pytest.raises(ValueError, match=r"missing chunk X/c/5/0/0/0") as err:
        source.read_chunk(last)
    assert str(store) in str(err.value)


def test_an_undecodable_chunk_is_bad_input_naming_the_store_and_chunk(tmp_path):
    store = digits_store(tmp_path / "digits.zarr")
    victim = chunk_file(store, "X", 3)
    victim.write_bytes(np.random.default_rng(0).bytes(os.path.getsize(victim)))  # same size: index intact
    code, lines = train_on(store, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert str(store) in lines[0] and "X/c/3/0/0/0" in lines[0] and "cannot be decoded" in lines[0]
