"""The base of every layer: a name, parameters with lr/decay multipliers, forward and backward."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

Shape = tuple[int, ...]


def pair(v: int | tuple[int, int], what: str) -> tuple[int, int]:
    pair = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(pair) != 2 or not all(isinstance(p, (int, np.integer)) for p in pair):
        raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return int(pair[0]), int(pair[1])


class Layer(ABC):
    """Base of all layers: a name, parameters (maybe none), forward and backward."""

    type: ClassVar[str] = "Layer"
    accepts_blocked: ClassVar[bool] = False
    """True for layers that read and write oneDNN's blocked activations (`dasknn.nn.onednn`);
    the Net hands every other layer plain arrays."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a layer needs a non-empty string name, got {name!r}")
        self.name = name
        self.params: dict[str, Any] = {}
        self.lr_mult: dict[str, float] = {}
        self.decay_mult: dict[str, float] = {}
        self.in_shape: Shape | None = None
        self.out_shape: Shape | None = None

    def setup(self, in_shape: Shape) -> Shape:
        """Record the per-image input shape and return the output shape."""
        self.in_shape = tuple(int(s) for s in in_shape)
        self.out_shape = self._infer(self.in_shape)
        return self.out_shape

    def _infer(self, in_shape: Shape) -> Shape:
        return in_shape

    def init_params(self, rng: np.random.Generator, dtype=np.float32) -> None:
        """Draw the parameters from their fillers (layers without parameters have none)."""
        self.params = {}

    @abstractmethod
    def forward(self, x, train: bool = True, rng: np.random.Generator | None = None):
        """(N, *in_shape) → (output (N, *out_shape), cache for `backward`).

        `rng` is the only source of randomness a layer may use in training (`dasknn.nn.randomness`
        draws from it on every device); layers that draw refuse to train without one."""

    @abstractmethod
    def backward(self, dy, cache, need_dx: bool = True):
        """(dL/dy, cache) → (dL/dx or None when not `need_dx`, {param name: dL/dparam})."""

    def flops(self) -> int:
        """Forward FLOPs per image (multiply-adds count 2); backward is about twice this."""
        return math.prod(self.out_shape or ())

    def config(self) -> dict[str, Any]:
        """The hyperparameters that define this layer (equal configs make equal layers)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({self.name!r}{', ' if args else ''}{args})"
