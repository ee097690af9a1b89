"""Caffe's `transform_param` (mean subtraction and scaling) for numpy and dask arrays."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import array_module

__all__ = ["Transform"]


@dataclass(frozen=True)
class Transform:
    """out = (x − mean_value[c]) · scale, in float32: Caffe's DataTransformer order (mean first, then scale).

    `mean_value` is one value for every channel or one per channel (Caffe's repeated `mean_value`),
    in the units of the input: with Caffe's usual `scale: 0.00390625` (1/256) the input is raw
    0..255 pixels, so pair such a Transform with `load(..., raw=True)`. Works on NCHW numpy, cupy
    and dask arrays (lazily on dask).
    """

    scale: float = 1.0
    mean_value: float | Sequence[float] | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite; got {self.scale!r}")
        if self.mean_value is not None:
            means = np.atleast_1d(np.asarray(self.mean_value, dtype=np.float64))
            if means.ndim != 1 or means.size == 0 or not np.all(np.isfinite(means)):
                raise ValueError(
                    f"mean_value must be a finite number or a list of them; got {self.mean_value!r}"
                )
            object.__setattr__(self, "mean_value", tuple(float(m) for m in means))

    def __call__(self, x: Any) -> Any:
        """The transformed float32 copy of an (n, C, H, W) array (numpy, cupy or dask)."""
        if x.ndim != 4:
            raise ValueError(f"Transform expects 4-D (n, channels, height, width) input; got shape {x.shape}")
        out = x.astype(np.float32)
        if self.mean_value is not None:
            channels = x.shape[1]
            if len(self.mean_value) not in (1, channels):
                raise ValueError(
                    f"mean_value has {len(self.mean_value)} values; the input has {channels} channels "
                    "(give one value, or one per channel)"
                )
            xp = array_module(getattr(x, "_meta", x))
            mean = xp.asarray(self.mean_value, dtype=np.float32).reshape(1, -1, 1, 1)
            out = out - mean
        if self.scale != 1.0:
            out = out * np.float32(self.scale)
        return out
