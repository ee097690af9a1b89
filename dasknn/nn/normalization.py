"""BatchNorm and Scale (Caffe's split of batch normalisation, Ioffe & Szegedy 2015), and Softmax for
deploy nets: each forward and backward side by side.

BatchNorm keeps Caffe's three blobs: `mean`, `variance` (running sums) and `scale_factor`, with the
running estimate mean/scale_factor and variance/scale_factor. They are not learned: the solver
updates them as blob ← moving_average_fraction·blob + contribution (`Net.statistics`), where the
contribution of a batch is what `backward` returns for them. Contributions are weighted by the
number of images, n·batch mean, n·unbiased batch variance and n, so that the shards of one compute
group add up like gradients and the ratios are Caffe's (whose blobs count batches instead).
"""

from __future__ import annotations

import numpy as np

from dasknn.backend import array_module
from dasknn.nn.base import Layer
from dasknn.nn.fillers import Filler


def _channel_view(shape) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against a (N, C, ...) batch."""
    return (1, -1) + (1,) * (len(shape) - 2)


class BatchNorm(Layer):
    """Normalise each channel to zero mean and unit variance (Caffe's BatchNorm, no scale or shift).

    In training the batch's statistics are used (and contributed to the running ones); at test time,
    or always with `use_global_stats=True`, the running ones. `use_global_stats=None` is Caffe's
    default: False in training, True in test.
    """

    type = "BatchNorm"

    def __init__(
        self,
        name: str,
        use_global_stats: bool | None = None,
        moving_average_fraction: float = 0.999,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(name)
        self.use_global_stats = use_global_stats
        self.moving_average_fraction = float(moving_average_fraction)
        self.eps = float(eps)
        if not 0.0 <= self.moving_average_fraction <= 1.0 or not self.eps > 0:
            raise ValueError(f"layer {name!r}: need 0 <= moving_average_fraction <= 1 and eps > 0")
        self.lr_mult = {k: 0.0 for k in ("mean", "variance", "scale_factor")}
        self.decay_mult = dict(self.lr_mult)

    @property
    def statistics(self) -> dict[str, float]:
        """{blob: moving_average_fraction} of the running statistics the solver accumulates."""
        return {k: self.moving_average_fraction for k in ("mean", "variance", "scale_factor")}

    def param_shapes(self):
        c = self.in_shape[0]
        return {"mean": (c,), "variance": (c,), "scale_factor": (1,)}

    def init_params(self, rng, dtype=np.float32) -> None:
        self.params = {k: np.zeros(s, dtype=dtype) for k, s in self.param_shapes().items()}

    def _running(self, xp):
        factor = float(self.params["scale_factor"][0])
        scale = 0.0 if factor == 0 else 1.0 / factor
        return self.params["mean"] * scale, self.params["variance"] * scale

    def forward(self, x, train=True, rng=None):
        xp = array_module(x)
        view = _channel_view(x.shape)
        axes = (0, *range(2, x.ndim))
        global_stats = (not train) if self.use_global_stats is None else self.use_global_stats
        if global_stats:
            mean, var = self._running(xp)
            inv_std = 1.0 / xp.sqrt(var + x.dtype.type(self.eps))
            return (x - mean.reshape(view)) * inv_std.reshape(view), (None, inv_std, None)
        mean = x.mean(axis=axes)
        centred = x - mean.reshape(view)
        var = (centred * centred).mean(axis=axes)
        inv_std = 1.0 / xp.sqrt(var + x.dtype.type(self.eps))
        xhat = centred * inv_std.reshape(view)
        m = x.size // x.shape[1]
        n = x.dtype.type(x.shape[0])
        stats = {
            "mean": mean * n,
            "variance": var * x.dtype.type(n * m / max(m - 1, 1)),
            "scale_factor": xp.full((1,), n, dtype=x.dtype),
        }
        return xhat, (xhat, inv_std, stats)

    @staticmethod
    def contribution(cache) -> dict:
        """What the forward that left `cache` contributes to the running statistics ({} when it
        normalised by them: test mode, or `use_global_stats`); `backward` returns the same."""
        return dict(cache[2]) if cache[2] is not None else {}

    def backward(self, dy, cache, need_dx=True):
        xhat, inv_std, stats = cache
        view = _channel_view(dy.shape)
        grads = dict(stats) if stats is not None else {}
        if not need_dx:
            return None, grads
        if xhat is None:
            return dy * inv_std.reshape(view), grads
        axes = (0, *range(2, dy.ndim))
        mean_dy = dy.mean(axis=axes).reshape(view)
        mean_dy_xhat = (dy * xhat).mean(axis=axes).reshape(view)
        return (dy - mean_dy - xhat * mean_dy_xhat) * inv_std.reshape(view), grads

    def flops(self):
        return 4 * int(np.prod(self.out_shape))

    def config(self):
        return {
            "use_global_stats": self.use_global_stats,
            "moving_average_fraction": self.moving_average_fraction,
            "eps": self.eps,
        }


class Scale(Layer):
    """y = γ·x (+ β) with one learned γ (and β) per channel (Caffe's Scale with axis 1, one bottom),
    the learned affine part that follows BatchNorm."""

    type = "Scale"

    def __init__(
        self,
        name: str,
        bias_term: bool = True,
        filler: Filler | None = None,
        bias_filler: Filler | None = None,
        lr_mult: tuple[float, float] = (1.0, 1.0),
        decay_mult: tuple[float, float] = (1.0, 1.0),
    ) -> None:
        super().__init__(name)
        self.bias_term = bool(bias_term)
        self.filler = filler if filler is not None else Filler("constant", value=1.0)
        self.bias_filler = bias_filler if bias_filler is not None else Filler()
        self.lr_mult = {"weight": float(lr_mult[0]), "bias": float(lr_mult[1])}
        self.decay_mult = {"weight": float(decay_mult[0]), "bias": float(decay_mult[1])}

    def param_shapes(self):
        c = (self.in_shape[0],)
        return {"weight": c, "bias": c} if self.bias_term else {"weight": c}

    def init_params(self, rng, dtype=np.float32) -> None:
        shapes = self.param_shapes()
        self.params = {"weight": self.filler.fill(shapes["weight"], rng, dtype)}
        if self.bias_term:
            self.params["bias"] = self.bias_filler.fill(shapes["bias"], rng, dtype)

    def forward(self, x, train=True, rng=None):
        view = _channel_view(x.shape)
        y = x * self.params["weight"].reshape(view)
        if self.bias_term:
            y += self.params["bias"].reshape(view)
        return y, x

    def backward(self, dy, cache, need_dx=True):
        axes = (0, *range(2, dy.ndim))
        grads = {"weight": (dy * cache).sum(axis=axes)}
        if self.bias_term:
            grads["bias"] = dy.sum(axis=axes)
        dx = dy * self.params["weight"].reshape(_channel_view(dy.shape)) if need_dx else None
        return dx, grads

    def flops(self):
        return (2 if self.bias_term else 1) * int(np.prod(self.out_shape))

    def config(self):
        return {
            "bias_term": self.bias_term,
            "filler": self.filler,
            "bias_filler": self.bias_filler,
            "lr_mult": (self.lr_mult["weight"], self.lr_mult["bias"]),
            "decay_mult": (self.decay_mult["weight"], self.decay_mult["bias"]),
        }


class Softmax(Layer):
    """Class probabilities of a deploy net (Caffe's Softmax over axis 1): y = softmax(x);
    backward dx = y·(dy − Σ dy·y)."""

    type = "Softmax"

    def forward(self, x, train=True, rng=None):
        xp = array_module(x)
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        e = xp.exp(flat - flat.max(axis=1, keepdims=True))
        y = (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
        return y, y

    def backward(self, dy, cache, need_dx=True):
        if not need_dx:
            return None, {}
        y = cache
        return y * (dy - (dy * y).sum(axis=1, keepdims=True)), {}

    def flops(self):
        return 3 * int(np.prod(self.out_shape))
