"""The online optimizer: trains from the first iteration and retunes g, η, µ as it measures.

Omnivore's Algorithm 1 probes a grid from one checkpoint and throws the losing probes away; its
search is ~10% of the run only when epochs last an hour. Systems since decide online (Pollux /
AdaptDL, OSDI'21; YellowFin's closed loop, 2017; AdaScale, ICML'20). So does this optimizer:

1. It starts at once at the smallest g the HE model says saturates the FC server (Omnivore §V-B;
   the engine's timing model, the `he_model` argument, or one from the net's FLOP split), with the
   explicit µ that makes the target total momentum with that g's implicit 1 − 1/g (§IV-B).
2. It trains in runs continuing from the current weights. After each it measures
   (`optimizer.measure`): time per iteration at that g, the gradient noise scale (the FC server's
   squared gradient norms of each batch and its halves), the total momentum present (explicit µ
   plus the implicit momentum of the measured staleness), and progress per second (the drop of the
   log probe score).
3. It decides (`optimizer.decide`, pure functions): µ is steered toward the target total
   (YellowFin's negative feedback); the g of highest goodput (Pollux: throughput × efficiency, the
   HE model calibrated by the measured times for g not yet run) is tried when it beats the current
   one by a margin, with the rate scaled by AdaScale's gain; otherwise the rate ×3 and /3 are tried
   in turn.
4. A trial is a run of training like any other: when it did not diverge its iterations stay in
   the model, and it is adopted when its progress per second beats the current configuration's in
   the runs before and after it (A-B-A). A diverging trial (non-finite, or its score
   `divergence_limit` × its start) is abandoned after at most `trial_iterations` and rolled back
   to its start state; its rate is never tried again from above.
5. Exploration time (trials) stays within `exploration_fraction` (default 10%) of the estimated
   time to target, re-estimated after every run from the training error's trend (the time
   budget when there is no target or trend); each decision row reports it.

Every decision is a row of the decisions log (`search.DECISION_COLUMNS` plus the measured
numbers that drove it: `seconds_per_iteration`, `noise_scale`, `total_momentum`, `goodput`,
`progress`, `exploration`, `time_to_target`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from dasknn.data.batching import n_batches
from dasknn.engine.trace import COLD_START, RunConfig, TrainState
from dasknn.optimizer import decide, measure
from dasknn.optimizer.options import (
    FRACTION,
    GAIN,
    HE_MODEL,
    PINNED_GROUPS,
    PINNED_LR,
    PINNED_MOMENTUM,
    PROBE_SCORE,
    SOME_COUNT,
    TARGET_ACCURACY,
    VERBOSE,
)
from dasknn.optimizer.search import (
    Runs,
    Snapshots,
    check,
    check_optimize_args,
    group_candidates,
    initial_groups,
)
from dasknn.optimizer.session import OptimizerResult, StopCallback
from dasknn.optimizer.tuner import StepTuner
from dasknn.policy import CURRENT, NextRun, Stop
from dasknn.rules import LEARNING_RATE, MOMENTUM, Number, Option
from dasknn.tradeoff.hardware import HEModel
from dasknn.tradeoff.statistical import final_loss

__all__ = ["OnlinePolicy"]


OPTIONS = (
    Option("n_workers", None, SOME_COUNT),
    Option("max_groups", None, SOME_COUNT),
    Option("he_model", None, HE_MODEL),
    Option("initial_lr", COLD_START.lr, LEARNING_RATE),
    Option("target_momentum", 0.9, MOMENTUM),
    Option("momentum_gain", 0.5, GAIN),
    Option("momentum_tolerance", 0.03, FRACTION),
    Option("exploration_fraction", 0.1, FRACTION),
    Option("run_iterations", None, SOME_COUNT),
    Option("trial_iterations", None, SOME_COUNT),
    Option("lr_factor", 3.0, Number(1, low_open=True)),
    Option("margin", 0.1, Number(0)),
    Option("divergence_limit", 2.0, Number(1, low_open=True)),
    Option("probe_score", None, PROBE_SCORE),
)
"""OnlinePolicy's options (`__init__`'s keywords, in order): name, default, rule."""
SETTINGS = (
    Option("target_accuracy", None, TARGET_ACCURACY),
    Option("n_groups", None, PINNED_GROUPS),
    Option("learning_rate", None, PINNED_LR),
    Option("momentum", None, PINNED_MOMENTUM),
    Option("verbose", 0, VERBOSE),
)
"""What a fit sets on a bound OnlinePolicy (`Tuner.for_fit`): the fit's target, the pinned knobs."""


