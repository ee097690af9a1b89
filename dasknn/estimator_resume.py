"""A fit's checkpoints as the estimator sees them: what they record, which one a fit continues.

A checkpoint (`dasknn.engine.checkpoint`) holds a training state; the estimator adds its meta: the
parameters a resumed fit must share (`fingerprint`, `estimator_params.RESUME_PARAMS`), the budget,
the classes and the feature count. `checkpoint_to_continue` says which checkpoint a fit goes on
from (resume, or warm_start without a fit in memory), `adopt` checks that it was written by a fit
with the same parameters, and `simulated_gflops` carries "calibrate"'s one measurement across a
resume (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dasknn.engine import checkpoint
from dasknn.estimator_params import RESUME_PARAMS
from dasknn.fitting import BUDGET

if TYPE_CHECKING:
    from dasknn.nn.net import Net

__all__ = [
    "Adopted",
    "adopt",
    "checkpoint_meta",
    "checkpoint_to_continue",
    "fingerprint",
    "simulated_gflops",
    "start_from",
]


def fingerprint(params: dict[str, Any], tuner: str) -> dict[str, Any]:
    """The parameters a resumed fit must share with the checkpointed one (they shape the run), as
    JSON-able values; `tuner`: the resolved one (`tuner_`)."""
    from dasknn.nn.net import Net

    out = {}
    for name in RESUME_PARAMS:
        value = tuner if name == "tuner" else params[name]
        if isinstance(value, Net):
            value = f"Net {value.name}"
        ok = value is None or isinstance(value, (str, bool, int, float))
        out[name] = value if ok else repr(value)
    return out


def checkpoint_meta(
    params: dict[str, Any], tuner: str, classes: np.ndarray, n_features_in: int, gflops: float | None
) -> dict[str, Any]:
    """The estimator's part of a checkpoint's meta; `gflops`: a simulated fit's device speed."""
    meta = {
        "params": fingerprint(params, tuner),
        "budget": {name: params[name] for name in BUDGET},
        "classes": np.asarray(classes),
        "n_features_in": int(n_features_in),
    }
    if gflops is not None:
        meta["simulated_gflops"] = gflops
    return meta


def save_fit(
    directory: str | os.PathLike, state, loop: dict[str, Any], tables: dict[str, pd.DataFrame], meta: dict
) -> Path:
    """A finished fit written as a checkpoint on request: its state, its loop's session marked
    finished, its records (history, events, trace) and the estimator's meta."""
    loop = dict(loop, finished=True, final_saved=True)
    return checkpoint.save(directory, state, {**meta, "loop": loop}, tables)


def checkpoint_to_continue(
    directory, resume: bool, warm_start: bool, in_memory: bool
) -> checkpoint.Checkpoint | None:
    """The latest checkpoint in `directory` for resume (or warm_start without a fit `in_memory`);
    a fresh fit raises ValueError when the directory already holds checkpoints (they would be
    mixed up)."""
    if directory is None:
        return None
    found = checkpoint.list_checkpoints(directory)
    if not (resume or warm_start):
        if found:
            raise ValueError(
                f"checkpoint_dir {directory} already holds checkpoints ({found[-1].name}); "
                "pass resume=True to continue that fit, warm_start=True to train on from it, "
                "or use an empty directory"
            )
        return None
    if warm_start and not resume and in_memory:
        return None
    return checkpoint.latest(directory)


@dataclass(frozen=True)
class Adopted:
    """What a fit takes over from a checkpoint: its classes and feature count, and the tuner
    when the checkpoint predates `tuner=` and this fit left it at its default (else None)."""

    classes: np.ndarray
    n_features_in: int
    tuner: str | None = None


