"""DistributedCNN: a scikit-learn classifier that trains a CNN with Omnivore on a Dask cluster.

`fit(X, y)` validates the data, builds the net, gets a Dask client (the default one, or a new
LocalCluster sized to the machine for the duration of the fit), and either runs Omnivore's
optimizer (when any of n_groups, learning_rate, momentum is "auto") or trains with the given
values. Learned state ends in `_`: `net_`, `classes_`, `history_`, `trace_`, `decisions_`,
`report_`, `tradeoff_`, `state_`, and `parts_` (the sample indices of X trained on, set aside for the
optimizer's selection, and held out for validation).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

from dasknn.data import check_X
from dasknn.data.batching import n_batches
from dasknn.data.chunks import own_keys
from dasknn.data.split import Carved, carve, split_parts
from dasknn.engine import checkpoint
from dasknn.engine.trace import RunConfig, TrainState
from dasknn.estimator_data import choose_data, merged, resolve_augment
from dasknn.estimator_input import (
    as_array,
    build_net,
    check_fit_input,
    check_net_on_data,
    check_validation_data,
    smallest_rate,
)
from dasknn.estimator_params import SIMULATED_GFLOPS, check_params, parameters_doc
from dasknn.estimator_resume import (
    adopt,
    checkpoint_meta,
    checkpoint_to_continue,
    fingerprint,
    save_fit,
    simulated_gflops,
)
from dasknn.fitting import Evaluator
from dasknn.logs import verbose_logging
from dasknn.nn.loss import softmax
from dasknn.nn.net import Net
from dasknn.reports import DEFAULT_THRESHOLDS, time_to_accuracy
from dasknn.stopping import end_reason, wall_bound


class DistributedCNN(ClassifierMixin, BaseEstimator):
    """Train a convolutional network on a Dask cluster, Omnivore-style (Hadjis et al., 2016).

    {parameters}

    `partial_fit(X, y, classes)` trains one epoch of X (`max_epochs` epochs when set, within
    `time_budget` when set) from the current state, with the fixed knobs, or the ones the last fit
    ended with (the optimizer's choice; a lowered rate after a rollback); on a first call "auto"
    knobs take Omnivore's cold-start values n_groups=1, momentum=0.9 and learning_rate=0.01.
    Divergence (non-finite loss or exploding weights) never ends a fit with NaN weights: training
    rolls back to the last good state and divides the learning rate by 10 (`dasknn.fitting`).
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
        max_wall_time: Any = "auto",
        target_accuracy: float | None = None,
        engine: str = "dask",
        scheduler: str | None = None,
        n_workers: int | None = None,
        input_shape: Any = None,
        eval_size: int = 2000,
        validation_data: Any = None,
        validation_fraction: float | None = None,
        selection_size: int = 512,
        early_stopping: bool = False,
        n_iter_no_change: int = 10,
        tol: float = 1e-4,
        callbacks: list | None = None,
        strategy: str = "omnivore",
        physical_map: str = "merged",
        aggregation: str = "tree",
        split: str | None = None,
        security: Any = None,
        random_state: int = 0,
        verbose: int = 0,
        warm_start: bool = False,
        checkpoint_dir: Any = None,
        resume: bool = False,
        tuner_options: dict | None = None,
        tuner: str = "auto",
        optimizer: str | None = None,
        optimizer_options: dict | None = None,
        simulated_gflops: Any = SIMULATED_GFLOPS,
        data: str = "auto",
        augment: Any = None,
        shuffle_window: int = 1,
        backend: str | None = None,
    ) -> None:
        self.net = net
        self.batch_size = batch_size
        self.n_groups = n_groups
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.time_budget = time_budget
        self.max_epochs = max_epochs
        self.max_wall_time = max_wall_time
        self.target_accuracy = target_accuracy
        self.engine = engine
        self.scheduler = scheduler
        self.n_workers = n_workers
        self.input_shape = input_shape
        self.eval_size = eval_size
        self.validation_data = validation_data
        self.validation_fraction = validation_fraction
        self.selection_size = selection_size
        self.early_stopping = early_stopping
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.callbacks = callbacks
        self.strategy = strategy
        self.physical_map = physical_map
        self.aggregation = aggregation
        self.split = split
        self.security = security
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start, self.checkpoint_dir, self.resume = warm_start, checkpoint_dir, resume
        self.tuner_options, self.tuner = tuner_options, tuner
        self.optimizer, self.optimizer_options = optimizer, optimizer_options  # deprecated names
        self.simulated_gflops = simulated_gflops
        self.data = data
        self.augment = augment
        self.shuffle_window = shuffle_window
        self.backend = backend

    # -- validation ------------------------------------------------------------------------------
    def _check_params(self, partial: bool = False) -> None:
        check_params(self.get_params(deep=False), partial)

    def _strategy(self):
        """The engine's Strategy from strategy, physical_map, aggregation and split (validated there)."""
        from dasknn.engine.strategy import Strategy

        return Strategy(
            name=self.strategy, physical_map=self.physical_map, aggregation=self.aggregation, split=self.split
        )

    # -- the pieces of a fit ---------------------------------------------------------------------
    def _test_view(self, X):
        """X as the net sees it when scoring or predicting (centre-cropped with crop_size), lazily."""
        augment = getattr(self, "augment_", None)  # None before a fit resolved it
        return augment.test(X) if augment is not None else X

    def _engine(self, stack: ExitStack, net: Net):
        if self.engine == "simulated":
            from dasknn.engine.simulated import SimulatedEngine
            from dasknn.tradeoff.hardware import HEModel

            n_workers, gflops = self.n_workers or 8, self.simulated_gflops_
            timing = HEModel.estimate(net, self.batch_size, n_workers, gflops, bandwidth_bytes_per_s=1.25e9)
            return SimulatedEngine(timing, **self._engine_options()), None
        from dasknn.cluster import dask_client
        from dasknn.engine.dask import DaskEngine

        client = dask_client(stack, self.scheduler, self.security, self.n_workers)
        return DaskEngine(client, **self._engine_options()), client

    def _engine_options(self) -> dict[str, Any]:
        """What both engines take from the estimator: verbosity, strategy, augmentation, shuffling."""
        return {
            "verbose": max(0, self.verbose - 1),
            "strategy": self._strategy(),
            "augment": self.augment_,
            "shuffle_window": self.shuffle_window,
        }

    def _validation(self, y_all: np.ndarray, with_selection: bool, partial: bool):
        """The parts of X (`dasknn.data.split`) and the given validation data, checked like X."""
        fraction = self.validation_fraction
        if fraction is None and self.early_stopping and self.validation_data is None and not partial:
            fraction = 0.1
        if partial and fraction is not None:
            raise ValueError(
                "partial_fit trains on all of X; validation_fraction applies to fit (give validation_data)"
            )
        selection = self.selection_size if with_selection else 0
        parts = split_parts(y_all, fraction, selection, self.random_state)
        given = None
        if self.validation_data is not None:
            given = check_validation_data(
                self.validation_data, self.classes_, self._sample_shape, self.input_shape, self.batch_size
            )
        return parts, given

    def _eval_rows(self, n: int) -> np.ndarray:
        """Which of the n training samples score the training accuracy: `eval_size` of them, seeded."""
        rng = np.random.default_rng(self.random_state)
        return np.sort(rng.choice(n, min(self.eval_size, n), replace=False))

    def _evaluator(self, net: Net, evaluation, validation) -> Evaluator:
        X_eval, y_eval = evaluation
        return Evaluator(net, np.asarray(X_eval, dtype=np.float32), y_eval, *(validation or (None, None)))

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, X, y) -> DistributedCNN:
        """Train on X (n, C, H, W) and class labels y; returns self."""
        self._check_params()
        X, y, labels, stored = check_fit_input(X, y, self.input_shape, self.batch_size)
        self._resolve_tuner()
        in_memory = hasattr(self, "net_")
        ckpt = checkpoint_to_continue(self.checkpoint_dir, self.resume, self.warm_start, in_memory)
        if ckpt is not None:
            tuner = getattr(self, "tuner_", self.tuner)
            default = self.tuner == "auto" and self.optimizer is None
            adopted = adopt(ckpt, fingerprint(self.get_params(deep=False), tuner), self.resume, default)
            self.tuner_ = adopted.tuner or self.tuner_
            self.classes_, self.n_features_in_ = adopted.classes, adopted.n_features_in
        if ckpt is not None or (self.warm_start and hasattr(self, "net_")):
            self._check_labels(labels, "resume" if self.resume else "warm_start")
        else:
            self.classes_ = labels
        with verbose_logging(self.verbose):
            return self._fit(X, y, stored, ckpt)

    def partial_fit(self, X, y, classes=None) -> DistributedCNN:
        """Train one epoch of (X, y) (`max_epochs` when set) from the current state; returns self.

        sklearn's incremental contract: `classes` (all labels of the stream) on the first call, or
        the labels of this y; later calls may only use those. Knobs: see the class docstring.
        """
        self._check_params(partial=True)
        X, y, labels, stored = check_fit_input(X, y, self.input_shape, self.batch_size)
        self._resolve_tuner()
        if not hasattr(self, "net_"):
            if self.checkpoint_dir is not None and checkpoint.list_checkpoints(self.checkpoint_dir):
                raise ValueError(f"checkpoint_dir {self.checkpoint_dir} already holds checkpoints")
            self.classes_ = labels if classes is None else np.unique(np.asarray(classes))
        elif classes is not None and not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
            raise ValueError(
                f"classes={list(classes)} differs from the first call's {self.classes_.tolist()}"
            )
        self._check_labels(labels, "partial_fit")
        epochs = self.max_epochs if self.max_epochs is not None else 1.0
        with verbose_logging(self.verbose):
            return self._fit(X, y, stored, None, partial_epochs=epochs)

    def _resolve_tuner(self) -> None:
        """`tuner_` and `tuner_options_`: the tuner, the deprecated `optimizer=` names mapped onto it."""
        from dasknn.estimator_params import resolve_tuner

        self.tuner_, self.tuner_options_ = resolve_tuner(self.get_params(deep=False))

    def save_checkpoint(self, directory: str | os.PathLike | None = None) -> Path:
        """Write the fitted state as a checkpoint (on request) to `directory` or `checkpoint_dir`."""
        self._check_fitted()
        directory = directory if directory is not None else self.checkpoint_dir
        if directory is None:
            raise ValueError("save_checkpoint needs a directory (or checkpoint_dir)")
        loop = dict(self._loop_, config=asdict(self.config_))
        tables = {"history": pd.DataFrame(self.history_), "events": self.decisions_, "trace": self.trace_}
        return save_fit(directory, self.state_, loop, tables, self._checkpoint_meta())

    def save(self, path: str | os.PathLike) -> Path:
        """Write this fitted model to the new folder `path`, without pickle (`dasknn.saving`)."""
        from dasknn.saving import save

        return save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DistributedCNN:
        """A model written by `save`: it predicts without a cluster and trains on (`partial_fit`)."""
        from dasknn.saving import load

        return load(path, cls)

    def _check_labels(self, labels, context: str) -> None:
        unseen = np.setdiff1d(labels, self.classes_)
        if unseen.size:
            raise ValueError(f"{context}: y has classes {unseen.tolist()} that the first fit did not see")

    def _checkpoint_meta(self) -> dict[str, Any]:
        gflops = self.simulated_gflops_ if self.engine == "simulated" else None
        tuner = getattr(self, "tuner_", self.tuner)
        return checkpoint_meta(self.get_params(deep=False), tuner, self.classes_, self.n_features_in_, gflops)

    def _fit(self, X, y, stored, ckpt: checkpoint.Checkpoint | None, partial_epochs: float | None = None):
        """Train from `ckpt` (resume: its fit's loop too), else the fit in memory (warm_start,
        partial_fit), else afresh. `stored`: X in its stored integer dtype, for a streamed fit."""
        started = time.perf_counter()  # max_wall_time counts from here: the fit's set-up included
        if len(self.classes_) < 2:
            raise ValueError(f"y has {len(self.classes_)} class; a classifier needs at least 2")
        if isinstance(y, da.Array):
            y_idx = y.map_blocks(_label_index, self.classes_, dtype=np.int64)
        else:
            y_idx = da.from_array(_label_index(y, self.classes_), chunks=(X.chunks[0],))
        n_features = int(math.prod(X.shape[1:]))
        warm = ckpt is None and hasattr(self, "net_") and (self.warm_start or partial_epochs is not None)
        if (warm or ckpt is not None) and n_features != self.n_features_in_:
            raise ValueError(
                f"X has {n_features} features, but DistributedCNN is expecting {self.n_features_in_} "
                "features as input"
            )
        self.n_features_in_ = n_features
        self._sample_shape = tuple(X.shape[1:])
        self.augment_ = resolve_augment(self.augment, self.net, self.engine, self.strategy, self.physical_map)
        auto = "auto" in (self.n_groups, self.learning_rate, self.momentum) and partial_epochs is None
        y_all = y_idx.compute() if isinstance(y, da.Array) else _label_index(y, self.classes_)
        parts, given = self._validation(np.asarray(y_all), auto, partial_epochs is not None)
        self.parts_ = parts
        if warm:
            net, start = self.net_, self.state_
        else:
            shape = tuple(X.shape[1:]) if self.augment_ is None else self.augment_.sample_shape(X.shape[1:])
            net = build_net(self.net, shape, len(self.classes_), self.random_state, self.backend)
            start = None if ckpt is None else ckpt.state
            if ckpt is not None:
                net.set_params(ckpt.state.params)
        resume_from = ckpt if self.resume else None
        rate = smallest_rate(self.get_params(deep=False))
        check_net_on_data(net, X, self.split, self.batch_size, rate, self.augment_)
        if self.engine == "simulated":
            previous = getattr(self, "simulated_gflops_", None) if warm else None
            self.simulated_gflops_ = simulated_gflops(self.simulated_gflops, ckpt, previous)
        self.max_wall_time_ = wall_bound(self.max_wall_time, self.engine, self.time_budget)
        with ExitStack() as stack:
            engine, client = self._engine(stack, net)
            is_merged = merged(self.strategy, self.physical_map)
            self.data_ = choose_data(self.data, is_merged, engine, client, X)
            if self.data_ == "stream":
                # the stored dtype (uint8 pixels) goes to the workers, which convert each batch
                X_train = stored if stored is not None and stored.chunks == X.chunks else X
                y_idx = da.from_array(np.asarray(y_all), chunks=(X.chunks[0],))
            elif client is not None:
                # once per fit, under this fit's own key names (`own_keys`): the engine's runs then
                # reuse these chunks, and no later fit resubmits a key the scheduler still holds
                fit_id = uuid.uuid4().hex
                X = client.persist(own_keys(X, fit_id)) if isinstance(X, da.Array) else X
                y_idx = client.persist(own_keys(y_idx, fit_id)) if isinstance(y_idx, da.Array) else y_idx
            train_from = X_train if self.data_ == "stream" else X
            data = self._carve(X, y_idx, parts, given, train_from)
            if self.data_ != "stream" and client is not None and len(parts.train) < len(y_all):
                data.X, data.y = client.persist(data.X), client.persist(data.y)
            try:
                self._train(engine, net, data, start, resume_from, partial_epochs, started)
            except Exception as err:
                from dasknn.cluster import scheduler_answers, scheduler_lost

                if client is not None and not scheduler_answers(client):
                    raise scheduler_lost(client, err) from err
                raise
        self.net_ = net
        return self

    def _carve(self, X, y, parts, given, train_from) -> Carved:
        """The fit's data in its parts (`dasknn.data.split.carve`), the user's validation labels as
        class indices; `n_train_samples_`."""
        from dasknn.data.chunks import samples_per_chunk

        if given is not None:
            given = (given[0], _label_index(np.asarray(dask.compute(given[1])[0]), self.classes_))
        carved = carve(
            X,
            y,
            parts,
            scored=parts.train[self._eval_rows(len(parts.train))],
            view=self._test_view,
            train_from=train_from,
            rows_per_chunk=samples_per_chunk(X.shape[1:], self.batch_size),
            given=given,
        )
        self.n_train_samples_ = int(carved.X.shape[0])
        return carved

    def _train(self, engine, net: Net, data: Carved, start, resume_from, partial_epochs, started) -> None:
        from dasknn.callbacks import EarlyStopping, ProgressBar, call
        from dasknn.fitting import Loop
        from dasknn.optimizer.search import SelectionLoss

        callbacks = list(self.callbacks or [])
        if self.early_stopping:
            callbacks.append(EarlyStopping("val_loss", self.n_iter_no_change, self.tol))
        if self.verbose >= 1 and not any(isinstance(cb, ProgressBar) for cb in callbacks):
            callbacks.append(ProgressBar())
        X, y = data.X, data.y
        nb = n_batches(X.shape[0], self.batch_size)
        epochs = self.max_epochs if partial_epochs is None else partial_epochs
        max_iterations = None if epochs is None else max(1, int(epochs * nb))
        auto = "auto" in (self.n_groups, self.learning_rate, self.momentum) and partial_epochs is None
        session = None
        if resume_from is not None:
            session = dict(resume_from.meta.get("loop", {}))
            auto = session.get("kind", "auto" if auto else "fixed") == "auto"
        loop = Loop(
            engine,
            net,
            X,
            y,
            batch_size=self.batch_size,
            weight_decay=float(self.weight_decay),
            seed=self.random_state,
            time_budget=self.time_budget if auto else None,
            max_iterations=max_iterations if auto else None,
            evaluate=self._evaluator(net, data.evaluation, data.validation),
            selection=SelectionLoss(net, *data.selection) if auto and data.selection else None,
            notify=self._notifier(callbacks),
            target_accuracy=self.target_accuracy,
            n_classes=len(self.classes_),
            checkpoint_dir=self.checkpoint_dir,
            meta=self._checkpoint_meta(),
            verbose=max(0, self.verbose - 1),
            max_wall_time=self.max_wall_time_,
            wall_start=started,
        )
        state = start.copy() if start is not None else TrainState.from_net(net)
        if resume_from is not None:
            session = loop.restore(resume_from)
        elif partial_epochs is not None and hasattr(self, "history_"):
            loop.continue_records(self.history_, self.trace_, self.decisions_)
        policy = self._policy(engine, auto, partial_epochs, max_iterations, loop.n_batches, X, net)
        limit = f"max_epochs={epochs}" if partial_epochs is None else f"partial_fit's {epochs:g} epoch(s)"
        resumed = resume_from is not None and loop.history
        began = {  # where this fit's budgets started, for stopped_by_ (a resume: the original fit's)
            "elapsed": loop.history[0]["time"] if resumed else loop.log.elapsed,
            "iteration": state.iterations_done, "max_iterations": max_iterations, "limit": limit,
        }  # fmt: skip
        call(callbacks, "on_fit_begin", self)
        try:
            result = loop.run(policy, state, session)
        finally:
            call(callbacks, "on_fit_end", self)
        self._finish(loop, net, result, callbacks, began)

    def _notifier(self, callbacks):
        """The loop's `notify(hook, info)`: calls the callbacks; for an evaluation, returns the reason
        of the first callback that asks to stop ("" when none does)."""
        from dasknn.callbacks import call, stop_requests

        def notify(hook: str, info: dict) -> bool | str:
            if hook == "on_evaluation":
                asked = stop_requests(callbacks, self, info["row"])
                if call(callbacks, "on_evaluated_state", self, info["row"], info["state"]) and not asked:
                    asked = "a callback's on_evaluated_state asked to stop"
                return asked
            return call(callbacks, hook, self, info)

        return notify

    def _policy(self, engine, auto: bool, partial_epochs, max_iterations, nb: int, X=None, net=None):
        """The loop's policy: the tuner ("auto", Algorithm 1, online) for "auto" knobs, else fixed knobs."""
        from dasknn.estimator_params import optimizer_class
        from dasknn.optimizer.fixed import FixedKnobs

        if not auto:
            config = self._fixed_config(partial_epochs is not None)
            return FixedKnobs(config, self.time_budget, max_iterations)
        options: dict[str, Any] = {**(self.tuner_options_ or {}), "verbose": max(0, self.verbose - 1)}
        # training is evaluated (and stops at the target) at least once per pass over the data, as
        # the fixed knobs' runs are: the two report time to accuracy at the same granularity
        if self.tuner_ == "auto":
            options.setdefault("net_name", self.net if isinstance(self.net, str) else None)
            if options.get("prior_cache", True) is not False and X is not None:
                from dasknn.optimizer.prior import PriorCache, dataset_key

                key = PriorCache.key(net, dataset_key(X), self.batch_size, X.shape[1:], self.weight_decay)
                options.setdefault("cache_key", key)
        elif self.tuner_ == "online":
            options.setdefault("run_iterations", min(nb, 200))
            options.setdefault("target_accuracy", self.target_accuracy)
        else:
            options.setdefault("stop_check_iterations", nb)
        for knob in ("n_groups", "learning_rate", "momentum"):
            if getattr(self, knob) != "auto":
                options[knob] = getattr(self, knob)
        return optimizer_class(self.tuner_)(engine, **options)

    def _finish(self, loop, net: Net, result, callbacks, began: dict[str, Any]) -> None:
        """The fitted attributes from a finished loop; early stopping's best state restored."""
        from dasknn.callbacks import EarlyStopping
        from dasknn.fitting import runs_by_config

        state = result.state
        restorer = next((cb for cb in callbacks if isinstance(cb, EarlyStopping) and cb.restore_best), None)
        best = None if restorer is None else restorer.best_state
        if best is not None and best.iterations_done != state.iterations_done:
            state = best
            net.set_params(best.params)
            why = f"restored the best (iteration {best.iterations_done})"
            loop.note(best, loop.history[-1]["time"], phase="end", event=why)  # history, not a new step
            result.stopped_by += f"; {why}"
        self.state_ = state
        self.trace_ = result.trace
        if self.engine == "simulated":
            self.trace_.attrs["simulated_gflops"] = self.simulated_gflops_
        self.decisions_ = result.decisions
        self.config_ = result.config
        self._loop_ = result.session
        self.history_ = loop.history
        self.checkpoint_ = loop.last_checkpoint
        self.net_ = net
        self.stopped_by_ = result.stopped_by or end_reason(
            limit=began["limit"],
            max_iterations=began["max_iterations"],
            iterations=int(result.state.iterations_done) - began["iteration"],
            iteration=int(result.state.iterations_done),
            time_budget=self.time_budget,
            elapsed=loop.log.elapsed - began["elapsed"],
            unit="simulated s" if self.engine == "simulated" else "s",
            decisions=result.decisions,
        )
        self.best_iteration_ = None if restorer is None else restorer.best_iteration
        self.n_iter_ = int(self.state_.iterations_done)
        self.report_ = self.time_to_accuracy()
        if result.session.get("kind") == "fixed":
            train = self.trace_[self.trace_["phase"] == "train"] if "phase" in self.trace_ else self.trace_
            train = train.drop(columns=["phase", "run", "kept"], errors="ignore")
            runs = _by_lr(train, self.config_)
        else:
            runs = runs_by_config(self.trace_, self.decisions_, self.random_state)
        self.tradeoff_ = self._tradeoff(runs, net, self.decisions_)

    def time_to_accuracy(self, thresholds=None, rule: str = "first") -> pd.DataFrame:
        """Time to accuracy of this fit: held-out rows (when there was validation data), then training.

        `thresholds`: default 0.9, 0.95, 0.98, 0.99 and `target_accuracy`; `rule`: "first" (DAWNBench:
        the first evaluation at or above) or "median5" (Crossbow: the median of the last five).
        Each row names its `metric` and `rule`; `attrs["time_unit"]` says whether `seconds` are
        simulated ("simulated s", engine="simulated") or real ("s"). `report_` is this with the defaults.
        """
        self._check_fitted()
        if thresholds is None:
            extra = [self.target_accuracy] if self.target_accuracy else []
            thresholds = sorted({*DEFAULT_THRESHOLDS, *extra})
        history = pd.DataFrame(self.history_)
        metrics = ["accuracy"]
        if "val_accuracy" in history and history["val_accuracy"].notna().any():
            metrics.insert(0, "val_accuracy")
        tables = [time_to_accuracy(history, thresholds, rule, run=self.net_.name, metric=m) for m in metrics]
        report = pd.concat(tables, ignore_index=True)
        report.attrs["time_unit"] = "simulated s" if self.engine == "simulated" else "s"
        return report

    def _fixed_config(self, partial: bool) -> RunConfig:
        """The knobs of a fixed-knob run: as given; a partial_fit's continue the last fit's config_."""
        if partial and hasattr(self, "config_"):
            return self.config_
        return RunConfig(
            n_groups=1 if self.n_groups == "auto" else int(self.n_groups),
            lr=0.01 if self.learning_rate == "auto" else float(self.learning_rate),
            momentum=0.9 if self.momentum == "auto" else float(self.momentum),
            weight_decay=float(self.weight_decay),
            batch_size=self.batch_size,
            seed=self.random_state,
        )

    def _tradeoff(self, runs, net: Net, decisions: pd.DataFrame):
        from dasknn.backend import device_info
        from dasknn.tradeoff.record import record_from_traces, with_decisions

        usable = {k: t for k, t in runs.items() if len(t)}
        if not usable:
            return None
        ds = record_from_traces(
            usable, net=net.name, dataset="user data", batch_size=self.batch_size, device=device_info()
        )
        return with_decisions(ds, decisions) if self.tuner_ in ("online", "auto") else ds

    # -- prediction ------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "net_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("this DistributedCNN is not fitted yet; call fit(X, y) first")

    def predict_proba(self, X):
        """Class probabilities, (n_samples, n_classes): numpy for numpy input, dask for dask input."""
        self._check_fitted()
        lazy = isinstance(X, da.Array)
        X = check_X(as_array(X, self.input_shape, self.n_features_in_), batch_size=self.batch_size)
        augment = getattr(self, "augment_", None)
        if augment is not None and tuple(X.shape[1:]) != self.net_.input_shape:
            X = augment.test(X)  # the centre crop, as when scoring during the fit
        if tuple(X.shape[1:]) != self.net_.input_shape:
            raise ValueError(
                f"X has samples of shape {tuple(X.shape[1:])}; the net was fitted on {self.net_.input_shape}"
            )
        # the net is one key of the graph, which each worker fetches once, not a copy in every task;
        # its name is new per call (a later call's net never meets this one's key on a scheduler)
        net = dask.delayed(self.net_, name=f"net-{uuid.uuid4().hex}", pure=False)
        n_classes = len(self.classes_)
        proba = X.map_blocks(
            _proba_block,
            net,
            drop_axis=[2, 3],
            chunks=(X.chunks[0], (n_classes,)),
            dtype=np.float32,
            meta=np.empty((0, n_classes), np.float32),
            token=dask.base.tokenize(X.name, net.key),
        )
        return proba if lazy else proba.compute()

    def predict(self, X):
        """Predicted class labels (the original labels, not indices)."""
        proba = self.predict_proba(X)
        if isinstance(proba, da.Array):
            # the classes, not the estimator (a closure over self carried it into every task)
            return proba.argmax(axis=1).map_blocks(_take, self.classes_, dtype=self.classes_.dtype)
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


if DistributedCNN.__doc__:  # the Parameters section comes from the table (`dasknn.estimator_params`)
    DistributedCNN.__doc__ = DistributedCNN.__doc__.replace(
        "{parameters}", parameters_doc().replace("\n", "\n    ")
    )


def _by_lr(trace: pd.DataFrame, config: RunConfig) -> dict[RunConfig, pd.DataFrame]:
    """Fixed knobs' trace rows per learning rate (a rollback changes it), keyed by RunConfig."""
    if not len(trace) or "lr" not in trace:
        return {}
    return {config.with_(lr=float(lr)): rows for lr, rows in trace.groupby("lr", sort=False)}


def _take(index: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return classes[index]


def _proba_block(block: np.ndarray, net: Net) -> np.ndarray:
    logits, _ = net.forward(block, train=False)
    return softmax(logits).astype(np.float32)


def _label_index(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Positions of labels in the sorted `classes_` (the class index the net is trained on)."""
    return np.searchsorted(classes, labels).astype(np.int64)
