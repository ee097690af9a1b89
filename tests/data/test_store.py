"""Conversion to zarr under the data home: round trips, reuse, and no half-written store ever loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr

from dasknn.data import convert, data_home, load, store_path
from dasknn.data.store import is_complete, write_store

from .files import write_cifar10, write_mnist

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DASKNN_DATA", str(tmp_path / "home"))
    return tmp_path / "home"


def test_data_home_is_env_then_checkout_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("DASKNN_DATA", str(tmp_path))
    assert data_home() == tmp_path
    monkeypatch.delenv("DASKNN_DATA")
    assert data_home() == REPO / "datasets"


def test_convert_digits_round_trips_exactly(home):
    path = convert("digits", size=28)
    assert path == home / "digits_size-28.zarr" == store_path("digits", size=28)
    group = zarr.open_group(str(path), mode="r")
    assert (
        group["X"].dtype == np.uint8 and group.attrs["complete"] is True and group.attrs["unit_max"] == 16.0
    )
    X, y = load("digits", size=28, from_store=True, batch_size=32)
    X_src, y_src = load("digits", size=28, from_store=False, batch_size=32)
    assert "from-zarr" in X.name or "zarr" in str(X.dask.keys())
    np.testing.assert_array_equal(X.compute(), X_src.compute())
    np.testing.assert_array_equal(y.compute(), y_src.compute())
    assert X.chunks == X_src.chunks and X.dtype == np.float32


def test_load_prefers_a_complete_store_and_reads_it_lazily(home):
    path = convert("digits")
    X_auto, _ = load("digits")
    assert any("zarr" in str(k[0] if isinstance(k, tuple) else k) for k in X_auto.dask.keys())
    X_zarr, y_zarr = load("zarr", path=path, raw=True)
    assert float(X_zarr.max().compute()) == 16.0 and y_zarr.shape == (1797,)


def test_convert_tiny_idx_set_round_trips(home, tmp_path):
    written = write_mnist(home / "mnist", n_train=50, n_test=20)
    for split, (images, labels) in written.items():
        path = convert("mnist", split=split, batch_size=8)
        assert path.name == f"mnist_split-{split}.zarr"
        X, y = load("mnist", split=split, raw=True, from_store=True)
        np.testing.assert_array_equal(X.compute(), images[:, None].astype(np.float32))
        np.testing.assert_array_equal(y.compute(), labels.astype(np.int64))


def test_convert_cifar10_binary_to_a_chosen_path_round_trips(home, tmp_path):
    written = write_cifar10(tmp_path / "src", "binary")
    out = convert("cifar10", path=tmp_path / "src", split="test", out=tmp_path / "c10.zarr")
    assert out == tmp_path / "c10.zarr" and is_complete(out)
    X, y = load("zarr", path=out, raw=True)
    np.testing.assert_array_equal(X.compute(), written["test"][0].astype(np.float32))
    np.testing.assert_array_equal(y.compute(), written["test"][1])
    Xs, _ = load("zarr", path=out)
    assert float(Xs.max().compute()) <= 1.0 and Xs.dtype == np.float32


def test_explicit_source_path_bypasses_the_store(home, tmp_path):
    write_mnist(home / "mnist", n_train=10)
    convert("mnist")
    other = write_mnist(tmp_path / "other", n_train=6, seed=9)
    X, _ = load("mnist", path=tmp_path / "other", raw=True)
    np.testing.assert_array_equal(X.compute()[:, 0], other["train"][0])


def test_existing_store_is_kept_unless_overwrite(home):
    path = convert("synthetic", n_samples=100, shape=(1, 4, 4))
    stamp = (path / "zarr.json").stat().st_mtime_ns
    assert convert("synthetic", n_samples=100, shape=(1, 4, 4)) == path
    assert (path / "zarr.json").stat().st_mtime_ns == stamp
    convert("synthetic", n_samples=100, shape=(1, 4, 4), overwrite=True)
    assert is_complete(path) and not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_a_failed_write_leaves_no_store_and_no_temp_folder(tmp_path):
    def explode(block):
        raise RuntimeError("disk on fire")

    X = da.zeros((64, 1, 2, 2), chunks=(16, 1, 2, 2)).map_blocks(explode, dtype=np.float64)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_store(X, da.zeros(64, chunks=16), tmp_path / "x.zarr", attrs={"unit_max": 1.0})
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_store_is_refused(home):
    path = convert("digits")
    zarr.open_group(str(path), mode="r+").attrs["complete"] = False
    assert not is_complete(path)
    with pytest.raises(ValueError, match="not a complete dasknn store"):
        load("zarr", path=path)
    X, _ = load("digits")  # auto falls back to the source
    assert X.shape == (1797, 1, 8, 8)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        convert("digits")
    assert is_complete(convert("digits", overwrite=True))


def test_from_store_true_without_a_store_says_so(home):
    with pytest.raises(FileNotFoundError, match="no converted store at .*digits_size-8.zarr"):
        load("digits", from_store=True)
    with pytest.raises(ValueError, match="'zarr' is already a store"):
        convert("zarr", path="x")


def test_killed_conversion_leaves_nothing_that_loads(home):
    options = dict(n_samples=200_000, shape=(3, 32, 32), seed=1)
    script = textwrap.dedent(
        f"""
        from dasknn.data import convert
        convert("synthetic", batch_size=64, **{options!r})
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env={**os.environ, "DASKNN_DATA": str(home)}
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            temps = list(home.glob(".*.tmp-*")) if home.exists() else []
            if temps and any((t / "X").exists() for t in temps):
                break
            assert proc.poll() is None, "conversion finished before it could be interrupted"
            time.sleep(0.05)
        else:
            pytest.fail("conversion never started writing")
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    final = store_path("synthetic", **options)
    assert not final.exists() and not is_complete(final)
    assert [p.name for p in home.iterdir() if not p.name.startswith(".")] == []
    with pytest.raises(FileNotFoundError):
        load("synthetic", from_store=True, **options)
    X, _ = load("synthetic", **options)  # the source, not the half store
    assert "zarr" not in X.name
