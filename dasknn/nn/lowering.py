"""Convolution as lowering, one GEMM per batch partition, and lifting (Caffe con Troll §2).

A convolution of `bp` images at once *lowers* the images into a matrix D̂, multiplies it by the
kernel matrix K̂ in one GEMM and *lifts* the product R̂ back into the output; the three Types of
CcT §2.1 differ in where the k² blow-up sits (Type 1 im2col, Type 2 balanced, Type 3 expensive
lifting). The Types, the channels-last layout inside and strides: docs/architecture.md, "Lowering".
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from numbers import Integral
from typing import Any, NamedTuple

from dasknn.backend import array_module

__all__ = [
    "LOWERINGS",
    "ConvCache",
    "choose_lowering",
    "default_bp",
    "dx_by_convolution",
    "conv_backward",
    "conv_direct",
    "conv_forward",
    "conv_output_size",
    "largest_bp",
    "lowered_bytes",
]

LOWERINGS = ("type1", "type2", "type3")

TYPE1_MAX_D_OVER_O = 2.0
"""`choose_lowering` picks Type 1 while d/o ≤ this (see its docstring for the measurements)..."""
TYPE3_MIN_D_OVER_O = 16.0
"""... Type 3 from this d/o up, and Type 2 in between."""

_CACHE_BYTES = 8 * 2**20
"""Working set of one col2im pass on the CPU (the Type 1 scatter-add stays in the last-level cache)."""
PARTITION_BYTES = 8 * 2**20
"""Lowered bytes per batch partition that `default_bp` aims for on the CPU (see its docstring)."""
_SLAB_MIN_CHANNELS = 8
"""Type 1 col2im runs one GEMM per kernel tap from this many input channels up (`_col2im_type1`)."""
DX_CONV_MIN_CHANNELS = 8
"""`dx_by_convolution` takes dx as a convolution of dy from this many input channels up."""


class _Geometry(NamedTuple):
    n: int  # images
    c: int  # input channels (d)
    h: int
    w: int
    o: int  # output channels (o)
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    oh: int  # output rows (m)
    ow: int
    hu: int  # padded rows any window touches: (oh - 1)·sh + kh
    wu: int


@dataclass(frozen=True)
class ConvCache:
    """What `conv_backward` needs from `conv_forward`: the padded input, weights, shapes and choices.

    `lowered` keeps D̂ of the whole batch when bp == N (Types 1 and 2), so backward's dW GEMM does not
    lower again (one im2col copy saved, experiments/README.md), at the price of holding D̂ until the
    cache is dropped (with bp < N, the CPU default for all but small layers, D̂ is rebuilt per
    partition while it fits in cache).
    `lowered_nbytes` is the size of the lowering buffers forward allocated (D̂ plus the R̂ that
    lifting reads), which `lowered_bytes` predicts.
    """

    xpad: Any
    k_hat: Any
    geometry: _Geometry
    lowering: str
    bp: int
    lowered: Any | None
    lowered_nbytes: int


def conv_output_size(n: int, k: int, stride: int, pad: int) -> int:
    """Output length of a convolution along one axis: ⌊(n + 2·pad − k)/stride⌋ + 1."""
    return (n + 2 * pad - k) // stride + 1


def _pair(v: int | tuple[int, int], name: str, least: int) -> tuple[int, int]:
    """(v, v) for an int, v for a pair; a ValueError unless both are integers >= least."""
    try:
        pair = tuple(operator.index(p) for p in ((v, v) if isinstance(v, Integral) else v))
    except TypeError:
        pair = ()
    if len(pair) != 2 or min(pair) < least:
        raise ValueError(f"{name} must be an int >= {least} or a pair of them; got {v!r}")
    return pair


def _geometry(x_shape: tuple, w_shape: tuple, stride: Any, pad: Any) -> _Geometry:
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(f"x must be (N, C, H, W) and w (O, C, KH, KW); got {x_shape} and {w_shape}")
    n, c, h, w = (int(s) for s in x_shape)
    o, cw, kh, kw = (int(s) for s in w_shape)
    if c != cw:
        raise ValueError(f"input has {c} channels but the kernels expect {cw}")
    (sh, sw), (ph, pw) = _pair(stride, "stride", 1), _pair(pad, "pad", 0)
    if kh > h + 2 * ph or kw > w + 2 * pw:
        raise ValueError(f"kernel {kh}x{kw} is larger than the padded input {h + 2 * ph}x{w + 2 * pw}")
    if min(n, c, o, kh, kw) < 1:
        raise ValueError(f"empty convolution: x {x_shape}, w {w_shape}")
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    return _Geometry(n, c, h, w, o, kh, kw, sh, sw, ph, pw, oh, ow, (oh - 1) * sh + kh, (ow - 1) * sw + kw)


def _check_lowering(lowering: str) -> str:
    if lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS} or 'auto'; got {lowering!r}")
    return lowering


def _lowered_rows(g: _Geometry, lowering: str) -> int:
    """Rows of D̂ (and R̂) per image: m² (Type 1), n·m (Type 2), n² (Type 3)."""
    return {"type1": g.oh * g.ow, "type2": g.hu * g.ow, "type3": g.hu * g.wu}[lowering]


def _lowered_cols(g: _Geometry, lowering: str) -> int:
    """Columns of D̂: k²d (Type 1), kd (Type 2), d (Type 3)."""
    return {"type1": g.kh * g.kw * g.c, "type2": g.kw * g.c, "type3": g.c}[lowering]


def _lifted_cols(g: _Geometry, lowering: str) -> int:
    """Columns of R̂ that lifting reads: none for Type 1 (R̂ is the output), ko (Type 2), k²o (Type 3)."""
    return {"type1": 0, "type2": g.kh * g.o, "type3": g.kh * g.kw * g.o}[lowering]


def lowered_bytes(
    image_shape: tuple[int, int, int],
    w_shape: tuple[int, int, int, int],
    stride: int | tuple[int, int],
    pad: int | tuple[int, int],
    bp: int,
    lowering: str = "type1",
    itemsize: int = 4,
) -> int:
    """Bytes of the lowered matrix D̂ for `bp` images of shape (C, H, W), plus R̂ where lifting needs it.

    Caffe con Troll §2.2: memory grows linearly in bp. Type 1: bp·m²·k²d (R̂ is the output itself);
    Type 2: bp·n·m·(kd + ko); Type 3: bp·n²·(d + k²o), with n the used padded extent.
    """
    g = _geometry((1, *image_shape), w_shape, stride, pad)
    lowering = _check_lowering(lowering)
    per_image = _lowered_rows(g, lowering) * (_lowered_cols(g, lowering) + _lifted_cols(g, lowering))
    return int(bp) * per_image * int(itemsize)


def largest_bp(
    image_shape: tuple[int, int, int],
    w_shape: tuple[int, int, int, int],
    stride: int | tuple[int, int],
    pad: int | tuple[int, int],
    batch_size: int,
    memory_budget_bytes: int,
    lowering: str = "type1",
    itemsize: int = 4,
) -> int:
    """The largest bp ≤ batch_size whose lowered bytes fit the budget; 1 when even one image does not.

    Caffe con Troll §2.2 (batch partitions): the biggest partition that fits gives the largest GEMM.
    """
    if batch_size < 1 or memory_budget_bytes < 0:
        raise ValueError(f"need batch_size >= 1 and a budget >= 0; got {batch_size}, {memory_budget_bytes}")
    per_image = lowered_bytes(image_shape, w_shape, stride, pad, 1, lowering, itemsize)
    return int(max(1, min(batch_size, memory_budget_bytes // per_image)))


def choose_lowering(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: int | tuple[int, int] = (1, 1),
    pad: int | tuple[int, int] = (0, 0),
) -> str:
    """The lowering for "auto" by CcT's d/o rule: Type 1 for small d/o, Type 2 between, Type 3 for large.

    Caffe con Troll Appendix A: the bytes moved are ∝ k²d + o (Type 1), k(d + o) (Type 2) and
    d + k²o (Type 3), so by bytes alone Type 1 would give way to Type 2 at d/o = 1/k and Type 2 to
    Type 3 at d/o = k. Here all three GEMMs run near peak, but Types 2 and 3 also compute the padded
    border (n² rows instead of m²) and lift in k or k² separate passes, which moves the crossovers
    up: by the three Types' measured speeds (experiments/README.md, "Measurements behind the code's
    choices"), Type 1 up to d/o = TYPE1_MAX_D_OVER_O (2), Type 3 from TYPE3_MIN_D_OVER_O (16),
    Type 2 between. CaffeNet (d/o ≤ 1.5) and LeNet take Type 1.
    Strided layers always take Type 1: Types 2 and 3 compute s or s² times the useful FLOPs.
    """
    g = _geometry(tuple(x_shape), tuple(w_shape), stride, pad)
    ratio = g.c / g.o
    if ratio <= TYPE1_MAX_D_OVER_O or g.sh > 1 or g.sw > 1:
        return "type1"
    return "type3" if ratio >= TYPE3_MIN_D_OVER_O else "type2"


def default_bp(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: int | tuple[int, int] = (1, 1),
    pad: int | tuple[int, int] = (0, 0),
    lowering: str = "type1",
    itemsize: int = 4,
    device: str = "cpu",
) -> int:
    """Images per GEMM when bp is None: the whole batch on a GPU, a cache-sized partition on a CPU.

    Caffe con Troll §2.2 sizes bp by memory; on the CPU the partition whose D̂ and R̂ take at most
    PARTITION_BYTES wins, because a partition that stays in cache is lowered, multiplied and
    lifted without a trip to DRAM, and its buffers are reused instead of freshly faulted in.
    GEMMs of a few images are already large enough to run near peak (M = bp·m² rows). CPU time of
    forward+backward, one BLAS thread (2-core Xeon, AVX-512, shared), default bp vs bp = N:
    CIFAR-10 quick (b = 128) conv1 67 vs 99 ms (bp 27), conv2 88 vs 103 ms (bp 10), conv3 36 vs
    38 ms; LeNet conv2 (b = 64, bp = N); CaffeNet (b = 64) conv2 1.56 vs 1.51 s (bp 1), conv3
    0.47 vs 0.47 s (bp 5).
    """
    g = _geometry(tuple(x_shape), tuple(w_shape), stride, pad)
    if device != "cpu":
        return g.n
    image_bytes = lowered_bytes((g.c, g.h, g.w), w_shape, stride, pad, 1, _check_lowering(lowering), itemsize)
    return int(max(1, min(g.n, PARTITION_BYTES // image_bytes)))


def dx_by_convolution(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: int | tuple[int, int] = (1, 1),
    pad: int | tuple[int, int] = (0, 0),
) -> bool:
    """Whether backward computes dx as a convolution of dy instead of dD̂ = dR̂·K̂ᵀ and a col2im.

    For stride 1, dx is the full convolution of dy with the kernels flipped in space and their
    channels swapped, padded by k − 1 − pad. Its GEMM has forward's shape, K = k²o and N = d, where
    col2im's per-tap GEMMs have K = o and N = d, too thin for BLAS when both are small. It computes
    H·W rows where col2im's GEMM has m², so it is taken only for "same" convolutions (m ≥ H, W), and
    from DX_CONV_MIN_CHANNELS input channels up (below, dx is rarely wanted: first layers). CPU time
    of dx alone, one BLAS thread (2-core Xeon, AVX-512), col2im vs convolution: CIFAR-10 quick conv2
    (d = o = 32, b = 128) 33 vs 22 ms, conv3 (32→64) 12.4 vs 12.0 ms; LeNet conv2 (pad 0) 3.8 vs
    5.7 ms, hence the "same" rule.
    """
    g = _geometry(tuple(x_shape), tuple(w_shape), stride, pad)
    same = g.oh >= g.h and g.ow >= g.w and g.ph <= g.kh - 1 and g.pw <= g.kw - 1
    return g.c >= DX_CONV_MIN_CHANNELS and g.sh == g.sw == 1 and same


def _transposed_kernels(w: Any) -> Any:
    """The kernels of dx = conv(dy, ·): w (O, C, KH, KW) flipped in space, as (C, O, KH, KW)."""
    xp = array_module(w)
    return xp.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))


def _chunks(n: int, step: int) -> Iterator[tuple[int, int]]:
    for a in range(0, n, step):
        yield a, min(n, a + step)


def _pad_channels_last(x: Any, g: _Geometry, dtype: Any) -> Any:
    """x (N, C, H, W) as a zero-padded (N, n_h, n_w, C) array over the extent that windows touch."""
    xp = array_module(x)
    xpad = xp.zeros((g.n, g.hu, g.wu, g.c), dtype=dtype)
    hh, ww = max(0, min(g.h, g.hu - g.ph)), max(0, min(g.w, g.wu - g.pw))
    xpad[:, g.ph : g.ph + hh, g.pw : g.pw + ww, :] = x[:, :, :hh, :ww].transpose(0, 2, 3, 1)
    return xpad


def _unpad_channels_first(dxpad: Any, g: _Geometry) -> Any:
    """The gradient of `_pad_channels_last`: dxpad (N, n_h, n_w, C) back to (N, C, H, W)."""
    xp = array_module(dxpad)
    hh, ww = max(0, min(g.h, g.hu - g.ph)), max(0, min(g.w, g.wu - g.pw))
    dx = (xp.empty if (hh, ww) == (g.h, g.w) else xp.zeros)((g.n, g.c, g.h, g.w), dtype=dxpad.dtype)
    dx[:, :, :hh, :ww] = dxpad[:, g.ph : g.ph + hh, g.pw : g.pw + ww, :].transpose(0, 3, 1, 2)
    return dx


def _lower(xpad: Any, g: _Geometry, lowering: str, out: Any | None) -> Any:
    """D̂ of the images of `xpad` (bp, n, n, C), one strided copy into `out`; Type 3's D̂ is xpad itself."""
    xp = array_module(xpad)
    nb = xpad.shape[0]
    if lowering == "type3":  # D̂[(i, r, c), ch] = D[i, r, c, ch]
        return xpad.reshape(nb * g.hu * g.wu, g.c)
    s0, s1, s2, s3 = xpad.strides
    if lowering == "type1":  # D̂[(i, r, c), (kh, kw, ch)] = D[i, r·sh + kh, c·sw + kw, ch]
        shape = (nb, g.oh, g.ow, g.kh, g.kw * g.c)
        strides = (s0, g.sh * s1, g.sw * s2, s1, s3)
    else:  # Type 2: D̂[(i, r, c), (kw, ch)] = D[i, r, c·sw + kw, ch]
        shape, strides = (nb, g.hu, g.ow, g.kw * g.c), (s0, s1, g.sw * s2, s3)
    d_hat = out[: nb * _lowered_rows(g, lowering)]
    d_hat.reshape(shape)[...] = xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)
    return d_hat


