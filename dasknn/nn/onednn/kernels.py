"""oneDNN primitives for the conv phase's layers, created once per layer shape and cached.

Each `*Kernel` holds the forward-training, backward-data and backward-weights primitives of one
layer at one batch size, with the layouts they chose (`format_tag_any` for convolutions; pooling,
ReLU and LRN work in the layout of their input). `impls` names the implementation oneDNN picked
for each primitive, so callers can refuse reference (`ref`) kernels. Kernels are built on first
use and kept for the life of the process, one per OpenMP thread count (`kernel` below); the time
spent building them is part of the first iteration's, inside the fit's clock.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from dasknn.nn.onednn import capi
from dasknn.nn.onednn.memory import (
    Layout,
    as_buffer,
    empty,
    execute,
    plain_layout,
    queried_layout,
    threads,
    wrap,
)

__all__ = ["ConvKernel", "LRNKernel", "PoolKernel", "ReLUKernel", "kernel", "is_reference"]

_lock = threading.Lock()
_kernels: dict[tuple, Any] = {}


def is_reference(impl: str) -> bool:
    """True for oneDNN's reference implementations (their names start with "ref")."""
    return impl.startswith("ref")


class Primitive:
    """One primitive and its descriptor: its implementation name and user-managed scratchpad."""

    def __init__(self, pd: capi.Handle, what: str) -> None:
        lib = capi.library()
        self.pd = pd
        impl = ctypes.c_char_p()
        capi.check(lib.dnnl_primitive_desc_query(pd, capi.QUERY_IMPL_INFO_STR, 0, ctypes.byref(impl)), what)
        self.impl = impl.value.decode()
        self.prim = capi.Handle()
        capi.check(lib.dnnl_primitive_create(ctypes.byref(self.prim), pd), f"primitive_create ({what})")
        size = lib.dnnl_memory_desc_get_size(
            lib.dnnl_primitive_desc_query_md(pd, capi.QUERY_SCRATCHPAD_MD, 0)
        )
        self.scratchpad = (
            queried_layout(pd, capi.QUERY_SCRATCHPAD_MD, (size // 4 or 1,), self) if size else None
        )

    def layout(self, query: int, dims) -> Layout | None:
        return queried_layout(self.pd, query, tuple(dims), self)

    def run(self, args: dict[int, tuple[Layout, np.ndarray]]) -> None:
        if self.scratchpad is not None:
            args[capi.ARG_SCRATCHPAD] = (self.scratchpad, empty(self.scratchpad))
        execute(self.prim, args)


def _attr() -> capi.Handle:
    attr = capi.Handle()
    lib = capi.library()
    capi.check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
    capi.check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, capi.SCRATCHPAD_USER), "set_scratchpad_mode")
    return attr


def _any(dims) -> capi.Handle:
    md = capi.Handle()
    capi.check(
        capi.library().dnnl_memory_desc_create_with_tag(
            ctypes.byref(md), len(dims), capi.dims(dims), capi.F32, capi.FORMAT_ANY
        ),
        "memory_desc_create_with_tag (any)",
    )
    return md


def _create(fn: str, *args) -> capi.Handle:
    pd = capi.Handle()
    capi.check(getattr(capi.library(), fn)(ctypes.byref(pd), capi.engine(), *args), fn)
    return pd


def kernel(cls, *key):
    """The cached `cls(*key)` for the calling thread's OpenMP thread count (built on first use).

    oneDNN sizes a primitive's OpenMP team when it creates it (a convolution runs with the count
    its creating thread had, whatever the count when it runs), so a kernel is built with the
    worker's count applied (`memory.threads`) and cached under that count: a worker whose count
    changes (`engine.dask.nanny.SharedCores`, when workers join or leave) builds kernels for the
    new count rather than running the old ones with the old count's threads."""
    k = (cls, threads(), *key)
    found = _kernels.get(k)
    if found is None:
        found = cls(*key)
        with _lock:
            found = _kernels.setdefault(k, found)
    return found


