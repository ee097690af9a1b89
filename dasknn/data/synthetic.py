"""Learnable random images of any size, generated lazily chunk by chunk.

Each class has a prototype image: smooth random blobs (a random image at 1/4 resolution, upsampled
by 4 with nearest neighbour) with values in [0, 1]. A sample is its class's prototype plus Gaussian
noise of standard deviation `noise`, clipped to [0, 1]. Labels are uniform over the classes.

Sample i is a pure function of (seed, i) and the dataset's parameters (its noise has its own
random stream; labels come in fixed blocks of 4096), so each chunk is a pure function of (seed,
its sample range): no chunk depends on another, the data do not change with the chunking (or batch
size), nothing is held in memory, and the array can be far larger than memory (a 20 GB array is as
cheap to define as a 20 kB one; each batch costs only its own chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from .chunks import sample_chunks

__all__ = ["labels_of", "prototype", "synthetic"]

_BLOB = 4
_LABEL_BLOCK = 4096
_PROTOTYPE_STREAM, _LABEL_STREAM, _NOISE_STREAM = 0, 1, 2


def prototype(seed: int, label: int, shape: Sequence[int]) -> np.ndarray:
    """The prototype of class `label`: (C, H, W) float32 blobs in [0, 1], a function of (seed, label)."""
    c, h, w = shape
    rng = np.random.default_rng([seed, _PROTOTYPE_STREAM, label])
    coarse = rng.random((c, -(-h // _BLOB), -(-w // _BLOB)), dtype=np.float32)
    return np.repeat(np.repeat(coarse, _BLOB, axis=1), _BLOB, axis=2)[:, :h, :w]


def labels_of(seed: int, start: int, stop: int, n_classes: int) -> np.ndarray:
    """Labels of samples start..stop-1: uniform in 0..n_classes-1, drawn in fixed blocks of samples."""
    first, last = start // _LABEL_BLOCK, -(-stop // _LABEL_BLOCK)
    drawn = [
        np.random.default_rng([seed, _LABEL_STREAM, b]).integers(
            0, n_classes, size=_LABEL_BLOCK, dtype=np.int64
        )
        for b in range(first, last)
    ]
    offset = first * _LABEL_BLOCK
    return np.concatenate(drawn)[start - offset : stop - offset]


def _label_chunk(block_info: dict[Any, Any], *, seed: int, n_classes: int) -> np.ndarray:
    start, stop = block_info[None]["array-location"][0]
    return labels_of(seed, start, stop, n_classes)


def _image_chunk(
    block_info: dict[Any, Any],
    *,
    seed: int,
    shape: tuple[int, int, int],
    n_classes: int,
    noise: float,
) -> np.ndarray:
    start, stop = block_info[None]["array-location"][0]
    labels = labels_of(seed, start, stop, n_classes)
    out = np.empty((stop - start, *shape), dtype=np.float32)
    for i, sample in enumerate(range(start, stop)):
        rng = np.random.default_rng([seed, _NOISE_STREAM, sample])
        out[i] = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(noise)
    for label in np.unique(labels):
        out[labels == label] += prototype(seed, int(label), shape)
    return np.clip(out, 0.0, 1.0, out=out)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def synthetic(
    *,
    n_samples: int = 10_000,
    shape: Sequence[int] = (1, 28, 28),
    n_classes: int = 10,
    seed: int = 0,
    noise: float = 0.5,
    batch_size: int = 64,
) -> tuple[da.Array, da.Array]:
    """Images (n_samples, C, H, W) float32 in [0, 1] and labels (n_samples,) int64, lazy and seeded.

    `shape` is one sample's (C, H, W). See the module docstring for what the data look like; a
    nearest-prototype classifier separates the classes, so a CNN can learn them.
    """
    n_samples = _positive_int("n_samples", n_samples)
    n_classes = _positive_int("n_classes", n_classes)
    if isinstance(shape, (str, bytes)) or len(shape) != 3:
        raise ValueError(f"shape must be one sample's (channels, height, width); got {shape!r}")
    shape = tuple(_positive_int("shape entries", s) for s in shape)
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0; got {noise!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    chunks = sample_chunks(n_samples, shape, batch_size)
    tag = tokenize(seed, n_samples, shape, n_classes, float(noise), chunks[0])
    X = da.map_blocks(
        _image_chunk,
        chunks=chunks,
        dtype=np.float32,
        meta=np.empty((0,) * 4, dtype=np.float32),
        name=f"synthetic-images-{tag}",
        seed=int(seed),
        shape=shape,
        n_classes=n_classes,
        noise=float(noise),
    )
    y = da.map_blocks(
        _label_chunk,
        chunks=(chunks[0],),
        dtype=np.int64,
        meta=np.empty((0,), dtype=np.int64),
        name=f"synthetic-labels-{tag}",
        seed=int(seed),
        n_classes=n_classes,
    )
    return X, y
