"""A fit's loop as DistributedCNN sets it up, and what it reads back when the loop ends.

The estimator resolves its parameters once per fit into `FitSettings` (the tuner, max_wall_time,
the simulated device's speed), and plans the fit's extent (`plan`: "auto" knobs or fixed ones, the
iteration cap, which limit ends it). From these: the engine, the callbacks (the user's, early
stopping, the progress bar), the `fitting.Loop`, and its policy, the tuner for "auto" knobs or fixed knobs
(docs/architecture.md, "The loop and its policies"). When the loop returns, `ended` restores early
stopping's best state and says why the fit ended, and `tradeoff` records what its runs measured.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from dasknn.data.batching import n_batches
from dasknn.data.split import Carved
from dasknn.engine.trace import COLD_START, RunConfig, TrainState, time_unit
from dasknn.estimator_data import statistics_samples
from dasknn.estimator_params import KNOBS, PARAMS, tunes
from dasknn.fitting import Evaluator, Loop, runs_by_config
from dasknn.stopping import end_reason

if TYPE_CHECKING:
    from dasknn.nn.net import Net

__all__ = ["End", "FitSettings", "Plan", "began"]


@dataclass(frozen=True)
class Plan:
    """A fit's extent: whether the tuner drives it (`auto`), its cap on iterations and the limit
    that cap stands for (stopped_by_'s words), and whether it is a partial_fit."""

    auto: bool
    max_iterations: int | None
    limit: str
    partial: bool


@dataclass(frozen=True)
class End:
    """How a fit ended: its final state (early stopping's best, when restored), why it ended, and
    the best iteration early stopping saw (None without a restoring EarlyStopping)."""

    state: TrainState
    stopped_by: str
    best_iteration: int | None


class FitSettings:
    """One fit's settings: every parameter of the table (`estimator_params.PARAMS`) as an attribute,
    with the values the fit resolved in place of five of them (`RESOLVED`): `batch_size`
    (`batch_size_`: clipped to the samples trained on), `augment` (`augment_`), `tuner` (the tuner
    object: the one given, or the one `tuner_` names at its defaults), `max_wall_time`
    (`max_wall_time_`) and `simulated_gflops` (`simulated_gflops_`; None on the Dask engine).

    Its methods set up the fit in its order, then read its end: `plan`, `engine_for`,
    `fit_callbacks`, `build_loop`, `policy`; `ended`, `tradeoff`."""

    RESOLVED = ("batch_size", "augment", "tuner", "max_wall_time", "simulated_gflops")

    def __init__(self, params: dict[str, Any], **resolved: Any) -> None:
        """From `get_params(deep=False)` and the resolved values, by their parameters' names."""
        if sorted(resolved) != sorted(self.RESOLVED):
            raise TypeError(f"FitSettings resolves {sorted(self.RESOLVED)}; got {sorted(resolved)}")
        values = {p.name: params[p.name] for p in PARAMS}
        shadowed = sorted(name for name in values if hasattr(type(self), name))
        if shadowed:
            raise TypeError(f"parameters {shadowed} would hide FitSettings' own attributes")
        self.__dict__.update(values, **resolved)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FitSettings are fixed for the fit; {name} cannot be set")

    @property
    def time_unit(self) -> str:
        return time_unit(self.engine)

    def plan(self, n_train: int, partial_epochs: float | None, resume_from) -> Plan:
        """The extent of a fit on `n_train` samples: `max_epochs`, or a partial_fit's epochs (which
        train with fixed knobs); a resumed fit goes on as the checkpointed one ran (auto or fixed)."""
        epochs = self.max_epochs if partial_epochs is None else partial_epochs
        max_iterations = None if epochs is None else max(1, int(epochs * n_batches(n_train, self.batch_size)))
        auto = tunes(self.__dict__) and partial_epochs is None
        if resume_from is not None:
            session = dict(resume_from.meta.get("loop", {}))
            auto = session.get("kind", "auto" if auto else "fixed") == "auto"
        limit = f"max_epochs={epochs}" if partial_epochs is None else f"partial_fit's {epochs:g} epoch(s)"
        return Plan(auto, max_iterations, limit, partial_epochs is not None)

    def engine_for(self, stack: ExitStack, net: Net, averaging: str | None = None):
        """The fit's engine, and its Dask client (None on the simulator, whose timing model is the HE
        model of `net` on `n_workers` devices of `simulated_gflops`: by default as many as its first
        groups can split a batch over); a cluster started for the fit closes with `stack`."""
        from dasknn.engine.strategy import Strategy

        strategy = Strategy(
            name=self.strategy, physical_map=self.physical_map, aggregation=self.aggregation, split=self.split
        )
        options = {
            "verbose": max(0, self.verbose - 1),
            "strategy": strategy,
            "augment": self.augment,
            "shuffle_window": self.shuffle_window,
        }
        if self.engine == "simulated":
            from dasknn.engine.simulated import SimulatedEngine
            from dasknn.estimator_params import check_batch_split, simulated_workers
            from dasknn.tradeoff.hardware import HEModel

            n_workers = simulated_workers(self.n_workers, self.n_groups, self.batch_size)
            check_batch_split(n_workers, self.n_groups, self.batch_size)
            timing = HEModel.estimate(
                net, self.batch_size, n_workers, self.simulated_gflops, bandwidth_bytes_per_s=1.25e9
            )
            return SimulatedEngine(timing, averaging=averaging, **options), None
        from dasknn.cluster import dask_client
        from dasknn.engine.dask import DaskEngine

        client = dask_client(stack, self.scheduler, self.security, self.n_workers)
        engine = DaskEngine(client, worker_wait=self.worker_wait, averaging=averaging, **options)
        stack.callback(engine.close)  # the servers it keeps between runs go before the client
        return engine, client

    def fit_callbacks(self) -> list:
        """The user's callbacks, then early stopping's and (verbose >= 1) a progress bar."""
        from dasknn.callbacks import EarlyStopping, ProgressBar

        callbacks = list(self.callbacks or [])
        if self.early_stopping:
            callbacks.append(EarlyStopping("val_loss", self.n_iter_no_change, self.tol))
        if self.verbose >= 1 and not any(isinstance(cb, ProgressBar) for cb in callbacks):
            callbacks.append(ProgressBar())
        return callbacks

    def build_loop(
        self, p: Plan, engine, net: Net, data: Carved, *, notify, meta: dict, n_classes: int, started: float
    ) -> Loop:
        """The fit's loop over the carved `data`: the tuner's budgets for an "auto" fit (a fixed-knob
        policy holds its own), the selection part scored only for the tuner; `started`: the
        `time.perf_counter()` max_wall_time counts from."""
        from dasknn.optimizer.search import SelectionLoss

        X_val, y_val = data.validation or (None, None)
        scored_for_tuner = data.tuner if p.auto and self.tuner.name == "auto" else None
        # without held-out data a target is judged on the batches' running mean, then checked on
        # the carved training samples before the fit stops
        confirm = data.tuner if X_val is None and self.target_accuracy is not None else None
        evaluator = Evaluator(net, X_val, y_val, scored_for_tuner, confirm, statistics_samples(data.tuner))
        return Loop(
            engine,
            net,
            data.X,
            data.y,
            batch_size=self.batch_size,
            weight_decay=float(self.weight_decay),
            seed=self.random_state,
            time_budget=self.time_budget if p.auto else None,
            max_iterations=p.max_iterations if p.auto else None,
            evaluate=evaluator,
            selection=SelectionLoss(net, *data.selection, statistics=evaluator.model)
            if p.auto and data.selection
            else None,
            notify=notify,
            target_accuracy=self.target_accuracy,
            n_classes=n_classes,
            checkpoint_dir=self.checkpoint_dir,
            meta=meta,
            verbose=max(0, self.verbose - 1),
            max_wall_time=self.max_wall_time,
            wall_start=started,
        )

    def policy(self, p: Plan, engine, previous: RunConfig | None, nb: int, X=None, net=None):
        """The loop's policy: a clone of the tuner bound to this fit (`Tuner.for_fit`: the user's
        object is never changed) for "auto" knobs, else fixed knobs (a partial_fit's: `previous`, the
        last fit's config_, when there is one)."""
        from dasknn.optimizer.fixed import FixedKnobs

        if not p.auto:
            config = self._fixed_config(previous if p.partial else None)
            return FixedKnobs(config, self.time_budget, p.max_iterations)
        settings: dict[str, Any] = {"verbose": max(0, self.verbose - 1)}
        name = self.tuner.name
        if name == "auto":
            settings["net_name"] = self.net if isinstance(self.net, str) else None
            if self.prior_cache and X is not None:
                from dasknn.optimizer.prior import PriorCache, dataset_key

                key = PriorCache.key(net, dataset_key(X), self.batch_size, X.shape[1:], self.weight_decay)
                settings.update(prior_cache=True, cache_key=key)
        elif name == "online":
            settings["target_accuracy"] = self.target_accuracy
        settings.update({knob: getattr(self, knob) for knob in KNOBS if getattr(self, knob) != "auto"})
        tuner = self.tuner.for_fit(engine, **settings)
        # training is evaluated (and stops at the target) at least once per pass over the data, as
        # the fixed knobs' runs are: the two report time to accuracy at the same granularity
        if name == "online" and tuner.run_iterations is None:
            tuner.run_iterations = min(nb, 200)
        if name == "grid" and tuner.stop_check_iterations is None:
            tuner.stop_check_iterations = nb
        return tuner

    def _fixed_config(self, previous: RunConfig | None) -> RunConfig:
        """The knobs of a fixed-knob run: as given, Omnivore's cold start for those left "auto"
        (`COLD_START`); a partial_fit's continue the last fit's config_."""
        if previous is not None:
            return previous
        return RunConfig(
            n_groups=COLD_START.n_groups if self.n_groups == "auto" else int(self.n_groups),
            lr=COLD_START.lr if self.learning_rate == "auto" else float(self.learning_rate),
            momentum=COLD_START.momentum if self.momentum == "auto" else float(self.momentum),
            weight_decay=float(self.weight_decay),
            batch_size=self.batch_size,
            seed=self.random_state,
        )

    def ended(self, loop: Loop, net: Net, result, callbacks: list, began: dict[str, Any]) -> End:
        """The end of a finished loop: early stopping's best state restored into `net` (and noted in
        the history), a simulated trace's device speed in its attrs, and stopped_by_'s account."""
        from dasknn.callbacks import EarlyStopping

        state = result.state
        restorer = next((cb for cb in callbacks if isinstance(cb, EarlyStopping) and cb.restore_best), None)
        best = None if restorer is None else restorer.best_state
        if best is not None and best.iterations_done != state.iterations_done:
            state = best
            net.set_params(best.params)
            why = f"restored the best (iteration {best.iterations_done})"
            loop.note(best, loop.history[-1]["time"], phase="end", event=why)  # history, not a new step
            result.stopped_by += f"; {why}"
        if self.engine == "simulated":
            result.trace.attrs["simulated_gflops"] = self.simulated_gflops
        stopped_by = result.stopped_by or end_reason(
            limit=began["limit"],
            max_iterations=began["max_iterations"],
            iterations=int(result.state.iterations_done) - began["iteration"],
            iteration=int(result.state.iterations_done),
            time_budget=self.time_budget,
            elapsed=loop.log.elapsed - began["elapsed"],
            unit=self.time_unit,
            decisions=result.decisions,
        )
        return End(state, stopped_by, None if restorer is None else restorer.best_iteration)

    def tradeoff(self, result, net: Net):
        """The xarray record of what the fit's runs measured (`tradeoff.record`): a tuner's runs by
        configuration with its decisions, fixed knobs' runs by learning rate (a rollback changes it)."""
        from dasknn.backend import device_info
        from dasknn.tradeoff.record import record_from_traces, with_decisions

        trace, decisions = result.trace, result.decisions
        if result.session.get("kind") == "fixed":
            train = trace[trace["phase"] == "train"] if "phase" in trace else trace
            train = train.drop(columns=["phase", "run", "kept"], errors="ignore")
            runs = _by_lr(train, result.config)
        else:
            runs = runs_by_config(trace, decisions, self.random_state)
        usable = {k: t for k, t in runs.items() if len(t)}
        if not usable:
            return None
        ds = record_from_traces(
            usable, net=net.name, dataset="user data", batch_size=self.batch_size, device=device_info()
        )
        return with_decisions(ds, decisions) if self.tuner.name in ("online", "auto") else ds


def began(loop: Loop, p: Plan, state: TrainState, resumed: bool) -> dict[str, Any]:
    """Where this fit's budgets started, for stopped_by_ (a resume: the original fit's, its
    history's first row)."""
    first = loop.history[0] if resumed and loop.history else None
    return {
        "elapsed": loop.log.elapsed if first is None else first["time"],
        "iteration": state.iterations_done if first is None else int(first["iteration"]),
        "max_iterations": p.max_iterations,
        "limit": p.limit,
    }


def _by_lr(trace: pd.DataFrame, config: RunConfig) -> dict[RunConfig, pd.DataFrame]:
    """Fixed knobs' trace rows per learning rate (a rollback changes it), keyed by RunConfig."""
    if not len(trace) or "lr" not in trace:
        return {}
    return {config.with_(lr=float(lr)): rows for lr, rows in trace.groupby("lr", sort=False)}
