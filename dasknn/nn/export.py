"""A Net as an ONNX graph: the main path's layers as ONNX operators, the weights as initializers,
the class scores as `logits` and their softmax as `probabilities`.

Each layer type has one small emitter that writes the operators computing exactly what its
`forward(x, train=False)` computes (Caffe's test-phase semantics); `REFUSED` lists what has no
faithful graph, with the reason. The emitters, the input the graph takes and what it leaves out:
docs/architecture.md, "A net as an ONNX graph". The onnx package is an optional dependency
(`pip install "dasknn[export]"`), imported only here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dasknn.nn.base import Layer
from dasknn.nn.net import Net
from dasknn.nn.pooling import LRN, Pooling
from dasknn.nn.spec import CLASSES
from dasknn.written import written

__all__ = [
    "INPUT",
    "LOGITS",
    "OPSET",
    "PROBABILITIES",
    "REFUSED",
    "ExportError",
    "export_net",
    "net_to_onnx",
    "write_onnx",
]

OPSET = 17
"""The ONNX operator set the graph is written in (onnxruntime 1.14 and later run it)."""
INPUT, LOGITS, PROBABILITIES = "input", "logits", "probabilities"
"""Names of the graph's input (N images, or N rows of features) and its two outputs (N, classes)."""

REFUSED: dict[str, str] = {
    "BatchNorm with use_global_stats=False": (
        "it normalises every batch by that batch's own statistics at test time too, so an image's "
        "scores depend on the other images it is scored with; a deployed graph needs the running "
        "statistics (use_global_stats unset or True)"
    ),
    "a phase of a split net": (
        "its conv phase outputs the features the FC phase reads, not class scores, and an FC phase "
        "with several inputs has no one input to give; export the whole net"
    ),
    "a layer type of its own": "only dasknn's layer types have ONNX operators (`EMITTERS`)",
}
"""What cannot be exported, and why. No net of the zoo and no shared Caffe file is refused: the
tests export every one of them."""

INSTALL_HINT = 'pip install "dasknn[export]"'


class ExportError(ValueError):
    """Raised for a net that has no faithful ONNX graph (``REFUSED``); the message names the
    layer and the reason."""


def _onnx():
    """The onnx package, or an ImportError saying how to install it."""
    try:
        import onnx
    except ImportError as err:
        raise ImportError(f"exporting to ONNX needs the onnx package: {INSTALL_HINT}") from err
    return onnx


class _Graph:
    """The nodes and initializers of a graph under construction, with fresh names for constants."""

    def __init__(self, onnx) -> None:
        self.onnx, self.nodes, self.initializers = onnx, [], []
        self._names: set[str] = set()

    def constant(self, name: str, value: np.ndarray) -> str:
        base, i = name, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, name: str, **attrs: Any) -> str:
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=name, **attrs))
        return output


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), dtype=np.float32)


def _channel_vector(layer: Layer, values) -> np.ndarray:
    """A per-channel vector shaped to broadcast over (N, C, ...) of the layer's input."""
    return _f32(values).reshape((-1,) + (1,) * (len(layer.in_shape) - 1))


# -- emitters: (graph, layer, its parameters, input names, output name) -------------------------


def _convolution(g: _Graph, layer, params, xs, y) -> None:
    (ph, pw) = layer.pad
    inputs = [xs[0], g.constant(f"{layer.name}.weight", _f32(params["weight"]))]
    if layer.bias_term:
        inputs.append(g.constant(f"{layer.name}.bias", _f32(params["bias"])))
    g.node(
        "Conv",
        inputs,
        y,
        layer.name,
        kernel_shape=list(layer.kernel_size),
        strides=list(layer.stride),
        pads=[ph, pw, ph, pw],
        group=layer.group,
    )


def _pooling(g: _Graph, layer: Pooling, params, xs, y) -> None:
    # explicit pads, the bottom and right ones reaching the last window (Pooling's own padded
    # extent), so that ONNX's floor rounding gives exactly Caffe's rounded-up output size
    (top, bottom), (left, right) = layer._padded_extent()
    (kh, kw), (sh, sw) = layer.kernel_size, layer.stride
    window = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": [top, left, bottom, right]}
    if layer.pool == "max":
        g.node("MaxPool", xs, y, layer.name, **window)
        return
    # with count_include_pad every window divides by kh·kw; times kh·kw / Caffe's clipped divisor
    mean = g.node("AveragePool", xs, f"{y}/mean", layer.name, count_include_pad=1, **window)
    correction = g.constant(f"{layer.name}/divisor", _f32((kh * kw) / layer._divisor(np, np.float64)))
    g.node("Mul", [mean, correction], y, f"{layer.name}/divisor")


