"""Saving a fitted DistributedCNN to a folder and loading it back, without pickle.

A saved model is one folder:

    model.json    {"format": "dasknn-model", "version": 1, "dasknn": <version that wrote it>,
                   "params": <the estimator's parameters>, "fitted": <its learned attributes>}
    arrays.npz    every array (weights, momentum buffers, classes, numeric table columns), read
                  back with `allow_pickle=False`

Values are encoded as in checkpoints (`dasknn.engine.checkpoint.encode`), with tags for the
package's own objects: a Net is stored as its architecture (`dasknn.nn.spec`) and its parameters,
so a net read from a `.prototxt` loads after the file is gone; DataFrames as tables; the training
state, run configuration, data parts and augmentation as their fields; the trade-off record
(xarray) as its dict form. A loaded model predicts without a cluster, and `partial_fit`,
`warm_start` and `save_checkpoint` continue from it as from the fit that wrote it.

Parameters that hold live objects (callbacks, security settings) or data (validation_data) cannot
be written as data: `save` refuses them by name before writing anything. A file of a newer format
version is refused with the version it has.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine.checkpoint import decode, decode_table, encode, encode_table

__all__ = ["FORMAT", "VERSION", "load", "save"]

FORMAT, VERSION = "dasknn-model", 1
FILES = ("model.json", "arrays.npz")


class SavedModelError(ValueError):
    pass


UNSAVEABLE = {
    "callbacks": "callback objects are code, not data; set callbacks=None and pass them again after loading",
    "security": "TLS settings hold credentials; set security=None and pass them again after loading",
    "validation_data": "it is data, not the model; set validation_data=None (history_ keeps its scores)",
}
"""Parameters whose values `save` refuses (when not None or empty), and what to do instead."""


def _tagged(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """`value` encoded, the package's own objects tagged; a ValueError naming `where` otherwise."""
    from dasknn.data.augment import Augment
    from dasknn.data.split import Parts
    from dasknn.engine.trace import RunConfig, TrainState
    from dasknn.nn.net import Net
    from dasknn.nn.spec import net_spec

    if isinstance(value, Net):
        return {"__net__": net_spec(value), "params": encode(value.get_params(), arrays)}
    if isinstance(value, pd.DataFrame):
        return {"__table__": encode_table(value, arrays)}
    if isinstance(value, TrainState):
        return {"__state__": encode(asdict(value), arrays)}
    if isinstance(value, RunConfig):
        return {"__config__": encode(asdict(value), arrays)}
    if isinstance(value, Parts):
        return {"__parts__": encode(asdict(value), arrays)}
    if isinstance(value, Augment):
        return {"__augment__": encode(asdict(value), arrays)}
    if isinstance(value, os.PathLike):
        return {"__path__": os.fspath(value)}
    if type(value).__name__ == "Dataset" and type(value).__module__.startswith("xarray"):
        return {"__dataset__": encode(_without_objects(value).to_dict(data="array"), arrays)}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_tagged(v, arrays, where) for v in value]
    try:
        return encode(value, arrays)
    except TypeError as err:
        raise ValueError(f"cannot save {where}: {err}") from None


def _without_objects(ds):
    """`ds` with each object-dtype variable as numbers (None as NaN) or else as strings (None as ""):
    xarray keeps a record's column of optional values (a phase, a reason) as Python objects, which an
    npz read without pickle cannot hold."""
    for name in list(ds.variables):
        var = ds.variables[name]
        if var.dtype != object:
            continue
        values = var.values
        try:
            plain = values.astype(float)
        except (TypeError, ValueError):
            plain = np.array(["" if v is None else str(v) for v in values.ravel()]).reshape(values.shape)
        ds = (
            ds.assign_coords({name: (var.dims, plain, var.attrs)})
            if name in ds.coords
            else ds.assign({name: (var.dims, plain, var.attrs)})
        )
    return ds


def _untagged(obj: Any, arrays) -> Any:
    from dasknn.data.augment import Augment
    from dasknn.data.split import Parts
    from dasknn.engine.trace import RunConfig, TrainState
    from dasknn.nn.spec import net_from_spec

    if isinstance(obj, list):
        return [_untagged(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return decode(obj, arrays)
    if "__net__" in obj:
        net = net_from_spec(obj["__net__"])
        net.set_params(decode(obj["params"], arrays))
        return net
    if "__table__" in obj:
        return decode_table(obj["__table__"], arrays)
    if "__dataset__" in obj:
        import xarray as xr

        return xr.Dataset.from_dict(decode(obj["__dataset__"], arrays))
    if "__path__" in obj:
        return Path(obj["__path__"])
    tags = {"__state__": TrainState, "__config__": RunConfig, "__parts__": Parts, "__augment__": Augment}
    for tag, cls in tags.items():
        if tag in obj:
            values = decode(obj[tag], arrays)
            return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
    return decode(obj, arrays)


def _fitted_names(est) -> list[str]:
    """The learned attributes of `est` (ending in `_`, and the loop state `_loop_`)."""
    return sorted(k for k in vars(est) if k.endswith("_") and not k.startswith("__"))


def _check_saveable(est) -> None:
    refused = [name for name in UNSAVEABLE if getattr(est, name) not in (None, [], ())]
    if refused:
        why = "; ".join(f"{name}: {UNSAVEABLE[name]}" for name in refused)
        raise ValueError(f"cannot save parameters {refused}: {why}")


def save(est, path: str | os.PathLike) -> Path:
    """Write the fitted `est` to the new folder `path` (model.json + arrays.npz); returns its path.

    Refuses, before writing anything: an unfitted estimator, parameters that cannot be saved
    (`UNSAVEABLE`, named), and a `path` that exists. The folder appears complete or not at all
    (written beside it, then renamed).
    """
    from dasknn.version import __version__

    est._check_fitted()
    _check_saveable(est)
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; save writes a new folder (remove it or choose another path)")
    arrays: dict[str, np.ndarray] = {}
    params = {k: _tagged(v, arrays, f"parameter {k}") for k, v in est.get_params(deep=False).items()}
    fitted = {k: _tagged(getattr(est, k), arrays, f"attribute {k}") for k in _fitted_names(est)}
    doc = {"format": FORMAT, "version": VERSION, "dasknn": __version__, "params": params, "fitted": fitted}
    text = json.dumps(doc, allow_nan=False, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "model.json").write_text(text)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(parameters, learned attributes) of the model saved at `path`; a ValueError naming the path
    when it holds no saved DistributedCNN or one of a newer format."""
    path = Path(path)
    try:
        doc = json.loads((path / "model.json").read_text())
        blob = (path / "arrays.npz").read_bytes()
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not a saved DistributedCNN (model.json and arrays.npz): {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved DistributedCNN: model.json is not a {FORMAT} file")
    version = doc.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ValueError(
            f"{path} was saved in format version {version!r} by dasknn {doc.get('dasknn', '?')}, newer than "
            f"this dasknn reads (up to {VERSION}): upgrade dasknn to load it"
        )
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    params = {k: _untagged(v, arrays) for k, v in doc["params"].items()}
    fitted = {k: _untagged(v, arrays) for k, v in doc["fitted"].items()}
    return params, fitted


def load(path: str | os.PathLike, cls):
    """The estimator of class `cls` (DistributedCNN) saved at `path` by `save`, fitted, ready to
    predict or train on."""
    params, fitted = read(path)
    est = cls(**params)
    for name, value in fitted.items():
        setattr(est, name, value)
    return est
