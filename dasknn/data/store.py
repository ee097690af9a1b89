"""Converted datasets on disk: zarr stores under the data home, written atomically, read back lazily.

A store is a zarr group `<name>.zarr` with two arrays, `X` (samples in their raw units, e.g. uint8
pixels, chunked along samples) and `y` (int64 labels), and attributes saying what it holds
(`dataset`, `options`, `unit_max`: the raw value that means 1.0) plus `complete: true`, written last.
It is built in a hidden temporary folder beside its final place and renamed into place only when
complete, so an interrupted conversion never leaves a store that loads.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr

from .chunks import sample_chunks

__all__ = ["STORE_FORMAT", "data_home", "is_complete", "is_url", "open_store", "read_store", "write_store"]

STORE_FORMAT = 1
"""Version of the store layout, saved in each store's attributes as `dasknn_store`."""


def data_home() -> Path:
    """Where datasets and converted stores live.

    `$DASKNN_DATA` when set; else the `datasets/` folder of the source checkout dasknn runs from
    (a folder with pyproject.toml and datasets/); else `~/.dasknn/datasets`. Not created here.
    """
    env = os.environ.get("DASKNN_DATA")
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "datasets").is_dir():
        return checkout / "datasets"
    return Path.home() / ".dasknn" / "datasets"


def is_complete(path: str | Path) -> bool:
    """True when `path` is a finished dasknn store (its `complete` attribute is set)."""
    try:
        open_store(path)
    except (FileNotFoundError, ValueError):
        return False
    return True


def is_url(path: str | Path) -> bool:
    """True for an fsspec URL such as file:///data/x.zarr or s3://bucket/x.zarr (not a local path)."""
    return isinstance(path, str) and "://" in path


def open_store(path: str | Path) -> zarr.Group:
    """The zarr group of a finished store at a local path or an fsspec URL (`file://`, and the
    object stores fsspec reaches with their packages: `s3://` with s3fs, `gs://` with gcsfs);
    FileNotFoundError if absent, ValueError if not a finished store."""
    if not is_url(path):
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no converted store at {path}")
    try:
        group = zarr.open_group(str(path), mode="r")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no converted store at {path}: {err}") from err
    except Exception as err:
        raise ValueError(f"{path} is not a zarr store: {err}") from err
    attrs = dict(group.attrs)
    if attrs.get("dasknn_store") != STORE_FORMAT or attrs.get("complete") is not True:
        raise ValueError(
            f"{path} is not a complete dasknn store (format {attrs.get('dasknn_store')!r}, "
            f"complete={attrs.get('complete')!r}); delete it or convert again with overwrite=True"
        )
    return group


def read_store(path: str | Path, *, batch_size: int = 64) -> tuple[da.Array, da.Array, dict[str, Any]]:
    """The raw X, the labels y and the attributes of a finished store (a path or an fsspec URL), as
    lazy dask arrays: computing a chunk of X reads it from the store, wherever that runs.

    X keeps the stored dtype (e.g. uint8); its dask chunks are chosen for `batch_size` as for any
    dataset, whatever the chunks on disk.
    """
    group = open_store(path)
    zx, zy = group["X"], group["y"]
    if zx.shape[0] != zy.shape[0]:
        raise ValueError(f"{path}: X has {zx.shape[0]} samples but y has {zy.shape[0]}")
    chunks = sample_chunks(zx.shape[0], zx.shape[1:], batch_size)
    X = da.from_zarr(zx, chunks=chunks)
    y = da.from_zarr(zy, chunks=(chunks[0],))
    return X, y, dict(group.attrs)


def _create_array(
    group: zarr.Group, name: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: Any
) -> Any:
    create = getattr(group, "create_array", None) or group.create_dataset  # zarr 3, else zarr 2
    return create(name, shape=shape, chunks=chunks, dtype=dtype)


def write_store(
    X: da.Array, y: da.Array, path: str | Path, *, attrs: dict[str, Any], overwrite: bool = False
) -> Path:
    """Write X and y to a new store at `path`, atomically: a temp folder, then one rename.

    `attrs` (JSON-able) are saved with the store. An existing store at `path` raises
    FileExistsError unless `overwrite`, in which case it is replaced only once the new one is
    complete. On any error the temporary folder is removed.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has {y.shape[0]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group = zarr.open_group(str(tmp), mode="w")
        group.attrs.update({**attrs, "dasknn_store": STORE_FORMAT, "complete": False})
        per_chunk = max(1, X.chunks[0][0])
        X = X.rechunk({0: per_chunk, **{a: -1 for a in range(1, X.ndim)}})
        y = y.astype(np.int64).rechunk({0: per_chunk})
        zx = _create_array(group, "X", X.shape, (per_chunk, *X.shape[1:]), X.dtype)
        zy = _create_array(group, "y", y.shape, (per_chunk,), y.dtype)
        da.store([X, y], [zx, zy], lock=False)
        group.attrs["complete"] = True
        if path.exists():
            trash = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, trash)
            os.rename(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
