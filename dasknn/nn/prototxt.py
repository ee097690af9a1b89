"""Read Caffe `.prototxt` nets and solvers into dasknn objects, without the protobuf package.

`parse_prototxt` reads protobuf text format into plain dicts; `read_solver` types a
SolverParameter and fills Caffe's defaults; `read_net` turns the layers of a NetParameter that are
active in one phase into a `Net`. Field names, defaults and enum values follow Caffe's caffe.proto.
"""

from __future__ import annotations

import math
import operator
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dasknn.nn.caffe_schema import check_message
from dasknn.nn.layers import LRN, Convolution, Dropout, Filler, Flatten, InnerProduct, Pooling, ReLU
from dasknn.nn.merge import Concat, Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale
from dasknn.nn.textformat import (
    PrototxtError,
    get_all_typed,
    get_one,
    get_typed,
    load_message,
    parse_prototxt,
)

__all__ = ["PrototxtError", "get_one", "parse_prototxt", "read_net", "read_net_and_solver", "read_solver"]

SUPPORTED_TYPES = (
    "Convolution",
    "Pooling",
    "ReLU",
    "LRN",
    "Dropout",
    "InnerProduct",
    "Flatten",
    "Concat",
    "Eltwise",
    "BatchNorm",
    "Scale",
)
DATA_TYPES = ("Data", "ImageData", "HDF5Data", "MemoryData", "DummyData", "Input")
OUTPUT_TYPES = ("SoftmaxWithLoss", "Softmax")  # the net's loss: dropped, `Net` computes it
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
PHASES = ("TRAIN", "TEST")


