"""DistributedCNN: a scikit-learn classifier that trains a CNN with Omnivore on a Dask cluster.

`fit(X, y)` validates the data, builds the net, gets a Dask client (the default one, or a new
LocalCluster sized to the machine for the duration of the fit), and either runs a
tuner (when any of n_groups, learning_rate, momentum is "auto") or trains with the given
values. Learned state ends in `_`: `net_`, `classes_`, `history_`, `trace_`, `decisions_`,
`report_`, `tradeoff_`, `state_`, `parts_` (the sample indices of X trained on, set aside for the
tuner's selection, and held out for validation), and `batch_size_` (batch_size, clipped with a
warning to the samples trained on when they are fewer, as scikit-learn's MLPClassifier does).
"""

from __future__ import annotations

import math
import time
import uuid
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

from dasknn.data import check_X
from dasknn.data.chunks import is_dask_array
from dasknn.data.split import Carved, split_parts
from dasknn.engine import checkpoint
from dasknn.engine.trace import TrainState, time_unit
from dasknn.estimator_data import (
    carved,
    choose_data,
    class_indices,
    placed,
    resolve_augment,
    tuner_samples,
)
from dasknn.estimator_fit import FitSettings, began
from dasknn.estimator_input import (
    as_array,
    build_net,
    check_fit_input,
    check_net_on_data,
    check_validation_data,
    clipped_batch,
    smallest_rate,
)
from dasknn.estimator_params import (
    SIMULATED_GFLOPS,
    check_params,
    engine_averaging,
    merged,
    optimizer_class,
    parameters_doc,
    tuner_name,
    tunes,
)
from dasknn.estimator_resume import (
    adopt,
    checkpoint_to_continue,
    fingerprint,
    simulated_gflops,
    start_from,
)
from dasknn.estimator_saved import SavedModel
from dasknn.logs import verbose_logging
from dasknn.reports import fit_report
from dasknn.stopping import wall_bound

if TYPE_CHECKING:
    from dasknn.nn.net import Net


