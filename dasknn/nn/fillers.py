"""Weight fillers with Caffe's semantics: constant, gaussian, uniform, xavier, msra."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from dasknn.backend import to_device

FILLER_TYPES = ("constant", "gaussian", "uniform", "xavier", "msra")
VARIANCE_NORMS = ("fan_in", "fan_out", "average")


@dataclass(frozen=True)
class Filler:
    """How a parameter blob is initialised (Caffe's FillerParameter, with Caffe's defaults)."""

    type: str = "constant"
    value: float = 0.0
    mean: float = 0.0
    std: float = 1.0
    min: float = 0.0
    max: float = 1.0
    variance_norm: str = "fan_in"

    def __repr__(self) -> str:
        """As Caffe's prototxt reads: the type, then only the fields set away from their defaults."""
        default = Filler()
        rest = [
            f"{name}={value!r}"
            for name, value in vars(self).items()
            if name != "type" and value != getattr(default, name)
        ]
        return f"Filler({', '.join([repr(self.type), *rest])})"

    def __post_init__(self) -> None:
        if self.type not in FILLER_TYPES:
            raise ValueError(f"unknown filler type {self.type!r}; expected one of {FILLER_TYPES}")
        if self.variance_norm not in VARIANCE_NORMS:
            raise ValueError(
                f"unknown variance_norm {self.variance_norm!r}; expected one of {VARIANCE_NORMS}"
            )
        if self.type == "gaussian" and self.std < 0:
            raise ValueError(f"gaussian filler needs std >= 0, got {self.std}")
        if self.type == "uniform" and self.min > self.max:
            raise ValueError(f"uniform filler needs min <= max, got [{self.min}, {self.max}]")

    def _n(self, shape: tuple[int, ...]) -> float:
        """Caffe's fan: fan_in = count / shape[0], fan_out = count / shape[1]."""
        count = math.prod(shape)
        fan_in = count / shape[0]
        fan_out = count / shape[1] if len(shape) > 1 else count
        return {"fan_in": fan_in, "fan_out": fan_out, "average": (fan_in + fan_out) / 2}[self.variance_norm]

    def fill(self, shape: tuple[int, ...], rng: np.random.Generator, dtype=np.float32, xp: ModuleType = np):
        """A new array of `shape` drawn from this filler with the seeded generator `rng`."""
        if self.type == "constant":
            out = np.full(shape, self.value, dtype=np.float64)
        elif self.type == "gaussian":
            out = rng.normal(self.mean, self.std, size=shape)
        elif self.type == "uniform":
            out = rng.uniform(self.min, self.max, size=shape)
        elif self.type == "xavier":
            scale = math.sqrt(3.0 / self._n(shape))
            out = rng.uniform(-scale, scale, size=shape)
        else:  # msra
            out = rng.normal(0.0, math.sqrt(2.0 / self._n(shape)), size=shape)
        return to_device(out.astype(dtype), xp)
