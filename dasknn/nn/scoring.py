"""Scoring a net on fixed in-memory sets, its batches side by side on a few threads.

A fit scores the same held-out samples after every kept run (`dasknn.fitting.Evaluator`), in the
driver process, while the workers wait. The batches are independent forwards, so `Scorer` runs them on a
pool of threads, one copy of the net each (a layer notes what ran in it; oneDNN's primitives are
shared, built per thread count, each call with its own scratch space: `nn.onednn.kernels`), the
process's BLAS/OpenMP threads shared out among them (`threads_per_batch`). Each batch's (mean
loss, correct) is the one `nn.train.evaluate` computes with that many threads, and the sums run in
batch order, so the scores do not depend on which thread finished first. OpenMP threads that wait
at a barrier for a core another process holds slow a forward several times over on a busy
machine; one thread a batch never waits.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dasknn.backend import array_module, cpu_cores, to_device
from dasknn.nn.loss import softmax_with_loss
from dasknn.nn.net import Net

__all__ = ["Scorer", "Statistics", "batch_scores", "process_threads", "threads_per_batch", "totals"]


def batch_scores(net: Net, X, y) -> tuple[float, int]:
    """(mean loss, correct predictions) of the net on one batch, in test mode; the batch moves to
    the net's device first."""
    xp = array_module(next(iter(net.params.values()), None))
    logits, _ = net.forward(to_device(X, xp), train=False)
    yb = to_device(y, xp)
    loss, _ = softmax_with_loss(logits, yb)
    return loss, int((logits.argmax(axis=1) == yb).sum())


def totals(scores: list[tuple[float, int]], sizes: list[int]) -> tuple[float, float]:
    """(mean loss, accuracy) over batches of `sizes` samples from their `batch_scores`, summed in
    batch order."""
    total_loss, correct = 0.0, 0
    for (loss, right), size in zip(scores, sizes, strict=True):
        total_loss += loss * size
        correct += right
    n = sum(sizes)
    return total_loss / n, correct / n


