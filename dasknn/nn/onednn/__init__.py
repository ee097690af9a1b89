"""oneDNN as a kernel backend of the conv phase's layers (convolution, pooling, ReLU, LRN) and of
the FC phase's inner products. A layer's `backend` picks who computes it: "lowering" (the layers'
own numpy/cupy maths, the reference), "onednn" (oneDNN's direct kernels on blocked layouts, float32
numpy only) or "auto" (oneDNN where the library loads and computes the same function, else
lowering); `layer.backend_ran` and `net_backends` say what ran (docs/architecture.md, "Arrays and
devices"). The library is the `onednn-cpu-gomp` wheel's, or the one $DASKNN_ONEDNN_LIBRARY names
(empty: none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dasknn.nn.onednn import capi
from dasknn.nn.onednn.memory import Blocked, plain

__all__ = [
    "BACKENDS",
    "Blocked",
    "OneDNNCache",
    "available",
    "check_backend",
    "conv_kernel",
    "describe_kernels",
    "info",
    "inner_product_kernel",
    "lrn_kernel",
    "net_backends",
    "plain",
    "pool_kernel",
    "relu_kernel",
]

BACKENDS = ("auto", "lowering", "onednn")


@dataclass
class OneDNNCache:
    """A layer's forward cache when oneDNN computed it: the kernel and what its backward reads."""

    kernel: Any
    data: Any


def available() -> bool:
    """True when oneDNN's library loads in this process."""
    return capi.available()


def check_backend(value: str, where: str) -> str:
    """`value` if it is one of BACKENDS, else a ValueError naming `where`."""
    if value not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {value!r}; expected one of {BACKENDS}")
    return value


def _wanted(layer, x) -> bool:
    """Whether `layer` should try oneDNN on input `x` (the library, the dtype and the device)."""
    backend = layer.backend
    if backend == "lowering":
        return False
    if not isinstance(x, (np.ndarray, Blocked)) or x.dtype != np.float32:
        if backend == "onednn":
            kind = type(x).__module__.split(".")[0] + " " + str(x.dtype)
            raise ValueError(
                f"layer {layer.name!r}: backend 'onednn' computes float32 numpy arrays, got {kind}; "
                "use backend 'auto' or 'lowering'"
            )
        return False
    if not capi.available():
        if backend == "onednn":
            capi.library()  # raises OneDNNUnavailable with the install hint
        return False
    return True


def _chosen(layer, build):
    """The kernel `build()` makes, or None (lowering) when it is a reference one or cannot be made."""
    try:
        k = build()
    except capi.OneDNNError as err:
        layer.backend_ran = f"lowering ({err})"
        return None
    ref = [f"{p}={impl}" for p, impl in k.impls.items() if impl.startswith("ref")]
    if ref:
        layer.backend_ran = f"lowering (oneDNN offers only reference kernels: {', '.join(ref)})"
        return None
    layer.backend_ran = "onednn " + "/".join(dict.fromkeys(k.impls.values()))
    return k


def _src_layout(x, in_shape):
    from dasknn.nn.onednn.memory import plain_layout

    return x.layout if isinstance(x, Blocked) else plain_layout((x.shape[0], *in_shape))


def conv_kernel(layer, x):
    """The oneDNN kernel for Convolution `layer` on input `x`, or None to use lowering."""
    if not _wanted(layer, x):
        layer.backend_ran = "lowering"
        return None
    from dasknn.nn.onednn.kernels import ConvKernel, kernel

    c, h, w = layer.in_shape
    key = (x.shape[0], c, h, w, layer.num_output, layer.group, layer.kernel_size, layer.stride, layer.pad)
    return _chosen(layer, lambda: kernel(ConvKernel, *key, layer.out_shape[1:], layer.bias_term))


def average_divisor(layer) -> str | None:
    """oneDNN's average mode computing Caffe's AVE divisor for Pooling `layer`, or None.

    Caffe divides by the window clipped to the padded image: with no padding that is the count of
    real pixels ("exclude" padding); with padding it is the whole window ("include") as long as no
    window runs past the padding (Caffe's ceil rounding can add one that does)."""
    (top, bottom), (left, right) = layer._padded_extent()
    if layer.pad == (0, 0):
        return "exclude"
    if bottom <= layer.pad[0] and right <= layer.pad[1]:
        return "include"
    return None