def _lrn(g: _Graph, layer: LRN, params, xs, y) -> None:
    n, name = layer.local_size, layer.name
    if layer.norm_region == "across_channels":
        g.node("LRN", xs, y, name, size=n, alpha=layer.alpha, beta=layer.beta, bias=layer.k)
        return
    half = (n - 1) // 2
    square = g.node("Mul", [xs[0], xs[0]], f"{y}/square", f"{name}/square")
    mean = g.node(  # Σ over the zero-padded n×n window / n²
        "AveragePool",
        [square],
        f"{y}/window_mean",
        f"{name}/window",
        kernel_shape=[n, n],
        strides=[1, 1],
        pads=[half, half, half, half],
        count_include_pad=1,
    )
    scaled = g.node(
        "Mul", [mean, g.constant(f"{name}/alpha", _f32(layer.alpha))], f"{y}/scaled", f"{name}/alpha"
    )
    shifted = g.node("Add", [scaled, g.constant(f"{name}/one", _f32(1.0))], f"{y}/shifted", f"{name}/one")
    power = g.node(
        "Pow", [shifted, g.constant(f"{name}/beta", _f32(-layer.beta))], f"{y}/power", f"{name}/pow"
    )
    g.node("Mul", [xs[0], power], y, name)


def _relu(g: _Graph, layer, params, xs, y) -> None:
    if layer.negative_slope == 0.0:
        g.node("Relu", xs, y, layer.name)
    else:
        g.node("LeakyRelu", xs, y, layer.name, alpha=layer.negative_slope)


def _dropout(g: _Graph, layer, params, xs, y) -> None:
    g.node("Identity", xs, y, layer.name)


def _inner_product(g: _Graph, layer, params, xs, y) -> None:
    x = xs[0]
    if len(layer.in_shape) > 1:
        x = g.node("Flatten", [x], f"{y}/flat", f"{layer.name}/flatten", axis=1)
    inputs = [x, g.constant(f"{layer.name}.weight", _f32(params["weight"]))]
    if layer.bias_term:
        inputs.append(g.constant(f"{layer.name}.bias", _f32(params["bias"])))
    g.node("Gemm", inputs, y, layer.name, transB=1)


def _flatten(g: _Graph, layer, params, xs, y) -> None:
    g.node("Flatten", xs, y, layer.name, axis=1)


def _softmax(g: _Graph, layer, params, xs, y) -> None:
    g.node("Softmax", xs, y, layer.name, axis=1)


def _concat(g: _Graph, layer, params, xs, y) -> None:
    g.node("Concat", xs, y, layer.name, axis=1)


def _eltwise(g: _Graph, layer, params, xs, y) -> None:
    if layer.operation == "max":
        g.node("Max", xs, y, layer.name)
        return
    if layer.operation == "prod":
        acc = xs[0]
        for i, x in enumerate(xs[1:], 1):
            acc = g.node("Mul", [acc, x], y if i == len(xs) - 1 else f"{y}/prod{i}", f"{layer.name}/prod{i}")
        return
    terms = []
    for i, (c, x) in enumerate(zip(layer._coeffs(), xs, strict=True)):
        if c != 1.0:
            x = g.node(
                "Mul",
                [x, g.constant(f"{layer.name}/coeff{i}", _f32(c))],
                f"{y}/term{i}",
                f"{layer.name}/coeff{i}",
            )
        terms.append(x)
    g.node("Sum", terms, y, layer.name)


