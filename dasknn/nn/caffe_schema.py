"""Caffe's message schema: the fields of every message a net or solver file can hold, and the check.

The table lists each message of caffe.proto (BVLC/caffe 9b89154) reachable from NetParameter and
SolverParameter, its fields in our notation (`name` a scalar, `name*` repeated, `name:Type` a
message, `name=A|B` an enum), names and types only; `check_message` walks a parsed message against
it before anything is built, so a typo (`strde: 2`) names the layer, the line and the closest
known field. Why a table and not protobuf's text_format: docs/architecture.md, "What a user hands
in".
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cache
from typing import NamedTuple

from dasknn.nn.textformat import PrototxtError

_OPAQUE = {"V1LayerParameter"}  # NetParameter.layers: refused by read_net with an upgrade hint

SCHEMA: dict[str, str] = {
    "NetParameter": (
        "name input* input_shape*:BlobShape input_dim* force_backward state:NetState debug_info "
        "layer*:LayerParameter layers*:V1LayerParameter"
    ),
    "SolverParameter": (
        "net net_param:NetParameter train_net test_net* train_net_param:NetParameter "
        "test_net_param*:NetParameter train_state:NetState test_state*:NetState test_iter* "
        "test_interval test_compute_loss test_initialization base_lr display average_loss max_iter "
        "iter_size lr_policy gamma power momentum weight_decay regularization_type stepsize "
        "stepvalue* clip_gradients snapshot snapshot_prefix snapshot_diff "
        "snapshot_format=HDF5|BINARYPROTO solver_mode=CPU|GPU device_id random_seed type delta "
        "momentum2 rms_decay debug_info snapshot_after_train "
        "solver_type=SGD|NESTEROV|ADAGRAD|RMSPROP|ADADELTA|ADAM layer_wise_reduce weights*"
    ),
    "BlobShape": "dim*",
    "NetState": "phase=TRAIN|TEST level stage*",
    "LayerParameter": (
        "name type bottom* top* phase=TRAIN|TEST loss_weight* param*:ParamSpec blobs*:BlobProto "
        "propagate_down* include*:NetStateRule exclude*:NetStateRule "
        "transform_param:TransformationParameter loss_param:LossParameter "
        "accuracy_param:AccuracyParameter argmax_param:ArgMaxParameter "
        "batch_norm_param:BatchNormParameter bias_param:BiasParameter clip_param:ClipParameter "
        "concat_param:ConcatParameter contrastive_loss_param:ContrastiveLossParameter "
        "convolution_param:ConvolutionParameter crop_param:CropParameter data_param:DataParameter "
        "dropout_param:DropoutParameter dummy_data_param:DummyDataParameter "
        "eltwise_param:EltwiseParameter elu_param:ELUParameter embed_param:EmbedParameter "
        "exp_param:ExpParameter flatten_param:FlattenParameter hdf5_data_param:HDF5DataParameter "
        "hdf5_output_param:HDF5OutputParameter hinge_loss_param:HingeLossParameter "
        "image_data_param:ImageDataParameter infogain_loss_param:InfogainLossParameter "
        "inner_product_param:InnerProductParameter input_param:InputParameter "
        "log_param:LogParameter lrn_param:LRNParameter memory_data_param:MemoryDataParameter "
        "mvn_param:MVNParameter parameter_param:ParameterParameter pooling_param:PoolingParameter "
        "power_param:PowerParameter prelu_param:PReLUParameter python_param:PythonParameter "
        "recurrent_param:RecurrentParameter reduction_param:ReductionParameter "
        "relu_param:ReLUParameter reshape_param:ReshapeParameter scale_param:ScaleParameter "
        "sigmoid_param:SigmoidParameter softmax_param:SoftmaxParameter spp_param:SPPParameter "
        "slice_param:SliceParameter swish_param:SwishParameter tanh_param:TanHParameter "
        "threshold_param:ThresholdParameter tile_param:TileParameter "
        "window_data_param:WindowDataParameter"
    ),
    "ParamSpec": "name share_mode=STRICT|PERMISSIVE lr_mult decay_mult",
    "BlobProto": "shape:BlobShape data* diff* double_data* double_diff* num channels height width",
    "NetStateRule": "phase=TRAIN|TEST min_level max_level stage* not_stage*",
    "TransformationParameter": "scale mirror crop_size mean_file mean_value* force_color force_gray",
    "LossParameter": "ignore_label normalization=FULL|VALID|BATCH_SIZE|NONE normalize",
    "AccuracyParameter": "top_k axis ignore_label",
    "ArgMaxParameter": "out_max_val top_k axis",
    "BatchNormParameter": "use_global_stats moving_average_fraction eps",
    "BiasParameter": "axis num_axes filler:FillerParameter",
    "ClipParameter": "min max",
    "ConcatParameter": "axis concat_dim",
    "ContrastiveLossParameter": "margin legacy_version",
    "ConvolutionParameter": (
        "num_output bias_term pad* kernel_size* stride* dilation* pad_h pad_w kernel_h kernel_w "
        "stride_h stride_w group weight_filler:FillerParameter bias_filler:FillerParameter "
        "engine=DEFAULT|CAFFE|CUDNN axis force_nd_im2col"
    ),
    "CropParameter": "axis offset*",
    "DataParameter": (
        "source batch_size rand_skip backend=LEVELDB|LMDB scale mean_file crop_size mirror "
        "force_encoded_color prefetch"
    ),
    "DropoutParameter": "dropout_ratio",
    "DummyDataParameter": "data_filler*:FillerParameter shape*:BlobShape num* channels* height* width*",
    "EltwiseParameter": "operation=PROD|SUM|MAX coeff* stable_prod_grad",
    "ELUParameter": "alpha",
    "EmbedParameter": (
        "num_output input_dim bias_term weight_filler:FillerParameter bias_filler:FillerParameter"
    ),
    "ExpParameter": "base scale shift",
    "FlattenParameter": "axis end_axis",
    "HDF5DataParameter": "source batch_size shuffle",
    "HDF5OutputParameter": "file_name",
    "HingeLossParameter": "norm=L1|L2",
    "ImageDataParameter": (
        "source batch_size rand_skip shuffle new_height new_width is_color scale mean_file "
        "crop_size mirror root_folder"
    ),
    "InfogainLossParameter": "source axis",
    "InnerProductParameter": (
        "num_output bias_term weight_filler:FillerParameter bias_filler:FillerParameter axis transpose"
    ),
    "InputParameter": "shape*:BlobShape",
    "LogParameter": "base scale shift",
    "LRNParameter": (
        "local_size alpha beta norm_region=ACROSS_CHANNELS|WITHIN_CHANNEL k engine=DEFAULT|CAFFE|CUDNN"
    ),
    "MemoryDataParameter": "batch_size channels height width",
    "MVNParameter": "normalize_variance across_channels eps",
    "ParameterParameter": "shape:BlobShape",
    "PoolingParameter": (
        "pool=MAX|AVE|STOCHASTIC pad pad_h pad_w kernel_size kernel_h kernel_w stride stride_h "
        "stride_w engine=DEFAULT|CAFFE|CUDNN global_pooling round_mode=CEIL|FLOOR"
    ),
    "PowerParameter": "power scale shift",
    "PReLUParameter": "filler:FillerParameter channel_shared",
    "PythonParameter": "module layer param_str share_in_parallel",
    "RecurrentParameter": (
        "num_output weight_filler:FillerParameter bias_filler:FillerParameter debug_info expose_hidden"
    ),
    "ReductionParameter": "operation=SUM|ASUM|SUMSQ|MEAN axis coeff",
    "ReLUParameter": "negative_slope engine=DEFAULT|CAFFE|CUDNN",
    "ReshapeParameter": "shape:BlobShape axis num_axes",
    "ScaleParameter": "axis num_axes filler:FillerParameter bias_term bias_filler:FillerParameter",
    "SigmoidParameter": "engine=DEFAULT|CAFFE|CUDNN",
    "SoftmaxParameter": "engine=DEFAULT|CAFFE|CUDNN axis",
    "SPPParameter": "pyramid_height pool=MAX|AVE|STOCHASTIC engine=DEFAULT|CAFFE|CUDNN",
    "SliceParameter": "axis slice_point* slice_dim",
    "SwishParameter": "beta",
    "TanHParameter": "engine=DEFAULT|CAFFE|CUDNN",
    "ThresholdParameter": "threshold",
    "TileParameter": "axis tiles",
    "WindowDataParameter": (
        "source scale mean_file batch_size crop_size mirror fg_threshold bg_threshold fg_fraction "
        "context_pad crop_mode cache_images root_folder"
    ),
    "FillerParameter": "type value min max mean std sparse variance_norm=FAN_IN|FAN_OUT|AVERAGE",
}


class Field(NamedTuple):
    """One field of a message: repeated or not, and its message type or enum value names."""

    repeated: bool
    message: str | None = None  # the message type of a message field
    enum: tuple[str, ...] = ()  # the value names of an enum field


@cache
def fields(type_name: str) -> dict[str, Field]:
    """{field name: Field} of one message of SCHEMA."""
    out = {}
    for entry in SCHEMA[type_name].split():
        entry, _, enum = entry.partition("=")
        entry, _, message = entry.partition(":")
        enum_names = tuple(enum.split("|")) if enum else ()
        out[entry.rstrip("*")] = Field(entry.endswith("*"), message or None, enum_names)
    return out


@cache
def _owners() -> dict[str, tuple[str, ...]]:
    """{field name: the messages that have it}, for the hint on a field written in the wrong block."""
    owners: dict[str, list[str]] = {}
    for type_name in SCHEMA:
        for name in fields(type_name):
            owners.setdefault(name, []).append(type_name)
    return {name: tuple(types) for name, types in owners.items()}


def _unknown(field: str, type_name: str, where: str) -> str:
    """The message for an unknown field: the closest known field, or where a field of that name lives."""
    message = f"{where}: unknown field '{field}' ({type_name} has no such field"
    close = difflib.get_close_matches(field, fields(type_name), n=1, cutoff=0.6)
    if close:
        return f"{message}); did you mean '{close[0]}'?"
    owners = [t for t in _owners().get(field, ()) if t != type_name]
    if owners:
        more = ", ..." if len(owners) > 3 else ""
        return f"{message}; '{field}' is a field of {', '.join(owners[:3])}{more})"
    return message + ")"


def check_message(message: Mapping, type_name: str, where: str, source: str | None = None) -> None:
    """Refuse, with PrototxtError, any field `type_name` does not have, a message written as a value
    or a value as a message, a single field given twice, and an unknown enum value name.

    `message` comes from `textformat.parse_prototxt` (its `positions` put the line in the error; a
    plain dict gives errors without one); `where` names the message ("net", "solver"), and each
    layer is named by its `name`. Recursion is bounded by the schema's nesting (five levels).
    """
    source = getattr(message, "source", None) or source
    known = fields(type_name)
    positions = getattr(message, "positions", {})
    for name, values in message.items():
        at = positions.get(name, [])

        def error(text: str, k: int = 0, at: list = at) -> PrototxtError:
            line, column = at[k] if k < len(at) else (None, None)
            return PrototxtError(text, line, column, source)

        field = known.get(name)
        if field is None:
            raise error(_unknown(name, type_name, where))
        if not field.repeated and len(values) > 1:
            raise error(f"{where}: field '{name}' is given {len(values)} times", 1)
        for k, value in enumerate(values):
            if field.message is None and isinstance(value, Mapping):
                raise error(f"{where}: field '{name}' takes a value ({name}: ...), not a block {{ }}", k)
            if field.message is not None and not isinstance(value, Mapping):
                raise error(f"{where}: field '{name}' is a block: write {name} {{ ... }}", k)
            if field.enum and isinstance(value, str) and value not in field.enum:
                names = ", ".join(field.enum)
                raise error(f"{where}: field '{name}' must be one of {names}, got {value!r}", k)
            if field.message is not None and field.message not in _OPAQUE:
                check_message(value, field.message, _name(value, name, k, where), source)


def _name(value: Mapping, field: str, k: int, where: str) -> str:
    """How errors name a nested message: a layer by its name, any other block by its field."""
    if field != "layer":
        return f"{where} {field}"
    names = value.get("name") or []
    label = f"layer '{names[0]}'" if names and isinstance(names[0], str) else f"layer #{k}"
    return label if where == "net" else f"{where} {label}"
