"""Batches streamed from the data's source on a worker, read ahead by a thread, never persisted: a
group's lead worker computes only the chunks its batches lie in, keeps those of two shuffle
windows, and a `StreamReader` runs `prefetch` batches ahead of the loop; `stream_reads` counts what
each source delivered. docs/architecture.md, "The data path".
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .batching import BatchOrder, check_window

__all__ = ["StreamSource", "StreamReader", "reset_stream_reads", "stream_reads"]

_READS: dict[str, dict[str, np.ndarray]] = {}  # source name → {"samples": counts, "chunks": counts}
_READS_LOCK = threading.Lock()


def stream_reads(name: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """What this process's readers have read so far, per source name (or of one source): how many
    times each sample was delivered in a batch and each chunk loaded from the source."""
    with _READS_LOCK:
        picked = _READS if name is None else {k: v for k, v in _READS.items() if k == name}
        return {k: {what: counts.copy() for what, counts in v.items()} for k, v in picked.items()}


def reset_stream_reads() -> int:
    """Forget the counts of `stream_reads`; returns how many sources were counted."""
    with _READS_LOCK:
        n = len(_READS)
        _READS.clear()
    return n


def _count(name: str, n_samples: int, n_chunks: int, what: str, where: np.ndarray | int) -> None:
    with _READS_LOCK:
        counts = _READS.setdefault(
            name,
            {"samples": np.zeros(n_samples, dtype=np.int64), "chunks": np.zeros(n_chunks, dtype=np.int64)},
        )
        np.add.at(counts[what], where, 1)


@dataclass(frozen=True, eq=False)
class StreamSource:
    """The training data as workers stream it: X a dask array chunked along samples only (its
    graph reads the source: zarr chunks, image files), y the labels in memory (one int per sample)."""

    X: Any
    y: np.ndarray
    chunks: tuple[int, ...] = field(init=False)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        import dask.array as da

        if not isinstance(self.X, da.Array):
            raise ValueError(f"a stream source needs X as a dask array, got {type(self.X).__name__}")
        if any(np.isnan(c) for c in self.X.chunks[0]) or any(len(c) > 1 for c in self.X.chunks[1:]):
            raise ValueError("a stream source needs X chunked along samples only, with known chunk sizes")
        y = np.asarray(self.y)
        if y.shape != (self.X.shape[0],):
            raise ValueError(f"X has {self.X.shape[0]} samples but y has shape {y.shape}")
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "chunks", tuple(int(c) for c in self.X.chunks[0]))
        object.__setattr__(self, "name", str(self.X.name))

    def read_chunk(self, c: int) -> np.ndarray:
        """Chunk c of X computed here, from the source, by dask's synchronous scheduler."""
        out = np.asarray(self.X.blocks[c].compute(scheduler="sync"))
        _count(self.name, self.X.shape[0], len(self.chunks), "chunks", c)
        return out


class StreamReader:
    """The batches `batches` (global batch numbers, in the order the loop asks for them) of
    `source` in `BatchOrder(source.chunks, batch_size, seed, window)`'s order, read `prefetch`
    ahead by a thread; `get(b)` returns the next one, `(prepare(x, b), y)`. `close()` when done.

    With `rows=(lo, hi)`, x holds only samples lo:hi of each batch (a worker's shard: only the
    chunks those samples lie in are read) while y still holds every label of the batch."""

    def __init__(
        self,
        source: StreamSource,
        batch_size: int,
        seed: int,
        batches: Iterable[int],
        *,
        window: int = 1,
        prefetch: int = 2,
        prepare: Callable[[np.ndarray, int], np.ndarray] | None = None,
        timeout: float = 120.0,
        rows: tuple[int, int] | None = None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1 (batches), got {prefetch!r}")
        if rows is not None and not 0 <= rows[0] < rows[1] <= batch_size:
            raise ValueError(f"rows {rows} are not a part of a batch of {batch_size}")
        self.rows = None if rows is None else slice(int(rows[0]), int(rows[1]))
        self.source = source
        self.window = check_window(window)
        self.order = BatchOrder(source.chunks, batch_size, seed, self.window)
        self.starts = np.concatenate([[0], np.cumsum(source.chunks)[:-1]]).astype(np.int64)
        self.prepare, self.timeout = prepare, float(timeout)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(iter(batches),), name="dasknn-stream", daemon=True
        )
        self._thread.start()

    def _chunk(self, c: int) -> np.ndarray:
        if c in self._cache:
            self._cache.move_to_end(c)
            return self._cache[c]
        self._cache[c] = self.source.read_chunk(c)
        while len(self._cache) > 2 * self.window:
            self._cache.popitem(last=False)
        return self._cache[c]

    def read(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch b (its `rows`) in the source's dtype, with its labels (in the calling thread)."""
        idx = self.order.indices(b)
        labels = self.source.y[idx]
        if self.rows is not None:
            idx = idx[self.rows]
        owner = np.searchsorted(self.starts, idx, side="right") - 1
        x = None
        for c in dict.fromkeys(owner.tolist()):
            block = self._chunk(c)
            rows = owner == c
            if x is None:
                x = np.empty((len(idx), *block.shape[1:]), dtype=block.dtype)
            x[rows] = block[idx[rows] - self.starts[c]]
        _count(self.source.name, len(self.source.y), len(self.source.chunks), "samples", idx)
        return x, labels

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, batches) -> None:
        for b in batches:
            if self._stop.is_set():
                return
            try:
                x, y = self.read(b)
                if self.prepare is not None:
                    x = self.prepare(x, b)
                item = (b, x, y, None)
            except BaseException as err:  # handed to the loop, which raises it
                item = (b, None, None, err)
            if not self._put(item) or item[3] is not None:
                return

    def get(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The next batch, which must be batch b; raises what reading it raised (TimeoutError after
        `timeout` s without it)."""
        try:
            got, x, y, err = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(
                f"batch {b} was not read from the source within {self.timeout:.0f} s"
            ) from None
        if err is not None:
            raise err
        if got != b:
            raise RuntimeError(f"the stream read batch {got} where batch {b} was asked for")
        return x, y

    def close(self) -> None:
        """Stop the reading thread (it ends within ~0.1 s) and drop what it read ahead."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5.0)
        self._cache.clear()
