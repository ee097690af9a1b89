"""Validation of DistributedCNN's parameters: one gate, each error naming the parameter.

Follows scikit-learn: `__init__` stores, `fit` calls `check_params` first, so bad options fail
before any data is read or any cluster is started.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from dasknn.nn.net import Net

ENGINES = ("dask", "simulated")
OPTIMIZERS = ("grid", "online")


def _auto_or(value, name: str, check) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not check(value):
        raise ValueError(f"{name} must be 'auto' or {check.__doc__}, got {value!r}")


def _positive_int(v):
    """an integer >= 1"""
    return float(v).is_integer() and v >= 1


def _positive_float(v):
    """a finite number > 0"""
    return math.isfinite(v) and v > 0


def _momentum(v):
    """a number in [0, 1)"""
    return 0 <= v < 1


class _NoEngine:
    """Stands in for the engine while optimizer options are checked: nothing may run."""

    def run(self, *args, **kwargs):  # pragma: no cover - never called
        raise RuntimeError("optimizer options are only being checked")


OWN_OPTIONS = ("n_groups", "learning_rate", "momentum", "verbose")


def optimizer_class(name: str):
    """The optimizer class of DistributedCNN's `optimizer` parameter."""
    from dasknn.optimizer import OmnivoreOptimizer, OnlineOptimizer

    return OnlineOptimizer if name == "online" else OmnivoreOptimizer