def _kernel_matrix(w: Any, lowering: str) -> Any:
    """K̂ from w (O, C, KH, KW): Type 1 (O, k²d) used transposed, Type 2 (kd, ko), Type 3 (d, k²o)."""
    xp = array_module(w)
    o, c, kh, kw = w.shape
    if lowering == "type1":
        return xp.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(o, kh * kw * c)
    if lowering == "type2":
        return xp.ascontiguousarray(w.transpose(3, 1, 2, 0)).reshape(kw * c, kh * o)
    return xp.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(c, kh * kw * o)


def _weights_from(dk: Any, g: _Geometry, lowering: str) -> Any:
    """The gradient of `_kernel_matrix`: dK̂ back to (O, C, KH, KW)."""
    xp = array_module(dk)
    if lowering == "type1":
        dw = dk.reshape(g.o, g.kh, g.kw, g.c).transpose(0, 3, 1, 2)
    elif lowering == "type2":
        dw = dk.reshape(g.kw, g.c, g.kh, g.o).transpose(3, 1, 2, 0)
    else:
        dw = dk.reshape(g.c, g.kh, g.kw, g.o).transpose(3, 0, 1, 2)
    return xp.ascontiguousarray(dw)


def _window(start: int, m: int, stride: int) -> slice:
    """The m positions start, start + stride, ... that one kernel tap reads along an axis."""
    return slice(start, start + (m - 1) * stride + 1, stride)


