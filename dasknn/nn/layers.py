"""The layers of a CNN, Caffe's set: each with its parameters, `forward` and `backward` side by side.

A layer holds hyperparameters and parameters only. `forward(x, train, rng)` returns the output and a
cache; `backward(dy, cache)` returns the input gradient and the parameter gradients. Caches are plain
data, so a forward can run in one task and its backward in a later task on the same worker
(docs/architecture.md, "One iteration's data flow"). Shapes are per image (C, H, W) without the batch.
All array maths goes through `xp = array_module(x)`: the same code runs on numpy and cupy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dasknn.backend import array_module
from dasknn.nn.base import Layer, Shape, pair
from dasknn.nn.fillers import Filler
from dasknn.nn.lowering import LOWERINGS, conv_backward, conv_forward, conv_output_size
from dasknn.nn.onednn import (
    OneDNNCache,
    check_backend,
    conv_kernel,
    inner_product_kernel,
    plain,
    relu_kernel,
)
from dasknn.nn.pooling import LRN, Pooling
from dasknn.nn.randomness import bernoulli

__all__ = [
    "LAYER_TYPES",
    "LRN",
    "Convolution",
    "Dropout",
    "Filler",
    "Flatten",
    "InnerProduct",
    "Layer",
    "Pooling",
    "ReLU",
]


class _Weighted(Layer):
    """A layer with a weight and an optional bias, each with a filler and lr/decay multipliers."""

    def __init__(self, name, bias_term, weight_filler, bias_filler, lr_mult, decay_mult) -> None:
        super().__init__(name)
        self.bias_term = bool(bias_term)
        self.weight_filler = weight_filler if weight_filler is not None else Filler("xavier")
        self.bias_filler = bias_filler if bias_filler is not None else Filler()
        lr_mult, decay_mult = tuple(lr_mult), tuple(decay_mult)
        if len(lr_mult) != 2 or len(decay_mult) != 2:
            raise ValueError(f"layer {name!r}: lr_mult and decay_mult are (weight, bias) pairs")
        self.lr_mult = {"weight": float(lr_mult[0]), "bias": float(lr_mult[1])}
        self.decay_mult = {"weight": float(decay_mult[0]), "bias": float(decay_mult[1])}

    def weight_shape(self) -> Shape:
        """Shape of the weight blob, known once `setup` has seen the input shape."""
        raise AssertionError("subclasses define weight_shape")

    def init_params(self, rng, dtype=np.float32) -> None:
        w_shape = self.weight_shape()
        self.params = {"weight": self.weight_filler.fill(w_shape, rng, dtype)}
        if self.bias_term:
            self.params["bias"] = self.bias_filler.fill((w_shape[0],), rng, dtype)

    def _common_config(self) -> dict[str, Any]:
        return {
            "bias_term": self.bias_term,
            "weight_filler": self.weight_filler,
            "bias_filler": self.bias_filler,
            "lr_mult": (self.lr_mult["weight"], self.lr_mult["bias"]),
            "decay_mult": (self.decay_mult["weight"], self.decay_mult["bias"]),
        }


class Convolution(_Weighted):
    """2-D convolution with bias, computed by batched lowering + one GEMM (Caffe con Troll §2).

    `lowering` is one of `lowering.LOWERINGS` or "auto"; `bp` is how many images are lowered
    together per GEMM (None: `lowering.default_bp`, a cache-sized partition on CPUs, the whole
    batch on GPUs). The bias is added while the output is lifted.
    `group` splits channels into independent convolutions, as Caffe's (CaffeNet uses 2).
    `backend` ("auto", "lowering" or "onednn") picks oneDNN's direct kernels instead of lowering
    (`dasknn.nn.onednn`); lowering stays the reference.
    """

    type = "Convolution"
    accepts_blocked = True

    def __init__(
        self,
        name: str,
        num_output: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        pad: int | tuple[int, int] = 0,
        group: int = 1,
        bias_term: bool = True,
        weight_filler: Filler | None = None,
        bias_filler: Filler | None = None,
        lr_mult: tuple[float, float] = (1.0, 1.0),
        decay_mult: tuple[float, float] = (1.0, 1.0),
        lowering: str = "auto",
        bp: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(name, bias_term, weight_filler, bias_filler, lr_mult, decay_mult)
        self.num_output = int(num_output)
        self.kernel_size = pair(kernel_size, f"layer {name!r}: kernel_size")
        self.stride = pair(stride, f"layer {name!r}: stride")
        self.pad = pair(pad, f"layer {name!r}: pad")
        self.group = int(group)
        if self.num_output < 1 or min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.pad) < 0:
            raise ValueError(f"layer {name!r}: need num_output >= 1, kernel_size >= 1, stride >= 1, pad >= 0")
        if self.group < 1 or self.num_output % self.group:
            raise ValueError(f"layer {name!r}: num_output {num_output} not divisible by group {group}")
        if lowering != "auto" and lowering not in LOWERINGS:
            raise ValueError(
                f"layer {name!r}: unknown lowering {lowering!r}; expected 'auto' or one of {LOWERINGS}"
            )
        if bp is not None and int(bp) < 1:
            raise ValueError(f"layer {name!r}: bp must be >= 1 or None, got {bp}")
        self.lowering = lowering
        self.bp = bp
        self.backend = check_backend(backend, f"layer {name!r}")

    def _infer(self, in_shape):
        if len(in_shape) != 3:
            raise ValueError(f"layer {self.name!r}: Convolution needs (C, H, W) input, got {in_shape}")
        c, h, w = in_shape
        if c % self.group:
            raise ValueError(f"layer {self.name!r}: {c} input channels not divisible by group {self.group}")
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        if h + 2 * ph < kh or w + 2 * pw < kw:
            raise ValueError(
                f"layer {self.name!r}: kernel {kh}x{kw} larger than padded input {h + 2 * ph}x{w + 2 * pw}"
            )
        return (self.num_output, conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw))

    def weight_shape(self):
        return (self.num_output, self.in_shape[0] // self.group, *self.kernel_size)

    def forward(self, x, train=True, rng=None):
        w = self.params["weight"]
        b = self.params["bias"] if self.bias_term else None
        kernel = conv_kernel(self, x)
        if kernel is not None:
            y, cache = kernel.forward(x, w, b)
            return y, OneDNNCache(kernel, cache)
        x = plain(x)
        xp = array_module(x)
        g, cg, og = self.group, x.shape[1] // self.group, self.num_output // self.group
        ys, caches = [], []
        for i in range(g):
            xi = x if g == 1 else x[:, i * cg : (i + 1) * cg]
            bi = None if b is None else b[i * og : (i + 1) * og]
            yi, ci = conv_forward(
                xi, w[i * og : (i + 1) * og], self.stride, self.pad, self.lowering, self.bp, bi
            )
            ys.append(yi)
            caches.append(ci)
        y = ys[0] if g == 1 else xp.concatenate(ys, axis=1)
        return y, caches

    def backward(self, dy, cache, need_dx=True):
        if isinstance(cache, OneDNNCache):
            dx, dw, db = cache.kernel.backward(dy, cache.data, need_dx)
            return dx, {"weight": dw, "bias": db} if self.bias_term else {"weight": dw}
        dy = plain(dy)
        xp = array_module(dy)
        g, og = self.group, self.num_output // self.group
        dxs, dws = [], []
        for i, ci in enumerate(cache):
            dyi = dy if g == 1 else xp.ascontiguousarray(dy[:, i * og : (i + 1) * og])
            dxi, dwi = conv_backward(dyi, ci, need_dx=need_dx)
            dxs.append(dxi)
            dws.append(dwi)
        grads = {"weight": dws[0] if g == 1 else xp.concatenate(dws, axis=0)}
        if self.bias_term:
            grads["bias"] = dy.sum(axis=(0, 2, 3))
        if not need_dx:
            return None, grads
        return (dxs[0] if g == 1 else xp.concatenate(dxs, axis=1)), grads

    def flops(self):
        o, oh, ow = self.out_shape
        kh, kw = self.kernel_size
        return 2 * o * (self.in_shape[0] // self.group) * kh * kw * oh * ow

    def config(self):
        return {
            "num_output": self.num_output,
            "kernel_size": self.kernel_size,
            "stride": self.stride,
            "pad": self.pad,
            "group": self.group,
            **self._common_config(),
        }


class InnerProduct(_Weighted):
    """Fully connected layer y = x·Wᵀ + b on the flattened input (Caffe's InnerProduct, axis 1).

    `backend` as for Convolution: "auto" computes float32 numpy batches with oneDNN's inner
    product (on the same OpenMP threads as the conv phase's kernels), "lowering" with numpy's
    BLAS, the reference."""

    type = "InnerProduct"

    def __init__(
        self,
        name: str,
        num_output: int,
        bias_term: bool = True,
        weight_filler: Filler | None = None,
        bias_filler: Filler | None = None,
        lr_mult: tuple[float, float] = (1.0, 1.0),
        decay_mult: tuple[float, float] = (1.0, 1.0),
        backend: str = "auto",
    ) -> None:
        super().__init__(name, bias_term, weight_filler, bias_filler, lr_mult, decay_mult)
        self.num_output = int(num_output)
        if self.num_output < 1:
            raise ValueError(f"layer {name!r}: num_output must be >= 1, got {num_output}")
        self.backend = check_backend(backend, f"layer {name!r}")

    def _infer(self, in_shape):
        return (self.num_output,)

    def weight_shape(self):
        return (self.num_output, math.prod(self.in_shape))

    def forward(self, x, train=True, rng=None):
        x2 = x.reshape(x.shape[0], -1)
        b = self.params["bias"] if self.bias_term else None
        kernel = inner_product_kernel(self, x2)
        if kernel is not None:
            return kernel.forward(x2, self.params["weight"], b), OneDNNCache(kernel, x2)
        y = x2 @ self.params["weight"].T
        if b is not None:
            y += b
        return y, x2

    def backward(self, dy, cache, need_dx=True):
        if isinstance(cache, OneDNNCache):
            dx2, dw, db = cache.kernel.backward(dy, cache.data, self.params["weight"], need_dx)
            grads = {"weight": dw, "bias": db} if self.bias_term else {"weight": dw}
            dx = dx2.reshape((dy.shape[0], *self.in_shape)) if need_dx else None
            return dx, grads
        x2 = cache
        grads = {"weight": dy.T @ x2}
        if self.bias_term:
            grads["bias"] = dy.sum(axis=0)
        dx = (dy @ self.params["weight"]).reshape((dy.shape[0], *self.in_shape)) if need_dx else None
        return dx, grads

    def flops(self):
        return 2 * self.num_output * math.prod(self.in_shape)

    def config(self):
        return {"num_output": self.num_output, **self._common_config()}


class Flatten(Layer):
    """Reshape (N, C, H, W) to (N, C·H·W)."""

    type = "Flatten"

    def _infer(self, in_shape):
        return (math.prod(in_shape),)

    def forward(self, x, train=True, rng=None):
        return x.reshape(x.shape[0], -1), None

    def backward(self, dy, cache, need_dx=True):
        return dy.reshape((dy.shape[0], *self.in_shape)), {}

    def flops(self):
        return 0


class ReLU(Layer):
    """Rectified linear unit, with Caffe's optional leaky negative slope."""

    type = "ReLU"
    accepts_blocked = True

    def __init__(self, name: str, negative_slope: float = 0.0, backend: str = "auto") -> None:
        super().__init__(name)
        self.negative_slope = float(negative_slope)
        self.backend = check_backend(backend, f"layer {name!r}")

    def forward(self, x, train=True, rng=None):
        kernel = relu_kernel(self, x)
        if kernel is not None:
            y, cache = kernel.forward(x)
            return y, OneDNNCache(kernel, cache)
        x = plain(x)
        xp = array_module(x)
        if self.negative_slope == 0.0:  # y > 0 exactly where x > 0: y is the cache, no mask pass
            y = xp.maximum(x, 0, dtype=x.dtype)
            return y, y
        positive = x > 0
        return xp.where(positive, x, x * x.dtype.type(self.negative_slope)), positive

    def backward(self, dy, cache, need_dx=True):
        if isinstance(cache, OneDNNCache):
            return cache.kernel.backward(dy, cache.data), {}
        dy = plain(dy)
        xp = array_module(dy)
        if self.negative_slope == 0.0:
            return dy * (cache > 0), {}
        return xp.where(cache, dy, dy * dy.dtype.type(self.negative_slope)), {}

    def config(self):
        return {"negative_slope": self.negative_slope}


class Dropout(Layer):
    """Inverted dropout as Caffe: in training keep each unit with probability 1 − ratio and scale
    it by 1/(1 − ratio); identity at test time. The mask comes from the `rng` of `forward`
    (`dasknn.nn.randomness`): the same on numpy and cupy, and training without one is an error."""

    type = "Dropout"

    def __init__(self, name: str, dropout_ratio: float = 0.5) -> None:
        super().__init__(name)
        self.dropout_ratio = float(dropout_ratio)
        if not 0.0 <= self.dropout_ratio < 1.0:
            raise ValueError(f"layer {name!r}: dropout_ratio must be in [0, 1), got {dropout_ratio}")

    def forward(self, x, train=True, rng=None):
        if not train or self.dropout_ratio == 0.0:
            return x, None
        keep = bernoulli(rng, x.shape, self.dropout_ratio, x, self.name)
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.dropout_ratio))
        return x * mask, mask

    def backward(self, dy, cache, need_dx=True):
        return (dy if cache is None else dy * cache), {}

    def config(self):
        return {"dropout_ratio": self.dropout_ratio}


LAYER_TYPES: dict[str, type[Layer]] = {
    cls.type: cls for cls in (Convolution, InnerProduct, Flatten, ReLU, Dropout, Pooling, LRN)
}