def adopt(ckpt: checkpoint.Checkpoint, ours: dict[str, Any], check: bool, tuner_default: bool) -> Adopted:
    """A checkpoint's classes and feature count; with `check`, a ValueError naming each parameter
    of our `fingerprint` that differs from the checkpointed fit's. `tuner_default`: this fit left
    tuner at its default."""
    meta = ckpt.meta
    if "params" not in meta or "classes" not in meta:
        raise ValueError(f"{ckpt.path} is not a DistributedCNN checkpoint (no params/classes)")
    tuner = None
    if check:
        ours, theirs = dict(ours), dict(meta["params"])
        old = "tuner" not in theirs and "optimizer" in theirs  # written before tuner= (default "grid")
        if old:
            theirs["tuner"] = theirs.pop("optimizer")
            if tuner_default and theirs["tuner"] != "auto":
                # the tuner left at its default: go on with the one the checkpointed fit used
                warnings.warn(
                    f"resuming {ckpt.path}, written before tuner= existed, with its tuner "
                    f"{theirs['tuner']!r} (the default then)",
                    UserWarning,
                    stacklevel=3,
                )
                tuner = ours["tuner"] = theirs["tuner"]
        diff = {k: (theirs[k], ours[k]) for k in RESUME_PARAMS if k in theirs and theirs[k] != ours[k]}
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a!r}, this estimator {b!r}" for k, (a, b) in diff.items())
            hint = ""
            if old and "tuner" in diff:
                hint = "; it predates tuner= (then optimizer=, default 'grid'): "
                hint += f"pass tuner={theirs['tuner']!r}"
            raise ValueError(
                f"resume: {ckpt.path} was written by a fit with other parameters ({detail}){hint}; a "
                "resumed fit may change only its budget (time_budget, max_epochs, target_accuracy) and "
                "callbacks"
            )
    classes, n_features = meta["classes"], meta["n_features_in"]
    if not (isinstance(classes, np.ndarray) and classes.ndim == 1 and classes.dtype.kind in "biufU"):
        raise checkpoint.CheckpointError(f"{ckpt.path}: its classes are not a 1-D array of labels")
    if len(classes) < 2 or not np.array_equal(np.unique(classes), classes):
        raise checkpoint.CheckpointError(
            f"{ckpt.path}: its classes {classes.tolist()} are not distinct and sorted"
        )
    if type(n_features) is not int or n_features < 1:
        raise checkpoint.CheckpointError(
            f"{ckpt.path}: its n_features_in {n_features!r} is not an integer >= 1"
        )
    return Adopted(classes, n_features, tuner)


def start_from(ckpt: checkpoint.Checkpoint, net: Net) -> None:
    """Set `net`'s weights to the checkpoint's, which must be exactly the net's (names, shapes and
    dtypes: nothing is cast); a CheckpointError naming the checkpoint otherwise."""
    ours, theirs = net.get_params(), ckpt.state.params
    if set(ours) != set(theirs):
        raise checkpoint.CheckpointError(
            f"{ckpt.path}: its weights {sorted(theirs)} are not the net {net.name!r}'s ({sorted(ours)})"
        )
    for key, a in theirs.items():
        if a.shape != ours[key].shape or a.dtype != ours[key].dtype:
            raise checkpoint.CheckpointError(
                f"{ckpt.path}: weight {key} is {a.dtype}{list(a.shape)}; the net {net.name!r} has "
                f"{ours[key].dtype}{list(ours[key].shape)} (for {net.num_classes} classes)"
            )
    net.set_params(theirs)


def simulated_gflops(given: Any, ckpt: checkpoint.Checkpoint | None, previous: float | None) -> float:
    """A simulated fit's device speed: the given one, or "calibrate"'s one measurement of this
    machine, taken once per fit and then carried (a checkpoint's, or `previous`: the last fit's
    on warm_start)."""
    if given != "calibrate":
        return float(given)
    if ckpt is not None and "simulated_gflops" in ckpt.meta:
        return float(ckpt.meta["simulated_gflops"])
    if previous is not None:
        return previous
    from dasknn.backend import sgemm_gflops

    return float(sgemm_gflops())
