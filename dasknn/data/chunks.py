"""Chunk sizes along the sample axis, chosen for a batch size.

Every dataset in dasknn is a dask array chunked along samples only. A chunk holds a whole number of
batches and about `CHUNK_BYTES` of float32 data, so a batch is cut from one chunk (or two, where a
chunk boundary falls inside it) and a chunk is a few MB: large enough that per-task overhead is
small, small enough that a worker holds many.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import dask.array as da

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_BATCH_SIZE",
    "check_batch_size",
    "from_numpy",
    "is_dask_array",
    "sample_chunks",
    "samples_per_chunk",
    "own_keys",
    "select_rows",
    "take_rows",
]

CHUNK_BYTES = 4 * 2**20
"""Target size of one chunk of float32 samples (4 MiB)."""

DEFAULT_BATCH_SIZE = 64


def is_dask_array(x: Any) -> bool:
    """Whether x is a dask array, without importing dask.array: where it was never imported, nothing
    can be one (dasknn imports dask where it first builds or reads one, so that `import dasknn`
    stays quick)."""
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(x, module.Array)


def check_batch_size(batch_size: int) -> int:
    """`batch_size` as a positive int, or a ValueError saying what it was."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    return int(batch_size)


def samples_per_chunk(sample_shape: Sequence[int], batch_size: int, *, itemsize: int = 4) -> int:
    """Samples in one chunk: the largest multiple of `batch_size` within CHUNK_BYTES, at least one batch."""
    batch_size = check_batch_size(batch_size)
    sample_bytes = max(1, math.prod(sample_shape) * itemsize)
    return batch_size * max(1, CHUNK_BYTES // (batch_size * sample_bytes))


def sample_chunks(
    n_samples: int, sample_shape: Sequence[int], batch_size: int, *, itemsize: int = 4
) -> tuple[tuple[int, ...], ...]:
    """Dask chunks for an array of `n_samples` samples of `sample_shape`, split along samples only.

    All chunks but the last hold `samples_per_chunk(...)` samples, a multiple of `batch_size`; the
    other axes are one chunk each.
    """
    per_chunk = samples_per_chunk(sample_shape, batch_size, itemsize=itemsize)
    full, rest = divmod(int(n_samples), per_chunk)
    along = (per_chunk,) * full + ((rest,) if rest or not full else ())
    return (along,) + tuple((int(s),) for s in sample_shape)


def from_numpy(x: np.ndarray, batch_size: int = DEFAULT_BATCH_SIZE) -> da.Array:
    """A numpy array as a dask array chunked along its first axis for `batch_size` (float32 sizing)."""
    import dask.array as da

    x = np.asarray(x)
    return da.from_array(x, chunks=sample_chunks(x.shape[0], x.shape[1:], batch_size))


def select_rows(block, index):
    """block[index]: the rows of one chunk a task keeps (a module-level function, so it pickles)."""
    return block[index]


def _same(block):
    return block


def own_keys(x: da.Array, owner: str) -> da.Array:
    """x under key names of its own for `owner` (one fit): `{name}-{tokenize(name, owner)}`.

    What one fit persists must not reuse the keys of the user's graph: a previous fit's persisted
    chunks may still be held (their release waits for Python's garbage collector) when the next
    fit submits the same keys in another form (fused into a reduction, or not), and the scheduler
    warns "Detected different run_spec" for them, which can deadlock. Under the owner's names the
    user's keys are only ever intermediates, fused away."""
    from dask.base import tokenize

    name = f"{x.name.split('-')[0]}-own-{tokenize(x.name, owner)}"
    return x.map_blocks(_same, name=name, dtype=x.dtype, meta=x._meta)


def take_rows(x: da.Array, index) -> da.Array:
    """x[index] along samples for a strictly increasing `index`, lazily: one row selection inside each
    chunk that holds some of the rows (a task that reads only its chunk), concatenated in order.

    dask's own fancy indexing plans a shuffle across chunks, and computing any part of it can read
    every chunk at once; this keeps a held-out or training part of an array larger than memory
    readable chunk by chunk."""
    index = np.asarray(index, dtype=np.int64).ravel()
    if not is_dask_array(x):  # an in-memory array: plain indexing reads nothing twice
        return x[index]
    if index.size and (index[0] < 0 or index[-1] >= x.shape[0] or np.any(np.diff(index) <= 0)):
        raise ValueError(f"index must be strictly increasing sample numbers below {x.shape[0]}")
    bounds = np.cumsum((0, *x.chunks[0]))
    pieces = []
    for b in range(len(x.chunks[0])):
        lo, hi = np.searchsorted(index, [bounds[b], bounds[b + 1]])
        if hi > lo:
            local = index[lo:hi] - bounds[b]
            chunks = ((int(hi - lo),), *x.chunks[1:])
            pieces.append(x.blocks[b].map_blocks(select_rows, local, chunks=chunks, dtype=x.dtype))
    import dask.array as da

    return da.concatenate(pieces, axis=0) if pieces else x[:0]
