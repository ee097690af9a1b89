"""How a group's loop gets its batches on its lead worker: from the persisted chunks, or streamed
from the data's source with read-ahead (`dasknn.data.stream`), then augmented and made float32 there.

Both follow `BatchOrder` (the data's chunks, the batch size, the run's seed and the shuffle
window), so a run sees the same batches whether its data is persisted or streamed, and a resumed
run the batches an uninterrupted one would have seen; the augmentation of batch b is drawn from
(seed, b) (`dasknn.data.augment`), the same on any worker.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dasknn.data.augment import Augment
from dasknn.data.batching import BatchOrder
from dasknn.data.stream import StreamReader

__all__ = ["BatchReader", "batch_reader", "group_batches", "prepare_batch"]


class BatchReader:
    """The samples of global batch b, read from the persisted chunks in the data's epoch order.

    Batch b is rows [pos·B, (pos+1)·B) of epoch b // n_batches's order (`BatchOrder` with the
    spec's `shuffle_window`; window 1: exactly the batches `iterate_batches` yields). Consecutive
    batches come from the same shuffled chunks, so the last 2·window chunks read are kept.
    """

    def __init__(self, client, spec: Any, keep: int = 2) -> None:
        window = getattr(spec, "shuffle_window", 1)
        self.client, self.spec, self.keep = client, spec, max(keep, 2 * window)
        self.starts = np.concatenate([[0], np.cumsum(spec.chunks)[:-1]]).astype(np.int64)
        self.order = BatchOrder(spec.chunks, spec.batch_size, spec.seed, window)
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _chunk(self, c: int):
        from distributed import Future

        if c not in self._chunks:
            # the driver persisted and waited for the chunks, so their futures are finished
            xf = Future(self.spec.x_keys[c], self.client, state="memory")
            yf = Future(self.spec.y_keys[c], self.client, state="memory")
            self._chunks[c] = tuple(self.client.gather([xf, yf]))
            while len(self._chunks) > self.keep:
                self._chunks.pop(next(iter(self._chunks)))
        return self._chunks[c]

    def get(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        bs = self.spec.batch_size
        idx = self.order.indices(b)
        owner = np.searchsorted(self.starts, idx, side="right") - 1
        x = y = None
        for c in dict.fromkeys(owner.tolist()):
            xc, yc = self._chunk(c)
            rows = owner == c
            if x is None:
                x = np.empty((bs, *xc.shape[1:]), dtype=xc.dtype)
                y = np.empty((bs,), dtype=yc.dtype)
            x[rows] = xc[idx[rows] - self.starts[c]]
            y[rows] = yc[idx[rows] - self.starts[c]]
        return x, y

    def close(self) -> None:
        """Drop the chunks kept."""
        self._chunks.clear()


def prepare_batch(
    augment: Augment | None, seed: int, x: np.ndarray, b: int, rows: tuple[int, int, int] | None = None
) -> np.ndarray:
    """Global batch b as the conv phase takes it: augmented for training (`augment.train`, seeded
    by (seed, b); with `rows` (lo, hi, n), x is that shard of the batch and gets its draws), then
    integer pixels made float32 (a uint8 batch is converted here, on the worker)."""
    if augment is not None:
        x = augment.train(x, seed, b, rows)
    return x.astype(np.float32) if x.dtype.kind in "biu" else x


def group_batches(spec: Any):
    """The global batches group `spec.group` of `spec.n_groups` takes, in order: first_batch +
    group + n_groups·i."""
    i = 0
    while spec.iterations is None or i < spec.iterations:
        yield spec.first_batch + spec.group + spec.n_groups * i
        i += 1


class _PersistedBatches:
    """A BatchReader whose batches pass through `prepare_batch`, read when asked for."""

    def __init__(self, client, spec: Any) -> None:
        self.reader, self.spec = BatchReader(client, spec), spec

    def get(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.reader.get(b)
        return prepare_batch(self.spec.augment, self.spec.seed, x, b), y

    def close(self) -> None:
        self.reader.close()


def batch_reader(client, spec: Any, rows: tuple[int, int] | None = None):
    """The group's batches: streamed from the source with read-ahead when the data is not
    persisted (`spec.source`), else cut from the persisted chunks; either way prepared
    (`prepare_batch`) on this worker. `rows` (lo, hi), streamed only: this worker's shard of
    each batch, the only samples it reads (the labels stay the whole batch's)."""
    if spec.source is None:
        if rows is not None:
            raise ValueError("a shard's rows are read apart only from a streamed source")
        return _PersistedBatches(client, spec)
    shard = None if rows is None else (int(rows[0]), int(rows[1]), int(spec.batch_size))
    return StreamReader(
        spec.source,
        spec.batch_size,
        spec.seed,
        group_batches(spec),
        window=spec.shuffle_window,
        prefetch=spec.prefetch,
        prepare=lambda x, b: prepare_batch(spec.augment, spec.seed, x, b, shard),
        timeout=spec.timeout,
        rows=rows,
    )