@dataclass
class _Run:
    """One engine run of the online optimizer: its trace, end state, score and progress."""

    config: RunConfig
    trace: pd.DataFrame
    state: TrainState | None
    diverged: bool
    seconds: float
    run: int
    score_start: float
    score_end: float

    @property
    def progress(self) -> float:
        return measure.progress_rate(self.score_start, self.score_end, self.seconds)


class OnlinePolicy(StepTuner):
    """Goodput-driven online tuning of (g, η, µ) over any engine (see the module docstring).

    `initial_lr` (default 0.01, Caffe's LeNet rate): the first rate; `target_momentum`: the total
    momentum µ is steered to (default 0.9); `momentum_gain`, `momentum_tolerance`: the feedback's
    step and dead band; `exploration_fraction`: trials' share of the time to target;
    `run_iterations`: a training run (default one pass over the data, at most 200
    iterations); `trial_iterations`: a trial (default half a run, at least 5·g); `lr_factor`:
    the rate's step (×3 / ÷3); `margin`: how much better a trial's progress (and a g's predicted
    goodput) must be; `divergence_limit`: a trial whose score reaches this multiple of its start
    is abandoned. `probe_score(state)`: the loss runs are judged on (e.g. a selection part of
    the training data; default the smoothed training loss). `n_workers`, `max_groups`, `he_model`
    as for `GridPolicy`. A fit's settings (`for_fit`): `target_accuracy`, for the time-to-target
    estimate; `n_groups`, `learning_rate`, `momentum` pin a knob; `verbose`.

    Examples
    --------
    >>> from dasknn.estimator import DistributedCNN
    >>> from dasknn.optimizer import OnlinePolicy
    >>> est = DistributedCNN(tuner=OnlinePolicy(initial_lr=0.03))
    >>> est.set_params(tuner__exploration_fraction=0.2).get_params()["tuner__exploration_fraction"]
    0.2
    """

    name = "online"
    OPTIONS = OPTIONS
    SETTINGS = SETTINGS

    def __init__(
        self,
        *,
        n_workers: int | None = None,
        max_groups: int | None = None,
        he_model: HEModel | None = None,
        initial_lr: float = COLD_START.lr,
        target_momentum: float = 0.9,
        momentum_gain: float = 0.5,
        momentum_tolerance: float = 0.03,
        exploration_fraction: float = 0.1,
        run_iterations: int | None = None,
        trial_iterations: int | None = None,
        lr_factor: float = 3.0,
        margin: float = 0.1,
        divergence_limit: float = 2.0,
        probe_score: Callable[[TrainState], float] | None = None,
    ) -> None:
        self.n_workers, self.max_groups, self.he_model = n_workers, max_groups, he_model
        self.initial_lr, self.target_momentum = initial_lr, target_momentum
        self.momentum_gain, self.momentum_tolerance = momentum_gain, momentum_tolerance
        self.exploration_fraction = exploration_fraction
        self.run_iterations, self.trial_iterations = run_iterations, trial_iterations
        self.lr_factor, self.margin, self.divergence_limit = lr_factor, margin, divergence_limit
        self.probe_score = probe_score

    def smallest_start_rate(self, net: Any) -> float:
        """Its first rate, `initial_lr`: it only lowers it after a divergence."""
        return float(self.initial_lr)

    def bound(self) -> None:
        """The engine checked (a standalone `optimize` runs on it)."""
        engine = self.engine
        check(
            engine is None or callable(getattr(engine, "run", None)),
            f"engine must have a run(...) method; got {engine!r}",
        )

    # -- the policy (dasknn.policy.Policy) -------------------------------------------------------
    def begin(self, fit, resume: dict[str, Any] | None) -> None:
        """Start a fit on the loop's `fit` (or go on from a checkpoint's `resume` session)."""
        self._run = _OnlineRun(self, fit)
        base = RunConfig(1, self.initial_lr, 0.0, fit.weight_decay, fit.batch_size, fit.seed)
        self.start_steps(self._run.run(fit.snapshot(CURRENT), base, resume))

    def pending_checkpoint(self) -> dict[str, Any] | None:
        """The session after a run, which rides on the next run as its checkpoint."""
        pending, self._run.pending = self._run.pending, None
        return pending

    def checkpointed(self) -> dict[str, Any] | None:
        return self._run.last_session

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
        """Train `net` on (X, y) until a budget is spent or `should_stop(state, trace)` says so.

        The arguments are `GridPolicy.optimize`'s: `time_budget` in the engine's clock,
        trials included; `max_epochs` passes over the data. The fit runs on `dasknn.fitting.Loop`.
        """
        from dasknn.fitting import run_policy

        check(self.engine is not None, "OnlinePolicy.optimize needs an engine: call it on for_fit(engine)")
        limits = check_optimize_args(unknown, time_budget, max_epochs, max_iterations, should_stop, start)
        time_budget, max_epochs, max_iterations = (
            limits["time_budget"],
            limits["max_epochs"],
            limits["max_iterations"],
        )
        if max_epochs is not None:
            per_epoch = max_epochs * n_batches(int(X.shape[0]), int(batch_size))
            max_iterations = per_epoch if max_iterations is None else min(max_iterations, per_epoch)
        done = run_policy(
            self,
            self.engine,
            net,
            X,
            y,
            batch_size=batch_size,
            weight_decay=weight_decay,
            seed=seed,
            time_budget=time_budget,
            max_iterations=max_iterations,
            should_stop=should_stop,
            start=start,
            selection=self.probe_score,
            verbose=self.verbose,
        )
        return OptimizerResult(
            done.state, done.trace, done.decisions, done.config, self._run.history, self._run.he_model
        )