def _tap_views(r_hat: Any, g: _Geometry, lowering: str) -> list[Any]:
    """The shifted slices of R̂ that lifting sums, one (bp, m, m, o) view per kernel tap (Types 2, 3)."""
    nb = r_hat.shape[0] // _lowered_rows(g, lowering)
    if lowering == "type2":  # R[i, r, c] = Σ_kh R̂[i, r·sh + kh, c, kh]
        r = r_hat.reshape(nb, g.hu, g.ow, g.kh, g.o)
        return [r[:, _window(i, g.oh, g.sh), :, i] for i in range(g.kh)]
    r = r_hat.reshape(nb, g.hu, g.wu, g.kh, g.kw, g.o)  # Type 3: sum over both taps
    return [
        r[:, _window(i, g.oh, g.sh), _window(j, g.ow, g.sw), i, j] for i in range(g.kh) for j in range(g.kw)
    ]


def _lift(r_hat: Any, g: _Geometry, lowering: str) -> Any:
    """The output (bp, m, m, o), channels-last, from R̂ = D̂·K̂ (trivial for Type 1)."""
    if lowering == "type1":
        return r_hat.reshape(-1, g.oh, g.ow, g.o)
    taps = _tap_views(r_hat, g, lowering)
    out = taps[0].copy()
    for tap in taps[1:]:
        out += tap
    return out