class ConvKernel:
    """Convolution (grouped, strided, padded, with bias) of an (n, c, h, w) batch: o outputs."""

    def __init__(self, n, c, h, w, o, group, kernel_size, stride, pad, out_hw, bias: bool) -> None:
        (kh, kw), (sh, sw), (ph, pw), (oh, ow) = kernel_size, stride, pad, out_hw
        self.src_dims, self.dst_dims = (n, c, h, w), (n, o, oh, ow)
        self.w_dims = (o, c, kh, kw) if group == 1 else (group, o // group, c // group, kh, kw)
        self.plain_w_shape = (o, c // group, kh, kw)
        pr, pc = (oh - 1) * sh + kh - h - ph, (ow - 1) * sw + kw - w - pw
        geometry = (capi.dims((sh, sw)), capi.dims((0, 0)), capi.dims((ph, pw)), capi.dims((pr, pc)))
        src, wts, dst = _any(self.src_dims), _any(self.w_dims), _any(self.dst_dims)
        self.bias_layout = plain_layout((o,)) if bias else None
        b = self.bias_layout.md if bias else None
        attr = _attr()
        fwd = _create(
            "dnnl_convolution_forward_primitive_desc_create",
            capi.FORWARD_TRAINING,
            capi.CONVOLUTION_DIRECT,
            src,
            wts,
            b,
            dst,
            *geometry,
            attr,
        )
        bwd_d = _create(
            "dnnl_convolution_backward_data_primitive_desc_create",
            capi.CONVOLUTION_DIRECT,
            src,
            wts,
            dst,
            *geometry,
            fwd,
            attr,
        )
        bwd_w = _create(
            "dnnl_convolution_backward_weights_primitive_desc_create",
            capi.CONVOLUTION_DIRECT,
            src,
            wts,
            b,
            dst,
            *geometry,
            fwd,
            attr,
        )
        self.fwd = Primitive(fwd, "convolution forward")
        self.bwd_data = Primitive(bwd_d, "convolution backward data")
        self.bwd_weights = Primitive(bwd_w, "convolution backward weights")
        self.impls = {p: getattr(self, p).impl for p in ("fwd", "bwd_data", "bwd_weights")}
        self.src = self.fwd.layout(capi.QUERY_SRC_MD, self.src_dims)
        self.weights = self.fwd.layout(capi.QUERY_WEIGHTS_MD, self.w_dims)
        self.dst = self.fwd.layout(capi.QUERY_DST_MD, self.dst_dims)
        self.bd_weights = self.bwd_data.layout(capi.QUERY_WEIGHTS_MD, self.w_dims)
        self.bd_diff_dst = self.bwd_data.layout(capi.QUERY_DIFF_DST_MD, self.dst_dims)
        self.bd_diff_src = self.bwd_data.layout(capi.QUERY_DIFF_SRC_MD, self.src_dims)
        self.bw_src = self.bwd_weights.layout(capi.QUERY_SRC_MD, self.src_dims)
        self.bw_diff_dst = self.bwd_weights.layout(capi.QUERY_DIFF_DST_MD, self.dst_dims)
        self.bw_diff_weights = self.bwd_weights.layout(capi.QUERY_DIFF_WEIGHTS_MD, self.w_dims)
        for md in (src, wts, dst):
            capi.library().dnnl_memory_desc_destroy(md)

    def forward(self, x, weight: np.ndarray, bias: np.ndarray | None):
        """(output, cache): the output in the layout oneDNN chose, the cache its backward's inputs."""
        src = as_buffer(x, self.src)
        wts = as_buffer(weight, self.weights, weights=True)
        out = empty(self.dst)
        args = {
            capi.ARG_SRC: (self.src, src),
            capi.ARG_WEIGHTS: (self.weights, wts),
            capi.ARG_DST: (self.dst, out),
        }
        if bias is not None:
            args[capi.ARG_BIAS] = (self.bias_layout, np.ascontiguousarray(bias, dtype=np.float32))
        self.fwd.run(args)
        return wrap(out, self.dst), (wrap(src, self.src), wts, weight)

    def backward(self, dy, cache, need_dx: bool):
        """(dx or None, dweight (plain, the layer's shape), dbias or None)."""
        x, wts, weight = cache
        dst_bw = as_buffer(dy, self.bw_diff_dst)
        dw = empty(self.bw_diff_weights)
        args = {
            capi.ARG_SRC: (self.bw_src, as_buffer(x, self.bw_src)),
            capi.ARG_DIFF_DST: (self.bw_diff_dst, dst_bw),
            capi.ARG_DIFF_WEIGHTS: (self.bw_diff_weights, dw),
        }
        db = None
        if self.bias_layout is not None:
            db = np.empty(self.dst_dims[1], dtype=np.float32)
            args[capi.ARG_DIFF_BIAS] = (self.bias_layout, db)
        self.bwd_weights.run(args)
        dx = None
        if need_dx:
            w_bd = (
                wts if self.bd_weights is self.weights else as_buffer(weight, self.bd_weights, weights=True)
            )
            dst_bd = dst_bw if self.bd_diff_dst is self.bw_diff_dst else as_buffer(dy, self.bd_diff_dst)
            out = empty(self.bd_diff_src)
            self.bwd_data.run(
                {
                    capi.ARG_DIFF_DST: (self.bd_diff_dst, dst_bd),
                    capi.ARG_WEIGHTS: (self.bd_weights, w_bd),
                    capi.ARG_DIFF_SRC: (self.bd_diff_src, out),
                }
            )
            dx = wrap(out, self.bd_diff_src)
        if self.bw_diff_weights.is_plain:
            dweight = dw.reshape(self.plain_w_shape)
        else:
            from dasknn.nn.onednn.memory import reorder

            dweight = reorder(dw, self.bw_diff_weights, plain_layout(self.w_dims), "weights")
            dweight = dweight.reshape(self.plain_w_shape)
        return dx, dweight, db


class _Elementwise:
    """Shared by pooling, ReLU and LRN: the forward works in its input's layout (`src`)."""

    fwd: Primitive
    bwd: Primitive
    src: Layout
    dst: Layout
    workspace: Layout | None

    def _finish(self, fwd, bwd, src_dims, dst_dims) -> None:
        self.fwd = Primitive(fwd, f"{self.what} forward")
        self.bwd = Primitive(bwd, f"{self.what} backward")
        self.impls = {"fwd": self.fwd.impl, "bwd": self.bwd.impl}
        self.dst = self.fwd.layout(capi.QUERY_DST_MD, dst_dims)
        self.diff_dst = self.bwd.layout(capi.QUERY_DIFF_DST_MD, dst_dims)
        self.diff_src = self.bwd.layout(capi.QUERY_DIFF_SRC_MD, src_dims)
        lib = capi.library()
        ws = lib.dnnl_primitive_desc_query_md(fwd, capi.QUERY_WORKSPACE_MD, 0)
        size = lib.dnnl_memory_desc_get_size(ws) if ws else 0
        self.workspace = self.fwd.layout(capi.QUERY_WORKSPACE_MD, (size // 4 or 1,)) if size else None
        if self.workspace is not None and self.workspace.size * 4 < size:
            self.workspace.size = -(-size // 4)

    def _forward(self, x, extra_cache: bool):
        src = as_buffer(x, self.src)
        out = empty(self.dst)
        args = {capi.ARG_SRC: (self.src, src), capi.ARG_DST: (self.dst, out)}
        ws = None
        if self.workspace is not None:
            ws = empty(self.workspace)
            args[capi.ARG_WORKSPACE] = (self.workspace, ws)
        self.fwd.run(args)
        y = wrap(out, self.dst)
        return y, (wrap(src, self.src) if extra_cache else None, y, ws)

    def _backward(self, dy, cache, data_arg: int | None, data_from_src: bool):
        x, y, ws = cache
        out = empty(self.diff_src)
        args = {
            capi.ARG_DIFF_DST: (self.diff_dst, as_buffer(dy, self.diff_dst)),
            capi.ARG_DIFF_SRC: (self.diff_src, out),
        }
        if data_arg is not None:
            data, layout = (x, self.src) if data_from_src else (y, self.dst)
            args[data_arg] = (layout, as_buffer(data, layout))
        if ws is not None:
            args[capi.ARG_WORKSPACE] = (self.workspace, ws)
        self.bwd.run(args)
        return wrap(out, self.diff_src)


class PoolKernel(_Elementwise):
    """Max or average pooling of an (n, c, h, w) batch in the input's layout `src`.

    `padding` is ((top, bottom), (left, right)); the bottom/right pad may exceed the layer's pad
    (Caffe's ceil rounding). `average` is "include" or "exclude" padding (oneDNN's two divisors)."""

    what = "pooling"

    def __init__(self, src: Layout, out_hw, pool: str, kernel_size, stride, padding, average: str) -> None:
        n, c, h, w = src.dims
        self.src = src
        dst_dims = (n, c, *out_hw)
        alg = {
            "max": capi.POOLING_MAX,
            "include": capi.POOLING_AVG_INCLUDE_PADDING,
            "exclude": capi.POOLING_AVG_EXCLUDE_PADDING,
        }["max" if pool == "max" else average]
        (top, bottom), (left, right) = padding
        geometry = (
            capi.dims(stride),
            capi.dims(kernel_size),
            capi.dims((0, 0)),
            capi.dims((top, left)),
            capi.dims((bottom, right)),
        )
        dst = _any(dst_dims)
        attr = _attr()
        fwd = _create(
            "dnnl_pooling_forward_primitive_desc_create",
            capi.FORWARD_TRAINING,
            alg,
            src.md,
            dst,
            *geometry,
            attr,
        )
        dst_chosen = capi.library().dnnl_primitive_desc_query_md(fwd, capi.QUERY_DST_MD, 0)
        bwd = _create(
            "dnnl_pooling_backward_primitive_desc_create", alg, src.md, dst_chosen, *geometry, fwd, attr
        )
        capi.library().dnnl_memory_desc_destroy(dst)
        self._finish(fwd, bwd, src.dims, dst_dims)

    def forward(self, x):
        return self._forward(x, extra_cache=False)

    def backward(self, dy, cache):
        return self._backward(dy, cache, None, False)


class ReLUKernel(_Elementwise):
    """ReLU (leaky with slope ≥ 0) in the input's layout; its backward reads the output, as the
    layer's own (y > 0 exactly where x > 0)."""

    what = "ReLU"

    def __init__(self, src: Layout, negative_slope: float) -> None:
        self.src = src
        alg, slope = capi.ELTWISE_RELU_USE_DST_FOR_BWD, float(negative_slope)
        attr = _attr()
        fwd = _create(
            "dnnl_eltwise_forward_primitive_desc_create",
            capi.FORWARD_TRAINING,
            alg,
            src.md,
            src.md,
            slope,
            0.0,
            attr,
        )
        bwd = _create(
            "dnnl_eltwise_backward_primitive_desc_create", alg, src.md, src.md, src.md, slope, 0.0, fwd, attr
        )
        self._finish(fwd, bwd, src.dims, src.dims)

    def forward(self, x):
        return self._forward(x, extra_cache=False)

    def backward(self, dy, cache):
        return self._backward(dy, cache, capi.ARG_DST, False)


class LRNKernel(_Elementwise):
    """Local response normalisation in the input's layout (across channels, or within a channel
    with k = 1 as Caffe's), with oneDNN's alpha/n (alpha/n²) scaling, the same as Caffe's."""

    what = "LRN"

    def __init__(
        self, src: Layout, local_size: int, alpha: float, beta: float, k: float, region: str
    ) -> None:
        self.src = src
        alg = capi.LRN_ACROSS_CHANNELS if region == "across_channels" else capi.LRN_WITHIN_CHANNEL
        hyper = (int(local_size), float(alpha), float(beta), float(k))
        attr = _attr()
        fwd = _create(
            "dnnl_lrn_forward_primitive_desc_create", capi.FORWARD_TRAINING, alg, src.md, src.md, *hyper, attr
        )
        bwd = _create(
            "dnnl_lrn_backward_primitive_desc_create", alg, src.md, src.md, src.md, *hyper, fwd, attr
        )
        self._finish(fwd, bwd, src.dims, src.dims)

    def forward(self, x):
        return self._forward(x, extra_cache=True)

    def backward(self, dy, cache):
        return self._backward(dy, cache, capi.ARG_SRC, True)