class _OnlineRun:
    """One `optimize` call of the online optimizer: the log and clock, the measurements, the loop."""

    def __init__(self, opt: OnlinePolicy, fit) -> None:
        self.opt, self.fit, self.net, self.batch_size = opt, fit, fit.net, fit.batch_size
        self.log = fit.log
        self.snapshots = Snapshots()
        self.passes = fit.n_batches
        self.pending: dict[str, Any] | None = None  # a session for the checkpoint before the next run
        self.last_session: dict[str, Any] | None = None
        self.stopped = ""
        self.stop_asked = False  # the loop's evaluation after the last run asked to stop
        self.tpi: dict[int, float] = {}  # measured seconds per iteration at each g that ran
        self.noise = measure.NoiseScale()
        self.explored = 0.0
        self.lr_ceiling = math.inf  # the lowest rate that diverged: no trial at or above it
        self.rejected: dict[str, int] = {}  # trials rejected in a row, per direction
        self.turn = 0  # which rate trial comes next (up, down)
        self.history: list[dict[str, Any]] = []
        self.he_model: HEModel | None = None
        self.candidates: list[int] = []
        self.score = math.nan
        self.trial: tuple[_Run, str] | None = None  # a trial waiting for its "after" run
        self.last_trace = pd.DataFrame()  # the last run measured

    # -- set-up ----------------------------------------------------------------------------------
    def he(self) -> tuple[HEModel, str]:
        """The HE model: the argument, the simulated engine's timing, else the net's FLOP split."""
        opt, n = self.opt, self.n_workers
        timing = getattr(self.fit.engine, "timing", None)
        if opt.he_model is not None:
            return opt.he_model, "HE model from the he_model argument"
        if isinstance(timing, HEModel) and timing.n_workers == (n or timing.n_workers):
            return timing, "HE model of the engine's timing"
        model = HEModel.estimate(
            self.net, self.batch_size, n or 1, device_gflops=1.0, bandwidth_bytes_per_s=1e15
        )
        return model, "HE model from the FLOP split of the conv and FC phases (relative times)"

    def first_config(self, base: RunConfig) -> tuple[RunConfig, str]:
        """The saturating g, µ for its implicit momentum, the initial rate (pinned knobs kept)."""
        opt = self.opt
        self.n_workers = opt.n_workers or (opt.he_model.n_workers if opt.he_model else None)
        engine = self.fit.engine
        self.n_workers = self.n_workers or getattr(engine, "n_workers", None)
        if self.n_workers is None and callable(getattr(engine, "conv_worker_count", None)):
            self.n_workers = engine.conv_worker_count()  # a DaskEngine's cluster as it is now
        self.candidates = group_candidates(self.n_workers, opt.max_groups or self.n_workers or 32)
        self.he_model, source = self.he()
        g, why = initial_groups(self.he_model, self.candidates, fixed_workers=self.n_workers is not None)
        if opt.n_groups is not None:
            g, why = opt.n_groups, f"n_groups = {opt.n_groups} given by the user"
        mu = decide.explicit_momentum(opt.target_momentum, g) if opt.momentum is None else opt.momentum
        lr = opt.learning_rate or opt.initial_lr
        why = f"{source}; {why}; µ = {mu:.3g} for total {opt.target_momentum:g} with implicit 1 - 1/{g}"
        return base.with_(n_groups=g, lr=lr, momentum=mu), why

    # -- the loop --------------------------------------------------------------------------------
    def run(self, state: TrainState, base: RunConfig, resume: dict[str, Any] | None) -> Runs:
        """The online loop: runs, measurements, decisions and trials, as the runs it asks for."""
        log = self.log
        if resume is not None:
            config = self.restore(resume)
        else:
            config, why = self.first_config(base)
            self.score = self.fit.score(CURRENT) if self.fit.has_selection else math.nan
            log.record("online", "start", config, why, score=self.score)
        before = math.nan
        while not self.finished():
            seg = yield from self.train_run(config, state, self.run_length(config), "train")
            if seg is None:
                break
            if seg.diverged:  # the loop rolled it back (and gives up after too many in a row)
                self.lr_ceiling = min(self.lr_ceiling, config.lr)
                config = config.with_(lr=config.lr / self.opt.lr_factor)
                log.record(
                    "train",
                    "rollback",
                    config,
                    "diverged: back to the run's start, lr / factor",
                    diverged=True,
                    chosen=True,
                    run=seg.run,
                    **self.numbers(config),
                )
                continue
            state = seg.state
            self.measured(seg)
            log.record(
                "train",
                "run",
                config,
                f"{len(seg.trace)} iterations",
                score=seg.score_end,
                iterations=len(seg.trace),
                seconds=seg.seconds,
                run=seg.run,
                chosen=True,
                progress=seg.progress,
                **self.numbers(config),
            )
            self.run_done(state, config, seg)
            if self.finished():
                break
            config = self.steer(config, seg)
            state, config, before = yield from self.explore(state, config, seg, before)
        return self.finish(state, config)

    def run_length(self, config: RunConfig) -> int:
        if self.opt.run_iterations is not None:
            return self.opt.run_iterations
        return max(5 * config.n_groups, min(self.passes, 200))

    def trial_length(self, config: RunConfig) -> int:
        if self.opt.trial_iterations is not None:
            return self.opt.trial_iterations
        return max(5 * config.n_groups, self.run_length(config) // 2)

    def train_run(self, config: RunConfig, state: TrainState, iterations: int, phase: str) -> Runs:
        """One kept run from `state`, scored by the loop; None when the budget is spent. A trial
        (phase "explore") also diverges when its score reaches `divergence_limit` × its start."""
        log = self.log
        budget = log.budget(iterations=iterations)
        if budget is None:
            return None
        start_score = self.score

        def start_of(trace: pd.DataFrame) -> float:  # no scorer: the first losses of this run
            if not math.isfinite(start_score) and len(trace):
                return float(trace["loss"].head(10).mean())
            return start_score

        def diverges(trace: pd.DataFrame, score: float) -> bool:
            return decide.diverging(start_of(trace), score, self.opt.divergence_limit)

        request = NextRun(
            config,
            budget,
            start=self.snapshots.name(state),
            phase=phase,
            score=True,
            diverges=diverges if phase == "explore" else None,
        )
        out = yield request
        self.snapshots.seen(out)
        self.stop_asked = out.stop
        end_score = math.inf if out.score is None else out.score
        if not out.diverged:
            self.score = end_score
        return _Run(
            config, out.trace, out.state, out.diverged, out.seconds, out.run, start_of(out.trace), end_score
        )

    # -- measuring and deciding ------------------------------------------------------------------
    def measured(self, seg: _Run) -> None:
        """Fold a run's time per iteration and gradient norms into the running measurements."""
        g = seg.config.n_groups
        tpi = measure.seconds_per_iteration(seg.trace)
        if math.isfinite(tpi):
            self.tpi[g] = tpi if g not in self.tpi else 0.5 * (self.tpi[g] + tpi)
        self.noise.update(seg.trace, self.batch_size)
        self.last_trace = seg.trace

    def predicted_tpi(self) -> dict[int, float]:
        """Seconds per iteration per candidate g: measured where it ran, else the HE model scaled by
        the measured/modelled ratio of the g's that ran."""
        model, out = self.he_model, dict(self.tpi)
        usable = [g for g in self.candidates if g <= model.n_workers]
        ratios = [t / model.he(g) for g, t in self.tpi.items() if g <= model.n_workers and model.he(g) > 0]
        scale = sum(ratios) / len(ratios) if ratios else math.nan
        for g in usable:
            if g not in out and math.isfinite(scale):
                out[g] = model.he(g) * scale
        return out

    def numbers(self, config: RunConfig) -> dict[str, float]:
        """The measured numbers a decision row carries."""
        tpi = self.tpi.get(config.n_groups, math.nan)
        trace = self.last_trace
        return {
            "seconds_per_iteration": tpi,
            "noise_scale": self.noise.value,
            "total_momentum": measure.total_momentum(trace, config.momentum),
            "goodput": decide.goodput(tpi, self.noise.value, self.batch_size, config.n_groups),
            "exploration": self.explored,
            "time_to_target": self.time_to_target()[0],
        }

    def time_to_target(self) -> tuple[float, str]:
        """The estimated time to target on the optimizer's clock, else the time budget."""
        kept = self.log.trace()
        kept = kept[kept["kept"]] if len(kept) else kept
        when, how = measure.time_to_target(kept, self.opt.target_accuracy)
        if not math.isfinite(when):
            if self.log.time_budget is not None:
                return self.log.time_budget, f"{how}: the time budget"
            return math.nan, how
        return when, how

    def steer(self, config: RunConfig, seg: _Run) -> RunConfig:
        """YellowFin's closed loop on µ from the run's measured total momentum."""
        if self.opt.momentum is not None:
            return config
        total = measure.total_momentum(seg.trace, config.momentum)
        mu, why = decide.steer_momentum(
            config.momentum,
            total,
            self.opt.target_momentum,
            self.opt.momentum_gain,
            self.opt.momentum_tolerance,
        )
        if mu != config.momentum:
            config = config.with_(momentum=mu)
            self.log.record("train", "momentum", config, why, chosen=True, **self.numbers(config))
        return config

    def next_trial(self, config: RunConfig) -> tuple[RunConfig, str, str] | None:
        """The next configuration to try: a g of higher predicted goodput, else the rate up or down."""
        opt = self.opt
        mu_excess = (
            config.momentum == 0
            and measure.total_momentum(self.last_trace, 0.0) > opt.target_momentum + opt.momentum_tolerance
        )
        if opt.n_groups is None:
            g, why, _ = decide.choose_groups(
                self.predicted_tpi(),
                self.noise.value,
                self.batch_size,
                config.n_groups,
                opt.margin,
                mu_excess,
            )
            if g != config.n_groups and self.rejected.get(f"g{g}", 0) < 2:
                lr = (
                    config.lr
                    if opt.learning_rate
                    else decide.scale_lr(config.lr, self.noise.value, self.batch_size, config.n_groups, g)
                )
                mu = (
                    config.momentum
                    if opt.momentum is not None
                    else decide.explicit_momentum(opt.target_momentum, g)
                )
                lr = min(lr, self.lr_ceiling / opt.lr_factor)
                return config.with_(n_groups=g, lr=lr, momentum=mu), f"g{g}", why
        if opt.learning_rate is not None:
            return None
        for _ in range(2):
            direction = ("up", "down")[self.turn % 2]
            self.turn += 1
            lr = config.lr * opt.lr_factor if direction == "up" else config.lr / opt.lr_factor
            if (direction == "up" and lr >= self.lr_ceiling) or self.rejected.get(direction, 0) >= 2:
                continue
            return config.with_(lr=lr), direction, f"try the rate {direction}: {config.lr:g} -> {lr:g}"
        return None

    def explore(self, state: TrainState, config: RunConfig, seg: _Run, before: float) -> Runs:
        """Run a trial when exploration time allows; judge it A-B-A; returns (state, config, the
        current config's progress before a pending trial)."""
        log, opt = self.log, self.opt
        pending = self.trial
        current = seg.progress
        if pending is not None:  # this run is the "after" of the trial
            self.trial = None
            trial, key = pending
            adopt, why = decide.judge_trial(trial.progress, before, seg.progress, opt.margin)
            self.rejected[key] = 0 if adopt else self.rejected.get(key, 0) + 1
            if adopt:
                # the way back was just measured worse: a line search goes on the way it went
                back = {"up": "down", "down": "up"}.get(key, f"g{config.n_groups}")
                config, self.rejected, current = trial.config, {back: 2}, trial.progress
            log.record(
                "explore",
                "adopt" if adopt else "reject",
                trial.config,
                why,
                chosen=adopt,
                progress=trial.progress,
                **self.numbers(trial.config),
            )
        proposal = self.next_trial(config)
        if proposal is None:
            return state, config, current
        trial_config, key, why = proposal
        iterations = self.trial_length(trial_config)
        tpi = self.predicted_tpi().get(trial_config.n_groups, self.tpi.get(config.n_groups, math.nan))
        seconds = iterations * tpi
        ttt, how = self.time_to_target()
        if not decide.explore_allowed(self.explored, seconds, ttt, opt.exploration_fraction):
            return state, config, current
        trial = yield from self.train_run(trial_config, state, iterations, "explore")
        if trial is None:
            return state, config, current
        self.explored += trial.seconds
        if trial.diverged:
            self.lr_ceiling = min(self.lr_ceiling, trial_config.lr)
            self.rejected[key] = self.rejected.get(key, 0) + 1
            log.record(
                "explore",
                "abandon",
                trial_config,
                f"{why}; diverged within {len(trial.trace)} iterations: rolled back to its start",
                diverged=True,
                run=trial.run,
                iterations=len(trial.trace),
                seconds=trial.seconds,
                **self.numbers(trial_config),
            )
            return state, config, current
        self.measured(trial)
        log.record(
            "explore",
            "trial",
            trial_config,
            f"{why}; exploration within {opt.exploration_fraction:.0%} of {ttt:.3g} s to target ({how})",
            score=trial.score_end,
            iterations=len(trial.trace),
            seconds=trial.seconds,
            run=trial.run,
            progress=trial.progress,
            **self.numbers(trial_config),
        )
        self.trial = (trial, key)
        self.run_done(trial.state, config, trial)
        return trial.state, config, current

    # -- bookkeeping -----------------------------------------------------------------------------
    def run_done(self, state: TrainState, config: RunConfig, seg: _Run) -> None:
        """History, the stop check and the checkpoint hook after every run kept."""
        log = self.log
        self.history.append(
            {
                "epoch": len(self.history) + 1,
                "phase": "explore" if seg.config != config else "train",
                "time": log.elapsed,
                "iterations": log.iterations,
                "model_iterations": state.iterations_done,
                "loss": final_loss(seg.trace),
                "accuracy": float(seg.trace["accuracy"].tail(10).mean()) if len(seg.trace) else math.nan,
                "n_groups": seg.config.n_groups,
                "lr": seg.config.lr,
                "momentum": seg.config.momentum,
            }
        )
        if self.stop_asked:
            self.stopped = "should_stop returned True"
        if self.fit.checkpoints:
            self.pending = self.last_session = self.session(config)

    def session(self, config: RunConfig) -> dict[str, Any]:
        """The JSON-able rest of the run's state, for checkpoints (`restore` reads it back)."""
        log = self.log
        return {
            "kind": "auto",
            "optimizer": "online",
            "config": asdict(config),
            "elapsed": log.elapsed,
            "iterations": log.iterations,
            "charged": list(log.charged),
            "kept": sorted(log.kept),
            "history": list(self.history),
            "tpi": {str(g): t for g, t in self.tpi.items()},
            "explored": self.explored,
            "lr_ceiling": self.lr_ceiling if math.isfinite(self.lr_ceiling) else None,
            "score": self.score,
            "stopped": self.stopped,
        }

    def restore(self, session: dict[str, Any]) -> RunConfig:
        """Go on from a checkpoint's `session` (the loop restored the clock and records): the measurements."""
        self.first_config(RunConfig(**session["config"]))
        self.last_session = dict(session)
        self.history = list(session["history"])
        self.tpi = {int(g): float(t) for g, t in session["tpi"].items()}
        self.explored = float(session["explored"])
        self.lr_ceiling = math.inf if session["lr_ceiling"] is None else float(session["lr_ceiling"])
        self.score, self.stopped = float(session["score"]), session["stopped"]
        return RunConfig(**session["config"])

    def finished(self) -> bool:
        return bool(self.stopped) or self.log.exhausted()

    def finish(self, state: TrainState, config: RunConfig) -> Stop:
        log = self.log
        why = self.stopped or ("budget spent" if log.exhausted() else "stopped")
        log.record(
            "train", "stop", config, f"{why}; exploration {self.explored:.3g} s", **self.numbers(config)
        )
        return Stop(why, config, state=self.snapshots.name(state))
