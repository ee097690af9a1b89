"""The schema of a saved model's model.json: what `dasknn.saving.read` checks before it builds a model.

A model folder is data, never instructions: only known fields, each of its type and range; the
net's spec of float32 or float64 and its weights exactly of that dtype, of the spec's shapes and
finite; `state_` holding the net's own weights; `classes_` one label per output of the net;
`n_features_in_`, `n_iter_` and the records consistent with the net and the state; a zoo net's
spec the zoo's (a max pool edited to an average one is refused); the parameters checked by their
rules (`dasknn.estimator_params.PARAMS`); a tuner object as its name and the options it sets,
each a known option of that tuner, checked by its rule. Parameters that are paths, addresses, live
objects or data (`Param.saved` False) are never restored: they load as their defaults. Each check
raises a ValueError naming the field; `dasknn.saving` adds the file.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import fields
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine.averaging import AVERAGING
from dasknn.engine.checkpoint import MAX_COUNT, check_state, decode, decode_table
from dasknn.engine.trace import TrainState
from dasknn.estimator_params import BY_NAME, PARAMS, TUNERS, check_params, defaults
from dasknn.nn.net import Net

__all__ = ["NOT_SAVED", "TOP_FIELDS", "net_from", "restore", "tuner_data", "untagged"]

TOP_FIELDS = ("format", "version", "dasknn", "params", "fitted")
NOT_SAVED = tuple(p.name for p in PARAMS if not p.saved)
"""Parameters a model folder never sets (paths, addresses, live objects, data): they load as defaults."""
SPEC_FIELDS = {"version", "name", "input_blob", "input_shape", "transform", "seed", "dtype", "loss_weights",
               "layers"}  # fmt: skip
LAYER_FIELDS = {"type", "name", "config", "bottom", "top"}
NET_DTYPES = ("<f4", "<f8")
HOW_NOT_WHAT = ("lowering", "bp", "backend")
"""Layer settings that say how a layer computes, not what (left out when a zoo net is compared)."""


def _fail(what: str) -> None:
    raise ValueError(what)


def _int(value: Any, low: int = 0, high: int = MAX_COUNT) -> bool:
    return type(value) is int and low <= value <= high


def _number(value: Any, low: float = 0.0, low_open: bool = False) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value > low if low_open else value >= low)


def _keys(obj: Any, allowed: set[str], where: str, required: set[str] | None = None) -> dict:
    if not isinstance(obj, dict):
        _fail(f"{where} is a {type(obj).__name__}, not a mapping")
    required = allowed if required is None else required
    unknown, missing = sorted(set(obj) - allowed), sorted(required - set(obj))
    if unknown or missing:
        _fail(f"{where} has unknown fields {unknown}" if unknown else f"{where} lacks the fields {missing}")
    return obj


# -- tagged values -------------------------------------------------------------------------------
TAGGED = {"__table__", "__dataset__", "__path__", "__state__", "__config__", "__parts__", "__augment__",
          "__net__"}  # fmt: skip
"""The tags `dasknn.saving` writes for the package's own objects (see its module docstring)."""


def _dataclass(cls, values: Any, where: str):
    _keys(values, {f.name for f in fields(cls)}, where, required=set())
    return cls(**values)


def untagged(obj: Any, arrays, where: str = "a value") -> Any:
    """A value written by `dasknn.saving`'s `tagged`, each tag with its own fields only. Nets, states
    and paths are refused here: `net_from`, the state's check and the parameters read those."""
    from dasknn.data.augment import Augment
    from dasknn.data.split import Parts
    from dasknn.engine.trace import RunConfig

    if isinstance(obj, list):
        return [untagged(v, arrays, where) for v in obj]
    tag = set(obj) & TAGGED if isinstance(obj, dict) else set()
    if not tag:
        return decode(obj, arrays)
    (tag,) = tag if len(obj) == 1 else (None,)
    if tag == "__table__":
        return decode_table(_keys(obj[tag], {"columns", "attrs"}, where), arrays)
    if tag == "__dataset__":
        import xarray as xr

        return xr.Dataset.from_dict(decode(obj[tag], arrays))
    classes = {"__config__": RunConfig, "__parts__": Parts, "__augment__": Augment}
    if tag in classes:
        return _dataclass(classes[tag], decode(obj[tag], arrays), where)
    _fail(f"{where} holds {sorted(obj)[:3]}: a net, state or path where none belongs")


