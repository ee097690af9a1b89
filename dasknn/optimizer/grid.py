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
from typing import Any

from dasknn.engine.trace import RunConfig, TrainState
from dasknn.optimizer.options import (
    COUNT,
    FRACTION,
    HE_MODEL,
    PINNED_GROUPS,
    PINNED_LR,
    PINNED_MOMENTUM,
    POSITIVE,
    PROBE_SCORE,
    SOME_COUNT,
    SOME_POSITIVE,
    VERBOSE,
)
from dasknn.optimizer.search import Judge, check, check_optimize_args
from dasknn.optimizer.session import OptimizerResult, StopCallback, _Session
from dasknn.optimizer.tuner import StepTuner
from dasknn.policy import CURRENT
from dasknn.rules import LEARNING_RATE, MOMENTUM, Boolean, Custom, Grid, Number, Option
from dasknn.tradeoff.hardware import HEModel

__all__ = ["GridPolicy"]


OPTIONS = (
    Option("n_workers", None, SOME_COUNT),
    Option("lr_grid", (0.1, 0.01, 0.001, 1e-4, 1e-5), Grid(LEARNING_RATE)),
    Option("momentum_grid", (0.0, 0.3, 0.6, 0.9), Grid(MOMENTUM)),
    Option("cold_start_momentum", 0.9, MOMENTUM),
    Option("small_momenta", (0.1, 0.2), Grid(MOMENTUM, empty=True)),
    Option("probe_iterations", None, SOME_COUNT),
    Option("probe_seconds", None, SOME_POSITIVE),
    Option("clear_winner", 0.05, FRACTION),
    Option("winner_window", 50, COUNT),
    Option("max_extensions", 1, Number(0, integer=True)),
    Option("epoch_factor", 10, POSITIVE),
    Option("cold_start_fraction", 0.15, Number(0, 1, low_open=True)),
    Option("stop_checks", 4, COUNT),
    Option("stop_check_iterations", None, SOME_COUNT),
    Option("max_groups", None, SOME_COUNT),
    Option("he_model", None, HE_MODEL),
    Option("probe_losses", None, Custom("None or a callable", accepts=lambda v: v is None or callable(v))),
    Option("probe_score", None, PROBE_SCORE),
    Option("cold_start_groups", True, Boolean()),
    Option("momentum_early_stop", True, Boolean()),
)
"""GridPolicy's options (`__init__`'s keywords, in order): name, default (the paper's value), rule."""
SETTINGS = (
    Option("n_groups", None, PINNED_GROUPS),
    Option("learning_rate", None, PINNED_LR),
    Option("momentum", None, PINNED_MOMENTUM),
    Option("verbose", 0, VERBOSE),
)
"""What a fit sets on a bound GridPolicy (`Tuner.for_fit`): the knobs the user pinned, verbosity."""


class GridPolicy(StepTuner):
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
    of the grid, as appendix E lists it. A fit's settings (`for_fit`): `n_groups`, `learning_rate`,
    `momentum` pin a knob the user fixed (the others are still tuned), `verbose`.

    Examples
    --------
    >>> from dasknn.estimator import DistributedCNN
    >>> from dasknn.optimizer import GridPolicy
    >>> est = DistributedCNN(tuner=GridPolicy(lr_grid=(0.1, 0.03, 0.01)))
    >>> est.set_params(tuner__probe_iterations=10).get_params()["tuner__probe_iterations"]
    10
    """

    name = "grid"
    OPTIONS = OPTIONS
    SETTINGS = SETTINGS
    max_epochs: int | None = None
    """Train epochs, when `optimize` is given max_epochs."""

    def __init__(
        self,
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
    ) -> None:
        self.n_workers, self.lr_grid, self.momentum_grid = n_workers, lr_grid, momentum_grid
        self.cold_start_momentum, self.small_momenta = cold_start_momentum, small_momenta
        self.probe_iterations, self.probe_seconds = probe_iterations, probe_seconds
        self.clear_winner, self.winner_window = clear_winner, winner_window
        self.max_extensions = max_extensions
        self.epoch_factor, self.cold_start_fraction = epoch_factor, cold_start_fraction
        self.stop_checks, self.stop_check_iterations = stop_checks, stop_check_iterations
        self.max_groups, self.he_model = max_groups, he_model
        self.probe_losses, self.probe_score = probe_losses, probe_score
        self.cold_start_groups, self.momentum_early_stop = cold_start_groups, momentum_early_stop

    def checked(self) -> dict[str, Any]:
        """The options checked (`Tuner.checked`), and n_workers against the HE model's."""
        values = super().checked()
        he_model, n_workers = values["he_model"], values["n_workers"]
        if he_model is not None and n_workers is not None:
            check(
                he_model.n_workers == n_workers,
                f"n_workers={n_workers} disagrees with he_model.n_workers={he_model.n_workers}",
            )
        return values

    def smallest_start_rate(self, net: Any) -> float:
        """The grid's smallest rate: the cold start may pick any of them."""
        return float(min(self.lr_grid))

    def bound(self) -> None:
        """The engine checked; a pinned knob's grid reduced to it (the others are still tuned)."""
        engine = self.engine
        check(
            engine is None or callable(getattr(engine, "run", None)),
            f"engine must have a run(...) method; got {engine!r}",
        )
        if self.learning_rate is not None:
            self.lr_grid = (self.learning_rate,)
        if self.momentum is not None:
            self.cold_start_momentum = self.momentum
            self.momentum_grid, self.small_momenta = (self.momentum,), ()

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
            self.start_steps(self._session.resume(state, resume))
        else:
            self.start_steps(self._session.run(state))

    def pending_checkpoint(self) -> dict[str, Any] | None:
        """A train epoch's session, which rides on the next run as its checkpoint."""
        session = self._session
        if not session.pending:
            return None
        session.pending = False
        return session.session

    def checkpointed(self) -> dict[str, Any] | None:
        return self._session.session

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

        check(self.engine is not None, "GridPolicy.optimize needs an engine: call it on for_fit(engine)")
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