def _lift_transpose(dy: Any, g: _Geometry, lowering: str, out: Any) -> Any:
    """dR̂ from dy (bp, m, m, o): the adjoint of `_lift`, written into `out` (Types 2, 3)."""
    out[...] = 0
    for tap in _tap_views(out, g, lowering):
        tap[...] = dy
    return out


def conv_forward(
    x: Any,
    w: Any,
    stride: int | tuple[int, int] = (1, 1),
    pad: int | tuple[int, int] = (0, 0),
    lowering: str = "auto",
    bp: int | None = None,
    bias: Any | None = None,
) -> tuple[Any, ConvCache]:
    """y = conv(x, w) + bias for x (N, C, H, W), w (O, C, KH, KW) by lowering bp images per GEMM.

    Caffe con Troll §2.1 (lowering, multiply, lifting) and §2.2 (batching): the batch is processed
    in partitions of `bp` images (None: `default_bp`; bp > N is taken as N). The bias (O,), if
    given, is added while the lifted partition is written out, not in a pass of its own. Computes
    in the dtype of x (float32 or float64; other dtypes are promoted).
    """
    xp = array_module(x)
    g = _geometry(tuple(x.shape), tuple(w.shape), stride, pad)
    if lowering == "auto":
        lowering = choose_lowering(x.shape, w.shape, stride, pad)
    _check_lowering(lowering)
    dtype = xp.result_type(x.dtype, xp.float32)
    if bp is None:
        device = "cpu" if xp.__name__ == "numpy" else "gpu"
        bp = default_bp(x.shape, w.shape, stride, pad, lowering, dtype.itemsize, device)
    bp = int(bp)
    if bp < 1:
        raise ValueError(f"bp must be >= 1 (images lowered per GEMM); got {bp}")
    bp = min(bp, g.n)
    xpad = _pad_channels_last(x, g, dtype)
    k_hat = _kernel_matrix(xp.asarray(w, dtype=dtype), lowering)
    rows = _lowered_rows(g, lowering)
    low = None if lowering == "type3" else xp.empty((bp * rows, _lowered_cols(g, lowering)), dtype)
    r_buf = xp.empty((bp * rows, _lifted_cols(g, lowering) or g.o), dtype)
    y = xp.empty((g.n, g.o, g.oh, g.ow), dtype)
    if bias is not None:
        if tuple(bias.shape) != (g.o,):
            raise ValueError(
                f"bias must have shape ({g.o},), one per output channel; got {tuple(bias.shape)}"
            )
        bias_nchw = xp.asarray(bias, dtype=dtype).reshape(1, g.o, 1, 1)
    for a, b in _chunks(g.n, bp):
        d_hat = _lower(xpad[a:b], g, lowering, low)
        r_hat = xp.matmul(d_hat, k_hat.T if lowering == "type1" else k_hat, out=r_buf[: (b - a) * rows])
        lifted = _lift(r_hat, g, lowering).transpose(0, 3, 1, 2)
        if bias is None:
            y[a:b] = lifted
        else:
            xp.add(lifted, bias_nchw, out=y[a:b])
    nbytes = (xpad[:bp].nbytes if low is None else low.nbytes) + (lowering != "type1") * r_buf.nbytes
    keep = low if bp == g.n and lowering != "type3" else None
    return y, ConvCache(xpad, k_hat, g, lowering, bp, keep, nbytes)


