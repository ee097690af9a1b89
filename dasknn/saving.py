"""Saving a fitted DistributedCNN to a folder and loading it back, without pickle.

A saved model is a folder of model.json (the parameters and the fitted attributes, encoded as in
checkpoints, with the net as its architecture), arrays.npz and manifest.json. Paths, addresses,
live objects and data are never written; model.json is checked against its schema
(`dasknn.saving_schema`) before anything is built, and every unreadable model is a
`SavedModelError` naming the file. The layout and the trust rule: docs/architecture.md, "Saved
models and checkpoints".
"""

from __future__ import annotations

import io
import json
import os
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine import manifest
from dasknn.engine.checkpoint import encode, encode_table
from dasknn.estimator_params import BY_NAME
from dasknn.saving_schema import FITTED_NAMES, restore, tuner_data
from dasknn.written import written

__all__ = ["FILES", "FORMAT", "VERSION", "SavedModelError", "load", "read", "save"]

FORMAT, VERSION = "dasknn-model", 2
FILES = ("model.json", "arrays.npz")
"""The files the manifest covers."""
LEFT_OUT = ("callbacks", "security", "validation_data")
"""Parameters that a user sets on a model and that `save` leaves out with a warning."""
STALE_DURING_FIT = ("_loop_", "best_iteration_", "checkpoint_", "config_", "report_", "stopped_by_",
                    "tradeoff_")  # fmt: skip
"""Attributes of an earlier fit that a save during a fit (a callback's) does not write."""


class SavedModelError(ValueError):
    """Raised by ``DistributedCNN.load`` for a model folder that is missing, damaged, edited, or
    of a format this version of dasknn does not read; the message names the file and the fault."""


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


def _param(name: str, value: Any, fitted_net, arrays: dict[str, np.ndarray]) -> Any:
    """A parameter as written: a net read from a path as its fitted architecture (no path)."""
    from dasknn.nn.net import Net
    from dasknn.nn.spec import net_spec
    from dasknn.nn.zoo import NETS

    if name == "net" and not isinstance(value, Net):
        if isinstance(value, str) and value.lower().replace("-", "_") in NETS:
            return value
        return {"__net__": net_spec(fitted_net)}
    if name == "tuner" and not isinstance(value, str):
        return tuner_data(value)[0]
    return _tagged(value, arrays, f"parameter {name}")


def _fitted_values(est) -> dict[str, Any]:
    """The learned attributes to write: the fitted model's, or during a fit (a callback's
    `on_evaluation`) the state being evaluated with the fit's records so far."""
    evaluation = getattr(est, "_evaluation", None)
    if evaluation is None:
        est._check_fitted()
    values = {k: v for k, v in vars(est).items() if k in FITTED_NAMES and k != "checkpoint_"}
    if evaluation is None:
        return values
    net, state, loop = evaluation["net"], evaluation["state"], evaluation["loop"]
    for name in STALE_DURING_FIT:
        values.pop(name, None)
    net = net.copy()
    net.set_params({k: np.asarray(v) for k, v in state.params.items()})
    values.update(
        net_=net, state_=state.copy(), n_iter_=int(state.iterations_done), history_=list(loop.history)
    )
    values.update(trace_=loop.log.trace(), decisions_=loop.log.decisions())
    return values


def _left_out(params: dict[str, Any]) -> list[str]:
    """The parameters set that `save` leaves out, named for its warning."""
    out = [name for name in LEFT_OUT if params[name] not in (None, [], ())]
    if not isinstance(params["tuner"], str):
        out += tuner_data(params["tuner"])[1]
    return out


