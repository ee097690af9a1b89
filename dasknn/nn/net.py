"""`Net`: a directed acyclic graph of layers over named blobs, with shape inference, costs per
layer, several weighted losses, and the phase split.

Caffe's model: each layer reads its `bottom` blobs and writes one `top` blob (in place allowed, as
Caffe's ReLU), a blob read by several layers gets the sum of their gradients (Caffe's implicit
Split), and layers run in the given topological order, backward in reverse; a plain list of layers
is a chain. `split_phases()` cuts a Net at Omnivore's conv/FC boundary (§II-B) into two Nets that
share their layers (`split_layers`: the rule on graphs, auxiliary loss heads included).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.backend import array_module, to_device, to_numpy
from dasknn.nn.base import Layer
from dasknn.nn.layers import InnerProduct
from dasknn.nn.loss import accuracy, softmax, softmax_with_loss
from dasknn.nn.onednn import check_backend, plain
from dasknn.nn.onednn.memory import add

if TYPE_CHECKING:
    import pandas as pd

Shape = tuple[int, ...]


MAX_PARAMS = 2**28
"""Most parameters a Net may have (1 GiB of float32; VGG-16 has 138 M)."""
MAX_BLOB = 2**28
"""Most values one image's input or any layer's output may hold (1 GiB of float32 per image)."""


def _names(value: str | Sequence[str], what: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must be a blob name or a list of blob names, got {value!r}")
    return names


def pack(arrays: Sequence[Any]):
    """Several blobs of one batch as one (N, Σ values) array: what crosses the phase split when more
    than one blob does (the main path and auxiliary heads)."""
    if len(arrays) == 1:
        return arrays[0]
    xp = array_module(arrays[0])
    return xp.concatenate([a.reshape(a.shape[0], -1) for a in arrays], axis=1)


def unpack(x, shapes: Sequence[Shape]) -> list[Any]:
    """The blobs of per-image `shapes` inside a packed (N, Σ values) array (inverse of `pack`)."""
    if len(shapes) == 1:
        return [x]
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(x[:, start : start + size].reshape((x.shape[0], *shape)))
        start += size
    return out


class Net:
    """A graph of layers on a per-image input shape (C, H, W), ending in class scores.

    `layers` holds Layers (each reads the previous entry's output: a chain) or `(layer, bottom, top)`
    entries (bottom: a blob name or a list of them; top: a blob name). The input blob is called
    `input_blob`; each chained layer writes a blob named after itself. The main output is the last
    layer's top; every other blob that no layer reads is an auxiliary output and needs a weight in
    `loss_weights` (Caffe's `loss_weight` of a SoftmaxWithLoss on it, e.g. GoogLeNet's 0.3).
    `transform` carries Caffe's `transform_param` (e.g. {"scale": 1/256}) for the data pipeline.
    Parameters are drawn from each layer's fillers with a generator seeded by `seed`, in layer order.
    `backend` ("auto", "lowering" or "onednn"; None keeps each layer's own) sets the kernel backend
    of every conv-phase layer that has one (`dasknn.nn.onednn`); it travels with the layers, so
    copies, pickles, phase splits and the workers' copies keep it.
    """

    def __init__(
        self,
        layers: Sequence[Layer | tuple[Layer, str | Sequence[str], str]],
        input_shape: Sequence[int],
        name: str = "net",
        transform: dict | None = None,
        seed: int = 0,
        dtype: Any = np.float32,
        init_params: bool = True,
        loss_weights: dict[str, float] | None = None,
        input_blob: str = "data",
        backend: str | None = None,
        *,
        _inputs: Sequence[tuple[str, Shape]] | None = None,
        _outputs: Sequence[str] | None = None,
    ) -> None:
        if not layers:
            raise ValueError("a Net needs at least one layer")
        self.layers: list[Layer] = []
        entries = []
        for entry in layers:
            if isinstance(entry, Layer):
                entries.append((entry, None, None))
            elif isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], Layer):
                entries.append(entry)
            else:
                raise ValueError(f"a Net's layers are Layers or (layer, bottom, top) tuples, got {entry!r}")
            self.layers.append(entries[-1][0])
        names = [layer.name for layer in self.layers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"layer names must be unique; repeated: {dupes}")
        self.name = name
        self.transform = dict(transform) if transform else None
        self.seed = seed
        self.dtype = np.dtype(dtype)
        if _inputs is None:
            shape = tuple(int(s) for s in input_shape)
            if not shape or min(shape) < 1:
                raise ValueError(f"input_shape must be positive sizes, e.g. (C, H, W); got {input_shape}")
            _inputs = [(input_blob, shape)]
        self.inputs: list[tuple[str, Shape]] = [(b, tuple(s)) for b, s in _inputs]
        self.input_shape: Shape = (
            self.inputs[0][1] if len(self.inputs) == 1 else (sum(math.prod(s) for _, s in self.inputs),)
        )
        self._wire(entries)
        self.outputs: list[str] = list(_outputs) if _outputs is not None else [self.tops[-1]]
        self.output_shape: Shape = (
            self.blob_shapes[self.outputs[0]]
            if len(self.outputs) == 1
            else (sum(math.prod(self.blob_shapes[b]) for b in self.outputs),)
        )
        self._check_outputs(loss_weights, _outputs is not None)
        self._check_size()
        if backend is not None:
            self.backend = backend
        if init_params:
            rng = np.random.default_rng(seed)
            for layer in self.layers:
                layer.init_params(rng, self.dtype)

    def _wire(self, entries) -> None:
        """Resolve blob names to blob ids (a blob written again in place gets a new id), set every
        layer up on its bottoms' shapes, and find each blob's last reader (to free it in forward)."""
        current = {b: b for b, _ in self.inputs}
        self.blob_shapes: dict[str, Shape] = dict(self.inputs)
        self.bottoms: list[list[str]] = []
        self.tops: list[str] = []
        previous = self.inputs[0][0]
        for layer, bottom, top in entries:
            bottom = [previous] if bottom is None else _names(bottom, f"layer {layer.name!r}: bottom")
            top = layer.name if top is None else _names(top, f"layer {layer.name!r}: top")
            if isinstance(top, list):
                if len(top) != 1:
                    raise ValueError(f"layer {layer.name!r}: one top blob per layer, got {top}")
                top = top[0]
            unknown = [b for b in bottom if b not in current]
            if unknown:
                raise ValueError(
                    f"layer {layer.name!r} reads {unknown}, which no earlier layer writes "
                    "(layers must come in an order where each blob is written before it is read)"
                )
            ids = [current[b] for b in bottom]
            shapes = [self.blob_shapes[b] for b in ids]
            if getattr(layer, "multi_input", False):
                out = layer.setup(shapes)
            elif len(ids) != 1:
                raise ValueError(f"layer {layer.name!r} ({layer.type}) reads one blob, got {bottom}")
            else:
                out = layer.setup(shapes[0])
            blob = top if top not in self.blob_shapes else f"{top}@{layer.name}"
            current[top] = blob
            self.blob_shapes[blob] = tuple(out)
            self.bottoms.append(ids)
            self.tops.append(blob)
            previous = top
        self._last_read = {b: i for i, ids in enumerate(self.bottoms) for b in ids}
        self._current = current

    def _check_outputs(self, loss_weights: dict[str, float] | None, phase_part: bool) -> None:
        """The loss heads: the main output (weight 1 unless given) and every blob no layer reads."""
        read = {b for ids in self.bottoms for b in ids}
        sinks = [b for b in self.tops if b not in read]
        weights = {self._current.get(b, b): w for b, w in (loss_weights or {}).items()}
        unknown = sorted(set(weights) - set(sinks))
        if unknown:
            raise ValueError(f"net {self.name!r}: loss_weights name {unknown}, which are not outputs {sinks}")
        if phase_part:
            self.loss_weights = {b: float(w) for b, w in weights.items()}
            return
        main = self.outputs[0]
        extra = [b for b in sinks if b != main and b not in weights]
        if extra:
            raise ValueError(
                f"net {self.name!r}: blobs {extra} are computed but never used; give them a loss "
                "weight (an auxiliary loss head) or remove the layers"
            )
        self.loss_weights = {main: float(weights.get(main, 1.0))}
        self.loss_weights.update({b: float(w) for b, w in weights.items() if b != main})
        for b, w in self.loss_weights.items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"net {self.name!r}: loss weight of {b!r} must be finite and >= 0, got {w}")
            if math.prod(self.blob_shapes[b]) != math.prod(self.blob_shapes[main]):
                raise ValueError(
                    f"net {self.name!r}: loss head {b!r} gives {math.prod(self.blob_shapes[b])} scores, the "
                    f"main head {main!r} {math.prod(self.blob_shapes[main])}: every head scores the classes"
                )

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
            if hasattr(layer, "param_shapes"):
                n_params += sum(math.prod(s) for s in layer.param_shapes().values())
            elif hasattr(layer, "weight_shape"):
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
    def is_chain(self) -> bool:
        """True when every layer reads the previous layer's output (or the input, for the first)."""
        previous = [self.inputs[0][0], *self.tops[:-1]]
        return len(self.inputs) == 1 and all(
            ids == [p] for ids, p in zip(self.bottoms, previous, strict=True)
        )

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
        """(type, name, hyperparameters, output shape) per layer: equal lists mean equal nets.

        A graph adds each layer's bottom blobs, so equal chains compare as before."""
        if self.is_chain:
            return [(layer.type, layer.name, layer.config(), layer.out_shape) for layer in self.layers]
        return [
            (layer.type, layer.name, layer.config(), layer.out_shape, tuple(ids))
            for layer, ids in zip(self.layers, self.bottoms, strict=True)
        ]

    def summary(self) -> pd.DataFrame:
        """Per-layer costs: output shape, forward FLOPs per image, parameter and activation bytes,
        the phase, and `to_fc` (the layer's output crosses the phase split)."""
        import pandas as pd  # here, not at import: a worker that trains never loads pandas

        itemsize = self.dtype.itemsize
        conv_idx, _, boundary = self._split_sets()
        main = self.main_path()
        rows = []
        for i, layer in enumerate(self.layers):
            rows.append(
                {
                    "layer": layer.name,
                    "type": layer.type,
                    "phase": "conv" if i in conv_idx else "fc",
                    "output_shape": layer.out_shape,
                    "flops": layer.flops(),
                    "param_bytes": sum(int(p.size) for p in layer.params.values()) * itemsize,
                    "activation_bytes": math.prod(layer.out_shape) * itemsize,
                    "to_fc": self.tops[i] in boundary,
                    "main_path": i in main,
                }
            )
        return pd.DataFrame(rows).set_index("layer")

    def _ancestors(self, blobs: Sequence[str]) -> set[int]:
        """Indices of the layers that the given blobs depend on."""
        producer = {b: i for i, b in enumerate(self.tops)}
        todo, seen = [producer[b] for b in blobs if b in producer], set()
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(producer[b] for b in self.bottoms[i] if b in producer)
        return seen

    def _descendants(self, i: int) -> set[int]:
        """Index `i` and the indices of every layer that reads what it computes."""
        out, written = {i}, {self.tops[i]}
        for j in range(i + 1, len(self.layers)):
            if written.intersection(self.bottoms[j]):
                out.add(j)
                written.add(self.tops[j])
        return out

    def main_path(self) -> set[int]:
        """Indices of the layers the main output depends on."""
        return self._ancestors(self.outputs[:1])

    def split_point(self, at: str | None = None) -> int:
        """Index of the first FC-phase layer on the main path: `at` if given, else the first
        InnerProduct on the main path (len(layers) when there is none)."""
        main = self.main_path()
        if at is not None:
            i = self.layers.index(self.layer(at))
            if i not in main:
                raise ValueError(
                    f"net {self.name!r}: split layer {at!r} is not on the main path to {self.outputs[0]!r}"
                )
            return i
        for i, layer in enumerate(self.layers):
            if i in main and isinstance(layer, InnerProduct):
                return i
        return len(self.layers)

    def _split_sets(self, at: str | None = None) -> tuple[set[int], set[int], list[str]]:
        """(conv-phase layer indices, FC-phase layer indices, blobs crossing the split in order).

        Omnivore §II-B on a graph: the FC phase is the split layer and everything computed from it,
        and, for each auxiliary loss head that leaves the main path before the split, its part from
        its first InnerProduct on (or its last layer when it has none). So every loss is computed
        on the FC server, the conv phase stays conv-only, and an auxiliary head's gradient joins the
        conv phase's backward through the blob it reads (GoogLeNet's loss1/loss2 heads cross as
        their 4×4×128 conv outputs)."""
        i = self.split_point(at)
        if i == len(self.layers):
            return set(range(len(self.layers))), set(), []
        fc = self._descendants(i)
        before = self._ancestors([self.tops[i]])
        for blob in list(self.loss_weights)[1:]:
            producer = self.tops.index(blob)
            if producer in fc:
                continue
            branch = sorted(self._ancestors([blob]) - before)
            first_ip = [j for j in branch if isinstance(self.layers[j], InnerProduct)]
            fc |= self._descendants(first_ip[0] if first_ip else producer)
        conv = set(range(len(self.layers))) - fc
        inputs = [b for b, _ in self.inputs]
        boundary = []
        for j in sorted(fc):
            for b in self.bottoms[j]:
                if b not in boundary and (b in inputs or self.tops.index(b) in conv):
                    boundary.append(b)  # a branch starting at the input crosses with the input itself
        boundary.sort(key=lambda b: -1 - inputs.index(b) if b in inputs else self.tops.index(b))
        return conv, fc, boundary

    def split_phases(self, at: str | None = None) -> tuple[Net, Net | None]:
        """(conv phase, FC phase) as two Nets sharing these layers; FC is None if the net has none.

        Omnivore §II-B: the split is at the first fully connected layer of the main path unless
        `at` names another; auxiliary heads follow `_split_sets`. When several blobs cross the split
        the conv phase outputs them packed as one (N, Σ values) array, which the FC phase unpacks.
        """
        conv_idx, fc_idx, boundary = self._split_sets(at)
        if not conv_idx:
            raise ValueError(
                f"net {self.name!r}: the conv phase would be empty (split at {self.layers[0].name!r})"
            )
        kw = {"transform": self.transform, "seed": self.seed, "dtype": self.dtype, "init_params": False}

        def entries(idx, first=None):
            order = sorted(idx, key=lambda j: (j != first, j))
            return [(self.layers[j], self.bottoms[j], self.tops[j]) for j in order]

        if not fc_idx:
            whole = {"_outputs": self.outputs, "loss_weights": self.loss_weights}
            return Net(
                entries(conv_idx), (), name=f"{self.name}/conv", _inputs=self.inputs, **whole, **kw
            ), None
        conv = Net(
            entries(conv_idx), (), name=f"{self.name}/conv", _inputs=self.inputs, _outputs=boundary, **kw
        )
        fc = Net(
            entries(fc_idx, first=self.split_point(at)),
            (),
            name=f"{self.name}/fc",
            _inputs=[(b, self.blob_shapes[b]) for b in boundary],
            _outputs=self.outputs,
            loss_weights=self.loss_weights,
            **kw,
        )
        return conv, fc

    @property
    def backend(self) -> str:
        """The kernel backend of the layers that have one: "auto", "lowering", "onednn", or
        "mixed" when they differ ("auto" for a net without such layers)."""
        values = {layer.backend for layer in self.layers if hasattr(layer, "backend")}
        return values.pop() if len(values) == 1 else ("mixed" if values else "auto")

    @backend.setter
    def backend(self, value: str) -> None:
        check_backend(value, f"net {self.name!r}")
        for layer in self.layers:
            if hasattr(layer, "backend"):
                layer.backend = value

    # -- parameters ------------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Any]:
        """Live parameter arrays as a flat dict {"layer.param": array}."""
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.params.items()}

    def get_params(self) -> dict[str, np.ndarray]:
        """Copies of all parameters as numpy arrays (for servers and checkpoints)."""
        return {k: to_numpy(v).copy() for k, v in self.params.items()}

    def set_params(self, params: dict[str, Any], strict: bool = True, copy: bool = True) -> None:
        """Replace parameters from a flat dict; shapes must match; `strict` requires every name.

        Each array moves to the module of the parameter it replaces with one copy; one already there
        is copied too, so the net never shares memory with the caller, unless `copy=False`: then
        arrays already on the net's module and dtype are adopted as they are (the caller hands them
        over, as `DeviceNet` does with the views of its one transferred buffer)."""
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
                    xp, value = array_module(layer.params[k]), params[key]
                    if array_module(value) is xp:
                        layer.params[k] = value.astype(self.dtype, copy=copy)
                    else:
                        layer.params[k] = to_device(value, xp).astype(self.dtype, copy=False)

    @property
    def lr_mult(self) -> dict[str, float]:
        return {f"{layer.name}.{k}": layer.lr_mult.get(k, 1.0) for layer in self.layers for k in layer.params}

    @property
    def decay_mult(self) -> dict[str, float]:
        return {
            f"{layer.name}.{k}": layer.decay_mult.get(k, 1.0) for layer in self.layers for k in layer.params
        }

    @property
    def statistics(self) -> dict[str, float]:
        """{"layer.blob": moving_average_fraction} of the running statistics (BatchNorm's), which
        the solver accumulates instead of learning."""
        return {
            f"{layer.name}.{k}": f
            for layer in self.layers
            for k, f in getattr(layer, "statistics", {}).items()
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

    def forward_heads(self, x, train: bool = True, rng: np.random.Generator | None = None):
        """Run every layer in order; returns ({blob: value} of the outputs and loss heads, caches)."""
        self._check_input(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        keep = set(self.outputs) | set(self.loss_weights)
        blobs = dict(zip([b for b, _ in self.inputs], unpack(x, [s for _, s in self.inputs]), strict=True))
        caches = []
        for i, layer in enumerate(self.layers):
            if not layer.accepts_blocked:
                for b in self.bottoms[i]:
                    blobs[b] = plain(blobs[b])
            xs = [blobs[b] for b in self.bottoms[i]]
            y, cache = layer.forward(
                xs if getattr(layer, "multi_input", False) else xs[0], train=train, rng=rng
            )
            caches.append(cache)
            for b in set(self.bottoms[i]):
                if self._last_read[b] == i and b not in keep:
                    del blobs[b]
            blobs[self.tops[i]] = y
        return {b: plain(blobs[b]) for b in keep}, caches

    def forward(self, x, train: bool = True, rng: np.random.Generator | None = None):
        """Run every layer; returns (output, caches for `backward`). The output is the main class
        scores (or, for a conv phase, the blobs crossing the split, packed when several)."""
        heads, caches = self.forward_heads(x, train=train, rng=rng)
        return pack([heads[b] for b in self.outputs]), caches

    def backward(self, dout, caches, need_dx: bool = False):
        """Back-propagate in reverse layer order; returns (dL/dinput or None, flat dict of parameter
        grads). `dout` is dL/doutput, or a dict {blob: gradient} over outputs and loss heads.
        A blob read by several layers receives the sum of their gradients (Caffe's Split)."""
        if isinstance(dout, dict):
            diffs = dict(dout)
        else:
            shapes = [self.blob_shapes[b] for b in self.outputs]
            diffs = dict(zip(self.outputs, unpack(dout, shapes), strict=True))
        inputs = {b for b, _ in self.inputs}
        grads: dict[str, Any] = {}
        for i in range(len(self.layers) - 1, -1, -1):
            layer, top = self.layers[i], self.tops[i]
            dy = diffs.pop(top, None)
            if dy is None:
                continue
            if not layer.accepts_blocked:
                dy = plain(dy)
            wanted = need_dx or any(b not in inputs for b in self.bottoms[i])
            dx, g = layer.backward(dy, caches[i], need_dx=wanted)
            for k, v in g.items():
                grads[f"{layer.name}.{k}"] = v
            if not wanted:
                continue
            dxs = dx if getattr(layer, "multi_input", False) else [dx]
            for b, d in zip(self.bottoms[i], dxs, strict=True):
                if d is None or (b in inputs and not need_dx):
                    continue
                diffs[b] = d if b not in diffs else add(diffs[b], d)
        if not need_dx:
            return None, grads
        diffs = {b: plain(d) for b, d in diffs.items()}
        some = next(iter(diffs.values()))
        xp, n = array_module(some), some.shape[0]
        dxs = [
            diffs[b] if b in diffs else xp.zeros((n, *shape), dtype=some.dtype) for b, shape in self.inputs
        ]
        return pack(dxs), grads

    def loss(self, heads: dict[str, Any], labels) -> dict[str, Any]:
        """SoftmaxWithLoss on every loss head: {"loss": Σ weight·loss (what is optimised),
        "main_loss", "accuracy" (of the main head), "dheads": {blob: weight·dloss/dscores}}."""
        total, dheads, main = 0.0, {}, next(iter(self.loss_weights))
        for blob, weight in self.loss_weights.items():
            value, d = softmax_with_loss(heads[blob], labels)
            total += weight * value
            dheads[blob] = d if weight == 1.0 else d * d.dtype.type(weight)
            if blob == main:
                main_loss = value
        return {
            "loss": total,
            "main_loss": main_loss,
            "accuracy": accuracy(heads[main], labels),
            "dheads": dheads,
        }

    def train_step(self, x, labels, rng: np.random.Generator | None = None, need_dx: bool = False):
        """One forward and backward pass through every loss head: `loss` (the weighted total),
        `main_loss`, `accuracy` (main head), `grads`, and `dx` (dL/dinput, with `need_dx`)."""
        heads, caches = self.forward_heads(x, train=True, rng=rng)
        out = self.loss(heads, labels)
        dx, grads = self.backward(out.pop("dheads"), caches, need_dx=need_dx)
        return {**out, "grads": grads, "dx": dx}

    def loss_and_grads(self, x, labels, rng: np.random.Generator | None = None):
        """One forward and backward pass with SoftmaxWithLoss on every head: (weighted total loss,
        batch accuracy of the main head, grads)."""
        out = self.train_step(x, labels, rng=rng)
        return out["loss"], out["accuracy"], out["grads"]

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
        if self.is_chain:
            lines += [f"  {layer!r} -> {layer.out_shape}" for layer in self.layers]
        else:
            lines += [
                f"  {layer!r} <- {', '.join(ids)} -> {top} {layer.out_shape}"
                for layer, ids, top in zip(self.layers, self.bottoms, self.tops, strict=True)
            ]
        return "\n".join(lines)
