"""Chunk sizes along the sample axis, chosen for a batch size.

Every dataset in dasknn is a dask array chunked along samples only. A chunk holds a whole number of
batches and about `CHUNK_BYTES` of float32 data, so a batch is cut from one chunk (or two, where a
chunk boundary falls inside it) and a chunk is a few MB: large enough that per-task overhead is
small, small enough that a worker holds many.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import dask.array as da
import numpy as np

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_BATCH_SIZE",
    "check_batch_size",
    "from_numpy",
    "sample_chunks",
    "samples_per_chunk",
]

CHUNK_BYTES = 4 * 2**20
"""Target size of one chunk of float32 samples (4 MiB)."""

DEFAULT_BATCH_SIZE = 64


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
    x = np.asarray(x)
    return da.from_array(x, chunks=sample_chunks(x.shape[0], x.shape[1:], batch_size))