def _batch_norm(g: _Graph, layer, params, xs, y) -> None:
    if layer.use_global_stats is False:
        raise ExportError(
            f"layer {layer.name!r} (BatchNorm, use_global_stats=False) cannot be exported: "
            f"{REFUSED['BatchNorm with use_global_stats=False']}"
        )
    factor = float(np.asarray(params["scale_factor"]).ravel()[0])
    scale = 0.0 if factor == 0 else 1.0 / factor  # the running estimates, as BatchNorm._running
    mean = _f32(np.asarray(params["mean"], dtype=np.float32) * np.float32(scale))
    var = _f32(np.asarray(params["variance"], dtype=np.float32) * np.float32(scale))
    c = mean.shape[0]
    inputs = [
        xs[0],
        g.constant(f"{layer.name}/unit_scale", np.ones(c, np.float32)),
        g.constant(f"{layer.name}/zero_shift", np.zeros(c, np.float32)),
        g.constant(f"{layer.name}.mean", mean),
        g.constant(f"{layer.name}.variance", var),
    ]
    g.node("BatchNormalization", inputs, y, layer.name, epsilon=layer.eps)


def _scale(g: _Graph, layer, params, xs, y) -> None:
    gamma = g.constant(f"{layer.name}.weight", _channel_vector(layer, params["weight"]))
    if not layer.bias_term:
        g.node("Mul", [xs[0], gamma], y, layer.name)
        return
    scaled = g.node("Mul", [xs[0], gamma], f"{y}/scaled", f"{layer.name}/weight")
    g.node(
        "Add",
        [scaled, g.constant(f"{layer.name}.bias", _channel_vector(layer, params["bias"]))],
        y,
        layer.name,
    )


EMITTERS: dict[str, Callable[..., None]] = {
    "Convolution": _convolution,
    "Pooling": _pooling,
    "LRN": _lrn,
    "ReLU": _relu,
    "Dropout": _dropout,
    "InnerProduct": _inner_product,
    "Flatten": _flatten,
    "Softmax": _softmax,
    "Concat": _concat,
    "Eltwise": _eltwise,
    "BatchNorm": _batch_norm,
    "Scale": _scale,
}
"""Each layer type's emitter: the ONNX operators of its test-phase forward."""


def net_to_onnx(net: Net, rows: tuple[int, ...] | None = None, crop: bool = False, classes=None):
    """`net` as an `onnx.ModelProto` (not yet written): input `INPUT`, outputs `LOGITS` and
    `PROBABILITIES`, each of shape (N, classes), N free.

    Parameters
    ----------
    net : Net
        A whole net (not one phase of a split); its parameters become the graph's weights.
    rows : tuple of int, optional
        Take N rows of features (2-D input) and reshape each to this (C, H, W), as DistributedCNN
        does for an `input_shape`; by default the input is (N, C, H, W).
    crop : bool, default False
        Cut every image to the net's H × W at its centre (Caffe's test-time crop, as
        `Augment.test`): the input's H and W are then free, at least the net's.
    classes : array-like, optional
        The label of each output column, written as the model's metadata property "classes" (a
        JSON list).

    Returns
    -------
    onnx.ModelProto
        The checked model (`onnx.checker.check_model`).

    Raises
    ------
    ImportError
        onnx is not installed (the message says `pip install "dasknn[export]"`).
    ExportError
        A layer in `REFUSED`; the message names the layer and the reason.

    Examples
    --------
    >>> from dasknn.nn import zoo
    >>> from dasknn.nn.export import net_to_onnx
    >>> model = net_to_onnx(zoo.lenet(), classes=list(range(10)))
    >>> [output.name for output in model.graph.output]
    ['logits', 'probabilities']
    """
    onnx = _onnx()
    if len(net.inputs) != 1 or net.outputs[0] not in net.loss_weights:
        raise ExportError(f"net {net.name!r} cannot be exported: {REFUSED['a phase of a split net']}")
    g = _Graph(onnx)
    input_dims = _input(g, net, rows, crop)
    _emit_main_path(g, net)
    scores = net.outputs[0]
    flat = len(net.blob_shapes[scores]) > 1
    g.node("Flatten" if flat else "Identity", [_value(scores)], LOGITS, "logits")
    g.node("Softmax", [LOGITS], PROBABILITIES, "probabilities", axis=1)
    helper, f32, n = onnx.helper, onnx.TensorProto.FLOAT, net.num_classes
    graph = helper.make_graph(
        g.nodes,
        net.name,
        [helper.make_tensor_value_info(INPUT, f32, input_dims)],
        [helper.make_tensor_value_info(name, f32, ["N", n]) for name in (LOGITS, PROBABILITIES)],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph, producer_name="dasknn", opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8
    )
    if classes is not None:
        helper.set_model_props(model, {"classes": json.dumps(np.asarray(classes).tolist())})
    onnx.checker.check_model(model)
    return model


