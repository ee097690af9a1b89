"""`Net`: an ordered list of layers with shape inference, costs per layer, and the phase split.

Omnivore §II-B: a CNN is a conv phase (conv, pool, ReLU, LRN: big data, small model) followed by an
FC phase (fully connected layers and the loss: small data, big model). `split_phases()` cuts a Net
there, at the first InnerProduct, into two Nets that share their layers (and so their parameters).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from dasknn.backend import array_module, to_device, to_numpy
from dasknn.nn.base import Layer
from dasknn.nn.layers import InnerProduct
from dasknn.nn.loss import accuracy, softmax, softmax_with_loss

Shape = tuple[int, ...]


MAX_PARAMS = 2**28
"""Most parameters a Net may have (1 GiB of float32; VGG-16 has 138 M)."""
MAX_BLOB = 2**28
"""Most values one image's input or any layer's output may hold (1 GiB of float32 per image)."""


class Net:
    """An ordered list of layers on a per-image input shape (C, H, W), ending in class scores.

    `transform` carries Caffe's `transform_param` (e.g. {"scale": 1/256}) for the data pipeline.
    Parameters are drawn from each layer's fillers with a generator seeded by `seed`, in layer order.
    """

    def __init__(
        self,
        layers: Sequence[Layer],
        input_shape: Sequence[int],
        name: str = "net",
        transform: dict | None = None,
        seed: int = 0,
        dtype: Any = np.float32,
        init_params: bool = True,
    ) -> None:
        self.layers = list(layers)
        if not self.layers:
            raise ValueError("a Net needs at least one layer")
        names = [layer.name for layer in self.layers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"layer names must be unique; repeated: {dupes}")
        self.input_shape: Shape = tuple(int(s) for s in input_shape)
        if not self.input_shape or min(self.input_shape) < 1:
            raise ValueError(f"input_shape must be positive sizes, e.g. (C, H, W); got {input_shape}")
        self.name = name
        self.transform = dict(transform) if transform else None
        self.seed = seed
        self.dtype = np.dtype(dtype)
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.setup(shape)
        self.output_shape: Shape = shape
        self._check_size()
        if init_params:
            rng = np.random.default_rng(seed)
            for layer in self.layers:
                layer.init_params(rng, self.dtype)

    def _check_size(self) -> None:
        """A ValueError when the parameters or one image's blobs pass MAX_PARAMS / MAX_BLOB, before any
        allocation: a typo such as `num_output: 1000000000` or a huge input must not exhaust memory."""
        for where, blob in [("input", self.input_shape), *((f"layer '{n}'", s) for n, s in self.shapes)]:
            if math.prod(blob) > MAX_BLOB:
                raise ValueError(
                    f"net: {where} has {math.prod(blob):,} values per image {blob}; at most {MAX_BLOB:,}"
                )
        n_params = 0
        for layer in self.layers:
            if hasattr(layer, "weight_shape"):
                w_shape = layer.weight_shape()
                n_params += math.prod(w_shape) + (w_shape[0] if layer.bias_term else 0)
        if n_params > MAX_PARAMS:
            raise ValueError(f"net: {n_params:,} parameters; dasknn builds nets of at most {MAX_PARAMS:,}")

    # -- structure -------------------------------------------------------------------------------
    @property
    def shapes(self) -> list[tuple[str, Shape]]:
        """(layer name, per-image output shape) for every layer, in order."""
        return [(layer.name, layer.out_shape) for layer in self.layers]

    @property
    def num_classes(self) -> int:
        """Number of class scores the net outputs."""
        return math.prod(self.output_shape)

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(
            f"no layer named {name!r} in net {self.name!r}; layers: {[lr.name for lr in self.layers]}"
        )

    def architecture(self) -> list[tuple[str, str, dict, Shape]]:
        """(type, name, hyperparameters, output shape) per layer: equal lists mean equal nets."""
        return [(layer.type, layer.name, layer.config(), layer.out_shape) for layer in self.layers]

    def summary(self) -> pd.DataFrame:
        """Per-layer costs: output shape, forward FLOPs per image, parameter and activation bytes."""
        itemsize = self.dtype.itemsize
        conv_names = {layer.name for layer in self.split_phases()[0].layers}
        rows = []
        for layer in self.layers:
            rows.append(
                {
                    "layer": layer.name,
                    "type": layer.type,
                    "phase": "conv" if layer.name in conv_names else "fc",
                    "output_shape": layer.out_shape,
                    "flops": layer.flops(),
                    "param_bytes": sum(int(p.size) for p in layer.params.values()) * itemsize,
                    "activation_bytes": math.prod(layer.out_shape) * itemsize,
                }
            )
        return pd.DataFrame(rows).set_index("layer")

    def split_point(self, at: str | None = None) -> int:
        """Index of the first FC-phase layer: `at` if given, else the first InnerProduct."""
        if at is not None:
            return self.layers.index(self.layer(at))
        for i, layer in enumerate(self.layers):
            if isinstance(layer, InnerProduct):
                return i
        return len(self.layers)

    def split_phases(self, at: str | None = None) -> tuple[Net, Net | None]:
        """(conv phase, FC phase) as two Nets sharing these layers; FC is None if the net has none.

        Omnivore §II-B: the split is at the first fully connected layer unless `at` names another.
        """
        i = self.split_point(at)
        if i == 0:
            raise ValueError(
                f"net {self.name!r}: the conv phase would be empty (split at {self.layers[0].name!r})"
            )
        kw = {"transform": self.transform, "seed": self.seed, "dtype": self.dtype, "init_params": False}
        conv = Net(self.layers[:i], self.input_shape, name=f"{self.name}/conv", **kw)
        if i == len(self.layers):
            return conv, None
        fc = Net(self.layers[i:], conv.output_shape, name=f"{self.name}/fc", **kw)
        return conv, fc

    # -- parameters ------------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Any]:
        """Live parameter arrays as a flat dict {"layer.param": array}."""
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.params.items()}

    def get_params(self) -> dict[str, np.ndarray]:
        """Copies of all parameters as numpy arrays (for servers and checkpoints)."""
        return {k: to_numpy(v).copy() for k, v in self.params.items()}

    def set_params(self, params: dict[str, Any], strict: bool = True) -> None:
        """Replace parameters from a flat dict; shapes must match; `strict` requires every name."""
        own = self.params
        unknown = sorted(set(params) - set(own))
        if unknown:
            raise KeyError(f"net {self.name!r} has no parameters {unknown}")
        missing = sorted(set(own) - set(params))
        if strict and missing:
            raise KeyError(f"parameters missing for net {self.name!r}: {missing}")
        for key, value in params.items():
            if tuple(value.shape) != tuple(own[key].shape):
                raise ValueError(
                    f"parameter {key!r}: shape {tuple(value.shape)} != expected {own[key].shape}"
                )
        for layer in self.layers:
            for k in layer.params:
                key = f"{layer.name}.{k}"
                if key in params:
                    xp = array_module(layer.params[k])
                    layer.params[k] = to_device(params[key], xp).astype(self.dtype, copy=True)

    @property
    def lr_mult(self) -> dict[str, float]:
        return {f"{layer.name}.{k}": layer.lr_mult.get(k, 1.0) for layer in self.layers for k in layer.params}

    @property
    def decay_mult(self) -> dict[str, float]:
        return {
            f"{layer.name}.{k}": layer.decay_mult.get(k, 1.0) for layer in self.layers for k in layer.params
        }

    @property
    def n_params(self) -> int:
        return sum(int(v.size) for v in self.params.values())

    def to(self, xp: ModuleType) -> Net:
        """Move all parameters to the array module `xp` (numpy or cupy), in place; returns self."""
        for layer in self.layers:
            layer.params = {k: to_device(v, xp) for k, v in layer.params.items()}
        return self

    def copy(self) -> Net:
        """A deep copy: same architecture, independent parameter arrays."""
        return copy.deepcopy(self)

    # -- computation -----------------------------------------------------------------------------
    def _check_input(self, x) -> None:
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(
                f"net {self.name!r} expects input of shape (N, {', '.join(map(str, self.input_shape))}), "
                f"got {tuple(x.shape)}"
            )

    def forward(self, x, train: bool = True, rng: np.random.Generator | None = None):
        """Run every layer; returns (output, caches for `backward`)."""
        self._check_input(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        caches = []
        for layer in self.layers:
            x, cache = layer.forward(x, train=train, rng=rng)
            caches.append(cache)
        return x, caches

    def backward(self, dout, caches, need_dx: bool = False):
        """Back-propagate dL/doutput; returns (dL/dinput or None, flat dict of parameter grads)."""
        grads: dict[str, Any] = {}
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            dout, g = layer.backward(dout, caches[i], need_dx=need_dx or i > 0)
            for k, v in g.items():
                grads[f"{layer.name}.{k}"] = v
        return dout, grads

    def loss_and_grads(self, x, labels, rng: np.random.Generator | None = None):
        """One forward and backward pass with SoftmaxWithLoss: (loss, batch accuracy, grads)."""
        logits, caches = self.forward(x, train=True, rng=rng)
        loss, dlogits = softmax_with_loss(logits, labels)
        _, grads = self.backward(dlogits, caches)
        return loss, accuracy(logits, labels), grads

    def predict_proba(self, x, batch_size: int = 256) -> np.ndarray:
        """Class probabilities for a numpy/cupy batch, computed `batch_size` images at a time."""
        self._check_input(x)
        out = []
        for i in range(0, x.shape[0], batch_size):
            logits, _ = self.forward(x[i : i + batch_size], train=False)
            out.append(to_numpy(softmax(logits)))
        return np.concatenate(out) if out else np.zeros((0, self.num_classes), dtype=self.dtype)

    def __repr__(self) -> str:
        lines = [f"Net({self.name!r}, input_shape={self.input_shape}, {self.n_params:,} parameters)"]
        lines += [f"  {layer!r} -> {layer.out_shape}" for layer in self.layers]
        return "\n".join(lines)
