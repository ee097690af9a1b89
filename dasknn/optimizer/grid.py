"""Omnivore's optimizer: a cold start, then epochs of a grid search over (g, µ, η) and training.

Omnivore §V-B (Algorithm 1), appendix E and its cold start (§IV-C,
appendix E-D). A policy of the training loop (`dasknn.policy.Policy`): it never calls the engine,
it asks the loop (`dasknn.fitting.Loop`) for runs, so it drives the SimulatedEngine and the
DaskEngine alike. Times and budgets are in the engine's clock ("simulated s" on the simulator).

1. Cold start (g = 1, µ = 0.9): probe η in `lr_grid` order from the same state, stopping at the
   first rate worse than the previous one (or diverging) → η*.
2. Initial g: the smallest g that saturates the FC server per the HE model (the `he_model`
   argument, or one built from the cold-start probe's time per iteration).
   Appendix E-D: g = 2, 4, … up to it get a (µ, η) grid too, and each g's winner runs the same
   time; the lowest loss picks the cold start's g ("a cold-start run with slight asynchrony may
   more quickly terminate the cold start phase"; optimizer.cold_start). Then train an epoch at
   that g so that the weights find their scale, and go on at the initial g.
3. Each epoch: probe µ ∈ momentum_grid × η ∈ {η*_last, η*_last/10} (no µ > µ*_last at η*_last)
   from the same checkpoint; without a clear winner (5% over the last 50 iterations) probe the tied
   ones longer; if µ* = 0 also try µ = 0.1, 0.2; if 0 still wins and g > 1, halve g and search
   again. Train with the winner for `epoch_factor` × the search time, continuing from the winning
   probe's end state, and repeat until a budget is spent or `should_stop` says so.

Probe length: `probe_iterations` (default max(20, 5·g): every group gets five turns, so staleness
reaches its steady value g − 1 within the probe) and/or `probe_seconds`. On a real cluster each
engine run pays a start-up cost (actors), so prefer fewer, longer probes there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from dasknn.engine.trace import RunConfig, TrainState
from dasknn.optimizer.search import (
    Judge,
    check,
    check_optimize_args,
    check_values,
    float_option,
    int_option,
)
from dasknn.optimizer.session import OptimizerResult, StopCallback, _Session
from dasknn.policy import CURRENT, NextRun, Outcome, Stop
from dasknn.tradeoff.hardware import HEModel

__all__ = ["GridPolicy"]


def _unit(value: float) -> bool:
    return 0 <= value < 1


class GridPolicy:
    """Omnivore Algorithm 1 with its cold start, over any engine (see the module docstring).

    Every number is a parameter with the paper's value as its default: the grids (appendix E),
    `clear_winner` = 5% over `winner_window` = 50 iterations, `small_momenta` = (0.1, 0.2) tried
    when µ* = 0, `epoch_factor` = 10 (search ≤ 10% of the time); the cold start's training epoch is
    at most `cold_start_fraction` = 15% of the time budget (appendix E-D: the cold start is < 15% of
    the run). `max_extensions`: how many times tied probes are run longer; `stop_checks`: train
    runs per epoch when `should_stop` is given, each at most `stop_check_iterations` long (default
    no limit; DistributedCNN passes one pass over the data, as its fixed loop checks: the optimizer's
    training is then evaluated, and stops at the target, as often as a fixed run's).
    `n_workers`: the conv devices N (default: he_model's, the engine's `n_workers`, or the number of
    conv workers of its `placement_` after a run); `max_groups`: the largest g (default N, else 32).
    `probe_losses(trace, config)`: the per-iteration losses probes are judged by (default: the
    training loss column; e.g. a planted or validation loss); `probe_score(state)`: judge probes by
    the loss of their end weights instead (e.g. `optimizer.search.SelectionLoss` on the selection part;
    its time is charged to the clock). `cold_start_groups`: tune g during the cold start too
    (appendix E-D; False: the cold-start epoch runs at g = 1). `momentum_early_stop`: each rate's
    momenta are probed from the highest down, stopping at the first worse one (the cold start's rule
    for η, applied to µ; about half the probes when the loss is unimodal in µ); False: every point
    of the grid, as appendix E lists it. `n_groups`, `learning_rate`,
    `momentum` pin a knob the user fixed; the others are still tuned. Unknown options raise ValueError.
    """

    def __init__(
        self,
        engine,
        *,
        n_workers: int | None = None,
        lr_grid: Sequence[float] = (0.1, 0.01, 0.001, 1e-4, 1e-5),
        momentum_grid: Sequence[float] = (0.0, 0.3, 0.6, 0.9),
        cold_start_momentum: float = 0.9,
        small_momenta: Sequence[float] = (0.1, 0.2),
        probe_iterations: int | None = None,
        probe_seconds: float | None = None,
        clear_winner: float = 0.05,
        winner_window: int = 50,
        max_extensions: int = 1,
        epoch_factor: float = 10,
        cold_start_fraction: float = 0.15,
        stop_checks: int = 4,
        stop_check_iterations: int | None = None,
        max_groups: int | None = None,
        he_model: HEModel | None = None,
        probe_losses: Judge | None = None,
        probe_score: Callable[[TrainState], float] | None = None,
        cold_start_groups: bool = True,
        momentum_early_stop: bool = True,
        n_groups: int | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
        verbose: int = 0,
        **unknown: Any,
    ) -> None:
        check(not unknown, f"unknown option(s) {sorted(unknown)} for GridPolicy")
        check(callable(getattr(engine, "run", None)), f"engine must have a run(...) method; got {engine!r}")
        self.engine = engine
        self.n_workers = int_option(n_workers, "n_workers")
        self.lr_grid = check_values(lr_grid, "lr_grid", lambda v: v > 0, "> 0")
        self.momentum_grid = check_values(momentum_grid, "momentum_grid", _unit, "in [0, 1)")
        self.cold_start_momentum = check_values(
            [cold_start_momentum], "cold_start_momentum", _unit, "in [0, 1)"
        )[0]
        self.small_momenta = (
            check_values(small_momenta, "small_momenta", _unit, "in [0, 1)") if small_momenta else ()
        )
        self.probe_iterations = int_option(probe_iterations, "probe_iterations")
        self.probe_seconds = float_option(probe_seconds, "probe_seconds")
        self.clear_winner = check_values([clear_winner], "clear_winner", _unit, "in [0, 1)")[0]
        self.winner_window = int_option(winner_window, "winner_window")
        self.max_extensions = int_option(max_extensions, "max_extensions", minimum=0)
        self.epoch_factor = float_option(epoch_factor, "epoch_factor")
        self.cold_start_fraction = check_values(
            [cold_start_fraction], "cold_start_fraction", lambda v: 0 < v <= 1, "in (0, 1]"
        )[0]
        self.stop_checks = int_option(stop_checks, "stop_checks")
        self.stop_check_iterations = int_option(stop_check_iterations, "stop_check_iterations")
        self.max_groups = int_option(max_groups, "max_groups")
        check(
            he_model is None or isinstance(he_model, HEModel),
            f"he_model must be an HEModel; got {he_model!r}",
        )
        if he_model is not None and self.n_workers is not None:
            check(
                he_model.n_workers == self.n_workers,
                f"n_workers={self.n_workers} disagrees with he_model.n_workers={he_model.n_workers}",
            )
        self.he_model = he_model
        check(
            probe_losses is None or callable(probe_losses),
            f"probe_losses must be callable; got {probe_losses!r}",
        )
        self.probe_losses = probe_losses
        check(
            probe_score is None or callable(probe_score),
            f"probe_score must be callable (a TrainState -> loss); got {probe_score!r}",
        )
        self.probe_score = probe_score
        check(
            isinstance(cold_start_groups, bool),
            f"cold_start_groups must be True or False; got {cold_start_groups!r}",
        )
        self.cold_start_groups = cold_start_groups
        check(
            isinstance(momentum_early_stop, bool),
            f"momentum_early_stop must be True or False; got {momentum_early_stop!r}",
        )
        self.momentum_early_stop = momentum_early_stop
        self.verbose = int_option(verbose, "verbose", minimum=0)
        self.max_epochs: int | None = None  # train epochs, when `optimize` is given max_epochs
        # pinned knobs: the user fixed them, the optimizer tunes only the others
        self.n_groups = int_option(n_groups, "n_groups")
        self.learning_rate = None
        if learning_rate is not None:
            self.learning_rate = check_values([learning_rate], "learning_rate", lambda v: v > 0, "> 0")[0]
            self.lr_grid = (self.learning_rate,)
        if momentum is not None:
            self.cold_start_momentum = check_values([momentum], "momentum", _unit, "in [0, 1)")[0]
            self.momentum_grid, self.small_momenta = (self.cold_start_momentum,), ()

    def probe_length(self, n_groups: int) -> tuple[int | None, float | None]:
        """(iterations, seconds) of one probe at g groups: the arguments, else max(20, 5·g) iterations."""
        if self.probe_iterations is None and self.probe_seconds is None:
            return max(20, 5 * int(n_groups)), None
        return self.probe_iterations, self.probe_seconds

    # -- the policy (dasknn.policy.Policy) -------------------------------------------------------
    def begin(self, fit, resume: dict[str, Any] | None) -> None:
        """Start a fit of Algorithm 1 on the loop's `fit` (or go on from a checkpoint's `resume` session)."""
        base = RunConfig(
            1, self.lr_grid[0], self.cold_start_momentum, fit.weight_decay, fit.batch_size, fit.seed
        )
        self._session = _Session(self, fit, base, self.max_epochs)
        self._session.checkpoints = fit.checkpoints
        state = fit.snapshot(CURRENT)
        if resume is not None:
            self._session.session = dict(resume)
            self._steps = self._session.resume(state, resume)
        else:
            self._steps = self._session.run(state)
        self._started = False

    def next_run(self, last: Outcome | None) -> NextRun | Stop:
        """The next probe or train run of Algorithm 1, or Stop; a train epoch's session rides on the
        next run as its checkpoint."""
        session = self._session
        try:
            step = self._steps.send(last) if self._started else next(self._steps)
        except StopIteration as done:
            stop = done.value
            final = {**(session.session or {"kind": "auto"}), "finished": True, "config": asdict(stop.config)}
            return replace(stop, session=final)
        self._started = True
        if session.pending:
            session.pending = False
            step = replace(step, checkpoint=session.session)
        return step

    def optimize(
        self,
        net,
        X,
        y,
        *,
        batch_size: int,
        weight_decay: float = 0.0,
        seed: int = 0,
        time_budget: float | None = None,
        max_epochs: int | None = None,
        max_iterations: int | None = None,
        should_stop: StopCallback | None = None,
        start: TrainState | None = None,
        **unknown: Any,
    ) -> OptimizerResult:
        """Train `net` on (X, y) by Omnivore Algorithm 1 until a budget is spent; sets its final weights.

        `time_budget` in the engine's clock, probes included; `max_iterations` counts every update
        run, probes included; `max_epochs` counts train epochs, the synchronous cold-start epoch
        included; `should_stop(state, trace_so_far)` is checked after each train run. The fit runs
        on `dasknn.fitting.Loop` (DistributedCNN's fits add evaluation, checkpoints and callbacks).
        """
        from dasknn.fitting import run_policy

        limits = check_optimize_args(unknown, time_budget, max_epochs, max_iterations, should_stop, start)
        self.max_epochs = limits["max_epochs"]
        done = run_policy(
            self,
            self.engine,
            net,
            X,
            y,
            batch_size=batch_size,
            weight_decay=weight_decay,
            seed=seed,
            time_budget=limits["time_budget"],
            max_iterations=limits["max_iterations"],
            should_stop=should_stop,
            start=start,
            selection=self.probe_score,
            verbose=self.verbose,
        )
        session = self._session
        return OptimizerResult(
            done.state, done.trace, done.decisions, done.config, session.history, session.he_model
        )


def __getattr__(name: str):
    """OmnivoreOptimizer, the name before GridPolicy (deprecated)."""
    if name == "OmnivoreOptimizer":
        import warnings

        warnings.warn("OmnivoreOptimizer is now GridPolicy", DeprecationWarning, stacklevel=2)
        return GridPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