def process_threads() -> int:
    """The threads this process computes with now: its BLAS pool's (which a Dask worker's setup, or
    `backend.blas_threads`, limits), else its cores."""
    from threadpoolctl import threadpool_info

    blas = [info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"]
    return max(1, int(blas[0])) if blas else cpu_cores()


def threads_per_batch(threads: int, n_batches: int) -> tuple[int, int]:
    """(batches side by side, BLAS/OpenMP threads each) sharing `threads` over `n_batches`."""
    side_by_side = max(1, min(threads, n_batches))
    return side_by_side, max(1, threads // side_by_side)


class Scorer:
    """(mean loss, accuracy) of a net's parameters on named in-memory sets, `batch_size` images a
    forward, the batches over `threads` threads (default `process_threads()`, shared out by
    `threads_per_batch`). With one thread, or a net on a GPU, the batches run one after another in
    the calling thread, as `nn.train.evaluate` runs them. `scored`: the samples scored so far."""

    def __init__(
        self, net: Net, sets: Mapping[str, tuple[Any, Any]], batch_size: int, threads: int | None = None
    ) -> None:
        self.sets = dict(sets)
        self.batch_size = int(batch_size)
        self.batches = [
            (name, start, min(start + self.batch_size, int(X.shape[0])))
            for name, (X, _) in self.sets.items()
            for start in range(0, int(X.shape[0]), self.batch_size)
        ]
        self.sizes = [stop - start for _, start, stop in self.batches]
        on_cpu = array_module(next(iter(net.params.values()), None)) is np
        available = process_threads() if threads is None else int(threads)
        available = available if on_cpu else 1
        self.side_by_side, self.threads_each = threads_per_batch(available, len(self.batches))
        self.nets = [net.copy() for _ in range(self.side_by_side)]
        self._pool: ThreadPoolExecutor | None = None
        self.scored = 0

    def __call__(self, params: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
        for net in self.nets:
            net.set_params(params)
        self.scored += sum(self.sizes)
        if self.side_by_side == 1:
            scores = [self._batch(self.nets[0], b) for b in self.batches]
        else:
            scores = self._side_by_side()
        out: dict[str, tuple[float, float]] = {}
        for name in self.sets:
            mine = [i for i, batch in enumerate(self.batches) if batch[0] == name]
            out[name] = totals([scores[i] for i in mine], [self.sizes[i] for i in mine])
        return out

    def _batch(self, net: Net, batch: tuple[str, int, int]) -> tuple[float, int]:
        name, start, stop = batch
        X, y = self.sets[name]
        return batch_scores(net, X[start:stop], y[start:stop])

    def _side_by_side(self) -> list[tuple[float, int]]:
        """Every batch's scores, the largest batches first (the pool then ends evenly), each on a
        free copy of the net, under the BLAS/OpenMP limit of `threads_each`."""
        from threadpoolctl import threadpool_limits

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.side_by_side, thread_name_prefix="dasknn-scoring")
        free: queue.SimpleQueue[Net] = queue.SimpleQueue()
        for net in self.nets:
            free.put(net)

        def run(batch: tuple[str, int, int]) -> tuple[float, int]:
            net = free.get()
            try:
                return self._batch(net, batch)
            finally:
                free.put(net)

        order = sorted(range(len(self.batches)), key=lambda i: -self.sizes[i])
        scores: list[tuple[float, int]] = [(math.nan, 0)] * len(self.batches)
        with threadpool_limits(limits=self.threads_each):
            futures = {i: self._pool.submit(run, self.batches[i]) for i in order}
            for i, future in futures.items():
                scores[i] = future.result()
        return scores


class Statistics:
    """The running statistics of a net's BatchNorm layers recomputed for given weights ("precise
    BatchNorm", Wu & Johnson 2021): forwards in training mode over fixed training samples `X`,
    `batch_size` images at a time, each BatchNorm's batch statistics summed over them as the solver
    sums its contributions (n·mean, n·unbiased variance, n), so the running estimate is their
    mean over the samples. During training the running statistics trail weights that change
    quickly (a moving average over past weights), and the average of weight averaging holds
    averaged sums that no weights produced; scored with either, a net with BatchNorm is judged
    below what its weights do. `__call__` returns the parameters with those blobs replaced (the
    same mapping when the net has no running statistics to recompute)."""

    def __init__(self, net: Net, X, batch_size: int = 128) -> None:
        self.layers = [(i, layer) for i, layer in enumerate(net.layers) if getattr(layer, "statistics", None)]
        self.X = None if X is None or not len(X) or not self.layers else X
        self.batch_size = int(batch_size)
        self.net = net.copy() if self.X is not None else None
        self._lock = threading.Lock()
        self._last: tuple[tuple[Any, ...], Mapping[str, Any]] | None = None

    @property
    def applies(self) -> bool:
        """Whether the net has running statistics and there are samples to recompute them from."""
        return self.X is not None

    def __call__(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.X is None:
            return params
        # the same arrays: the same statistics (an evaluation, its confirmation and the model the
        # fit returns score one state; a state's arrays are never written in place, as rollbacks
        # go back to them); the memo holds the arrays, so no id is reused while it lasts
        arrays = tuple(params.values())
        with self._lock:
            if (
                self._last is None
                or len(self._last[0]) != len(arrays)
                or any(a is not b for a, b in zip(self._last[0], arrays, strict=True))
            ):
                self._last = (arrays, self._recompute(params))
            return self._last[1]

    def _recompute(self, params: Mapping[str, Any]) -> dict[str, Any]:
        net, X = self.net, self.X
        net.set_params(params)
        xp = array_module(next(iter(net.params.values()), None))
        rng = np.random.default_rng(0)  # a dropout layer's masks, if any: the same every time
        sums: dict[str, Any] = {}
        for start in range(0, int(X.shape[0]), self.batch_size):
            batch = to_device(X[start : start + self.batch_size], xp)
            _, caches = net.forward_heads(batch, train=True, rng=rng)
            for i, layer in self.layers:
                for blob, value in layer.contribution(caches[i]).items():
                    key = f"{layer.name}.{blob}"
                    sums[key] = value if key not in sums else sums[key] + value
        out = dict(params)
        for key, value in sums.items():
            like = params[key]
            out[key] = to_device(value, array_module(like)).astype(like.dtype, copy=False).reshape(like.shape)
        return out