# -- the net -----------------------------------------------------------------------------------
def _check_spec(spec: Any, where: str) -> None:
    from dasknn.nn.spec import CLASSES

    _keys(spec, SPEC_FIELDS, where)
    if spec["dtype"] not in NET_DTYPES:
        _fail(f"{where}: dtype {spec['dtype']!r} is not float32 or float64 ({' or '.join(NET_DTYPES)})")
    shape = spec["input_shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(_int(s, 1, 2**20) for s in shape)):
        _fail(f"{where}: input_shape {shape!r} is not three positive integers")
    if not isinstance(spec["layers"], list) or not spec["layers"]:
        _fail(f"{where}: layers is not a list of layers")
    for entry in spec["layers"]:
        _keys(entry, LAYER_FIELDS, f"{where} layer")
        if entry["type"] not in CLASSES:
            _fail(f"{where}: layer {entry['name']!r} has an unknown type {entry['type']!r}")
        if not isinstance(entry["config"], dict):
            _fail(f"{where}: layer {entry['name']!r} has a config that is not a mapping")


def _weights(stored: Any, net: Net, where: str) -> dict[str, np.ndarray]:
    """The stored weights of `net`, each exactly of the net's dtype and shape, and finite."""
    expected = net.get_params()
    if not isinstance(stored, dict) or set(stored) != set(expected):
        got = sorted(stored) if isinstance(stored, dict) else stored
        _fail(f"{where}: the weights {got} are not the net's {sorted(expected)}")
    for key, want in expected.items():
        a = stored[key]
        if not isinstance(a, np.ndarray):
            _fail(f"{where}: weight {key} is not an array")
        if a.dtype != want.dtype:
            _fail(f"{where}: weight {key} has dtype {a.dtype}; the net computes in {want.dtype}")
        if a.shape != want.shape:
            _fail(f"{where}: weight {key} has shape {a.shape}; the net's spec gives {want.shape}")
        if not np.isfinite(a).all():
            _fail(f"{where}: weight {key} is not finite (NaN or inf)")
    return stored


def net_from(obj: Any, arrays, where: str) -> Net:
    """The Net of a `{"__net__": spec, "params": weights}` entry, checked; fresh filler draws when
    it has no "params"."""
    from dasknn.nn.spec import net_from_spec

    _keys(obj, {"__net__", "params"}, where, required={"__net__"})
    _check_spec(obj["__net__"], where)
    net = net_from_spec(obj["__net__"])
    if "params" in obj:
        net.set_params(_weights(decode(obj["params"], arrays), net, where))
    return net


def _same_architecture(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def plain(spec):
        layers = [{**x, "config": {k: v for k, v in x["config"].items() if k not in HOW_NOT_WHAT}}
                  for x in spec["layers"]]  # fmt: skip
        return {**spec, "layers": layers, "seed": None}  # the fillers' seed: not what the net computes

    return plain(a) == plain(b)


def _check_zoo_net(name: str, fitted: dict[str, Any], random_state: int) -> None:
    """A zoo net's fitted spec is the zoo's, for the fitted input shape and classes."""
    from dasknn.estimator_input import build_net
    from dasknn.nn.spec import net_spec

    net = fitted["net_"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo = build_net(name, net.input_shape, len(fitted["classes_"]), random_state, None)
    if not _same_architecture(net_spec(zoo), net_spec(net)):
        _fail(f"fitted.net_: its layers are not those of the zoo's net {name!r} (edited)")


# -- fitted attributes ---------------------------------------------------------------------------
def _state(obj: Any, arrays, fitted: dict[str, Any]) -> TrainState:
    where = "fitted.state_"
    _keys(obj, {"__state__"}, where)
    values = _keys(decode(obj["__state__"], arrays), {f.name for f in fields(TrainState)}, where)
    state = TrainState(**values)
    net = fitted["net_"]
    theirs = net.get_params()
    if not isinstance(state.params, dict) or set(state.params) != set(theirs):
        _fail(f"{where}: its weights are not net_'s")
    statistics = net.statistics  # BatchNorm's: net_ holds them recomputed for its weights, the
    for key, a in state.params.items():  # state the solver's running sums (fitting.Evaluator)
        like = isinstance(a, np.ndarray) and a.dtype == theirs[key].dtype and a.shape == theirs[key].shape
        if not like or (key not in statistics and not np.array_equal(a, theirs[key])):
            _fail(f"{where}: weight {key} is not net_'s")
    if not isinstance(state.momentum, dict) or not isinstance(state.extra, dict):
        _fail(f"{where}: momentum and extra must be mappings")
    for key, a in state.momentum.items():
        w = state.params.get(key)
        if not isinstance(a, np.ndarray) or w is None or a.shape != w.shape or a.dtype != w.dtype:
            _fail(f"{where}: momentum {key} is not of its weight's shape and dtype")
    if not (_int(state.iterations_done) and _int(state.batches_done)):
        _fail(f"{where}: iterations_done and batches_done must be integers in [0, 2**53]")
    problem = check_state(state)
    if problem:
        _fail(f"{where}: {problem}")
    return state


def _classes(value: Any, fitted: dict[str, Any]) -> str:
    n = fitted["net_"].num_classes
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "biufU":
        return "is not a 1-D array of labels"
    if len(value) != n:
        return f"has {len(value)} labels; the net has {n} outputs"
    if not np.array_equal(np.unique(value), value):
        return "labels are not distinct and sorted"
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        return "labels are not finite"
    return ""


def _n_features(value: Any, fitted: dict[str, Any]) -> str:
    size = math.prod(fitted["net_"].input_shape)
    if not _int(value, 1):
        return f"is {value!r}, not a positive integer"
    if fitted.get("augment_") is None and value != size:
        return f"is {value}; the net takes {size} features"
    if value < size:
        return f"is {value}, fewer than the net's {size} inputs"
    return ""


def _history(value: Any, fitted: dict[str, Any]) -> str:
    plain = (type(None), bool, int, float, str)
    if not isinstance(value, list) or not all(
        isinstance(row, dict) and all(isinstance(v, plain) for v in row.values()) for row in value
    ):
        return "is not a list of rows of numbers and strings"
    if any(not _number(row.get("iteration")) for row in value):
        return "has a row without an iteration count"
    return ""


def _config(value: Any, run_config: type) -> str:
    ok = isinstance(value, run_config) and _int(value.n_groups, 1) and _int(value.batch_size, 1)
    ok = ok and _number(value.lr, 0, True) and _number(value.momentum) and value.momentum < 1
    ok = ok and _number(value.weight_decay) and _int(value.seed, 0, 2**64)
    return "" if ok else "is not a run configuration (n_groups, batch_size, lr, momentum, weight_decay, seed)"


def _table(value: Any, fitted: dict[str, Any]) -> str:
    if not isinstance(value, pd.DataFrame):
        return "is not a table"
    return ""


def _check_field(name: str, value: Any, fitted: dict[str, Any]) -> str:
    """What is wrong with the decoded fitted attribute `name` ("" when nothing)."""
    import xarray as xr

    from dasknn.data.augment import Augment
    from dasknn.data.split import Parts
    from dasknn.engine.trace import RunConfig

    n_iter = fitted["n_iter_"]
    positive = "" if value is None or _number(value, 0, True) else "is not a number > 0"
    rules = {
        "classes_": lambda: _classes(value, fitted),
        "n_features_in_": lambda: _n_features(value, fitted),
        "history_": lambda: _history(value, fitted),
        "trace_": lambda: _table(value, fitted),
        "decisions_": lambda: _table(value, fitted),
        "report_": lambda: _table(value, fitted),
        "tradeoff_": lambda: "" if value is None or isinstance(value, xr.Dataset) else "is not a record",
        "augment_": lambda: "" if value is None or isinstance(value, Augment) else "is not an Augment",
        "averaging_": lambda: "" if value is None or value in AVERAGING else f"is not None or in {AVERAGING}",
        "config_": lambda: _config(value, RunConfig),
        "parts_": lambda: (
            ""
            if isinstance(value, Parts)
            and all(
                isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype.kind in "iu" and (a >= 0).all()
                for a in (value.train, value.selection, value.validation)
            )
            else "is not three arrays of sample indices"
        ),
        "best_iteration_": lambda: "" if value is None or _int(value, 0, n_iter) else f"not in [0, {n_iter}]",
        "n_train_samples_": lambda: "" if _int(value) else "is not an integer >= 0",
        "batch_size_": lambda: "" if _int(value, 1) else "is not an integer >= 1",
        "data_": lambda: "" if value in (None, "persist", "stream") else "is not 'persist' or 'stream'",
        "max_wall_time_": lambda: positive,
        "simulated_gflops_": lambda: positive,
        "stopped_by_": lambda: "" if isinstance(value, str) else "is not a string",
        "tuner_": lambda: "" if value in TUNERS else f"is not one of {TUNERS}",
        "_loop_": lambda: "" if isinstance(value, dict) else "is not a mapping",
    }
    return rules[name]() if name in rules else ""


FITTED_NAMES = ("_loop_", "augment_", "averaging_", "batch_size_", "best_iteration_", "checkpoint_",
                "classes_", "config_", "data_", "decisions_", "history_", "max_wall_time_", "n_features_in_",
                "n_iter_", "n_train_samples_", "net_", "parts_", "report_", "simulated_gflops_", "state_",
                "stopped_by_", "trace_", "tradeoff_", "tuner_")  # fmt: skip
"""The learned attributes a saved model may hold (`checkpoint_`, a path, is never restored)."""
REQUIRED = {"classes_", "n_features_in_", "net_", "state_"}


def _fitted(doc: Any, arrays) -> dict[str, Any]:
    if isinstance(doc, dict):  # earlier versions kept the tuner's options apart: now in params.tuner
        doc = {k: v for k, v in doc.items() if k != "tuner_options_"}
    _keys(doc, set(FITTED_NAMES), "fitted", required=REQUIRED)
    fitted: dict[str, Any] = {"net_": net_from(doc["net_"], arrays, "fitted.net_")}
    fitted["state_"] = _state(doc["state_"], arrays, fitted)
    done = fitted["state_"].iterations_done
    n_iter = doc.get("n_iter_", done)
    if n_iter != done or not _int(n_iter):
        _fail(f"fitted.n_iter_ = {n_iter!r} is not state_.iterations_done = {done}")
    fitted["n_iter_"] = n_iter
    for name in ("augment_", "classes_", *FITTED_NAMES):
        if name in fitted or name not in doc or name == "checkpoint_":
            continue
        fitted[name] = untagged(doc[name], arrays, f"fitted.{name}")
        problem = _check_field(name, fitted[name], fitted)
        if problem:
            _fail(f"fitted.{name} {problem}")
    problem = check_state(TrainState(params={}), fitted.get("_loop_"))
    if problem:
        _fail(f"fitted: {problem}")
    return fitted


# -- parameters ---------------------------------------------------------------------------------
def _net_param(value: Any, arrays, fitted: dict[str, Any]) -> Any:
    """The `net` parameter: a zoo name as it is; a saved Net checked; a path (a `.prototxt` file,
    which may be gone and is never read from a model folder) as the fitted architecture, its
    weights drawn afresh from its fillers."""
    from dasknn.nn.spec import net_from_spec, net_spec
    from dasknn.nn.zoo import NETS

    if isinstance(value, dict) and "__net__" in value:
        return net_from(value, arrays, "params.net")
    if isinstance(value, str) and value.lower().replace("-", "_") in NETS:
        return value
    if isinstance(value, str) or (isinstance(value, dict) and set(value) == {"__path__"}):
        return net_from_spec(net_spec(fitted["net_"]))
    _fail(f"params.net is {value!r}: not a zoo name, a net or a path")


FORMER_NAMES = {"optimizer": "tuner", "optimizer_options": "tuner_options"}
"""Parameters that models saved by earlier versions hold under a former name, and their names now."""
FORMER_OPTIONS = {"segment_iterations": "run_iterations"}
"""Likewise for the tuners' options."""
NOW_SETTINGS = ("prior_cache", "net_name", "cache_key")
"""Options that earlier versions' `tuner_options` could hold and that a fit now sets on its bound
tuner (`Tuner.for_fit`; `prior_cache` is the estimator's parameter): never restored from there."""


def _present_names(doc: Any) -> Any:
    """The parameters with each former name (`FORMER_NAMES`) read as its present one; None there
    was its default. A model holding both names with different values is refused."""
    if not isinstance(doc, dict):
        return doc
    out = {k: v for k, v in doc.items() if k not in FORMER_NAMES}
    for former, name in FORMER_NAMES.items():
        value = doc.get(former)
        if value is None:
            continue
        default = BY_NAME[name].default if name in BY_NAME else None
        present = out.get(name, default)
        if present != default and present != value:
            _fail(f"params.{former} {value!r} (the former name of {name}) differs from {name} {present!r}")
        out[name] = value
    return out


def _present_options(options: Any) -> Any:
    """Tuner options with each former name (`FORMER_OPTIONS`) read as its present one; where both
    are given, the present one counts (as it did when both names were accepted)."""
    if not isinstance(options, dict):
        return options
    return {
        FORMER_OPTIONS.get(k, k): v
        for k, v in options.items()
        if not (k in FORMER_OPTIONS and FORMER_OPTIONS[k] in options)
    }


def _with_options_in_tuner(doc: Any) -> Any:
    """The parameters of a model saved with `tuner_options` (earlier versions): its options moved
    into `tuner`, as the saved form of a tuner object (`tuner_data`), less the ones a fit now sets
    (`NOW_SETTINGS`, never restored)."""
    if not isinstance(doc, dict) or "tuner_options" not in doc:
        return doc
    out = {k: v for k, v in doc.items() if k != "tuner_options"}
    options = _present_options(doc["tuner_options"])
    if options is None:
        return out
    if not isinstance(options, dict):
        _fail(f"params.tuner_options is a {type(options).__name__}, not a mapping")
    options = {k: v for k, v in options.items() if k not in NOW_SETTINGS}
    name = out.get("tuner", "auto")
    if not isinstance(name, str):
        _fail("params holds both tuner_options and a tuner object")
    out["tuner"] = {"__tuner__": {"name": name, "params": options}} if options else name
    return out


def tuner_data(tuner: Any) -> tuple[dict[str, Any], list[str]]:
    """(the saved form of a tuner object: its name and the options it sets that are plain data;
    the names of the options it sets that are not, which are left out)."""
    params, left_out = {}, []
    defaults = {o.name: o.default for o in tuner.OPTIONS}
    for name, value in tuner.get_params(deep=False).items():
        if _plain(value) and value == defaults[name]:
            continue
        if _plain(value):
            params[name] = list(value) if isinstance(value, tuple) else value
        else:
            left_out.append(f"tuner.{name}")
    return {"__tuner__": {"name": tuner.name, "params": params}}, left_out


def _plain(value: Any) -> bool:
    """JSON data: None, a bool, number or string, or a list or mapping of them."""
    if value is None or isinstance(value, (bool, str)) or _number(value, -math.inf):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _plain(v) for k, v in value.items())


def _tuner_param(value: Any) -> Any:
    """The `tuner` parameter: a name as it is, or a saved tuner object (`tuner_data`) rebuilt from
    its name and options, each a known option of that tuner, plain data, checked by its rule."""
    if not (isinstance(value, dict) and set(value) == {"__tuner__"}):
        return value
    from dasknn.estimator_params import optimizer_class

    saved = _keys(value["__tuner__"], {"name", "params"}, "params.tuner")
    name, params = saved["name"], saved["params"]
    if not isinstance(params, dict):
        _fail(f"params.tuner.params is a {type(params).__name__}, not a mapping")
    if name not in TUNERS:
        _fail(f"params.tuner names {name!r}, not one of {TUNERS}")
    cls = optimizer_class(name)
    known = {o.name for o in cls.OPTIONS}
    for key, option in params.items():
        if key not in known:
            _fail(f"params.tuner: {key!r} is no option of the {name!r} tuner ({cls.__name__})")
        if not _plain(option):
            _fail(f"params.tuner.{key} is not plain data")
    tuner = cls(**params)
    try:
        tuner.checked()
    except (TypeError, ValueError) as err:
        _fail(f"params.tuner: {err}")
    return tuner


def _params(doc: Any, arrays, fitted: dict[str, Any]) -> dict[str, Any]:
    """The parameters, each by its rule; one that is missing takes its default (a model saved
    before that parameter existed), one under a former name is read as its present one."""
    doc = _with_options_in_tuner(_present_names(doc))
    _keys(doc, set(BY_NAME), "params", required=set())
    params = {}
    for name, value in doc.items():
        if name in NOT_SAVED:
            continue
        if name == "net":
            params[name] = _net_param(value, arrays, fitted)
            continue
        value = _tuner_param(value) if name == "tuner" else untagged(value, arrays, f"params.{name}")
        try:
            BY_NAME[name].rule.check(name, value)
        except (ValueError, FileNotFoundError) as err:
            _fail(f"params.{name}: {err}")
        params[name] = value
    full = {**defaults(), **params}
    check_params(full, partial=True)
    shape = full["input_shape"]
    n = fitted["n_features_in_"]
    if isinstance(shape, (tuple, list)) and math.prod(shape) != n:
        _fail(f"params.input_shape {tuple(shape)} does not give fitted.n_features_in_ = {n} features")
    if isinstance(full["net"], str) and isinstance(full["random_state"], numbers.Integral):
        _check_zoo_net(full["net"], fitted, int(full["random_state"]))
    return params


def restore(doc: Any, arrays) -> tuple[dict[str, Any], dict[str, Any]]:
    """(parameters, learned attributes) of a model.json document whose format and version the
    caller checked, every field checked here first; a ValueError naming the first field that is wrong."""
    _keys(doc, set(TOP_FIELDS), "model.json")
    if not isinstance(doc["dasknn"], str):
        _fail("the field dasknn (the version that saved it) is not a string")
    fitted = _fitted(doc["fitted"], arrays)
    return _params(doc["params"], arrays, fitted), fitted
