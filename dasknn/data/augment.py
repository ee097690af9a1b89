"""Data augmentation on the workers: Caffe's crop and mirror, random shifts, seeded per batch.

Caffe's DataTransformer (`transform_param { crop_size mirror }`): in training each image is cut at
a random (h, w) offset to crop_size × crop_size and flipped left-right with probability ½; in
testing it is cut at the centre and never flipped. For small images such as digits, where a
mirror would change the class, `shift` moves each image by up to that many pixels along each axis
with zero padding (the image keeps its size). Every draw of a batch comes from
`augment_rng(seed, batch)`, so a batch is augmented the same way whichever worker, group or run
(resumed or not) computes it. The functions are pure: arrays in, arrays out, any dtype (uint8
stays uint8), numpy or cupy for the random ops and numpy, cupy or dask for the centre crop.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import array_module

__all__ = [
    "AUGMENT_STREAM",
    "Augment",
    "as_augment",
    "augment_rng",
    "centre_crop",
    "random_crop",
    "random_mirror",
    "random_shift",
]

AUGMENT_STREAM = 7
"""The stream of a batch's augmentation draws (`augment_rng`); other streams: `engine.streams`."""

DIGIT_SHIFT = 2
"""Pixels of the "shift" preset: ±2 px on 28×28 digits, the usual MNIST augmentation."""


def augment_rng(seed: int, batch: int) -> np.random.Generator:
    """The generator of global batch `batch`'s augmentation in a run seeded `seed`."""
    return np.random.default_rng([int(seed), AUGMENT_STREAM, int(batch)])


def _check_4d(x: Any, what: str) -> None:
    if x.ndim != 4:
        raise ValueError(f"{what} expects 4-D (n, channels, height, width) input; got shape {x.shape}")


def _crops(x: Any, h: int, w: int, oy: np.ndarray, ox: np.ndarray) -> Any:
    """x[i, :, oy[i]:oy[i]+h, ox[i]:ox[i]+w] for every image i, as one array."""
    xp = array_module(x)
    rows = xp.asarray(oy)[:, None] + xp.arange(h)[None, :]  # (n, h)
    cols = xp.asarray(ox)[:, None] + xp.arange(w)[None, :]  # (n, w)
    n = xp.arange(x.shape[0])[:, None, None]
    out = x.transpose(0, 2, 3, 1)[n, rows[:, :, None], cols[:, None, :]]  # (n, h, w, C)
    return xp.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _draw(rng: np.random.Generator, high: int, x: Any, rows: tuple[int, int, int] | None) -> np.ndarray:
    """One integer in [0, high) per image of x; with `rows` (lo, hi, n), x is rows lo:hi of a batch
    of n, and it gets those rows' draws of the whole batch's (a shard sees what the batch would)."""
    if rows is None:
        return rng.integers(0, high, size=x.shape[0])
    lo, hi, n = rows
    if hi - lo != x.shape[0] or not 0 <= lo <= hi <= n:
        raise ValueError(f"rows {lo}:{hi} of a batch of {n} do not match {x.shape[0]} images")
    return rng.integers(0, high, size=n)[lo:hi]


def random_crop(x: Any, size: int, rng: np.random.Generator, rows: tuple[int, int, int] | None = None) -> Any:
    """Each image cut to size × size at its own offset, uniform in [0, H − size] × [0, W − size]."""
    _check_4d(x, "random_crop")
    h, w = x.shape[2], x.shape[3]
    if size > min(h, w):
        raise ValueError(f"crop_size {size} is larger than the {h}×{w} images")
    oy = _draw(rng, h - size + 1, x, rows)
    ox = _draw(rng, w - size + 1, x, rows)
    return _crops(x, size, size, oy, ox)


def centre_crop(x: Any, size: int) -> Any:
    """Every image cut to size × size at Caffe's test offset ((H − size) // 2, (W − size) // 2)."""
    _check_4d(x, "centre_crop")
    h, w = x.shape[2], x.shape[3]
    if size > min(h, w):
        raise ValueError(f"crop_size {size} is larger than the {h}×{w} images")
    oy, ox = (h - size) // 2, (w - size) // 2
    return x[:, :, oy : oy + size, ox : ox + size]


