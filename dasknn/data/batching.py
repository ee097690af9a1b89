"""Batches of an epoch as lazy dask arrays, shuffled without materialising the dataset: each epoch
visits the chunks in a random order and each chunk's samples in a random order (w chunks together
with a shuffle window w), drawn from `numpy.random.default_rng([seed, epoch])`, so the order is a
pure function of (seed, epoch, chunk sizes, window). docs/architecture.md, "The data path".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .chunks import check_batch_size, from_numpy, is_dask_array, select_rows

if TYPE_CHECKING:
    import dask.array as da

__all__ = [
    "BatchOrder",
    "check_window",
    "compute_batch",
    "epoch_indices",
    "epoch_order",
    "iterate_batches",
    "n_batches",
    "window_indices",
]


def n_batches(n_samples: int | Any, batch_size: int, *, drop_last: bool = True) -> int:
    """Batches per epoch for `n_samples` samples (or an array's length): floor, or ceil without drop_last."""
    n = n_samples if isinstance(n_samples, (int, np.integer)) else len(n_samples)
    batch_size = check_batch_size(batch_size)
    return int(n) // batch_size if drop_last else -(-int(n) // batch_size)


def epoch_order(
    chunks: Sequence[int], *, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> Iterator[tuple[int, np.ndarray]]:
    """(chunk index, order of that chunk's samples) in the order an epoch visits them.

    With `shuffle`, chunks come in a random order and each chunk's samples in a random order, all
    drawn from `default_rng([seed, epoch])`; without, everything in storage order.
    """
    _check_seed(seed, epoch)
    return _epoch_order(chunks, epoch, seed, shuffle)


def check_window(window: int) -> int:
    """The shuffle window (chunks shuffled together), an integer >= 1."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"shuffle window must be an integer >= 1 (chunks); got {window!r}")
    return int(window)


def window_indices(chunks: Sequence[int], *, epoch: int = 0, seed: int = 0, window: int = 1) -> np.ndarray:
    """The global sample indices of one shuffled epoch: chunks permuted, then the samples of each
    run of `window` consecutive permuted chunks shuffled together, all from `default_rng([seed,
    epoch])`. `window=1` is `epoch_indices`'s order (the same draws)."""
    _check_seed(seed, epoch)
    window = check_window(window)
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(np.int64)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(chunks))
    parts = []
    for w in range(0, len(perm), window):
        pool = np.concatenate(
            [starts[c] + np.arange(chunks[c], dtype=np.int64) for c in perm[w : w + window]]
        )
        parts.append(pool[rng.permutation(len(pool))])
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _check_seed(seed: int, epoch: int) -> None:
    for name, value in (("seed", seed), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer; got {value!r}")


def _epoch_order(
    chunks: Sequence[int], epoch: int, seed: int, shuffle: bool
) -> Iterator[tuple[int, np.ndarray]]:
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        for c in rng.permutation(len(chunks)):
            yield int(c), rng.permutation(chunks[c])
    else:
        for c, size in enumerate(chunks):
            yield c, np.arange(size)


def epoch_indices(
    chunks: Sequence[int], *, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> np.ndarray:
    """The global sample indices of one epoch in visiting order (one int64 per sample)."""
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(np.int64)
    parts = [starts[c] + order for c, order in epoch_order(chunks, epoch=epoch, seed=seed, shuffle=shuffle)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


class BatchOrder:
    """The global sample indices of batch b of an endless stream of epochs: rows
    [pos·B, (pos+1)·B) of epoch b // n_batches's order (`window_indices`), last partial batch
    dropped; with `window=1` exactly the batches `iterate_batches` yields. The current epoch's
    order is kept. A pure function of (chunks, batch size, seed, window, b): a resumed run that
    starts at batch b sees the batches an uninterrupted one does."""

    def __init__(self, chunks: Sequence[int], batch_size: int, seed: int = 0, window: int = 1) -> None:
        self.chunks = tuple(int(c) for c in chunks)
        self.batch_size = check_batch_size(batch_size)
        self.seed = seed
        self.window = check_window(window)
        self.n_batches = n_batches(int(sum(self.chunks)), self.batch_size)
        if self.n_batches == 0:
            raise ValueError(f"batch_size {batch_size} is larger than the {sum(self.chunks)} samples")
        self._order: tuple[int, np.ndarray] | None = None

    def indices(self, b: int) -> np.ndarray:
        epoch, pos = divmod(int(b), self.n_batches)
        if self._order is None or self._order[0] != epoch:
            order = window_indices(self.chunks, epoch=epoch, seed=self.seed, window=self.window)
            self._order = (epoch, order)
        return self._order[1][pos * self.batch_size : (pos + 1) * self.batch_size]


def _shuffled(block: da.Array, order: np.ndarray, shuffle: bool) -> da.Array:
    if not shuffle:
        return block
    return block.map_blocks(select_rows, order, dtype=block.dtype, meta=block._meta)


def _join(pieces: list[da.Array]) -> da.Array:
    if len(pieces) == 1:
        return pieces[0]
    import dask.array as da

    return da.concatenate(pieces, axis=0).rechunk({0: -1})


def _aligned_labels(y: Any, X: da.Array) -> da.Array:
    if not is_dask_array(y):
        y = np.asarray(y)
    if y.ndim == 0 or y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has shape {y.shape}")
    if not is_dask_array(y):
        import dask.array as da

        return da.from_array(y, chunks=(X.chunks[0],) + tuple((s,) for s in y.shape[1:]))
    return y if y.chunks[0] == X.chunks[0] else y.rechunk({0: X.chunks[0]})


def iterate_batches(
    X: da.Array | np.ndarray,
    y: da.Array | np.ndarray | None = None,
    batch_size: int = 64,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    transform: Callable[[da.Array], da.Array] | None = None,
) -> Iterator[tuple[da.Array, da.Array | None]]:
    """One epoch of (Xb, yb) batches, each a lazy single-chunk dask array of `batch_size` samples.

    The order is a pure function of (seed, epoch) and the chunks (see the module docstring).
    `drop_last=True` skips the final short batch (so every batch has `batch_size` samples);
    `drop_last=False` yields it, and the epoch visits every sample exactly once. `transform`
    (e.g. a `Transform`) is applied lazily to each Xb. y (optional) is rechunked to X's chunks
    when they differ; numpy inputs are wrapped as dask arrays. `n_batches` gives the count.
    """
    batch_size = check_batch_size(batch_size)
    X = X if is_dask_array(X) else from_numpy(X, batch_size)
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first")
    if y is not None:
        y = _aligned_labels(y, X)
    order = epoch_order(X.chunks[0], epoch=epoch, seed=seed, shuffle=shuffle)
    return _batches(X, y, batch_size, order, shuffle=shuffle, drop_last=drop_last, transform=transform)


def _batches(
    X: da.Array,
    y: da.Array | None,
    batch_size: int,
    order: Iterator[tuple[int, np.ndarray]],
    *,
    shuffle: bool,
    drop_last: bool,
    transform: Callable[[da.Array], da.Array] | None,
) -> Iterator[tuple[da.Array, da.Array | None]]:
    pieces_x: list[da.Array] = []
    pieces_y: list[da.Array] = []
    filled = 0
    for c, within in order:
        xs = _shuffled(X.blocks[c], within, shuffle)
        ys = _shuffled(y.blocks[c], within, shuffle) if y is not None else None
        pos = 0
        while pos < len(within):
            take = min(batch_size - filled, len(within) - pos)
            pieces_x.append(xs[pos : pos + take])
            if ys is not None:
                pieces_y.append(ys[pos : pos + take])
            filled += take
            pos += take
            if filled == batch_size:
                yield _finish(pieces_x, pieces_y, transform)
                pieces_x, pieces_y, filled = [], [], 0
    if filled and not drop_last:
        yield _finish(pieces_x, pieces_y, transform)


def _finish(
    pieces_x: list[da.Array], pieces_y: list[da.Array], transform: Callable[[da.Array], da.Array] | None
) -> tuple[da.Array, da.Array | None]:
    Xb = _join(pieces_x)
    if transform is not None:
        Xb = transform(Xb)
    return Xb, (_join(pieces_y) if pieces_y else None)


def compute_batch(Xb: da.Array, yb: da.Array | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A batch as numpy arrays, computed in one `dask.compute` call (shared chunks read once)."""
    import dask

    return dask.compute(Xb, yb)