def conv_backward(dy: Any, cache: ConvCache, need_dx: bool = True) -> tuple[Any | None, Any]:
    """(dx, dw) of the convolution that made `cache`, given dy (N, O, OH, OW); dx is None unless need_dx.

    Caffe con Troll §2.1 run backwards, per partition of bp images: dR̂ is the adjoint of lifting,
    dK̂ = D̂ᵀ·dR̂, dD̂ = dR̂·K̂ᵀ, and the adjoint of lowering scatter-adds dD̂ into dx: col2im over the
    k² taps for Type 1 (`_col2im_type1`), k column-shifted slabs for Type 2, nothing for Type 3
    (its D̂ is the padded input itself).
    """
    xp = array_module(dy)
    g, lowering, bp, k_hat = cache.geometry, cache.lowering, cache.bp, cache.k_hat
    if tuple(dy.shape) != (g.n, g.o, g.oh, g.ow):
        raise ValueError(f"dy has shape {tuple(dy.shape)}; the forward output was {(g.n, g.o, g.oh, g.ow)}")
    dtype, rows = cache.xpad.dtype, _lowered_rows(g, lowering)
    dx = None
    if need_dx and dx_by_convolution(
        (g.n, g.c, g.h, g.w), (g.o, g.c, g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw)
    ):
        w_t = _transposed_kernels(_weights_from(k_hat, g, lowering))
        dx, _ = conv_forward(dy, w_t, 1, (g.kh - 1 - g.ph, g.kw - 1 - g.pw))
        need_dx = False
    channels_first = lowering == "type1" and g.c < _SLAB_MIN_CHANNELS
    dxpad = None
    if need_dx and channels_first:  # an NHWC view of CNHW memory, for col2im's channels-first scatter
        dxpad = xp.zeros((g.c, g.n, g.hu, g.wu), dtype).transpose(1, 2, 3, 0)
    elif need_dx:
        dxpad = xp.zeros((g.n, g.hu, g.wu, g.c), dtype)
    dk, dk_part = xp.zeros(k_hat.shape, dtype), xp.empty(k_hat.shape, dtype)
    dy_buf = xp.empty((bp, g.oh, g.ow, g.o), dtype)
    low = None  # D̂ of a partition when forward kept none; col2im's scratch too with few channels
    if lowering != "type3" and (cache.lowered is None or (need_dx and channels_first)):
        low = xp.empty((bp * rows, _lowered_cols(g, lowering)), dtype)
    dr_buf = None if lowering == "type1" else xp.empty((bp * rows, _lifted_cols(g, lowering)), dtype)
    for a, b in _chunks(g.n, bp):
        nb = b - a
        dyc = dy_buf[:nb]
        dyc[...] = dy[a:b].transpose(0, 2, 3, 1)
        if cache.lowered is not None:
            d_hat = cache.lowered[a * rows : b * rows]
        else:
            d_hat = _lower(cache.xpad[a:b], g, lowering, low)
        if lowering == "type1":  # dK̂ᵀ = dR̂ᵀ·D̂, with dR̂ = dy (trivial lifting)
            d_r = dyc.reshape(nb * rows, g.o)
            dk += xp.matmul(d_r.T, d_hat, out=dk_part)
        else:
            d_r = _lift_transpose(dyc, g, lowering, dr_buf[: nb * rows])
            dk += xp.matmul(d_hat.T, d_r, out=dk_part)
        if not need_dx:
            continue
        if lowering == "type1":
            _col2im_type1(d_r, k_hat, g, dxpad[a:b], low[: nb * rows] if channels_first else None)
        elif lowering == "type3":
            xp.matmul(d_r, k_hat.T, out=dxpad[a:b].reshape(nb * rows, g.c))
        else:
            d_d = xp.matmul(d_r, k_hat.T, out=low[: nb * rows] if cache.lowered is None else None)
            d_d = d_d.reshape(nb, g.hu, g.ow, g.kw, g.c)
            for kw in range(g.kw):
                dxpad[a:b, :, _window(kw, g.ow, g.sw)] += d_d[:, :, :, kw]
    if need_dx:
        dx = _unpad_channels_first(dxpad, g)
    return dx, _weights_from(dk, g, lowering)


