"""In-process training: one SGD iteration of a Net, and a loop over in-memory arrays.

The reference every distributed engine must agree with: with one group and one worker, the Dask
engine's weights after n iterations equal `train_step` applied n times to the same batches.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dasknn.backend import array_module, to_device
from dasknn.nn.net import Net
from dasknn.nn.scoring import batch_scores, totals
from dasknn.nn.solver import SGD


def train_step(
    net: Net,
    solver: SGD,
    xb,
    yb,
    rng: np.random.Generator | None = None,
    lr: float | None = None,
    momentum: float | None = None,
) -> tuple[float, float]:
    """Forward, backward and one solver update on a batch; returns (loss, batch accuracy)."""
    loss, acc, grads = net.loss_and_grads(xb, yb, rng=rng)
    if not np.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at iteration {solver.iter}; lower the learning rate")
    solver.step(net.params, grads, lr=lr, momentum=momentum)
    return loss, acc


def _module_of(net: Net):
    """The array module the net's parameters live in (numpy for a net without any)."""
    return array_module(next(iter(net.params.values()), None))


def shuffled_batches(n: int, batch_size: int, seed: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Endless (epoch, indices) batches: a new seeded permutation each epoch, last partial batch dropped."""
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} is larger than the {n} samples")
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for i in range(0, n - batch_size + 1, batch_size):
            yield epoch, order[i : i + batch_size]
        epoch += 1


def train_arrays(
    net: Net,
    solver: SGD,
    X,
    y,
    batch_size: int = 64,
    iterations: int = 100,
    seed: int = 0,
    callback: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train on in-memory arrays (numpy or cupy) for `iterations` SGD steps; returns the history.

    Each batch moves to the net's device (no copy when data and net share one).
    X is already transformed (scaled) float data of shape (N, *net.input_shape); y integer labels.
    One history row per iteration: iteration, epoch, time (s since start), loss, accuracy, lr.
    """
    xp, data_xp = _module_of(net), array_module(X)
    y = np.asarray(y) if data_xp is np else y
    rng = np.random.default_rng([seed, 1])
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    batches = shuffled_batches(X.shape[0], batch_size, seed)
    for _ in range(iterations):
        epoch, idx = next(batches)
        idx = idx if data_xp is np else data_xp.asarray(idx)
        lr = solver.current_lr()
        xb, yb = to_device(X[idx], xp), to_device(y[idx], xp)
        loss, acc = train_step(net, solver, xb, yb, rng=rng)
        row = {
            "iteration": solver.iter,
            "epoch": epoch,
            "time": time.perf_counter() - start,
            "loss": loss,
            "accuracy": acc,
            "lr": lr,
        }
        history.append(row)
        if callback is not None:
            callback(row)
    return history


EVAL_BATCH_BYTES = 128 * 2**20
"""The blobs' bytes of one scoring batch (`scoring_batch_size`): a small net scores more images per
forward, where each forward's fixed cost (layer calls, kernel set-up, threads) is spread thinner."""


def scoring_batch_size(net: Net, floor: int = 256, ceiling: int = 4096) -> int:
    """Images per forward when scoring: as many as fit `EVAL_BATCH_BYTES` of the net's blobs (all
    of them, as float32), within [floor, ceiling] (LeNet's 20,194 values an image give 1,661;
    experiments/README.md, "Measurements behind the code's choices")."""
    per_image = 4 * sum(math.prod(shape) for shape in net.blob_shapes.values())
    return int(min(ceiling, max(floor, EVAL_BATCH_BYTES // max(1, per_image))))


def evaluate(net: Net, X, y, batch_size: int = 256) -> tuple[float, float]:
    """(mean loss, accuracy) of the net on in-memory data (numpy or cupy), in test mode, one batch
    after another (`nn.scoring.Scorer` runs them side by side).

    Each batch of images and labels moves to the net's device first, so numpy data meets a CuPy
    net (and the reverse) without mixing array modules."""
    starts = range(0, X.shape[0], batch_size)
    scores = [batch_scores(net, X[i : i + batch_size], y[i : i + batch_size]) for i in starts]
    return totals(scores, [min(batch_size, X.shape[0] - i) for i in starts])