class DistributedCNN(SavedModel, ClassifierMixin, BaseEstimator):
    """A scikit-learn classifier that trains a convolutional network on a Dask cluster.

    It trains as Omnivore does (Hadjis et al., 2016): the conv phase of the net runs on the
    workers in ``n_groups`` compute groups, synchronous inside a group and asynchronous across
    groups, and the FC phase on one merged FC server. The knobs left "auto" (``n_groups``,
    ``learning_rate``, ``momentum``) are chosen while training by the ``tuner``. With
    ``engine="simulated"`` the same maths runs in this process on a modeled clock.

    {parameters}

    {sections}
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
        worker_wait: float | None = None,
        input_shape: Any = None,
        eval_size: int | None = None,
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
        tuner: Any = "auto",
        prior_cache: bool = False,
        simulated_gflops: Any = SIMULATED_GFLOPS,
        data: str = "auto",
        augment: Any = None,
        shuffle_window: int = 1,
        backend: str | None = None,
        averaging: str | None = "auto",
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
        self.worker_wait = worker_wait
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
        self.tuner = tuner
        self.prior_cache = prior_cache
        self.simulated_gflops = simulated_gflops
        self.data = data
        self.augment = augment
        self.shuffle_window = shuffle_window
        self.backend = backend
        self.averaging = averaging

    # -- validation ------------------------------------------------------------------------------
    def _check_params(self, partial: bool = False) -> None:
        check_params(self.get_params(deep=False), partial)

    # -- the pieces of a fit ---------------------------------------------------------------------
    def _settings(self) -> FitSettings:
        """This fit's settings (`dasknn.estimator_fit`): the parameters, and the values it resolved."""
        gflops = self.simulated_gflops_ if self.engine == "simulated" else None
        tuner = optimizer_class(self.tuner_)() if isinstance(self.tuner, str) else self.tuner
        resolved = {"tuner": tuner, "augment": self.augment_, "batch_size": self.batch_size_}
        return FitSettings(
            self.get_params(deep=False),
            max_wall_time=self.max_wall_time_,
            simulated_gflops=gflops,
            **resolved,
        )

    def _engine(self, stack: ExitStack, net: Net, averaging: str | None = None):
        """The fit's engine and its Dask client (None on the simulator), keeping the weight average
        `averaging` (the fit's `averaging_`)."""
        return self._settings().engine_for(stack, net, averaging)

    def _validation(self, y_all: np.ndarray, with_selection: bool, partial: bool, sample_shape):
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
                self.validation_data, self.classes_, sample_shape, self.input_shape, self.batch_size
            )
        return parts, given

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, X, y) -> DistributedCNN:
        """Train the net on images X (n, C, H, W), or rows with ``input_shape``, and labels y.

        X and y are numpy or dask arrays; bad parameters or data raise a ValueError naming them
        before any cluster starts. Returns self, fitted.
        """
        self._check_params()
        X, y, labels, stored = check_fit_input(X, y, self.input_shape, self.batch_size)
        self._resolve_tuner()
        in_memory = hasattr(self, "net_")
        ckpt = checkpoint_to_continue(self.checkpoint_dir, self.resume, self.warm_start, in_memory)
        if ckpt is not None:
            default = self.tuner == "auto"
            adopted = adopt(ckpt, fingerprint(self.get_params(deep=False), self.tuner_), self.resume, default)
            self.tuner_ = adopted.tuner or self.tuner_
            self.classes_, self.n_features_in_ = adopted.classes, adopted.n_features_in
        if ckpt is not None or (self.warm_start and hasattr(self, "net_")):
            self._check_labels(labels, "resume" if self.resume else "warm_start")
        else:
            self.classes_ = labels
        with verbose_logging(self.verbose):
            return self._fit(X, y, stored, ckpt)

    def partial_fit(self, X, y, classes=None) -> DistributedCNN:
        """Train one epoch of (X, y) from the current state (``max_epochs`` epochs when set).

        scikit-learn's incremental contract: ``classes`` (every label of the stream) on the first
        call, default the labels of this y; later calls may only use those. Knobs left "auto" take
        the values the last fit ended with (see Notes). Returns self.
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
        """`tuner_`: the name of the tuner this fit starts with (a resumed fit may adopt its
        checkpoint's); the fit runs a clone of the `tuner` object (`Tuner.for_fit`), never it."""
        self.tuner_ = tuner_name(self.tuner)

    def _check_labels(self, labels, context: str) -> None:
        unseen = np.setdiff1d(labels, self.classes_)
        if unseen.size:
            raise ValueError(f"{context}: y has classes {unseen.tolist()} that the first fit did not see")

    def _fit(self, X, y, stored, ckpt: checkpoint.Checkpoint | None, partial_epochs: float | None = None):
        """Train from `ckpt` (resume: its fit's loop too), else the fit in memory (warm_start,
        partial_fit), else afresh. `stored`: X in its stored integer dtype, for a streamed fit."""
        started = time.perf_counter()  # max_wall_time counts from here: the fit's set-up included
        if len(self.classes_) < 2:
            raise ValueError(f"y has {len(self.classes_)} class; a classifier needs at least 2")
        n_features = int(math.prod(X.shape[1:]))
        warm = ckpt is None and hasattr(self, "net_") and (self.warm_start or partial_epochs is not None)
        if (warm or ckpt is not None) and n_features != self.n_features_in_:
            raise ValueError(
                f"X has {n_features} features, but DistributedCNN is expecting {self.n_features_in_} "
                "features as input"
            )
        self.n_features_in_ = n_features
        self.augment_ = resolve_augment(self.augment, self.net, self.engine, self.strategy, self.physical_map)
        auto = tunes(self.get_params(deep=False)) and partial_epochs is None
        y_idx, y_all = class_indices(y, self.classes_, X.chunks[0])
        parts, given = self._validation(y_all, auto, partial_epochs is not None, X.shape[1:])
        self.parts_ = parts
        self.batch_size_ = clipped_batch(self.batch_size, len(parts.train))
        if warm:
            net, start = self.net_, self.state_
        else:
            shape = tuple(X.shape[1:]) if self.augment_ is None else self.augment_.sample_shape(X.shape[1:])
            net = build_net(self.net, shape, len(self.classes_), self.random_state, self.backend)
            start = None if ckpt is None else ckpt.state
            if ckpt is not None:
                start_from(ckpt, net)
        resume_from = ckpt if self.resume else None
        rate = smallest_rate(self.get_params(deep=False))
        check_net_on_data(net, X, self.split, self.batch_size_, rate, self.augment_)
        if self.engine == "simulated":
            previous = getattr(self, "simulated_gflops_", None) if warm else None
            self.simulated_gflops_ = simulated_gflops(self.simulated_gflops, ckpt, previous)
        self.max_wall_time_ = wall_bound(self.max_wall_time, self.engine, self.time_budget)
        self.averaging_ = engine_averaging(self.get_params(deep=False), start)
        with ExitStack() as stack:
            engine, client = self._engine(stack, net, self.averaging_)
            if callable(getattr(engine, "warm_up", None)):  # the workers' kernels, beside the set-up below
                engine.warm_up(net, self.batch_size_)
            is_merged = merged(self.strategy, self.physical_map)
            self.data_ = choose_data(self.data, is_merged, engine, client, X)
            X, y_idx, train_from = placed(self.data_, client, X, y_idx, y_all, stored)
            data = carved(
                X, y_idx, parts, given, train_from, classes=self.classes_, augment=self.augment_,
                batch_size=self.batch_size_, eval_size=self.eval_size, seed=self.random_state,
                tuner_size=tuner_samples(
                    self.get_params(deep=False), held_out=given is not None or len(parts.validation) > 0,
                    statistics=bool(net.statistics),
                ),
            )  # fmt: skip
            self.n_train_samples_ = int(data.X.shape[0])
            if self.data_ != "stream" and client is not None and len(parts.train) < len(y_all):
                data.X, data.y = client.persist(data.X), client.persist(data.y)
            try:
                self._train(engine, net, data, start, resume_from, partial_epochs, started)
            except Exception as err:
                from dasknn.cluster import scheduler_answers, scheduler_lost

                if client is not None and not scheduler_answers(client):
                    raise scheduler_lost(client, err) from err
                raise
        return self

    def _train(self, engine, net: Net, data: Carved, start, resume_from, partial_epochs, started) -> None:
        """Run the fit's loop (`dasknn.estimator_fit`) from `start` and set the fitted attributes."""
        from dasknn.callbacks import call

        s = self._settings()
        callbacks = s.fit_callbacks()
        p = s.plan(data.X.shape[0], partial_epochs, resume_from)
        evaluating: dict[str, Any] = {"net": net}
        notify = self._notifier(callbacks, evaluating)
        meta, n_classes = self._checkpoint_meta(), len(self.classes_)
        loop = s.build_loop(
            p, engine, net, data, notify=notify, meta=meta, n_classes=n_classes, started=started
        )
        evaluating["loop"] = loop
        state = start.copy() if start is not None else TrainState.from_net(net)
        session = None
        if resume_from is not None:
            session = loop.restore(resume_from)
        elif p.partial and hasattr(self, "history_"):
            loop.continue_records(self.history_, self.trace_, self.decisions_)
        previous = getattr(self, "config_", None)
        fit_policy = s.policy(p, engine, previous, loop.n_batches, data.X, net)
        start_of_budgets = began(loop, p, state, resume_from is not None)
        call(callbacks, "on_fit_begin", self)
        try:
            result = loop.run(fit_policy, state, session)
        finally:
            call(callbacks, "on_fit_end", self)
        end = s.ended(loop, net, result, callbacks, start_of_budgets)
        self.state_, self.stopped_by_, self.best_iteration_ = end.state, end.stopped_by, end.best_iteration
        self.trace_, self.decisions_, self.config_ = result.trace, result.decisions, result.config
        self._loop_, self.history_, self.checkpoint_ = result.session, loop.history, loop.last_checkpoint
        self.net_ = net
        self.n_iter_ = int(self.state_.iterations_done)
        self.report_ = self.time_to_accuracy()
        self.tradeoff_ = s.tradeoff(result, net)

    def _notifier(self, callbacks, evaluating: dict[str, Any]):
        """The loop's `notify(hook, info)`: calls the callbacks; for an evaluation, returns the reason
        of the first callback that asks to stop ("" when none does). Meanwhile `_evaluation` (the
        net, the evaluated state, the loop) lets a callback `save` the model being fitted."""
        from dasknn.callbacks import call, stop_requests

        def notify(hook: str, info: dict) -> bool | str:
            if hook == "on_evaluation":
                self._evaluation = dict(evaluating, state=info["state"])
                try:
                    asked = stop_requests(callbacks, self, info["row"])
                    if call(callbacks, "on_evaluated_state", self, info["row"], info["state"]) and not asked:
                        asked = "a callback's on_evaluated_state asked to stop"
                finally:
                    del self._evaluation
                return asked
            return call(callbacks, hook, self, info)

        return notify

    def time_to_accuracy(self, thresholds=None, rule: str = "first") -> pd.DataFrame:
        """Time this fit took to reach each accuracy: held-out rows first, then training rows.

        ``thresholds``: default 0.9, 0.95, 0.98, 0.99 and ``target_accuracy``. ``rule``: "first"
        (the first evaluation at or above, DAWNBench's) or "median5" (the median of the last five,
        Crossbow's). Returns a DataFrame with a row per metric and threshold: ``metric``,
        ``threshold``, ``rule``, ``reached``, and the ``seconds``, ``iterations`` and ``epochs``
        it took (NaN when never); ``attrs["time_unit"]`` is "simulated s" or "s". ``report_`` is
        this with the defaults.
        """
        self._check_fitted()
        unit = time_unit(self.engine)
        return fit_report(self.history_, thresholds, rule, self.target_accuracy, self.net_.name, unit)

    # -- prediction ------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "net_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("this DistributedCNN is not fitted yet; call fit(X, y) first")

    def predict_proba(self, X):
        """Class probabilities of X, (n_samples, n_classes) float32, columns as ``classes_``: a
        dask array for a dask X (computed on the cluster), numpy for numpy."""
        self._check_fitted()
        import dask

        lazy = is_dask_array(X)
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
        """The most probable class of each sample of X, from ``classes_``: dask in, dask out."""
        proba = self.predict_proba(X)
        if is_dask_array(proba):
            # the classes, not the estimator (a closure over self carried it into every task)
            return proba.argmax(axis=1).map_blocks(_take, self.classes_, dtype=self.classes_.dtype)
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy of ``predict(X)`` against y (weighted by ``sample_weight``)."""
        pred = self.predict(X)
        y = np.asarray(y.compute() if is_dask_array(y) else y)
        pred = np.asarray(pred.compute() if is_dask_array(pred) else pred)
        if pred.shape != y.shape:
            raise ValueError(f"y has shape {y.shape}; expected ({pred.shape[0]},)")
        return float(np.average(pred == y, weights=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = self.engine == "dask"
        return tags


SECTIONS = """Attributes
----------
net_ : Net
    The fitted network (architecture and weights).
classes_ : ndarray
    The class labels, sorted; ``predict`` returns them.
n_features_in_ : int
    Features per sample (C·H·W) seen by ``fit``.
history_ : list of dict
    One row per evaluation: ``time``, ``iteration``, ``epoch``, ``loss``, ``accuracy``, and
    with validation data ``val_loss`` and ``val_accuracy``; also ``phase``, ``lr`` and
    ``event``. ``pandas.DataFrame(history_)`` reads it.
report_ : pandas.DataFrame
    Time to 90/95/98/99% accuracy (and ``target_accuracy``): held-out rows, then training
    rows; ``time_to_accuracy`` with its defaults.
stopped_by_ : str
    What ended the fit: ``max_epochs``, ``time_budget``, ``target_accuracy``,
    ``max_wall_time``, convergence or a callback, in words.
n_iter_ : int
    Iterations (weight updates) trained in all.
best_iteration_ : int or None
    The iteration whose weights the model holds when early stopping restored the best ones.
decisions_ : pandas.DataFrame
    The tuner's probes and choices, one row each with its reason (empty when every knob is
    given).