def _check_optimizer_options(options, optimizer: str = "grid") -> None:
    """None or a dict of the optimizer's options, each known and valid, none of the estimator's own."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise ValueError(f"optimizer_options must be None or a dict, got {type(options).__name__}")
    own = sorted(set(options) & set(OWN_OPTIONS))
    if own:
        raise ValueError(
            f"optimizer_options may not set {own}: use the estimator's parameters of those names"
        )
    try:
        optimizer_class(optimizer)(_NoEngine(), **options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"optimizer_options: {err}") from None


def check_params(est, partial: bool = False) -> None:
    """Every DistributedCNN parameter checked, each error naming it, before any data is touched."""
    if not (isinstance(est.batch_size, numbers.Integral) and est.batch_size >= 1):
        raise ValueError(f"batch_size must be an integer >= 1, got {est.batch_size!r}")
    _auto_or(est.n_groups, "n_groups", _positive_int)
    _auto_or(est.learning_rate, "learning_rate", _positive_float)
    _auto_or(est.momentum, "momentum", _momentum)
    if not (isinstance(est.weight_decay, numbers.Real) and 0 <= est.weight_decay < math.inf):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {est.weight_decay!r}")
    for name in ("time_budget", "max_epochs"):
        value = getattr(est, name)
        if value is not None and not (isinstance(value, numbers.Real) and _positive_float(value)):
            raise ValueError(f"{name} must be None or a number > 0, got {value!r}")
    if est.time_budget is None and est.max_epochs is None and not partial:
        raise ValueError("give time_budget or max_epochs (or both): training needs an end")
    ta = est.target_accuracy
    if ta is not None and not (isinstance(ta, numbers.Real) and 0 < ta <= 1):
        raise ValueError(f"target_accuracy must be None or in (0, 1], got {ta!r}")
    if est.engine not in ENGINES:
        raise ValueError(f"unknown engine {est.engine!r}; expected one of {ENGINES}")
    if est.n_workers is not None and not (isinstance(est.n_workers, numbers.Integral) and est.n_workers >= 1):
        raise ValueError(f"n_workers must be None or an integer >= 1, got {est.n_workers!r}")
    if not (isinstance(est.eval_size, numbers.Integral) and est.eval_size >= 1):
        raise ValueError(f"eval_size must be an integer >= 1, got {est.eval_size!r}")
    if est.split is not None and not isinstance(est.split, str):
        raise ValueError(f"split must be None, 'auto' or a layer name, got {est.split!r}")
    est._strategy()
    if est.checkpoint_dir is not None and not isinstance(est.checkpoint_dir, (str, os.PathLike)):
        kind = type(est.checkpoint_dir).__name__
        raise ValueError(f"checkpoint_dir must be None or a path, got {kind}")
    _check_checkpoint_dir(est.checkpoint_dir)
    if isinstance(est.verbose, bool) or not (isinstance(est.verbose, numbers.Integral) and est.verbose >= 0):
        raise ValueError(f"verbose must be an integer >= 0, got {est.verbose!r}")
    if est.scheduler is not None and not isinstance(est.scheduler, str):
        raise ValueError(f"scheduler must be None or an address string, got {est.scheduler!r}")
    for name in ("warm_start", "resume", "early_stopping"):
        if not isinstance(getattr(est, name), (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {getattr(est, name)!r}")
    if est.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {est.optimizer!r}")
    _check_optimizer_options(est.optimizer_options, est.optimizer)
    _check_validation(est)
    if est.resume and est.checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir (where the checkpoints are)")
    if est.security is not None:
        from distributed.security import Security

        if not isinstance(est.security, Security):
            kind = type(est.security).__name__
            raise ValueError(f"security must be None or a distributed.security.Security, got {kind}")
    _check_tls(est)
    for name in (
        "weight_decay",
        "time_budget",
        "max_epochs",
        "target_accuracy",
        "n_workers",
        "eval_size",
    ):
        if isinstance(getattr(est, name), (bool, np.bool_)):
            raise ValueError(f"{name} must be a number, got {getattr(est, name)!r}")
    rs = est.random_state
    if isinstance(rs, (bool, np.bool_)) or not (isinstance(rs, numbers.Integral) and 0 <= rs < 2**32):
        raise ValueError(f"random_state must be an integer in [0, 2**32), got {rs!r}")
    sg = est.simulated_gflops
    if not (isinstance(sg, str) and sg == "calibrate") and not (
        isinstance(sg, numbers.Real) and not isinstance(sg, (bool, np.bool_)) and _positive_float(sg)
    ):
        raise ValueError(f"simulated_gflops must be a number > 0 or 'calibrate', got {sg!r}")
    _check_input_shape(est)
    _check_net_spec(est)
    _check_data(est)
    if est.engine == "simulated" and est.n_groups != "auto" and int(est.n_groups) > (est.n_workers or 8):
        raise ValueError(
            f"n_groups={est.n_groups} needs at least that many workers; the simulated cluster has "
            f"n_workers={est.n_workers or 8}"
        )


DATA_MODES = ("auto", "persist", "stream")


def _check_data(est) -> None:
    """data, augment and shuffle_window, and the layouts that can stream and augment."""
    from dasknn.data.augment import as_augment
    from dasknn.data.batching import check_window

    if not (isinstance(est.data, str) and est.data in DATA_MODES):
        raise ValueError(f"data must be one of {DATA_MODES}, got {est.data!r}")
    augment = as_augment(est.augment)
    try:
        check_window(est.shuffle_window)
    except ValueError as err:
        raise ValueError(f"shuffle_window: {err}") from None
    if est.data == "stream" and est.engine != "dask":
        raise ValueError("data='stream' needs engine='dask' (the simulator holds X in memory)")
    merged = est.strategy == "omnivore" and est.physical_map == "merged"
    if est.engine == "dask" and not merged and (est.data == "stream" or augment is not None):
        what = "data='stream'" if est.data == "stream" else f"augment={est.augment!r}"
        raise ValueError(
            f"{what} runs on Omnivore's merged map on the Dask engine; strategy={est.strategy!r} with "
            f"physical_map={est.physical_map!r} reads persisted, unaugmented batches"
        )


HOOKS = ("on_fit_begin", "on_evaluation", "on_progress", "on_fit_end")


def _check_validation(est) -> None:
    """validation_data / validation_fraction, the selection part, early stopping and the callbacks."""
    vd, vf = est.validation_data, est.validation_fraction
    if vd is not None and not (isinstance(vd, (tuple, list)) and len(vd) == 2):
        raise ValueError(f"validation_data must be None or a pair (X_val, y_val), got {type(vd).__name__}")
    if vf is not None and (
        isinstance(vf, (bool, np.bool_)) or not isinstance(vf, numbers.Real) or not 0 < vf < 1
    ):
        raise ValueError(f"validation_fraction must be None or a number in (0, 1), got {vf!r}")
    if vd is not None and vf is not None:
        raise ValueError("give validation_data or validation_fraction, not both")
    sel = est.selection_size
    if isinstance(sel, (bool, np.bool_)) or not (isinstance(sel, numbers.Integral) and sel >= 0):
        raise ValueError(f"selection_size must be an integer >= 0, got {sel!r}")
    n = est.n_iter_no_change
    if isinstance(n, (bool, np.bool_)) or not (isinstance(n, numbers.Integral) and n >= 1):
        raise ValueError(f"n_iter_no_change must be an integer >= 1, got {n!r}")
    tol = est.tol
    if isinstance(tol, (bool, np.bool_)) or not (isinstance(tol, numbers.Real) and 0 <= tol < math.inf):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    cbs = est.callbacks
    if cbs is None:
        return
    if not isinstance(cbs, (list, tuple)):
        raise ValueError(f"callbacks must be None or a list, got {type(cbs).__name__}")
    for cb in cbs:
        if not any(callable(getattr(cb, hook, None)) for hook in HOOKS):
            raise ValueError(f"callback {cb!r} has none of the hooks {', '.join(HOOKS)}")


def _check_input_shape(est) -> None:
    shape = est.input_shape
    if shape is None or (isinstance(shape, str) and shape == "flat"):
        return
    ok = isinstance(shape, (tuple, list)) and len(shape) == 3
    ok = ok and all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in shape)
    if not ok:
        raise ValueError(f"input_shape must be None, 'flat' or (C, H, W) of positive integers, got {shape!r}")


def _check_net_spec(est) -> None:
    """The net is a Net, a zoo name or an existing .prototxt file: checked before any data is read."""
    spec = est.net
    if isinstance(spec, Net):
        return
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise ValueError(f"net must be a zoo name, a Net or a .prototxt path, got {spec!r}")
    if spec.endswith(".prototxt"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"net: no such .prototxt file {spec!r}")
        return
    from dasknn.nn.zoo import NETS

    if spec.lower().replace("-", "_") not in NETS:
        raise ValueError(f"unknown net {spec!r}; available: {sorted(NETS)}")


def _check_tls(est) -> None:
    """A tls:// scheduler needs credentials: from `security`, else the dask config's."""
    if not (isinstance(est.scheduler, str) and est.scheduler.startswith("tls://")):
        return
    from distributed.security import Security

    security = est.security if est.security is not None else Security()
    if not security.tls_ca_file:
        raise ValueError(
            f"scheduler {est.scheduler} speaks TLS but no TLS credentials are given: pass "
            "`dasknn train --tls-ca-file --tls-cert --tls-key`, or "
            "security=Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...), or set "
            "distributed.comm.tls.{ca-file,client.cert,client.key} in the dask config"
        )


def _check_checkpoint_dir(directory) -> None:
    """checkpoint_dir is a writable folder, or can be made one (checked before any training)."""
    if directory is None:
        return
    from pathlib import Path

    path = Path(directory).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"checkpoint_dir {os.fspath(directory)!r} exists and is not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"checkpoint_dir {os.fspath(directory)!r} is not writable ({parent} does not let this user write)"
        )