def random_mirror(x: Any, rng: np.random.Generator, rows: tuple[int, int, int] | None = None) -> Any:
    """Each image flipped left-right with probability ½ (Caffe's `mirror`)."""
    _check_4d(x, "random_mirror")
    xp = array_module(x)
    flip = xp.asarray(_draw(rng, 2, x, rows).astype(bool))
    return xp.where(flip[:, None, None, None], x[:, :, :, ::-1], x)


def random_shift(
    x: Any, shift: int, rng: np.random.Generator, rows: tuple[int, int, int] | None = None
) -> Any:
    """Each image moved by its own (dy, dx), each uniform in [−shift, shift], the uncovered border
    filled with zeros; the image keeps its size."""
    _check_4d(x, "random_shift")
    xp = array_module(x)
    padded = xp.pad(x, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
    h, w = x.shape[2], x.shape[3]
    oy = _draw(rng, 2 * shift + 1, x, rows)
    ox = _draw(rng, 2 * shift + 1, x, rows)
    return _crops(padded, h, w, oy, ox)


@dataclass(frozen=True)
class Augment:
    """What the workers do to each training batch: ``DistributedCNN(augment=...)``.

    Each batch's draws come from the fit's ``random_state`` and the batch's number, in the order
    crop, mirror, shift, so that runs and resumes see the same batches.

    Parameters
    ----------
    crop_size : int, optional
        Caffe's crop: a random crop_size × crop_size cut in training and the centre one when
        scoring and predicting; the net then takes crop_size inputs.
    mirror : bool, default False
        Caffe's mirror: flip left-right with probability ½.
    shift : int, default 0
        Move each image by up to this many pixels, with zero padding.

    Examples
    --------
    >>> from dasknn.data.augment import Augment
    >>> Augment(crop_size=227, mirror=True)
    Augment(crop_size=227, mirror=True, shift=0)
    """

    crop_size: int | None = None
    mirror: bool = False
    shift: int = 0

    def __post_init__(self) -> None:
        c = self.crop_size
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1):
            raise ValueError(f"crop_size must be None or an integer >= 1, got {c!r}")
        if not isinstance(self.mirror, (bool, np.bool_)):
            raise ValueError(f"mirror must be True or False, got {self.mirror!r}")
        s = self.shift
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0:
            raise ValueError(f"shift must be an integer >= 0 (pixels), got {s!r}")

    def sample_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The (C, H, W) the net sees for stored samples of `shape` (cropped with crop_size)."""
        c, h, w = (int(s) for s in shape)
        if self.crop_size is None:
            return (c, h, w)
        if self.crop_size > min(h, w):
            raise ValueError(f"crop_size {self.crop_size} is larger than the {h}×{w} images of X")
        return (c, self.crop_size, self.crop_size)

    def train(self, x: Any, seed: int, batch: int, rows: tuple[int, int, int] | None = None) -> Any:
        """Global batch `batch` of a run seeded `seed`, augmented for training; with `rows` (lo, hi,
        n), x is rows lo:hi of that batch of n (a worker's shard), augmented as in the whole batch."""
        rng = augment_rng(seed, batch)
        if self.crop_size is not None:
            x = random_crop(x, self.crop_size, rng, rows)
        if self.mirror:
            x = random_mirror(x, rng, rows)
        if self.shift:
            x = random_shift(x, self.shift, rng, rows)
        return x

    def test(self, x: Any) -> Any:
        """Samples as the net sees them when it is scored or predicts: centre-cropped, no draws."""
        return x if self.crop_size is None else centre_crop(x, self.crop_size)


def as_augment(value: Any) -> Augment | None:
    """DistributedCNN's `augment`: None, "shift" (±2 px, no mirror: digits), "crop_mirror:SIZE"
    (Caffe's crop and mirror), a dict of Augment's fields, or an Augment."""
    if value is None or isinstance(value, Augment):
        return value
    if isinstance(value, dict):
        try:
            return Augment(**value)
        except TypeError as err:
            raise ValueError(f"augment: {err}") from None
    if isinstance(value, str):
        if value == "shift":
            return Augment(shift=DIGIT_SHIFT)
        if value.startswith("crop_mirror:") and value.split(":", 1)[1].isdigit():
            return Augment(crop_size=int(value.split(":", 1)[1]), mirror=True)
    raise ValueError(
        f"augment must be None, 'shift', 'crop_mirror:SIZE', a dict of Augment fields or an Augment; "
        f"got {value!r}"
    )
