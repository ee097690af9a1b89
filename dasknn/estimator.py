"""DistributedCNN: a scikit-learn classifier that trains a CNN with Omnivore on a Dask cluster.

`fit(X, y)` validates the data, builds the net, gets a Dask client (the default one, or a new
LocalCluster sized to the machine for the duration of the fit), and either runs Omnivore's
optimizer (when any of n_groups, learning_rate, momentum is "auto") or trains with the given
values. Learned state ends in `_`: `net_`, `classes_`, `history_`, `trace_`, `decisions_`,
`report_`, `tradeoff_`, `state_`.
"""

from __future__ import annotations

import math
import numbers
import time
from contextlib import ExitStack
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

from dasknn.data import check_X, check_X_y
from dasknn.data.batching import n_batches
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn.loss import softmax
from dasknn.nn.net import Net
from dasknn.reports import DEFAULT_THRESHOLDS, time_to_accuracy

ENGINES = ("dask", "simulated")


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


class DistributedCNN(ClassifierMixin, BaseEstimator):
    """Train a convolutional network on a Dask cluster, Omnivore-style (Hadjis et al., 2016).

    Parameters
    ----------
    net : str, Net or path
        A zoo name ("lenet", "cifar10_quick", "cifar10_full", "caffenet", "mlp"), a `Net`
        (copied, its weights are the start), or a Caffe `.prototxt` path.
    batch_size : int
    n_groups, learning_rate, momentum : "auto" or a number
        Omnivore's knobs; "auto" lets the optimizer (Algorithm 1) choose.
    weight_decay : float
    time_budget : float or None
        Seconds of training (simulated seconds with engine="simulated"), the search included.
    max_epochs : float or None
    target_accuracy : float or None
        Stop once the training accuracy (on `eval_size` samples) reaches it.
    engine : "dask" or "simulated"
    scheduler : str or None
        Address of a running scheduler; None uses the default client, or starts a LocalCluster.
    n_workers : int or None
        Workers of the LocalCluster started when there is no client (default: one per core, at most 4),
        or of the simulated cluster.
    input_shape : None, (C, H, W) or "flat"
        None: X is 4-D (n, C, H, W). A tuple reshapes 2-D rows to images. "flat": each row's
        features are the channels of a 1×1 image (tabular data; use net="mlp").
    eval_size : int
        Training samples scored to track accuracy over time.
    strategy : "omnivore", "sma" or "model_averaging"
        Omnivore's asynchronous compute groups (default), Crossbow's synchronous model averaging
        (n_groups learners), or SparkNet's model averaging every `tau` iterations (issue #7).
    physical_map : "merged" or "unmerged"
        FC compute and model on one server (Omnivore), or FC compute on every conv worker with the FC
        model on a model server (the MXNet/SINGA layout, Omnivore appendix C).
    aggregation : "tree" or "ps"
        How a group sums its workers' gradients: a reduction tree (FireCaffe) or at one server.
    split : None, "auto" or a layer name
        Where the FC phase starts: the first InnerProduct (None), RALP's rule ("auto"), or a layer.
    security : distributed.security.Security or None
        TLS settings for the client and any LocalCluster the fit starts (e.g. `Security.temporary()`).
    random_state : int
    verbose : int
    warm_start : bool
        Continue from the previous fit's weights and data position.
    """

    def __init__(
        self,
        net: Any = "lenet",
        batch_size: int = 64,
        n_groups: Any = "auto",
        learning_rate: Any = "auto",
        momentum: Any = "auto",
        weight_decay: float = 5e-4,
        time_budget: float | None = 120.0,
        max_epochs: float | None = None,
        target_accuracy: float | None = None,
        engine: str = "dask",
        scheduler: str | None = None,
        n_workers: int | None = None,
        input_shape: Any = None,
        eval_size: int = 2000,
        strategy: str = "omnivore",
        physical_map: str = "merged",
        aggregation: str = "tree",
        split: str | None = None,
        security: Any = None,
        random_state: int = 0,
        verbose: int = 0,
        warm_start: bool = False,
    ) -> None:
        self.net = net
        self.batch_size = batch_size
        self.n_groups = n_groups
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.time_budget = time_budget
        self.max_epochs = max_epochs
        self.target_accuracy = target_accuracy
        self.engine = engine
        self.scheduler = scheduler
        self.n_workers = n_workers
        self.input_shape = input_shape
        self.eval_size = eval_size
        self.strategy = strategy
        self.physical_map = physical_map
        self.aggregation = aggregation
        self.split = split
        self.security = security
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start

    # -- validation ------------------------------------------------------------------------------
    def _check_params(self) -> None:
        if not (isinstance(self.batch_size, numbers.Integral) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        _auto_or(self.n_groups, "n_groups", _positive_int)
        _auto_or(self.learning_rate, "learning_rate", _positive_float)
        _auto_or(self.momentum, "momentum", _momentum)
        if not (isinstance(self.weight_decay, numbers.Real) and 0 <= self.weight_decay < math.inf):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        for name in ("time_budget", "max_epochs"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and _positive_float(value)):
                raise ValueError(f"{name} must be None or a number > 0, got {value!r}")
        if self.time_budget is None and self.max_epochs is None:
            raise ValueError("give time_budget or max_epochs (or both): training needs an end")
        ta = self.target_accuracy
        if ta is not None and not (isinstance(ta, numbers.Real) and 0 < ta <= 1):
            raise ValueError(f"target_accuracy must be None or in (0, 1], got {ta!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {ENGINES}")
        if self.n_workers is not None and not (
            isinstance(self.n_workers, numbers.Integral) and self.n_workers >= 1
        ):
            raise ValueError(f"n_workers must be None or an integer >= 1, got {self.n_workers!r}")
        if not (isinstance(self.eval_size, numbers.Integral) and self.eval_size >= 1):
            raise ValueError(f"eval_size must be an integer >= 1, got {self.eval_size!r}")
        if self.split is not None and not isinstance(self.split, str):
            raise ValueError(f"split must be None, 'auto' or a layer name, got {self.split!r}")
        self._strategy()
        if self.security is not None:
            from distributed.security import Security

            if not isinstance(self.security, Security):
                kind = type(self.security).__name__
                raise ValueError(f"security must be None or a distributed.security.Security, got {kind}")

    def _strategy(self):
        """The engine's Strategy from strategy, physical_map, aggregation and split (validated there)."""
        from dasknn.engine.trace import Strategy

        return Strategy(
            name=self.strategy, physical_map=self.physical_map, aggregation=self.aggregation, split=self.split
        )

    def _shape_X(self, X):
        shape = self.input_shape
        if shape is None:
            return X
        if np.ndim(X) != 2:
            raise ValueError(
                f"input_shape={shape!r} reshapes 2-D X (n_samples, n_features); X is {np.ndim(X)}-D"
            )
        n_features = X.shape[1]
        target = (n_features, 1, 1) if shape == "flat" else tuple(int(s) for s in shape)
        if len(target) != 3 or math.prod(target) != n_features:
            raise ValueError(f"input_shape {shape!r} does not hold {n_features} features per sample")
        return X.reshape((X.shape[0], *target))

    def _as_array(self, X, fitted: bool = False):
        """Dask arrays stay lazy; anything else goes through scikit-learn's gate (sparse, complex,
        object, empty and 1-D inputs get its standard errors), then the input_shape reshape.
        With `fitted`, 2-D input must have the features the estimator was fitted on."""
        if not isinstance(X, da.Array):
            from sklearn.utils.validation import check_array

            X = check_array(
                X,
                accept_sparse=False,
                dtype="numeric",
                allow_nd=True,
                ensure_all_finite=False,
                ensure_2d=True,
                input_name="X",
            )
            if fitted and X.ndim == 2 and X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1]} features, but DistributedCNN is expecting {self.n_features_in_} "
                    "features as input"
                )
        return self._shape_X(X)

    def _validate(self, X, y):
        """(X, y, the classes in y): every input error raised before any work."""
        self._check_params()
        if y is None:
            raise ValueError("DistributedCNN requires y to be passed, but the target y is None")
        X = self._as_array(X)
        if isinstance(y, da.Array):
            X, y = check_X_y(X, y, batch_size=self.batch_size)
            return X, y, np.unique(y.compute())
        from sklearn.utils.multiclass import check_classification_targets
        from sklearn.utils.validation import column_or_1d

        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        labels = np.unique(y)
        # the shared gate checks X and the lengths; labels of any type are encoded by the caller
        X, _ = check_X_y(X, np.searchsorted(labels, y), batch_size=self.batch_size)
        return X, y, labels

    # -- the pieces of a fit ---------------------------------------------------------------------
    def _build_net(self, input_shape, n_classes: int) -> Net:
        from dasknn.nn import zoo

        spec = self.net
        if isinstance(spec, Net):
            net = spec.copy()
        elif isinstance(spec, str) and spec.endswith(".prototxt"):
            from dasknn.nn.prototxt import read_net

            net = read_net(spec, input_shape=tuple(input_shape))
        elif isinstance(spec, str):
            net = zoo.get_net(
                spec, input_shape=tuple(input_shape), num_classes=n_classes, seed=self.random_state
            )
        else:
            raise ValueError(f"net must be a zoo name, a Net or a .prototxt path, got {type(spec).__name__}")
        if net.input_shape != tuple(input_shape):
            raise ValueError(
                f"net {net.name!r} takes inputs {net.input_shape}, but X has {tuple(input_shape)}"
            )
        if net.num_classes != n_classes:
            raise ValueError(f"net {net.name!r} outputs {net.num_classes} classes, but y has {n_classes}")
        return net

    def _engine(self, stack: ExitStack, net: Net):
        if self.engine == "simulated":
            from dasknn.backend import sgemm_gflops
            from dasknn.engine.simulate import SimulatedEngine
            from dasknn.tradeoff.hardware import HEModel

            timing = HEModel.estimate(
                net, self.batch_size, self.n_workers or 8, sgemm_gflops(), bandwidth_bytes_per_s=1.25e9
            )
            return SimulatedEngine(timing, verbose=max(0, self.verbose - 1), strategy=self._strategy()), None
        from distributed import Client, default_client

        from dasknn.engine.cluster import DaskEngine, local_client

        if self.scheduler is not None:
            client = stack.enter_context(Client(self.scheduler, security=self.security))
        else:
            try:
                client = default_client()
            except ValueError:
                client = stack.enter_context(local_client(n_workers=self.n_workers, security=self.security))
        engine = DaskEngine(client, verbose=max(0, self.verbose - 1), strategy=self._strategy())
        return engine, client

    def _evaluator(self, X, y, net: Net):
        n = X.shape[0]
        idx = np.sort(
            np.random.default_rng(self.random_state).choice(n, min(self.eval_size, n), replace=False)
        )
        X_eval, y_eval = dask.compute(X[idx], y[idx])
        scratch = net.copy()

        def evaluate(state: TrainState) -> tuple[float, float]:
            from dasknn.nn.train import evaluate as score

            scratch.set_params(state.params)
            return score(scratch, X_eval, y_eval)

        return evaluate

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, X, y) -> DistributedCNN:
        """Train on X (n, C, H, W) and class labels y; returns self."""
        X, y, labels = self._validate(X, y)
        if self.warm_start and hasattr(self, "classes_"):
            unseen = np.setdiff1d(labels, self.classes_)
            if unseen.size:
                raise ValueError(
                    f"warm_start: y has classes {unseen.tolist()} that the first fit did not see"
                )
        else:
            self.classes_ = labels
        if len(self.classes_) < 2:
            raise ValueError(f"y has {len(self.classes_)} class; a classifier needs at least 2")
        if isinstance(y, da.Array):
            y_idx = y.map_blocks(_label_index, self.classes_, dtype=np.int64)
        else:
            y_idx = da.from_array(_label_index(y, self.classes_), chunks=(X.chunks[0],))
        warm = self.warm_start and hasattr(self, "net_")
        net = self.net_ if warm else self._build_net(X.shape[1:], len(self.classes_))
        start = self.state_ if warm else None
        with ExitStack() as stack:
            engine, _client = self._engine(stack, net)
            self._train(engine, net, X, y_idx, start)
        self.net_ = net
        self.n_features_in_ = int(math.prod(X.shape[1:]))
        return self

    def _train(self, engine, net: Net, X, y, start: TrainState | None) -> None:
        evaluate = self._evaluator(X, y, net)
        nb = n_batches(X.shape[0], self.batch_size)
        max_iterations = None if self.max_epochs is None else max(1, int(self.max_epochs * nb))
        history: list[dict[str, Any]] = []
        t_wall = time.perf_counter()

        def record(state: TrainState, trace: pd.DataFrame) -> bool:
            loss, acc = evaluate(state)
            t = float(trace["t_end"].max()) if len(trace) else 0.0
            history.append(
                {
                    "time": t,
                    "iteration": state.iterations_done,
                    "epoch": state.batches_done / nb,
                    "loss": loss,
                    "accuracy": acc,
                    "wall_time": time.perf_counter() - t_wall,
                }
            )
            if self.verbose:
                print(
                    f"[dasknn] t={t:7.1f}s it={state.iterations_done:6d} "
                    f"epoch={state.batches_done / nb:5.2f} loss={loss:.4f} accuracy={acc:.2%}"
                )
            return self.target_accuracy is not None and acc >= self.target_accuracy

        auto = "auto" in (self.n_groups, self.learning_rate, self.momentum)
        if auto:
            result = self._optimize(engine, net, X, y, start, record, max_iterations)
        else:
            result = self._fixed(engine, net, X, y, start, record, max_iterations)
        self.state_ = result["state"]
        self.trace_ = result["trace"]
        self.decisions_ = result["decisions"]
        self.history_ = history
        self.n_iter_ = int(self.state_.iterations_done)
        thresholds = sorted({*DEFAULT_THRESHOLDS, *([self.target_accuracy] if self.target_accuracy else [])})
        self.report_ = time_to_accuracy(pd.DataFrame(history), thresholds, run=net.name)
        self.tradeoff_ = self._tradeoff(result["runs"], net)

    def _fixed(self, engine, net, X, y, start, record, max_iterations) -> dict[str, Any]:
        """Train with the given n_groups, learning_rate and momentum (a baseline, no optimizer)."""
        config = RunConfig(
            n_groups=int(self.n_groups),
            lr=float(self.learning_rate),
            momentum=float(self.momentum),
            weight_decay=float(self.weight_decay),
            batch_size=self.batch_size,
            seed=self.random_state,
        )
        state = start.copy() if start is not None else TrainState.from_net(net)
        first_iteration = state.iterations_done
        chunk = max(2.0, (self.time_budget or 60.0) / 20)
        traces, elapsed = [], 0.0
        record(state, pd.DataFrame({"t_end": []}))
        while True:
            seconds = chunk if self.time_budget is None else min(chunk, self.time_budget - elapsed)
            iterations = None
            if max_iterations is not None:
                iterations = max_iterations - (state.iterations_done - first_iteration)
            result = engine.run(
                net, X, y, config, Budget(seconds=seconds, iterations=iterations), start=state
            )
            trace = result.trace.copy()
            trace[["t_start", "t_end"]] += elapsed
            elapsed = float(trace["t_end"].max()) if len(trace) else elapsed + seconds
            traces.append(trace)
            state = result.state
            if trace.attrs.get("diverged") or (len(trace) and not np.isfinite(trace["loss"]).all()):
                raise FloatingPointError(f"training diverged at lr={config.lr}; lower learning_rate")
            done = record(state, trace)
            if (
                done
                or (self.time_budget is not None and elapsed >= self.time_budget)
                or (max_iterations is not None and state.iterations_done - first_iteration >= max_iterations)
            ):
                break
        full = pd.concat(traces, ignore_index=True) if traces else pd.DataFrame()
        full["phase"] = "train"
        return {"state": state, "trace": full, "decisions": pd.DataFrame(), "runs": {config: full}}

    def _optimize(self, engine, net, X, y, start, record, max_iterations) -> dict[str, Any]:
        """Omnivore's Algorithm 1 picks whichever of n_groups, learning_rate, momentum are "auto"."""
        from dasknn.optimizer import OmnivoreOptimizer

        options: dict[str, Any] = {"verbose": self.verbose}
        for knob, value in (
            ("n_groups", self.n_groups),
            ("learning_rate", self.learning_rate),
            ("momentum", self.momentum),
        ):
            if value != "auto":
                options[knob] = value
        optimizer = OmnivoreOptimizer(engine, **options)
        result = optimizer.optimize(
            net,
            X,
            y,
            batch_size=self.batch_size,
            weight_decay=float(self.weight_decay),
            seed=self.random_state,
            time_budget=self.time_budget,
            max_iterations=max_iterations,
            should_stop=lambda state, trace: record(state, trace),
            start=start,
        )
        return {
            "state": result.state,
            "trace": result.trace,
            "decisions": result.decisions,
            "runs": _runs_by_config(result.trace, result.decisions, self.random_state),
        }

    def _tradeoff(self, runs, net: Net):
        from dasknn import __version__
        from dasknn.backend import device_info
        from dasknn.tradeoff.record import record_from_traces

        usable = {k: t for k, t in runs.items() if len(t)}
        if not usable:
            return None
        ds = record_from_traces(
            usable, net=net.name, dataset="user data", batch_size=self.batch_size, device=device_info()
        )
        ds.attrs["dasknn_version"] = __version__
        return ds

    # -- prediction ------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "net_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("this DistributedCNN is not fitted yet; call fit(X, y) first")

    def predict_proba(self, X):
        """Class probabilities, (n_samples, n_classes): numpy for numpy input, dask for dask input."""
        self._check_fitted()
        lazy = isinstance(X, da.Array)
        X = check_X(self._as_array(X, fitted=True), batch_size=self.batch_size)
        if tuple(X.shape[1:]) != self.net_.input_shape:
            raise ValueError(
                f"X has samples of shape {tuple(X.shape[1:])}; the net was fitted on {self.net_.input_shape}"
            )
        net = self.net_
        n_classes = len(self.classes_)
        proba = X.map_blocks(
            _proba_block,
            net,
            drop_axis=[2, 3],
            chunks=(X.chunks[0], (n_classes,)),
            dtype=np.float32,
            meta=np.empty((0, n_classes), np.float32),
            token=dask.base.tokenize(X.name, id(net), self.n_iter_),
        )
        return proba if lazy else proba.compute()

    def predict(self, X):
        """Predicted class labels (the original labels, not indices)."""
        proba = self.predict_proba(X)
        if isinstance(proba, da.Array):
            return proba.argmax(axis=1).map_blocks(lambda i: self.classes_[i], dtype=self.classes_.dtype)
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy on (X, y), computed batch by batch."""
        pred = self.predict(X)
        y = np.asarray(y.compute() if isinstance(y, da.Array) else y)
        pred = np.asarray(pred.compute() if isinstance(pred, da.Array) else pred)
        if pred.shape != y.shape:
            raise ValueError(f"y has shape {y.shape}; expected ({pred.shape[0]},)")
        return float(np.average(pred == y, weights=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = self.engine == "dask"
        return tags


def _proba_block(block: np.ndarray, net: Net) -> np.ndarray:
    logits, _ = net.forward(block, train=False)
    return softmax(logits).astype(np.float32)


def _label_index(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Positions of labels in the sorted `classes_` (the class index the net is trained on)."""
    return np.searchsorted(classes, labels).astype(np.int64)


def _runs_by_config(trace: pd.DataFrame, decisions: pd.DataFrame, seed: int) -> dict:
    """The optimizer's runs keyed (n_groups, lr, momentum, seed), the longest run for each config,
    each on its own clock from 0 (for the xarray tradeoff record)."""
    if "run" not in trace or "run" not in decisions or not len(trace):
        return {}
    groups = decisions.dropna(subset=["run"]).drop_duplicates("run").set_index("run")["n_groups"]
    runs: dict = {}
    for run_id, rows in trace.groupby("run", sort=False):
        if run_id not in groups.index:
            continue
        key = (int(groups[run_id]), float(rows["lr"].iloc[0]), float(rows["momentum"].iloc[0]), seed)
        if key not in runs or len(rows) > len(runs[key]):
            rows = rows.copy()
            rows[["t_start", "t_end"]] -= rows["t_start"].min()
            runs[key] = rows
    return runs