trace_ : pandas.DataFrame
    One row per group iteration: times, model versions, staleness, loss; ``attrs`` records
    the run (workers, recoveries, the cluster's changes).
tradeoff_ : xarray.Dataset
    Hardware and statistical efficiency of the fit: loss, staleness, time per iteration,
    P_HE, P_SE.
state_ : TrainState
    The full training state (weights, momentum, data position, random states).
parts_ : Carved
    The sample indices of X trained on, set aside for the tuner's selection, and held out
    for validation.
batch_size_ : int
    The batch size used: ``batch_size``, clipped with a warning to the samples trained on
    when they are fewer.
data_ : str
    How the workers got the batches: "persist" or "stream" (None on the simulator).
augment_ : Augment or None
    The augmentation the fit used.
averaging_ : str or None
    The weight average the engine kept and the model is: ``averaging``, with "auto" resolved
    ("ema" on Omnivore's groups on the merged map, None elsewhere or where the fit went on from a
    state trained without one).
max_wall_time_ : float or None
    The wall-clock bound the fit used.
simulated_gflops_ : float
    With ``engine="simulated"``: the simulated devices' SGEMM speed the fit used.
n_train_samples_ : int
    Samples trained on (X less the held-out and selection parts).

See Also
--------
dasknn.callbacks : EarlyStopping, ModelCheckpoint, ProgressBar, CSVLogger.

Notes
-----
``partial_fit(X, y, classes)`` trains one epoch of X (``max_epochs`` epochs when set, within
``time_budget`` when set) from the current state, with the fixed knobs, or the ones the last
fit ended with (the tuner's choice; a lowered rate after a rollback); on a first call "auto"
knobs take Omnivore's cold-start values n_groups=1, momentum=0.9 and learning_rate=0.01.
Divergence (a non-finite loss or exploding weights) never ends a fit with NaN weights:
training rolls back to the last good state and divides the learning rate by 10.

Examples
--------
>>> from dasknn import DistributedCNN
>>> from dasknn.data import load
>>> X, y = load("digits", size=28)
>>> est = DistributedCNN(net="lenet", batch_size=32, n_groups=1, learning_rate=0.01,
...                      momentum=0.9, max_epochs=0.5, time_budget=None,
...                      validation_fraction=0.2, engine="simulated", n_workers=1)
>>> est.fit(X, y).n_iter_
22
>>> est.predict(X[:5].compute()).shape
(5,)
>>> sorted(est.history_[-1])[:4]
['accuracy', 'epoch', 'event', 'iteration']
"""
"""DistributedCNN's docstring after its Parameters: the learned attributes, notes and examples."""

if DistributedCNN.__doc__:  # the Parameters section comes from the table (`dasknn.estimator_params`)
    DistributedCNN.__doc__ = DistributedCNN.__doc__.replace(
        "{parameters}", parameters_doc().replace("\n", "\n    ")
    ).replace("{sections}", SECTIONS.rstrip("\n").replace("\n", "\n    "))


def _take(index: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return classes[index]


def _proba_block(block: np.ndarray, net: Net) -> np.ndarray:
    from dasknn.nn.loss import softmax

    logits, _ = net.forward(block, train=False)
    return softmax(logits).astype(np.float32)
