"""oneDNN's inner product for the FC phase's InnerProduct layers (Omnivore §II-B's FC phase).

The FC phase's three GEMMs (y = x·Wᵀ + b, dx = dy·W, dW = dyᵀ·x) on oneDNN's OpenMP threads rather
than numpy's BLAS: an iteration then runs all its kernels on one thread pool, so OpenBLAS's threads,
which spin on a core after each call, stay idle while oneDNN computes. Every array is plain
row-major, as numpy holds it: no reorders.
"""

from __future__ import annotations

import numpy as np

from dasknn.nn.onednn import capi
from dasknn.nn.onednn.kernels import Primitive, _attr, _create
from dasknn.nn.onednn.memory import empty, plain_layout

__all__ = ["InnerProductKernel"]


class InnerProductKernel:
    """Inner product of an (n, k) batch with (o, k) weights: forward, backward data and weights."""

    def __init__(self, n: int, k: int, o: int, bias: bool) -> None:
        self.src, self.weights, self.dst = plain_layout((n, k)), plain_layout((o, k)), plain_layout((n, o))
        self.bias = plain_layout((o,)) if bias else None
        b = self.bias.md if bias else None
        attr = _attr()
        fwd = _create(
            "dnnl_inner_product_forward_primitive_desc_create",
            capi.FORWARD_TRAINING,
            self.src.md,
            self.weights.md,
            b,
            self.dst.md,
            attr,
        )
        bwd_d = _create(
            "dnnl_inner_product_backward_data_primitive_desc_create",
            self.src.md,
            self.weights.md,
            self.dst.md,
            fwd,
            attr,
        )
        bwd_w = _create(
            "dnnl_inner_product_backward_weights_primitive_desc_create",
            self.src.md,
            self.weights.md,
            b,
            self.dst.md,
            fwd,
            attr,
        )
        self.fwd = Primitive(fwd, "inner product forward")
        self.bwd_data = Primitive(bwd_d, "inner product backward data")
        self.bwd_weights = Primitive(bwd_w, "inner product backward weights")
        self.impls = {p: getattr(self, p).impl for p in ("fwd", "bwd_data", "bwd_weights")}

    def forward(self, x2: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        """y = x2·weightᵀ + bias, (n, o)."""
        out = empty(self.dst)
        args = {
            capi.ARG_SRC: (self.src, _flat(x2)),
            capi.ARG_WEIGHTS: (self.weights, _flat(weight)),
            capi.ARG_DST: (self.dst, out),
        }
        if bias is not None:
            args[capi.ARG_BIAS] = (self.bias, _flat(bias))
        self.fwd.run(args)
        return out.reshape(self.dst.dims)

    def backward(self, dy: np.ndarray, x2: np.ndarray, weight: np.ndarray, need_dx: bool):
        """(dx2 (n, k) or None, dweight (o, k), dbias (o,) or None)."""
        dy = _flat(dy)
        dw = empty(self.weights)
        args = {
            capi.ARG_SRC: (self.src, _flat(x2)),
            capi.ARG_DIFF_DST: (self.dst, dy),
            capi.ARG_DIFF_WEIGHTS: (self.weights, dw),
        }
        db = None
        if self.bias is not None:
            db = empty(self.bias)
            args[capi.ARG_DIFF_BIAS] = (self.bias, db)
        self.bwd_weights.run(args)
        dx = None
        if need_dx:
            dx = empty(self.src)
            self.bwd_data.run(
                {
                    capi.ARG_DIFF_DST: (self.dst, dy),
                    capi.ARG_WEIGHTS: (self.weights, _flat(weight)),
                    capi.ARG_DIFF_SRC: (self.src, dx),
                }
            )
            dx = dx.reshape(self.src.dims)
        return dx, dw.reshape(self.weights.dims), db


def _flat(a: np.ndarray) -> np.ndarray:
    """`a` as a contiguous float32 buffer (a view when it already is one)."""
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
