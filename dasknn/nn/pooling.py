"""Pooling (max, average) and local response normalisation, with Caffe's exact conventions.

Both slide a window over a padded input; each is written as a loop over the few window offsets,
every step a vectorised operation on a strided view of the whole batch. A pooling window is
separable: its maximum (or sum) is taken along the rows first, over views whose rows stay
contiguous, then along the columns of that smaller result (`window_reduce`).
"""

from __future__ import annotations

import math

from dasknn.backend import array_module
from dasknn.nn.base import Layer, pair
from dasknn.nn.onednn import OneDNNCache, check_backend, lrn_kernel, plain, pool_kernel

POOL_METHODS = ("max", "ave")
NORM_REGIONS = ("across_channels", "within_channel")


def pool_output_size(n: int, k: int, stride: int, pad: int) -> int:
    """Caffe's pooled size: ceil((n + 2p − k)/s) + 1, minus one if the last window starts in the pad."""
    out = -(-(n + 2 * pad - k) // stride) + 1
    if pad > 0 and (out - 1) * stride >= n + pad:
        out -= 1
    return out


def _windows(xpad, kh, kw, sh, sw, oh, ow):
    """Yield (offset index, strided view) of each window position (i, j) over a padded batch."""
    for i in range(kh):
        for j in range(kw):
            yield (
                i * kw + j,
                (
                    slice(None),
                    slice(None),
                    slice(i, i + sh * (oh - 1) + 1, sh),
                    slice(j, j + sw * (ow - 1) + 1, sw),
                ),
            )


def window_reduce(xpad, kernel, stride, out_hw, op):
    """`op` (`maximum` or `add` of the array module) over every kh×kw window of a padded (N, C, Hp,
    Wp) batch at the given stride, taken separably: the kh rows of each output row first (kh − 1
    passes over full, contiguous rows), then the kw columns of that (N, C, oh, Wp) result."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw
    rows = xpad[:, :, 0 : sh * (oh - 1) + 1 : sh, :].copy()
    for i in range(1, kh):
        op(rows, xpad[:, :, i : i + sh * (oh - 1) + 1 : sh, :], out=rows)
    out = rows[..., 0 : sw * (ow - 1) + 1 : sw].copy()
    for j in range(1, kw):
        op(out, rows[..., j : j + sw * (ow - 1) + 1 : sw], out=out)
    return out


def window_scatter(g, padded_shape, kernel, stride):
    """The transpose of `window_reduce` with `add`: each output's g added to every element of its
    window over a zero (N, C, Hp, Wp) batch (overlapping windows add up), columns then rows."""
    xp = array_module(g)
    (kh, kw), (sh, sw) = kernel, stride
    n, c, oh, ow = g.shape
    rows = xp.zeros((n, c, oh, padded_shape[3]), dtype=g.dtype)
    for j in range(kw):
        rows[..., j : j + sw * (ow - 1) + 1 : sw] += g
    out = xp.zeros(padded_shape, dtype=g.dtype)
    for i in range(kh):
        out[:, :, i : i + sh * (oh - 1) + 1 : sh, :] += rows
    return out


def first_max_offsets(xpad, y, windows):
    """The window offset (i·kw + j) of the first maximum of each output's window, in window order as
    Caffe's argmax: one equality pass per offset, the later offsets written first so the first wins."""
    xp = array_module(y)
    windows = list(windows)
    offsets = xp.zeros(y.shape, dtype=xp.uint8 if len(windows) <= 256 else xp.int32)
    hit = xp.empty(y.shape, dtype=bool)
    for k, sl in reversed(windows):
        xp.equal(xpad[sl], y, out=hit)
        xp.putmask(offsets, hit, k)
    return offsets


def scatter_to_windows(dy, offsets, padded_shape, kernel, stride):
    """dL/dx over the padded input: each output's gradient added at its window's element `offsets`
    (overlapping windows add up), as one bincount over flat indices instead of a pass per offset."""
    xp = array_module(dy)
    n, c, hp, wp = padded_shape
    (kh, kw), (sh, sw) = kernel, stride
    _, _, oh, ow = dy.shape
    index = xp.int32 if n * c * hp * wp < 2**31 else xp.int64
    corner = (  # flat index of each window's top-left element in the padded (N·C, Hp, Wp) array
        (xp.arange(n * c, dtype=index) * (hp * wp))[:, None, None]
        + (xp.arange(oh, dtype=index) * (sh * wp))[:, None]
        + xp.arange(ow, dtype=index) * sw
    ).reshape(n, c, oh, ow)
    k = xp.arange(kh * kw, dtype=index)
    within = (k // kw) * wp + k % kw  # offset i·kw + j → i rows and j columns from the corner
    flat = corner + within[offsets]
    dx = xp.bincount(flat.ravel(), weights=dy.ravel(), minlength=n * c * hp * wp)
    return dx.astype(dy.dtype, copy=False).reshape(padded_shape)


class Pooling(Layer):
    """Max or average pooling over k×k windows with stride and padding (Caffe's PoolingLayer).

    Output size rounds up as Caffe does; a max window only sees real pixels; an average divides by
    the window's size clipped to the padded image (Caffe's AVE semantics). `backend` as
    Convolution's: oneDNN computes it where its divisor is Caffe's (`onednn.average_divisor`).
    """

    type = "Pooling"
    accepts_blocked = True

    def __init__(
        self,
        name: str,
        pool: str = "max",
        kernel_size: int | tuple[int, int] = 2,
        stride: int | tuple[int, int] = 1,
        pad: int | tuple[int, int] = 0,
        global_pooling: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__(name)
        self.backend = check_backend(backend, f"layer {name!r}")
        if pool not in POOL_METHODS:
            raise ValueError(f"layer {name!r}: unknown pool {pool!r}; expected one of {POOL_METHODS}")
        self.pool = pool
        self.kernel_size = pair(kernel_size, f"layer {name!r}: kernel_size")
        self.stride = pair(stride, f"layer {name!r}: stride")
        self.pad = pair(pad, f"layer {name!r}: pad")
        self.global_pooling = bool(global_pooling)
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.pad) < 0:
            raise ValueError(f"layer {name!r}: need kernel_size >= 1, stride >= 1, pad >= 0")
        if max(self.pad[0] - self.kernel_size[0], self.pad[1] - self.kernel_size[1]) >= 0:
            raise ValueError(f"layer {name!r}: pad must be smaller than the kernel")

    def _infer(self, in_shape):
        if len(in_shape) != 3:
            raise ValueError(f"layer {self.name!r}: Pooling needs (C, H, W) input, got {in_shape}")
        c, h, w = in_shape
        if self.global_pooling:
            self.kernel_size, self.stride, self.pad = (h, w), (1, 1), (0, 0)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        if h + 2 * ph < kh or w + 2 * pw < kw:
            raise ValueError(f"layer {self.name!r}: window {kh}x{kw} larger than padded input {h}x{w}")
        oh, ow = pool_output_size(h, kh, sh, ph), pool_output_size(w, kw, sw, pw)
        for axis, n, k, s, p, out in (("height", h, kh, sh, ph, oh), ("width", w, kw, sw, pw, ow)):
            if (out - 1) * s - p >= n:  # only when kernel < stride and pad = 0: Caffe keeps the window
                raise ValueError(
                    f"layer {self.name!r}: along the {axis} ({n}), the last of {out} windows "
                    f"(kernel_size {k}, stride {s}, pad {p}) starts past the input and pools nothing; "
                    "use a kernel_size >= stride, or pad"
                )
        return (c, oh, ow)

    def _padded_extent(self):
        (_, h, w), (_, oh, ow) = self.in_shape, self.out_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        # rows before the image (ph), the image, then enough rows for the last window.
        return (ph, max((oh - 1) * sh + kh - ph - h, 0)), (pw, max((ow - 1) * sw + kw - pw - w, 0))

    def _pad(self, x, fill):
        xp = array_module(x)
        (top, bottom), (left, right) = self._padded_extent()
        if top == bottom == left == right == 0:
            return x
        n, c, h, w = x.shape
        out = xp.full((n, c, top + h + bottom, left + w + right), fill, dtype=x.dtype)
        out[:, :, top : top + h, left : left + w] = x
        return out

    def _divisor(self, xp, dtype):
        """Caffe's AVE pool size per output: the window clipped to the image plus its padding."""
        (_, h, w), (_, oh, ow) = self.in_shape, self.out_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        hs = xp.arange(oh) * sh - ph
        ws = xp.arange(ow) * sw - pw
        hsize = xp.minimum(hs + kh, h + ph) - hs
        wsize = xp.minimum(ws + kw, w + pw) - ws
        return (hsize[:, None] * wsize[None, :]).astype(dtype)

    def forward(self, x, train=True, rng=None):
        kernel = pool_kernel(self, x)
        if kernel is not None:
            y, cache = kernel.forward(x)
            return y, OneDNNCache(kernel, cache)
        x = plain(x)
        xp = array_module(x)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        _, oh, ow = self.out_shape
        if self.pool == "max":
            xpad = self._pad(x, -xp.inf)
            y = window_reduce(xpad, (kh, kw), (sh, sw), (oh, ow), xp.maximum)
            return y, (xpad, y)
        xpad = self._pad(x, 0)
        y = window_reduce(xpad, (kh, kw), (sh, sw), (oh, ow), xp.add)
        y /= self._divisor(xp, x.dtype)
        return y, None

    def backward(self, dy, cache, need_dx=True):
        if not need_dx:
            return None, {}
        if isinstance(cache, OneDNNCache):
            return cache.kernel.backward(dy, cache.data), {}
        dy = plain(dy)
        xp = array_module(dy)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        (_, h, w), (_, oh, ow) = self.in_shape, self.out_shape
        (top, bottom), (left, right) = self._padded_extent()
        padded = (dy.shape[0], dy.shape[1], top + h + bottom, left + w + right)
        if self.pool == "max":
            xpad, y = cache
            offsets = first_max_offsets(xpad, y, _windows(xpad, kh, kw, sh, sw, oh, ow))
            dxpad = scatter_to_windows(dy, offsets, padded, (kh, kw), (sh, sw))
        else:
            g = dy / self._divisor(xp, dy.dtype)
            dxpad = window_scatter(g, padded, (kh, kw), (sh, sw))
        return dxpad[:, :, top : top + h, left : left + w], {}

    def flops(self):
        return math.prod(self.out_shape) * self.kernel_size[0] * self.kernel_size[1]

    def config(self):
        return {
            "pool": self.pool,
            "kernel_size": self.kernel_size,
            "stride": self.stride,
            "pad": self.pad,
            "global_pooling": self.global_pooling,
        }


class LRN(Layer):
    """Local response normalisation, Caffe's formula (AlexNet §3.3).

    across_channels: y = x · (k + α/n · Σ_{c' in window(c)} x_{c'}²)^−β, window of n channels;
    within_channel:  y = x · (1 + α/n² · Σ_{n×n spatial window} x²)^−β (Caffe ignores k here).
    """

    type = "LRN"
    accepts_blocked = True

    def __init__(
        self,
        name: str,
        local_size: int = 5,
        alpha: float = 1.0,
        beta: float = 0.75,
        k: float = 1.0,
        norm_region: str = "across_channels",
        backend: str = "auto",
    ) -> None:
        super().__init__(name)
        self.backend = check_backend(backend, f"layer {name!r}")
        self.local_size = int(local_size)
        if self.local_size < 1 or self.local_size % 2 == 0:
            raise ValueError(
                f"layer {name!r}: LRN local_size must be a positive odd number, got {local_size}"
            )
        if norm_region not in NORM_REGIONS:
            raise ValueError(
                f"layer {name!r}: unknown norm_region {norm_region!r}; expected one of {NORM_REGIONS}"
            )
        self.alpha, self.beta, self.k = float(alpha), float(beta), float(k)
        self.norm_region = norm_region

    def _window_sum(self, a):
        """Σ over the LRN window of `a` (channels, or an n×n spatial window), zero-padded."""
        xp = array_module(a)
        n, half = self.local_size, (self.local_size - 1) // 2
        if self.norm_region == "across_channels":
            c = a.shape[1]
            apad = xp.zeros((a.shape[0], c + n - 1, *a.shape[2:]), dtype=a.dtype)
            apad[:, half : half + c] = a
            out = apad[:, 0:c].copy()
            for i in range(1, n):
                out += apad[:, i : i + c]
            return out
        h, w = a.shape[2:]
        apad = xp.zeros((*a.shape[:2], h + n - 1, w + n - 1), dtype=a.dtype)
        apad[:, :, half : half + h, half : half + w] = a
        out = xp.zeros_like(a)
        for i in range(n):
            for j in range(n):
                out += apad[:, :, i : i + h, j : j + w]
        return out

    def _coefficients(self, dtype):
        if self.norm_region == "across_channels":
            return dtype.type(self.k), dtype.type(self.alpha / self.local_size)
        return dtype.type(1.0), dtype.type(self.alpha / self.local_size**2)

    def forward(self, x, train=True, rng=None):
        kernel = lrn_kernel(self, x)
        if kernel is not None:
            y, cache = kernel.forward(x)
            return y, OneDNNCache(kernel, cache)
        x = plain(x)
        shift, a = self._coefficients(x.dtype)
        scale = shift + a * self._window_sum(x * x)
        y = x * scale ** x.dtype.type(-self.beta)
        return y, (x, y, scale)

    def backward(self, dy, cache, need_dx=True):
        if not need_dx:
            return None, {}
        if isinstance(cache, OneDNNCache):
            return cache.kernel.backward(dy, cache.data), {}
        dy = plain(dy)
        x, y, scale = cache
        _, a = self._coefficients(dy.dtype)
        beta = dy.dtype.type(self.beta)
        dx = dy * scale ** (-beta) - (2 * a * beta) * x * self._window_sum(dy * y / scale)
        return dx, {}

    def flops(self):
        return math.prod(self.out_shape) * (2 * self.local_size + 4)

    def config(self):
        return {
            "local_size": self.local_size,
            "alpha": self.alpha,
            "beta": self.beta,
            "k": self.k,
            "norm_region": self.norm_region,
        }