def pool_kernel(layer, x):
    """The oneDNN kernel for Pooling `layer` on input `x`, or None to use lowering."""
    if not _wanted(layer, x):
        layer.backend_ran = "lowering"
        return None
    average = "exclude" if layer.pool == "max" else average_divisor(layer)
    if average is None:
        layer.backend_ran = "lowering (Caffe's average divisor: a window overflows the padding)"
        return None
    from dasknn.nn.onednn.kernels import PoolKernel, kernel

    src = _src_layout(x, layer.in_shape)
    args = (
        src,
        layer.out_shape[1:],
        layer.pool,
        layer.kernel_size,
        layer.stride,
        layer._padded_extent(),
        average,
    )
    return _chosen(layer, lambda: kernel(PoolKernel, *args))


def relu_kernel(layer, x):
    """The oneDNN kernel for ReLU `layer` on a 4-D input `x` (slope ≥ 0), or None to use numpy."""
    if x.ndim != 4 or layer.negative_slope < 0 or not _wanted(layer, x):
        layer.backend_ran = "lowering"
        return None
    from dasknn.nn.onednn.kernels import ReLUKernel, kernel

    src = _src_layout(x, layer.in_shape)
    return _chosen(layer, lambda: kernel(ReLUKernel, src, layer.negative_slope))


def lrn_kernel(layer, x):
    """The oneDNN kernel for LRN `layer` on input `x`, or None to use numpy."""
    if not _wanted(layer, x):
        layer.backend_ran = "lowering"
        return None
    from dasknn.nn.onednn.kernels import LRNKernel, kernel

    src = _src_layout(x, layer.in_shape)
    k = layer.k if layer.norm_region == "across_channels" else 1.0  # Caffe ignores k within a channel
    args = (src, layer.local_size, layer.alpha, layer.beta, k, layer.norm_region)
    return _chosen(layer, lambda: kernel(LRNKernel, *args))


def inner_product_kernel(layer, x2):
    """The oneDNN kernel for InnerProduct `layer` on its flattened (n, k) input `x2`, or None to use
    numpy's BLAS (the FC phase's GEMMs on the same OpenMP threads as the conv phase's kernels)."""
    if not _wanted(layer, x2):
        layer.backend_ran = "lowering"
        return None
    from dasknn.nn.onednn.dense import InnerProductKernel
    from dasknn.nn.onednn.kernels import kernel

    args = (x2.shape[0], x2.shape[1], layer.num_output, layer.bias_term)
    return _chosen(layer, lambda: kernel(InnerProductKernel, *args))


def net_backends(net, batch: int = 1) -> list[dict[str, str]]:
    """{layer, type, backend} per layer of `net`: what a float32 CPU forward of `batch` images runs
    (one forward of zeros, so each layer's choice, oneDNN's implementation included, is real)."""
    import copy

    probe = copy.deepcopy(net)
    probe.forward(
        np.zeros((batch, *net.input_shape), dtype=net.dtype), train=True, rng=np.random.default_rng(0)
    )
    return [
        {"layer": layer.name, "type": layer.type, "backend": getattr(layer, "backend_ran", "numpy")}
        for layer in probe.layers
    ]


def info() -> dict[str, Any]:
    """oneDNN's version, its CPU ISA and thread count here, or why it is unavailable."""
    try:
        lib = capi.library()
    except capi.OneDNNUnavailable as err:
        return {"available": False, "reason": str(err)}
    from dasknn.nn.onednn.memory import threads

    return {"available": True, "version": capi.version(), "threads": threads(), "library": lib._name}


def describe_kernels() -> str:
    """The CPU kernels "auto" picks for float32 layers, in words: oneDNN's version and threads, or
    batched lowering and why oneDNN is not there (what `dasknn info` and the experiments print)."""
    found = info()
    if not found["available"]:
        return f"batched lowering (oneDNN unavailable: {found['reason']})"
    return f"oneDNN {found['version']} ({found['threads']} threads), batched lowering as reference"