# -- solver ---------------------------------------------------------------------------------------
_SOLVER_FIELDS: dict[str, tuple[Any, Any]] = {  # field: (kind, default); "*" marks a repeated field
    "net": ("str", None),
    "train_net": ("str", None),
    "test_net": ("str*", []),
    "net_param": ("msg", None),
    "train_net_param": ("msg", None),
    "test_net_param": ("msg*", []),
    "train_state": ("msg", None),
    "test_state": ("msg*", []),
    "test_iter": ("int*", []),
    "test_interval": ("int", 0),
    "test_compute_loss": ("bool", False),
    "test_initialization": ("bool", True),
    "base_lr": ("float", 0.0),
    "display": ("int", 0),
    "average_loss": ("int", 1),
    "max_iter": ("int", 0),
    "iter_size": ("int", 1),
    "lr_policy": ("str", None),
    "gamma": ("float", 0.0),
    "power": ("float", 0.0),
    "momentum": ("float", 0.0),
    "weight_decay": ("float", 0.0),
    "regularization_type": (("L1", "L2"), "L2"),
    "stepsize": ("int", 0),
    "stepvalue": ("int*", []),
    "clip_gradients": ("float", -1.0),
    "snapshot": ("int", 0),
    "snapshot_prefix": ("str", None),
    "snapshot_diff": ("bool", False),
    "snapshot_format": (("HDF5", "BINARYPROTO"), "BINARYPROTO"),
    "solver_mode": (("CPU", "GPU"), "GPU"),
    "device_id": ("int", 0),
    "random_seed": ("int", -1),
    "type": ("str", "SGD"),
    "delta": ("float", 1e-8),
    "momentum2": ("float", 0.999),
    "rms_decay": ("float", 0.99),
    "debug_info": ("bool", False),
    "snapshot_after_train": ("bool", True),
    "layer_wise_reduce": ("bool", True),
    "weights": ("str*", []),
    "solver_type": (("SGD", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM"), None),
}
_SOLVER_TYPE_NAMES = {
    "SGD": "SGD",
    "NESTEROV": "Nesterov",
    "ADAGRAD": "AdaGrad",
    "RMSPROP": "RMSProp",
    "ADADELTA": "AdaDelta",
    "ADAM": "Adam",
}


def read_solver(path_or_text: str | os.PathLike) -> dict[str, Any]:
    """Caffe solver settings as {field: value}, Caffe's names and types, its defaults filled in.

    Fields of caffe.proto's SolverParameter are typed (repeated ones such as `stepvalue` and
    `test_iter` are lists; enums such as `solver_mode` are their names); absent ones get caffe.proto's
    default, except strings and messages without one (`net`, `snapshot_prefix`, ...), which stay
    absent. A field SolverParameter does not have is refused (`caffe_schema.check_message`: the
    line and the closest known field), as is one in an inline `net_param`. The legacy `solver_type` enum is
    upgraded into `type` as Caffe does. PrototxtError for: a `type` other than "SGD" (dasknn trains
    with momentum SGD only, as Omnivore); a missing or unknown `lr_policy`, which has no default in
    Caffe (it stops with "Unknown learning rate policy"); `lr_policy: "step"` without `stepsize` > 0.
    """
    message = load_message(path_or_text)
    check_message(message, "SolverParameter", "solver")
    solver: dict[str, Any] = {}
    for field, (kind, default) in _SOLVER_FIELDS.items():
        if isinstance(kind, str) and kind.endswith("*"):
            solver[field] = get_all_typed(message, field, kind[:-1], "solver")
        elif (value := get_typed(message, field, kind, default, "solver")) is not None:
            solver[field] = value
    if "solver_type" in solver:
        if "type" in message:
            raise PrototxtError("solver: give either 'type' or the deprecated 'solver_type', not both")
        solver["type"] = _SOLVER_TYPE_NAMES[solver.pop("solver_type")]
    if solver["type"] != "SGD":
        raise PrototxtError(f"solver type {solver['type']!r} is not supported: dasknn only supports SGD")
    policy = solver.get("lr_policy")
    if policy not in LR_POLICIES:
        raise PrototxtError(
            f"solver: lr_policy must be one of {', '.join(LR_POLICIES)}, got {policy!r}"
            + (" (Caffe has no default for it)" if policy is None else "")
        )
    if policy == "step" and solver["stepsize"] <= 0:
        raise PrototxtError("solver: lr_policy 'step' needs a stepsize > 0")
    _check_solver_values(solver)
    return solver


def _check_solver_values(solver: dict[str, Any]) -> None:
    """The ranges dasknn's SGD needs (Caffe CHECKs some of them only when training starts)."""
    problems = [
        f"{field} must be {what}, got {solver[field]!r}"
        for field, ok, what in (
            ("base_lr", solver["base_lr"] >= 0, ">= 0"),
            ("momentum", 0 <= solver["momentum"] < 1, "in [0, 1) (Omnivore's µ)"),
            ("weight_decay", solver["weight_decay"] >= 0, ">= 0"),
            ("iter_size", solver["iter_size"] >= 1, ">= 1"),
            ("average_loss", solver["average_loss"] >= 1, ">= 1"),
        )
        if not ok
    ]
    counts = ("max_iter", "stepsize", "display", "snapshot", "test_interval", "test_iter", "stepvalue")
    for field in counts:
        values = solver[field] if isinstance(solver[field], list) else [solver[field]]
        if min(values, default=0) < 0:
            problems.append(f"{field} must be >= 0, got {solver[field]!r}")
    steps = solver["stepvalue"]
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        problems.append(f"stepvalue must increase, got {steps}")
    if solver["lr_policy"] == "poly" and solver["max_iter"] <= 0:
        problems.append("lr_policy 'poly' needs a max_iter > 0")
    if solver["lr_policy"] in ("step", "multistep", "exp", "inv") and solver["gamma"] < 0:
        problems.append(
            f"lr_policy {solver['lr_policy']!r} needs gamma >= 0 (a negative one flips the lr's sign)"
        )
    if problems:
        raise PrototxtError("solver: " + "; ".join(problems))


# -- net ------------------------------------------------------------------------------------------
def _active(layer: dict, phase: str, level: int, stages: Sequence[str], where: str) -> bool:
    """Whether a layer is in the net for this NetState: Caffe's Net::FilterNet and StateMeetsRule."""

    def meets(rule: dict) -> bool:
        low, high = (
            get_typed(rule, "min_level", "int", level, where),
            get_typed(rule, "max_level", "int", level, where),
        )
        return (
            get_typed(rule, "phase", PHASES, phase, where) == phase
            and low <= level <= high
            and all(s in stages for s in get_all_typed(rule, "stage", "str", where))
            and not any(s in stages for s in get_all_typed(rule, "not_stage", "str", where))
        )

    include, exclude = (
        get_all_typed(layer, "include", "msg", where),
        get_all_typed(layer, "exclude", "msg", where),
    )
    if include and exclude:
        raise PrototxtError(f"{where}: give include rules or exclude rules, not both")
    return any(map(meets, include)) if include else not any(map(meets, exclude))


def _chw(dims: list, where: str) -> tuple[int, int, int]:
    if len(dims) != 4 or min(dims) < 1:
        raise PrototxtError(f"{where}: input shape must be 4 positive sizes (N, C, H, W), got {dims}")
    return dims[1], dims[2], dims[3]


def _data_shape(layer: dict, ltype: str, where: str) -> tuple[int, int, int] | None:
    """(C, H, W) of an Input, DummyData or MemoryData layer; None when the data gives it at run time."""
    field = {"Input": "input_param", "DummyData": "dummy_data_param", "MemoryData": "memory_data_param"}
    param = get_typed(layer, field.get(ltype, ""), "msg", {}, where)
    shapes = get_all_typed(param, "shape", "msg", where)
    if shapes:
        return _chw(get_all_typed(shapes[0], "dim", "int", where), where)
    legacy = {
        "DummyData": ("num", "channels", "height", "width"),  # first blob of each
        "MemoryData": ("batch_size", "channels", "height", "width"),
    }
    dims = [d for f in legacy.get(ltype, ()) for d in get_all_typed(param, f, "uint", where)[:1]]
    if ltype == "MemoryData" and "dim" in param:
        dims = get_all_typed(param, "dim", "uint", where)
    return _chw(dims, where) if dims else None


def _transform(layer: dict, where: str) -> dict | None:
    """transform_param as {"scale"[, "mean_value"]} (Caffe subtracts the mean, then scales), the
    keywords of `dasknn.data.Transform` (crop_size and mirror: `read_augment`); what dasknn cannot
    apply is warned about and ignored."""
    transform = get_typed(layer, "transform_param", "msg", {}, where)
    unused = ("mean_file", "crop_h", "crop_w")
    ignored = [f for f in unused if any(transform.get(f, []))]
    if ignored:
        warnings.warn(
            f"{where}: transform_param {', '.join(ignored)} ignored: dasknn applies scale, mean_value "
            "(give the mean as per-channel mean_value), crop_size and mirror",
            UserWarning,
            stacklevel=3,
        )
    if "scale" not in transform and "mean_value" not in transform:
        return None
    scale = get_typed(transform, "scale", "float", 1.0, where)
    means = get_all_typed(transform, "mean_value", "float", where)
    if not all(map(math.isfinite, [scale, *means])):
        raise PrototxtError(f"{where}: transform_param scale and mean_value must be finite")
    return {"scale": scale, **({"mean_value": means} if means else {})}


def read_augment(path_or_text: str | os.PathLike | Mapping, phase: str = "TRAIN") -> dict | None:
    """The data layer's transform_param crop_size and mirror in `phase` as the keywords of
    `dasknn.data.augment.Augment` ({"crop_size", "mirror"}), or None when it sets neither (Caffe's
    DataTransformer: random crop and mirror in TRAIN, centre crop in TEST)."""
    if str(phase).upper() not in PHASES:
        raise ValueError(f"phase must be 'TRAIN' or 'TEST', got {phase!r}")
    net = _load_net(path_or_text)
    for index, layer in enumerate(get_all_typed(net, "layer", "msg", "net")):
        name = get_typed(layer, "name", "str", "", f"layer #{index}") or f"layer{index}"
        where = f"layer '{name}'"
        if not _active(layer, str(phase).upper(), 0, (), where):
            continue
        if get_typed(layer, "type", "str", "", where) not in DATA_TYPES:
            continue
        transform = get_typed(layer, "transform_param", "msg", {}, where)
        crop = get_typed(transform, "crop_size", "uint", 0, where)
        mirror = bool(get_typed(transform, "mirror", "bool", False, where))
        if not crop and not mirror:
            return None
        return {"crop_size": int(crop) if crop else None, "mirror": mirror}
    return None


def _fields(message: dict, spec: dict[str, tuple[Any, Any]], where: str) -> dict[str, Any]:
    """{field: value} for the (kind, default) of each field in `spec`; enum names in lowercase."""
    values = {
        field: get_typed(message, field, kind, default, where) for field, (kind, default) in spec.items()
    }
    return {f: v.lower() if isinstance(spec[f][0], tuple) else v for f, v in values.items()}


_FILLER = {
    "type": ("str", "constant"),
    "value": ("float", 0.0),
    "mean": ("float", 0.0),
    "std": ("float", 1.0),
    "min": ("float", 0.0),
    "max": ("float", 1.0),
    "variance_norm": (("FAN_IN", "FAN_OUT", "AVERAGE"), "FAN_IN"),
}
_SIMPLE_LAYERS = {  # Caffe type: (dasknn class, parameter message, its fields with Caffe's defaults)
    "ReLU": (ReLU, "relu_param", {"negative_slope": ("float", 0.0)}),
    "Dropout": (Dropout, "dropout_param", {"dropout_ratio": ("float", 0.5)}),
    "LRN": (
        LRN,
        "lrn_param",
        {
            "local_size": ("uint", 5),
            "alpha": ("float", 1.0),
            "beta": ("float", 0.75),
            "k": ("float", 1.0),
            "norm_region": (("ACROSS_CHANNELS", "WITHIN_CHANNEL"), "ACROSS_CHANNELS"),
        },
    ),
}


def _geometry(param: dict, stem: str, default: Any, where: str) -> Any:
    """kernel/stride/pad: one int, or (h, w) from two values or from `{stem}_h` and `{stem}_w`."""
    field = "kernel_size" if stem == "kernel" else stem
    values = get_all_typed(param, field, "uint", where)
    h, w = (
        get_typed(param, f"{stem}_h", "uint", None, where),
        get_typed(param, f"{stem}_w", "uint", None, where),
    )
    if (h is None) != (w is None) or (h is not None and values) or len(values) > 2:
        raise PrototxtError(f"{where}: give one or two {field} (2-D only), or both {stem}_h and {stem}_w")
    if h is not None:
        return (h, w)
    return default if not values else values[0] if len(values) == 1 else tuple(values)


def _weighted(layer: dict, param: dict, where: str) -> dict[str, Any]:
    """Keywords shared by Convolution and InnerProduct: bias, fillers and (weight, bias) multipliers."""
    specs = get_all_typed(layer, "param", "msg", where)
    if (
        len(specs) > 2
        or any("name" in spec for spec in specs)
        or get_typed(param, "axis", "int", 1, where) != 1
    ):
        raise PrototxtError(
            f"{where}: only axis 1 and at most 2 param blocks (weight, bias) without shared "
            "names are supported"
        )
    fillers = {}
    for field in ("weight_filler", "bias_filler"):
        filler = get_typed(param, field, "msg", {}, where)
        if get_typed(filler, "sparse", "int", -1, where) != -1:
            raise PrototxtError(f"{where}: {field}: sparse gaussian fillers are not supported")
        fillers[field] = Filler(**_fields(filler, _FILLER, f"{where} {field}"))
    mults = {
        m: tuple(get_typed(s, m, "float", 1.0, where) for s in specs) + (1.0,) * (2 - len(specs))
        for m in ("lr_mult", "decay_mult")
    }
    if min(mults["lr_mult"] + mults["decay_mult"]) < 0:
        raise PrototxtError(f"{where}: lr_mult and decay_mult must be >= 0, got {mults}")
    return {"bias_term": get_typed(param, "bias_term", "bool", True, where), **fillers, **mults}


def _concat(layer: dict, name: str, where: str) -> Concat:
    p, pw = get_typed(layer, "concat_param", "msg", {}, where), f"{where} concat_param"
    axis = get_typed(p, "axis", "int", get_typed(p, "concat_dim", "uint", 1, pw), pw)
    if axis != 1:
        raise PrototxtError(f"{pw}: only axis 1 (channels) is supported, got {axis}")
    return Concat(name)


def _eltwise(layer: dict, name: str, where: str) -> Eltwise:
    p, pw = get_typed(layer, "eltwise_param", "msg", {}, where), f"{where} eltwise_param"
    operation = get_typed(p, "operation", ("PROD", "SUM", "MAX"), "SUM", pw).lower()
    return Eltwise(name, operation, tuple(get_all_typed(p, "coeff", "float", pw)))


def _batch_norm(layer: dict, name: str, where: str) -> BatchNorm:
    """Caffe's BatchNorm; its `param { lr_mult: 0 }` blocks are accepted (the blobs are never learned)."""
    p, pw = get_typed(layer, "batch_norm_param", "msg", {}, where), f"{where} batch_norm_param"
    specs = get_all_typed(layer, "param", "msg", where)
    if any(get_typed(s, "lr_mult", "float", 0.0, where) != 0 for s in specs):
        raise PrototxtError(f"{where}: BatchNorm's blobs are statistics, not learned: lr_mult must be 0")
    return BatchNorm(
        name,
        use_global_stats=get_typed(p, "use_global_stats", "bool", None, pw),
        moving_average_fraction=get_typed(p, "moving_average_fraction", "float", 0.999, pw),
        eps=get_typed(p, "eps", "float", 1e-5, pw),
    )


def _scale(layer: dict, name: str, where: str) -> Scale:
    """Caffe's Scale with one bottom, axis 1 and num_axes 1 (per-channel γ, optional β)."""
    p, pw = get_typed(layer, "scale_param", "msg", {}, where), f"{where} scale_param"
    if (get_typed(p, "axis", "int", 1, pw), get_typed(p, "num_axes", "int", 1, pw)) != (1, 1):
        raise PrototxtError(f"{pw}: only axis 1 and num_axes 1 (one factor per channel) are supported")
    fillers = {}
    for field, default in (("filler", Filler("constant", value=1.0)), ("bias_filler", Filler())):
        given = get_typed(p, field, "msg", None, pw)
        fillers[field] = default if given is None else Filler(**_fields(given, _FILLER, f"{pw} {field}"))
    specs = get_all_typed(layer, "param", "msg", where)
    if len(specs) > 2 or any("name" in spec for spec in specs):
        raise PrototxtError(f"{where}: at most 2 param blocks (scale, bias) without shared names")
    mults = {
        m: tuple(get_typed(s, m, "float", 1.0, where) for s in specs) + (1.0,) * (2 - len(specs))
        for m in ("lr_mult", "decay_mult")
    }
    return Scale(name, bias_term=get_typed(p, "bias_term", "bool", False, pw), **mults, **fillers)


_GRAPH_LAYERS = {"Concat": _concat, "Eltwise": _eltwise, "BatchNorm": _batch_norm, "Scale": _scale}


def _build(layer: dict, ltype: str, name: str, where: str) -> Any:
    """The dasknn layer for one Caffe layer of a supported type (fillers default to constant 0)."""
    if ltype in _SIMPLE_LAYERS:
        cls, field, spec = _SIMPLE_LAYERS[ltype]
        values = _fields(get_typed(layer, field, "msg", {}, where), spec, f"{where} {field}")
        if ltype == "LRN" and not (values["alpha"] >= 0 and values["k"] > 0):
            raise PrototxtError(
                f"{where} {field}: need alpha >= 0 and k > 0 (the base k + α/n·Σx² must stay positive), "
                f"got alpha={values['alpha']}, k={values['k']}"
            )
        return cls(name, **values)
    if ltype in _GRAPH_LAYERS:
        return _GRAPH_LAYERS[ltype](layer, name, where)
    field = "inner_product_param" if ltype == "InnerProduct" else f"{ltype.lower()}_param"
    p, pw = get_typed(layer, field, "msg", {}, where), f"{where} {field}"
    if ltype == "InnerProduct":
        return InnerProduct(
            name, num_output=get_typed(p, "num_output", "uint", 0, pw), **_weighted(layer, p, pw)
        )
    if ltype == "Flatten":
        if (get_typed(p, "axis", "int", 1, pw), get_typed(p, "end_axis", "int", -1, pw)) != (1, -1):
            raise PrototxtError(f"{pw}: only axis 1 to end_axis -1 is supported")
        return Flatten(name)
    kernel = _geometry(p, "kernel", None, pw)
    geometry = {"stride": _geometry(p, "stride", 1, pw), "pad": _geometry(p, "pad", 0, pw)}
    if ltype == "Convolution":
        if kernel is None or any(d != 1 for d in get_all_typed(p, "dilation", "uint", pw)):
            raise PrototxtError(f"{pw}: needs kernel_size, and dilation must be 1")
        return Convolution(
            name,
            num_output=get_typed(p, "num_output", "uint", 0, pw),
            kernel_size=kernel,
            group=get_typed(p, "group", "uint", 1, pw),
            **geometry,
            **_weighted(layer, p, pw),
        )
    pool = get_typed(p, "pool", ("MAX", "AVE", "STOCHASTIC"), "MAX", pw)
    global_pooling = get_typed(p, "global_pooling", "bool", False, pw)
    if pool == "STOCHASTIC" or get_typed(p, "round_mode", ("CEIL", "FLOOR"), "CEIL", pw) == "FLOOR":
        raise PrototxtError(f"{pw}: STOCHASTIC pooling and round_mode FLOOR are not supported")
    if global_pooling == (kernel is not None):
        raise PrototxtError(f"{pw}: give kernel_size, or global_pooling: true without it")
    if global_pooling and (geometry["stride"] not in (1, (1, 1)) or geometry["pad"] not in (0, (0, 0))):
        raise PrototxtError(f"{pw}: global_pooling takes only stride 1 and pad 0 (as Caffe)")
    return Pooling(
        name,
        pool=pool.lower(),
        **({} if kernel is None else {"kernel_size": kernel}),
        global_pooling=global_pooling,
        **geometry,
    )


def _at_layer(err: ValueError, net: Mapping, index: int, layer: Mapping) -> ValueError:
    """`err`, raised on the net's `index`-th layer, as a PrototxtError with the line it is about."""
    if isinstance(err, PrototxtError) and err.line is not None:
        return err
    text = err.message if isinstance(err, PrototxtError) else str(err)
    line, column = _layer_at(net, index, layer, text)
    if line is None:
        return err
    return PrototxtError(text, line, column, getattr(net, "source", None))


def _layer_at(net: Mapping, index: int, layer: Mapping, message: str) -> tuple[int | None, int | None]:
    """(line, column) of what `message` (an error of the net's `index`-th layer) is about: the field it
    names ("field 'pad'") in one of the layer's parameter blocks, else the layer itself; (None, None)
    for a net built in code."""
    named = re.search(r"field '(\w+)'", message)
    if named:
        for block in layer.values():
            for value in block if isinstance(block, list) else []:
                at = getattr(value, "positions", {}).get(named.group(1))
                if at:
                    return at[0]
    at = getattr(net, "positions", {}).get("layer", [])
    return at[index] if index < len(at) else (None, None)


def _load_net(path_or_text: str | os.PathLike | Mapping) -> Mapping:
    """A NetParameter message, its fields checked against Caffe's schema; V1 nets refused."""
    net = load_message(path_or_text)
    if "layers" in net:
        raise PrototxtError(
            "net uses the deprecated V1 'layers' field; upgrade it with Caffe's upgrade_net_proto_text tool"
        )
    check_message(net, "NetParameter", "net")
    return net


def read_net(
    path_or_text: str | os.PathLike | Mapping,
    phase: str = "TRAIN",
    input_shape: tuple[int, int, int] | None = None,
    *,
    level: int = 0,
    stages: Sequence[str] = (),
) -> Net:
    """A `Net` from a Caffe NetParameter: the layers active in `phase`, in file order, as a graph.

    Caffe's include/exclude rules pick the layers (`level` and `stages` as in caffe.proto's
    NetState). One data layer (Data, ImageData, HDF5Data, MemoryData, DummyData, Input) or the
    legacy top-level `input` (with `input_shape` or the old `input_dim` ×4 header of deploy files)
    gives the input blob; its transform_param becomes `Net.transform`. Input, DummyData, MemoryData
    and the legacy header give the input shape (C, H, W); `input_shape` overrides it and is required
    for the others. Layers read any blob written before them (branches, Concat, Eltwise, in-place
    layers). Each SoftmaxWithLoss is a loss head with its `loss_weight`; the one with the largest
    weight (the last on ties) is the main head, whose scores the net outputs. A Softmax on the last
    layer's output is a deploy net's output (dropped: `Net.predict_proba` applies it); Accuracy
    layers are metrics (dropped). `path_or_text` is a path, prototxt text, or a message from
    `parse_prototxt`. Every field is checked against Caffe's schema first (`caffe_schema`): a
    misspelled one is refused with its line and the closest known field, never read as its default.
    Errors name the layer: PrototxtError.
    """
    if str(phase).upper() not in PHASES:
        raise ValueError(f"phase must be 'TRAIN' or 'TEST', got {phase!r}")
    phase, net = str(phase).upper(), _load_net(path_or_text)
    blob, shape, transform, data_layer, label = None, None, None, None, None
    inputs = get_all_typed(net, "input", "str", "net")
    if len(inputs) > 1:
        raise PrototxtError(f"net: one input blob is supported, got {inputs}")
    if inputs:
        blob, data_layer = inputs[0], f"input '{inputs[0]}'"
        shapes = get_all_typed(net, "input_shape", "msg", "net")
        dims = (
            get_all_typed(shapes[0], "dim", "int", "net")
            if shapes
            else get_all_typed(net, "input_dim", "int", "net")
        )
        shape = _chw(dims, "net: input") if dims else None
    entries: list = []
    written = {blob} if blob else set()
    heads: list[tuple[str, float, str]] = []  # (blob, loss weight, where)
    deploy_output = None
    index, layer = -1, {}
    try:
        for index, layer in enumerate(get_all_typed(net, "layer", "msg", "net")):
            name = get_typed(layer, "name", "str", "", f"layer #{index}") or f"layer{index}"
            where = f"layer '{name}'"
            if not _active(layer, phase, level, stages, where):
                continue
            ltype = get_typed(layer, "type", "str", "", where)
            bottoms, tops = (
                get_all_typed(layer, "bottom", "str", where),
                get_all_typed(layer, "top", "str", where),
            )
            if ltype in DATA_TYPES:
                if data_layer or entries or not tops:
                    raise PrototxtError(
                        f"{where}: a data layer must have a top, come first and be the only one "
                        f"in phase {phase}" + (f" (already: {data_layer})" if data_layer else "")
                    )
                blob, data_layer = tops[0], where
                label = tops[1] if len(tops) > 1 else None
                written = {blob}
                shape, transform = _data_shape(layer, ltype, where), _transform(layer, where)
                continue
            if blob is None:
                raise PrototxtError(f"{where}: comes before any data layer or net input")
            if ltype in OUTPUT_TYPES or ltype == "Accuracy":
                if not bottoms or bottoms[0] not in written:
                    raise PrototxtError(f"{where}: {ltype} must read a blob written by an earlier layer")
                if ltype == "Softmax" and (not entries or bottoms[0] != entries[-1][2]):
                    last = entries[-1][2] if entries else blob
                    raise PrototxtError(f"{where}: Softmax must read the output of the last layer ('{last}')")
                if ltype == "SoftmaxWithLoss":
                    weights = get_all_typed(layer, "loss_weight", "float", where)
                    weight = weights[0] if weights else 1.0
                    if not (math.isfinite(weight) and weight >= 0):
                        raise PrototxtError(f"{where}: loss_weight must be finite and >= 0, got {weight}")
                    heads.append((bottoms[0], weight, where))
                elif ltype == "Softmax":
                    deploy_output = (bottoms[0], where)
                continue
            if ltype.endswith("Loss"):
                raise PrototxtError(
                    f"{where}: loss type '{ltype}' is not supported; dasknn trains with SoftmaxWithLoss"
                )
            if ltype not in SUPPORTED_TYPES:
                raise PrototxtError(
                    f"{where}: type '{ltype}' is not supported; supported: "
                    f"{', '.join(SUPPORTED_TYPES + DATA_TYPES + OUTPUT_TYPES)}, Accuracy"
                )
            after = [(b, w) for b, _, w in heads if b in bottoms or b in tops]
            if after:
                raise PrototxtError(
                    f"{where}: comes after the loss ({after[0][1]}) on its blob '{after[0][0]}': a loss "
                    "head's scores end their branch"
                )
            unknown = [b for b in bottoms if b not in written]
            if not bottoms or unknown or len(tops) != 1:
                raise PrototxtError(
                    f"{where}: needs bottoms written by earlier layers and one top; got bottom {bottoms} "
                    f"and top {tops}" + (f" ('{label}' is the labels)" if label in unknown else "")
                )
            try:
                entries.append((_build(layer, ltype, name, where), bottoms, tops[0]))
            except ValueError as err:  # the layer's own checks, e.g. an even LRN local_size
                text = err.message if isinstance(err, PrototxtError) else str(err)
                raise PrototxtError(text if text.startswith(where) else f"{where}: {text}") from err
            written.add(tops[0])
    except ValueError as err:  # a layer's value or place, named with the line the layer (or field) is on
        raise _at_layer(err, net, index, layer) from err
    if input_shape is not None:
        try:
            shape = tuple(operator.index(d) for d in input_shape)  # ints, numpy ints included
        except TypeError:
            shape = ()
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"input_shape must be 3 positive ints (C, H, W), got {input_shape!r}")
    if shape is None:
        raise PrototxtError(
            f"no input shape: {data_layer or 'the net'} does not give (C, H, W) "
            "(Data layers read it from the data); pass input_shape=(C, H, W)"
        )
    if transform and len(transform.get("mean_value", [0])) not in (1, shape[0]):
        raise PrototxtError(
            f"{data_layer}: {len(transform['mean_value'])} mean_value for {shape[0]} "
            "channels (give 1 or one per channel)"
        )
    if not entries:
        raise PrototxtError("net: no layers to train (only data, loss and accuracy layers)")
    entries, loss_weights = _outputs(entries, heads, deploy_output)
    name = get_typed(net, "name", "str", "net", "net") or "net"
    kw = {"name": name, "input_blob": blob, "loss_weights": loss_weights}
    try:
        _check_size(Net(entries, shape, init_params=False, **kw))  # shapes only, nothing allocated
        return Net(entries, shape, transform=transform, **kw)
    except ValueError as err:  # e.g. a kernel larger than its input, or repeated layer names
        raise PrototxtError(err.args[0] if isinstance(err, PrototxtError) else f"net: {err}") from err


def _outputs(entries: list, heads: list, deploy_output: tuple | None) -> tuple[list, dict[str, float]]:
    """(entries with the main head's layer last, {blob: loss weight}): the main head is the loss
    with the largest weight (the last on ties), else a deploy net's Softmax input, else the last
    layer's output. Its producer moves to the end (a net's main output is its last layer's top),
    which keeps a valid order as nothing reads a head's scores."""
    if heads:
        main = max(reversed(heads), key=lambda h: h[1])[0]
    else:
        main = deploy_output[0] if deploy_output else entries[-1][2]
    producers = [i for i, (_, _, top) in enumerate(entries) if top == main]
    if not producers:
        raise PrototxtError(f"net: the loss reads '{main}', which no compute layer writes")
    last = producers[-1]
    if any(main in ([b] if isinstance(b, str) else b) for _, b, _ in entries[last + 1 :]):
        raise PrototxtError(f"net: the main output '{main}' is read by later layers")
    entries = entries[:last] + entries[last + 1 :] + [entries[last]]
    return entries, {blob: weight for blob, weight, _ in heads}


def _check_size(net: Net) -> None:
    """Checks beyond Net's own size limits (MAX_PARAMS, MAX_BLOB): the LRN windows."""
    for layer in net.layers:
        if isinstance(layer, LRN):
            _check_lrn_window(layer)


def _check_lrn_window(layer: LRN) -> None:
    """An LRN window wider than any position can reach (2·C−1 channels, or 2·H−1 pixels) only rescales
    alpha, and costs local_size passes over the blob: refused, with the equivalent setting."""
    c, h, w = layer.in_shape
    across = layer.norm_region == "across_channels"
    reach = 2 * c - 1 if across else 2 * max(h, w) - 1
    n = layer.local_size
    if n > reach:
        alpha = layer.alpha * (reach / n if across else (reach / n) ** 2)
        raise PrototxtError(
            f"layer '{layer.name}': LRN local_size {n} is wider than the {reach} "
            f"{'channels' if across else 'pixels'} a window can reach; local_size {reach} with alpha "
            f"{alpha:.6g} computes the same"
        )


def _resolve(net_path: str, solver_dir: Path) -> Path:
    """Caffe files name nets from Caffe's root: try the path as given, in the solver's folder, then
    the file's name in the solver's folder."""
    candidates = [Path(net_path), solver_dir / net_path, solver_dir / Path(net_path).name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"net file {net_path!r} not found; tried {', '.join(map(str, candidates))}")


def read_net_and_solver(
    solver_path: str | os.PathLike,
    input_shape: tuple[int, int, int] | None = None,
    phase: str = "TRAIN",
) -> tuple[Net, dict[str, Any]]:
    """(net, solver settings) from a solver file and the net it names (`net`, `train_net`, or inline
    `net_param`/`train_net_param`: exactly one, as Caffe requires); see `read_net`, `read_solver`."""
    solver_path = Path(solver_path)
    solver = read_solver(solver_path)
    given = [f for f in ("train_net_param", "train_net", "net_param", "net") if f in solver]
    if len(given) != 1:
        raise PrototxtError(
            f"{solver_path}: give exactly one of train_net_param, train_net, net_param, net; "
            f"got {given or 'none'}"
        )
    net = solver[given[0]]
    source = net if isinstance(net, Mapping) else _resolve(net, solver_path.parent)
    return read_net(source, phase=phase, input_shape=input_shape), solver