def _col2im_type1(d_r: Any, k_hat: Any, g: _Geometry, dxpad: Any, scratch: Any | None) -> None:
    """dxpad += col2im(dR̂·K̂ᵀ): the adjoint of Type 1 lowering, a scatter-add over the k² kernel taps.

    With many channels, the dD̂ GEMM runs one tap at a time on a few images, and its (rows, C) slab
    is added into the tap's strided window of dxpad while both are in cache (~10% faster than one
    GEMM then col2im on CaffeNet conv2-conv5). With few channels (C < 8, first layers) those GEMMs
    would be C columns wide, so dD̂ᵀ is one GEMM into `scratch` and each tap's block, laid out
    (C, bp, m, m), is added into a channels-first dxpad.
    """
    xp = array_module(d_r)
    nb, rows = dxpad.shape[0], g.oh * g.ow
    if scratch is not None:
        d_dt = xp.matmul(k_hat.T, d_r.T, out=scratch.reshape(k_hat.shape[1], nb * rows))
        d_dt = d_dt.reshape(g.kh, g.kw, g.c, nb, g.oh, g.ow)
        dx_cf = dxpad.transpose(3, 0, 1, 2)
        for kh in range(g.kh):
            for kw in range(g.kw):
                dx_cf[:, :, _window(kh, g.oh, g.sh), _window(kw, g.ow, g.sw)] += d_dt[kh, kw]
        return
    w_taps = xp.ascontiguousarray(k_hat.reshape(g.o, g.kh, g.kw, g.c).transpose(1, 2, 0, 3))
    image_bytes = (g.hu * g.wu * g.c + rows * (g.c + g.o)) * dxpad.itemsize
    step = max(1, _CACHE_BYTES // image_bytes) if xp.__name__ == "numpy" else nb
    slab = xp.empty((min(step, nb) * rows, g.c), dxpad.dtype)
    for a, b in _chunks(nb, step):
        d_rs, out = d_r[a * rows : b * rows], slab[: (b - a) * rows]
        for kh in range(g.kh):
            for kw in range(g.kw):
                window = dxpad[a:b, _window(kh, g.oh, g.sh), _window(kw, g.ow, g.sw)]
                window += xp.matmul(d_rs, w_taps[kh, kw], out=out).reshape(window.shape)


def conv_direct(
    x: Any, w: Any, stride: int | tuple[int, int] = (1, 1), pad: int | tuple[int, int] = (0, 0)
) -> Any:
    """Reference convolution by CcT Eq. 1, no lowering: Σ over taps (kh, kw) of an einsum over channels.

    For tests and cross-checks: plain NCHW arithmetic that shares no layout code with the lowerings.
    """
    xp = array_module(x)
    g = _geometry(tuple(x.shape), tuple(w.shape), stride, pad)
    xpad = xp.pad(x, ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    y = xp.zeros((g.n, g.o, g.oh, g.ow), dtype=xp.result_type(x.dtype, w.dtype, xp.float32))
    for i in range(g.kh):
        for j in range(g.kw):
            window = xpad[:, :, _window(i, g.oh, g.sh), _window(j, g.ow, g.sw)]
            y += xp.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return y