def save(est, path: str | os.PathLike, overwrite: bool = False, warn: bool = True) -> Path:
    """Write the fitted `est` to the folder `path` (model.json, arrays.npz, manifest.json); returns
    its path.

    Refuses, before writing anything: an unfitted estimator, and a `path` that exists (unless
    `overwrite`; it then replaces only a saved model's folder or an empty one). Paths, addresses,
    live objects and data are not written: `callbacks`, `security` and `validation_data` when set,
    with one warning saying so (`warn`). The folder appears complete or not at all (written beside
    it, then renamed); an overwritten one stays until the new one is complete.
    """
    from dasknn.version import __version__

    fitted_values = _fitted_values(est)
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; save writes a new folder (pass overwrite=True to replace it)")
    if path.exists() and not (path.is_dir() and ((path / "model.json").is_file() or not any(path.iterdir()))):
        raise FileExistsError(
            f"{path} exists and is not a saved model: only a model's folder (or an empty one) is replaced"
        )
    given = est.get_params(deep=False)
    left_out = _left_out(given)
    if left_out and warn:
        warnings.warn(
            f"saved {path} without {', '.join(left_out)} (a model keeps no paths, objects or data): set "
            "them again after loading",
            UserWarning,
            stacklevel=3,
        )
    arrays: dict[str, np.ndarray] = {}
    net = fitted_values["net_"]
    params = {k: _param(k, v, net, arrays) for k, v in given.items() if BY_NAME[k].saved}
    fitted = {k: _tagged(v, arrays, f"attribute {k}") for k, v in fitted_values.items()}
    doc = {"format": FORMAT, "version": VERSION, "dasknn": __version__, "params": params, "fitted": fitted}
    text = json.dumps(doc, allow_nan=False, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written(path) as tmp:
        tmp.mkdir()
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "model.json").write_text(text)
        manifest.write(tmp, FILES)
    return path


def _load_arrays(path: Path, blob: bytes) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except Exception as err:  # numpy's and zipfile's own errors (BadZipFile, zlib.error, EOFError)
        raise SavedModelError(f"{path}/arrays.npz is damaged: {type(err).__name__}: {err}") from None


def _document(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """model.json's document and the arrays, after the manifest and the format version are checked."""
    try:
        blobs = {name: (path / name).read_bytes() for name in FILES}
    except OSError as err:
        what = "is not a saved DistributedCNN (model.json and arrays.npz)"
        raise SavedModelError(f"{path} {what}: {err}") from err
    problem = manifest.check(path, FILES, blobs)
    try:
        doc = manifest.parse_json(blobs["model.json"])
    except ValueError as err:
        raise SavedModelError(
            f"{path}/{problem or f'model.json is unreadable ({err}): damaged or edited'}"
        ) from None
    version = doc.get("version") if isinstance(doc, dict) else None
    if type(version) is int and version > VERSION:  # before the manifest: a newer one may differ
        raise SavedModelError(
            f"{path} was saved in format version {version} by dasknn {doc.get('dasknn', '?')}, newer than "
            f"this dasknn reads (up to {VERSION}): upgrade dasknn to load it"
        )
    if problem:
        raise SavedModelError(f"{path}/{problem}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SavedModelError(f"{path} is not a saved DistributedCNN: model.json is not a {FORMAT} file")
    if type(version) is not int or version < 1:
        raise SavedModelError(f"{path}/model.json: format version {version!r} is not one this dasknn reads "
                              f"(1 to {VERSION})")  # fmt: skip
    if version >= 2 and not (path / manifest.NAME).exists():
        raise SavedModelError(f"{path}/{manifest.NAME} is missing: damaged or edited")
    arrays = _load_arrays(path, blobs["arrays.npz"])
    problem = manifest.check_array_names(manifest.array_names(doc), list(arrays))
    if problem:
        raise SavedModelError(f"{path}/model.json: {problem}")
    return doc, arrays


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(parameters, learned attributes) of the model saved at `path`, checked against the schema
    before anything is built (`dasknn.saving_schema`); a SavedModelError naming the file and what
    is wrong otherwise."""
    path = Path(path)
    doc, arrays = _document(path)
    try:
        return restore(doc, arrays)
    except RecursionError:
        raise SavedModelError(f"{path}/model.json is nested too deeply") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, MemoryError) as err:
        what = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        raise SavedModelError(f"{path}/model.json: {' '.join(what.split())}") from None


def load(path: str | os.PathLike, cls):
    """The estimator of class `cls` (DistributedCNN) saved at `path` by `save`, fitted, ready to
    predict or train on."""
    params, fitted = read(path)
    est = cls(**params)
    for name, value in fitted.items():
        setattr(est, name, value)
    return est
