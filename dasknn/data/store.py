"""Converted datasets on disk: zarr stores under the data home, written atomically, read back lazily,
and checked before they are read (a missing or changed chunk is a `StoreError` naming the store and
the chunk). docs/architecture.md, "The data path".
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize

from .chunks import sample_chunks

if TYPE_CHECKING:
    import dask.array as da
    import zarr

__all__ = [
    "STORE_FORMAT",
    "StoreError",
    "check_store",
    "data_home",
    "is_complete",
    "is_url",
    "open_store",
    "read_store",
    "write_store",
]

STORE_FORMAT = 1
"""Version of the store layout, saved in each store's attributes as `dasknn_store`."""


class StoreError(ValueError):
    """A converted store with a chunk missing, changed or undecodable: bad input naming the chunk."""


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
    FileNotFoundError if absent, ValueError if not a finished store or one without X or y."""
    import zarr  # imported on use: a fit that reads no store (and its workers) never loads zarr

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
    for name in ("X", "y"):
        if name not in group:
            raise StoreError(
                f"{path}: no array {name!r} in the store (a dasknn store holds X and y); restore it or "
                "convert the dataset again"
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
    attrs = dict(group.attrs)
    check_store(group, str(path))
    chunks = sample_chunks(zx.shape[0], zx.shape[1:], batch_size)
    X = _from_store(CheckedArray(zx, "X", str(path)), chunks, attrs.get("index"))
    y = _from_store(CheckedArray(zy, "y", str(path)), (chunks[0],), attrs.get("index"))
    return X, y, attrs


def _from_store(array: CheckedArray, chunks: tuple, index: Any) -> da.Array:
    import dask.array as da  # imported on use: `data_home` and `is_complete` need no dask array

    token = tokenize(array.where, array.name, array.shape, str(array.dtype), index)
    meta = np.empty((0,) * array.ndim, dtype=array.dtype)
    return da.from_array(array, chunks=chunks, name=f"from-zarr-{array.name}-{token}", meta=meta, fancy=False)


class CheckedArray:
    """X or y of a store as dask reads it: a read first checks that its chunks' files are there
    (a listing of keys, no chunk read) and names any chunk it cannot decode (`StoreError`)."""

    def __init__(self, array: Any, name: str, where: str) -> None:
        self.array, self.name, self.where = array, name, where
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim
        self.rows_per_chunk = array.chunks[0]

    def _key(self, c: int) -> str:
        return f"{self.name}/{self.array.metadata.encode_chunk_key((c,) + (0,) * (self.ndim - 1))}"

    def __getitem__(self, key: tuple) -> np.ndarray:
        rows = key[0] if isinstance(key, tuple) and key else slice(None)
        start, stop, _ = rows.indices(self.shape[0]) if isinstance(rows, slice) else (0, self.shape[0], 1)
        touched = range(start // self.rows_per_chunk, -(-stop // self.rows_per_chunk))
        store, prefix = self.array.store_path.store, self.array.store_path.path
        group_prefix = prefix[: -len(self.name)]
        from zarr.core.sync import sync

        present = sync(_all_exist(store, [group_prefix + self._key(c) for c in touched]))
        for c, ok in zip(touched, present, strict=True):
            if not ok:
                raise StoreError(_missing(self.where, self._key(c), c, self.array.cdata_shape[0], self.name))
        try:
            return self.array[key]
        except Exception as err:
            for c in touched:
                try:
                    self.array[c * self.rows_per_chunk : (c + 1) * self.rows_per_chunk]
                except Exception as bad:
                    raise StoreError(
                        f"{self.where}: chunk {self._key(c)} cannot be decoded ({type(bad).__name__}: "
                        f"{' '.join(str(bad).split())}); restore the file or convert the dataset again"
                    ) from bad
            raise err


async def _all_exist(store: Any, keys: list[str]) -> list[bool]:
    return list(await asyncio.gather(*(store.exists(k) for k in keys)))


def _missing(where: str, key: str, c: int, n: int, name: str) -> str:
    return (
        f"{where}: missing chunk {key} (chunk {c + 1} of {n} of {name}): zarr would read it as zeros; "
        "restore the file or convert the dataset again"
    )


def _listing(group: zarr.Group) -> dict[str, int]:
    """Every file of the store under `group`: its key (relative to the group) and size in bytes."""
    from zarr.core.sync import sync

    store, prefix = group.store_path.store, group.store_path.path
    start = len(prefix) + 1 if prefix else 0

    async def collect() -> dict[str, int]:
        keys = [k async for k in store.list_prefix(prefix)]
        sizes = await asyncio.gather(*(store.getsize(k) for k in keys))
        return {k[start:]: int(size) for k, size in zip(keys, sizes, strict=True)}

    return sync(collect())


def _chunk_keys(group: zarr.Group, name: str) -> list[str]:
    array = group[name]
    return [f"{name}/{array.metadata.encode_chunk_key(c)}" for c in np.ndindex(*array.cdata_shape)]


def store_index(group: zarr.Group) -> dict[str, Any]:
    """The chunk count of X and y and a SHA-256 of their chunk listing (each key and size)."""
    listing = _listing(group)
    keys = {name: _chunk_keys(group, name) for name in ("X", "y")}
    lines = "".join(f"{k} {listing.get(k, -1)}\n" for name in ("X", "y") for k in keys[name])
    return {
        "chunks": {n: len(k) for n, k in keys.items()},
        "sha256": hashlib.sha256(lines.encode()).hexdigest(),
    }


def check_store(group: zarr.Group, where: str) -> None:
    """StoreError unless every chunk of X and y has its file and, when the store records its
    index, the listing still matches it. Lists the store; reads no chunk."""
    listing = _listing(group)
    for name in ("X", "y"):
        keys = _chunk_keys(group, name)
        for c, key in enumerate(keys):
            if key not in listing:
                raise StoreError(_missing(where, key, c, len(keys), name))
    recorded = group.attrs.get("index")
    if recorded is not None and store_index(group) != recorded:
        raise StoreError(
            f"{where}: its chunk files changed since it was written (their listing no longer matches "
            f"the index recorded at conversion, {recorded['chunks']} chunks); convert the dataset again"
        )


def _create_array(
    group: zarr.Group, name: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: Any
) -> Any:
    # every chunk gets its file, an all-zero one too: a missing file then always means damage
    return group.create_array(
        name, shape=shape, chunks=chunks, dtype=dtype, config={"write_empty_chunks": True}
    )


def write_store(
    X: da.Array, y: da.Array, path: str | Path, *, attrs: dict[str, Any], overwrite: bool = False
) -> Path:
    """Write X and y to a new store at `path`, atomically: a temp folder, then one rename.

    `attrs` (JSON-able) are saved with the store. An existing store at `path` raises
    FileExistsError unless `overwrite`, in which case it is replaced only once the new one is
    complete. On any error the temporary folder is removed.
    """
    import dask.array as da
    import zarr

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
        # on threads of our own, so that an error waits for the writes in flight: dask raises the
        # first error at once while other threads still write chunks, which would land in the
        # temporary folder after it was removed
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            da.store([X, y], [zx, zy], lock=False, scheduler="threads", pool=pool)
        group.attrs["index"] = store_index(group)
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
