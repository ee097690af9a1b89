"""Layers that join branches of a graph net: Concat and Eltwise (Caffe's), forward and backward
side by side. Each reads a list of blobs (`multi_input`) and returns a list of input gradients.

GoogLeNet (Szegedy et al. 2015) concatenates an Inception module's branches along the channels;
a residual block (He et al. 2016) sums its shortcut and its residual with Eltwise SUM.
"""

from __future__ import annotations

import math

from dasknn.backend import array_module
from dasknn.nn.base import Layer, Shape

ELTWISE_OPERATIONS = ("sum", "prod", "max")


class Concat(Layer):
    """Join the inputs along the channel axis (Caffe's Concat, axis 1); backward slices dy back."""

    type = "Concat"
    multi_input = True

    def setup(self, in_shapes: list[Shape]) -> Shape:
        shapes = [tuple(int(s) for s in shape) for shape in in_shapes]
        if len(shapes) < 2 or any(len(s) != len(shapes[0]) or s[1:] != shapes[0][1:] for s in shapes):
            raise ValueError(
                f"layer {self.name!r}: Concat needs two or more inputs that differ only in channels, "
                f"got {shapes}"
            )
        self.in_shapes = shapes
        self.in_shape = shapes[0]
        self.out_shape = (sum(s[0] for s in shapes), *shapes[0][1:])
        return self.out_shape

    def forward(self, xs, train=True, rng=None):
        return array_module(xs[0]).concatenate(xs, axis=1), None

    def backward(self, dy, cache, need_dx=True):
        if not need_dx:
            return None, {}
        dxs, start = [], 0
        for shape in self.in_shapes:
            dxs.append(dy[:, start : start + shape[0]])
            start += shape[0]
        return dxs, {}

    def flops(self):
        return 0


class Eltwise(Layer):
    """Element-wise SUM (with one coefficient per input), PROD or MAX of equal-shaped inputs (Caffe's
    Eltwise). MAX sends each gradient to the first input holding the maximum, as Caffe does."""

    type = "Eltwise"
    multi_input = True

    def __init__(self, name: str, operation: str = "sum", coeff: tuple[float, ...] = ()) -> None:
        super().__init__(name)
        if operation not in ELTWISE_OPERATIONS:
            raise ValueError(
                f"layer {name!r}: unknown operation {operation!r}; expected {ELTWISE_OPERATIONS}"
            )
        if coeff and operation != "sum":
            raise ValueError(f"layer {name!r}: coeff applies to operation 'sum' only")
        self.operation = operation
        self.coeff = tuple(float(c) for c in coeff)

    def setup(self, in_shapes: list[Shape]) -> Shape:
        shapes = [tuple(int(s) for s in shape) for shape in in_shapes]
        if len(shapes) < 2 or any(s != shapes[0] for s in shapes):
            raise ValueError(
                f"layer {self.name!r}: Eltwise needs two or more equal-shaped inputs, got {shapes}"
            )
        if self.coeff and len(self.coeff) != len(shapes):
            raise ValueError(f"layer {self.name!r}: {len(self.coeff)} coeff for {len(shapes)} inputs")
        self.in_shapes = shapes
        self.in_shape = self.out_shape = shapes[0]
        return self.out_shape

    def _coeffs(self) -> tuple[float, ...]:
        return self.coeff or (1.0,) * len(self.in_shapes)

    def forward(self, xs, train=True, rng=None):
        xp = array_module(xs[0])
        if self.operation == "sum":
            y = xp.zeros_like(xs[0])
            for c, x in zip(self._coeffs(), xs, strict=True):
                y += x if c == 1.0 else x * x.dtype.type(c)
            return y, None
        if self.operation == "prod":
            y = xs[0].copy()
            for x in xs[1:]:
                y *= x
            return y, xs
        y, arg = xs[0].copy(), xp.zeros(xs[0].shape, dtype=xp.int8 if len(xs) < 128 else xp.int32)
        for i, x in enumerate(xs[1:], 1):
            larger = x > y
            y = xp.where(larger, x, y)
            arg[larger] = i
        return y, arg

    def backward(self, dy, cache, need_dx=True):
        if not need_dx:
            return None, {}
        if self.operation == "sum":
            return [dy if c == 1.0 else dy * dy.dtype.type(c) for c in self._coeffs()], {}
        if self.operation == "prod":
            xs = cache
            dxs = []
            for i in range(len(xs)):
                d = dy.copy()
                for j, x in enumerate(xs):
                    if j != i:
                        d *= x
                dxs.append(d)
            return dxs, {}
        return [dy * (cache == i) for i in range(len(self.in_shapes))], {}

    def flops(self):
        return (len(self.in_shapes) - 1) * math.prod(self.out_shape)

    def config(self):
        return {"operation": self.operation, "coeff": self.coeff}