def _input(g: _Graph, net: Net, rows: tuple[int, ...] | None, crop: bool) -> list:
    """The operators from `INPUT` to the net's input blob (a reshape of rows, a centre crop), and
    the input's dimensions (names for the free ones)."""
    blob, shape = _value(net.inputs[0][0]), net.inputs[0][1]
    x, dims = INPUT, ["N", *shape]
    if crop:
        dims = ["N", shape[0], "H", "W"]
    if rows is not None:
        rows = tuple(int(r) for r in rows)
        if len(rows) != 3 or rows[0] != shape[0] or (not crop and rows != shape):
            raise ValueError(f"rows of shape {rows} do not make net {net.name!r}'s input {shape}")
        target = g.constant("input_shape", np.array([-1, *rows], dtype=np.int64))
        x, dims = g.node("Reshape", [x, target], f"{blob}/rows", "input_shape"), ["N", math.prod(rows)]
    if crop:  # offsets ((H − h) // 2, (W − w) // 2), as dasknn.data.augment.centre_crop
        size = g.constant("crop/size", np.array(shape[1:], dtype=np.int64))
        hw = g.node("Shape", [x], "crop/hw", "crop/hw", start=2)
        offset = g.node(
            "Div",
            [g.node("Sub", [hw, size], "crop/spare", "crop/spare"), g.constant("crop/two", np.int64(2))],
            "crop/offset",
            "crop/offset",
        )
        end = g.node("Add", [offset, size], "crop/end", "crop/end")
        axes = g.constant("crop/axes", np.array([2, 3], dtype=np.int64))
        x = g.node("Slice", [x, offset, end, axes], f"{blob}/crop", "crop")
    g.node("Identity", [x], blob, "input")
    return dims


def _value(blob: str) -> str:
    """The graph's name for a net's blob: its own, unless it is one of the graph's input or outputs."""
    return f"net/{blob}" if blob in (INPUT, LOGITS, PROBABILITIES) else blob


def _emit_main_path(g: _Graph, net: Net) -> None:
    """The operators of every layer the main output depends on, in the net's order."""
    params = net.get_params()
    main = net.main_path()
    for i, layer in enumerate(net.layers):
        if i not in main:
            continue
        emit = EMITTERS.get(layer.type)
        if emit is None or type(layer) is not CLASSES.get(layer.type):
            raise ExportError(
                f"layer {layer.name!r} ({type(layer).__name__}) cannot be exported: "
                f"{REFUSED['a layer type of its own']}"
            )
        own = {k: params[f"{layer.name}.{k}"] for k in layer.params}
        emit(g, layer, own, [_value(b) for b in net.bottoms[i]], _value(net.tops[i]))


def write_onnx(model, path: str | os.PathLike) -> Path:
    """Write `model` to `path`, which appears complete or not at all (written beside it, synced,
    then renamed); an OSError names `path`."""
    path = Path(path)
    with written(path) as tmp, open(tmp, "wb") as f:
        f.write(model.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    return path


def export_net(
    net: Net, path: str | os.PathLike, rows: tuple[int, ...] | None = None, crop: bool = False, classes=None
) -> Path:
    """Write a net as an ONNX file, which appears whole or not at all.

    Parameters
    ----------
    net : Net
        A whole net; its parameters become the graph's weights.
    path : str or path
        The .onnx file to write. A folder, or a file whose folder does not exist, is refused
        before the graph is built.
    rows, crop, classes
        As for ``net_to_onnx``.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    ExportError
        A layer with no faithful ONNX graph (``REFUSED``), named with the reason.

    Examples
    --------
    >>> from dasknn.nn import zoo
    >>> from dasknn.nn.export import export_net
    >>> net = zoo.lenet()
    >>> export_net(net, "lenet.onnx").name    # doctest: +SKIP
    'lenet.onnx'
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{path} is a folder; give the ONNX file to write, e.g. {path / 'model.onnx'}"
        )
    if not path.resolve().parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: its folder {path.resolve().parent} does not exist")
    return write_onnx(net_to_onnx(net, rows, crop, classes), path)
