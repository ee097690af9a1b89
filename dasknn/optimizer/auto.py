"""The "auto" optimizer: a free prior, an η ramp on the training path, capped trials, a plateau rule.

Searching cannot pay on short jobs (Omnivore appendix E: a job that converges in seconds is all
cold start; Pollux starts from the user's settings and never explores first). So "auto" trains
from the first iteration and only ever spends a bounded share of the run on anything else:

1. The prior (`optimizer.prior`): the smallest g within 10% of the HE model's best time per
   iteration; η and µ from the net's solver (a zoo net's published Caffe solver, else Caffe's
   0.01 / 0.9), or, when the fit asks for the prior cache, the configuration the last successful
   fit of the same job reached (then the ramp is skipped). The decisions log's "start" row names the source.
2. The η ramp (`optimizer.ramp`): windows of w iterations, one at the prior's η, then η × 4 and
   doublings while a window beats what the previous η would have done at the same loss level; the
   first worse, rising or non-finite window is undone (the run before it is the start of the next)
   and the previous η kept (an undone × 4 step tries × 2 next; one that blew the loss up ends the
   ramp one step lower, `ramp.end_rate`). Every run asks the loop's loss limit
   (`NextRun.loss_limit`), and a batch loss that spiked above twice the level the run started from
   and above uniform guessing's (`spike_rule`) blows it up too: such a window is rolled back, never
   kept, and the run after it restarts momentum; a training window rolled back is retried at η ÷ 4 before a
   span at that η, ÷ 3 after (`decide.back_off`).
3. Training windows, each judged by the plateau rule (`optimizer.plateau`: η ÷ 3 when progress
   falls below a tenth of the first span's at that η carried to the loss level now, as the ramp
   carries it, for two spans in a row; the fit stops on convergence after `max_drops` drops
   without a held-out gain) and by momentum feedback (`optimizer.momentum`: the total
   momentum regressed from the conv weights' updates steered to the prior's µ, YellowFin).
4. A new g when the cluster's size changes (`decide.regroup`, docs/architecture.md "Elastic
   clusters"): after a run that ended on another number of conv workers, the prior's rule on the
   HE model at the new count (a pinned `n_groups` stays); a trial under way is abandoned.
5. Capped trials (`optimizer.trials`): η × 2, η ÷ 2, g one step up or down, A-B-A (the current
   configuration's window before and after, `decide.judge_trial`; adopted only beyond the standard
   error of the difference, `trials.trial_noise`), started only while the trials' time on the
   trace's clock stays within 5% of the elapsed time, and cut to what is left of it.

It is a policy of the training loop (`dasknn.policy.Policy`): it never calls the engine; each answer
is one run (a window, a trial) or a stop. Its state is one typed record (`auto_state.AutoState`),
JSON-able (`AutoState.to_dict`), carried by the
checkpoints, so a fit stopped mid-ramp or mid-trial resumes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pandas as pd

from dasknn.engine.schedule import Schedule
from dasknn.engine.trace import Budget, RunConfig
from dasknn.optimizer import decide, measure
from dasknn.optimizer.auto_state import AutoState
from dasknn.optimizer.momentum import trace_momentum
from dasknn.optimizer.options import (
    COUNT,
    FRACTION,
    GAIN,
    HE_MODEL,
    PINNED_GROUPS,
    PINNED_LR,
    PINNED_MOMENTUM,
    SOME_COUNT,
    VERBOSE,
)
from dasknn.optimizer.plateau import Plateau
from dasknn.optimizer.prior import Prior, PriorCache, default_cache_path, groups_prior, solver_prior
from dasknn.optimizer.ramp import LrRamp, progress_and_error, window_level
from dasknn.optimizer.range_test import RangeTest
from dasknn.optimizer.search import group_candidates
from dasknn.optimizer.trials import (
    MAX_TRIAL_GAIN,
    TRIAL_FRACTION,
    neighbours,
    predicted_noise,
    resolvable,
    trial_noise,
    trial_seconds,
)
from dasknn.optimizer.tuner import Tuner
from dasknn.policy import CURRENT, EVAL_SHARE, START, NextRun, Outcome, Stop
from dasknn.rules import Choice, Custom, Number, Option
from dasknn.tradeoff.hardware import HEModel

__all__ = ["MEASURED_SAMPLES", "AutoPolicy"]

MEASURED_SAMPLES = 2000
"""Training samples (drawn once, seeded) the loop scores at each evaluation of an "auto" fit, for
the tuner's progress measure only (`AutoPolicy._measure`): the history's figures do not use them."""


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _optional_dict(value: Any) -> bool:
    return value is None or isinstance(value, dict)


def _cache_path(value: Any) -> bool:
    return isinstance(value, (bool, str, Path))


OPTIONS = (
    Option("solver", None, Custom("None or a dict of settings", accepts=_optional_dict)),
    Option("window", None, Number(2, integer=True, also=(None,))),
    Option("run_iterations", None, Number(2, integer=True, also=(None,))),
    Option("calibration_windows", 1, Number(1, 2, integer=True)),
    Option("first_step", 4.0, Number(2, 16)),
    Option("first_look", None, Number(2, integer=True, also=(None,))),
    Option("lr_search", "ramp", Choice(("ramp", "range"))),
    Option("trial_fraction", TRIAL_FRACTION, FRACTION),
    Option("plateau_fraction", 0.1, Number(0, 1, low_open=True, high_open=True)),
    Option("max_drops", 2, COUNT),
    Option("plateau_span", None, SOME_COUNT),
    Option("plateau_patience", 2, COUNT),
    Option("momentum_gain", 0.1, GAIN),
    Option("momentum_tolerance", 0.05, FRACTION),
    Option("n_workers", None, SOME_COUNT),
    Option("max_groups", None, SOME_COUNT),
    Option("he_model", None, HE_MODEL),
)
"""AutoPolicy's options (`__init__`'s keywords, in order): name, default, rule."""
SETTINGS = (
    Option("net_name", None, Custom("None or a zoo name", accepts=_optional_str)),
    Option("prior_cache", False, Custom("False, True or a path", accepts=_cache_path)),
    Option("cache_key", None, Custom("None or a key string", accepts=_optional_str)),
    Option("n_groups", None, PINNED_GROUPS),
    Option("learning_rate", None, PINNED_LR),
    Option("momentum", None, PINNED_MOMENTUM),
    Option("verbose", 0, VERBOSE),
)
"""What a fit sets on a bound AutoPolicy (`Tuner.for_fit`): the net's zoo name (its published
solver), the prior cache and the job's key in it (`prior_cache=True` of DistributedCNN), the knobs
the user pinned, verbosity."""


class AutoPolicy(Tuner):
    """The default tuner, "auto" (see the module docstring).

    `solver`: Caffe solver settings (`nn.prototxt.read_solver`) whose base_lr and momentum are the
    prior;
    `window`: w, iterations per ramp window (default half an epoch in [32, 64]: shorter windows
    judge a doubling on its first transient);
    `run_iterations`: a training run after the ramp (default half an epoch, at least w);
    `calibration_windows`: windows at the prior's η before the first step (1: progress taken to
    go as the loss level, γ = 1; 2: γ measured); `first_step`: the first step's factor (4; 2 gives
    plain doublings); `first_look`: iterations of
    the first window at a raised η (default w / 2: a rate past the best is undone after half a
    window; a transient gets its second look at full length);
    `lr_search`: "ramp" (the windows above) or "range" (`optimizer.range_test`: η found in-run);
    `trial_fraction`: trials' share of the elapsed time (5%); `plateau_fraction`, `max_drops`,
    `plateau_span` (default four windows or an epoch, the larger), `plateau_patience` (spans in a
    row below the expectation before a drop, 2): the plateau rule;
    `momentum_gain`, `momentum_tolerance`: the momentum feedback;
    `n_workers`, `max_groups`, `he_model`: the groups' candidates and HE model (as the other
    tuners). A fit's settings (`for_fit`): `net_name`, a zoo name for its published solver;
    `prior_cache`, the cache of earlier fits' end configurations (False, the default: none; True:
    the user's cache folder, `prior.cache_home`; a path: that file) and `cache_key`, the job's key
    there (`PriorCache.key`; None: no cache); `n_groups`, `learning_rate`, `momentum` pin a knob;
    `verbose`.

    Examples
    --------
    >>> from dasknn.estimator import DistributedCNN
    >>> from dasknn.optimizer import AutoPolicy
    >>> est = DistributedCNN(tuner=AutoPolicy(window=32))
    >>> est.set_params(tuner__window=16).tuner
    AutoPolicy(window=16)
    """

    name = "auto"
    OPTIONS = OPTIONS
    SETTINGS = SETTINGS

    def __init__(
        self,
        *,
        solver: dict[str, Any] | None = None,
        window: int | None = None,
        run_iterations: int | None = None,
        calibration_windows: int = 1,
        first_step: float = 4.0,
        first_look: int | None = None,
        lr_search: str = "ramp",
        trial_fraction: float = TRIAL_FRACTION,
        plateau_fraction: float = 0.1,
        max_drops: int = 2,
        plateau_span: int | None = None,
        plateau_patience: int = 2,
        momentum_gain: float = 0.1,
        momentum_tolerance: float = 0.05,
        n_workers: int | None = None,
        max_groups: int | None = None,
        he_model: HEModel | None = None,
    ) -> None:
        self.solver, self.window, self.run_iterations = solver, window, run_iterations
        self.calibration_windows, self.first_step = calibration_windows, first_step
        self.first_look, self.lr_search, self.trial_fraction = first_look, lr_search, trial_fraction
        self.plateau_fraction, self.max_drops = plateau_fraction, max_drops
        self.plateau_span, self.plateau_patience = plateau_span, plateau_patience
        self.momentum_gain, self.momentum_tolerance = momentum_gain, momentum_tolerance
        self.n_workers, self.max_groups, self.he_model = n_workers, max_groups, he_model

    # -- the policy (dasknn.policy.Policy) -------------------------------------------------------
    def begin(self, fit, resume: dict[str, Any] | None) -> None:
        """Start on the loop's `fit`: the prior (decision row "start"), or a checkpoint's session."""
        self.fit = fit
        nb = fit.n_batches
        self.w = self.window or max(32, min(64, nb // 2))
        self.look = self.first_look or max(2, self.w // 2)
        self.run_length = max(self.w, self.run_iterations or nb // 2)
        self.span = self.plateau_span or max(4 * self.w, nb)
        self.candidates, self.model = groups_and_model(self)
        self.resuming = resume is not None
        if resume is not None:
            self.s = AutoState.from_dict(resume)
            if self.s.n_workers:
                self.candidates, self.model = at_workers(self, int(self.s.n_workers))
            return
        prior = start_prior(self)
        config = RunConfig(
            prior.n_groups, prior.lr, prior.momentum, fit.weight_decay, fit.batch_size, fit.seed
        )
        cached = prior.source.startswith("the last successful fit")
        ramp = (
            None
            if cached or self.learning_rate is not None
            else LrRamp(
                prior.lr, window=self.w, calibrations=self.calibration_windows, first_factor=self.first_step
            )
        )
        self.s = AutoState(
            phase="ramp" if ramp is not None else "train",
            config=config,
            target_momentum=prior.momentum,
            ramp=None if ramp is None else ramp.to_dict(),
            plateau=None,
            peak_lr=prior.lr,
            checkpoint_epoch=math.floor(fit.snapshot(CURRENT).batches_done / nb),
            eval_loss=start_loss(self.fit),
            n_workers=worker_count(self),
        )
        fit.log.record("auto", "start", config, f"prior: {prior.source}; w = {self.w}", chosen=True)
        start_range(self)

    def next_run(self, last: Outcome | None) -> NextRun | Stop:
        """The next window or trial, judged from what the last one measured; or Stop."""
        s = self.s
        if last is not None:
            self._observe(last)
            if last.stop and not last.diverged:
                s.stopped = "the target or a callback stopped the fit"
        if s.stopped:
            return self._stop(s.stopped)
        if self.fit.log.exhausted():
            return self._stop("budget spent")
        return self._request()

    # -- measuring and deciding ------------------------------------------------------------------
    def _observe(self, last: Outcome) -> None:
        s, log = self.s, self.fit.log
        regroup_on_change(self, last)
        config = s.config
        trace = last.trace
        n = len(trace)
        p, se, level, loss_now = self._measure(last)
        phase = s.phase
        if phase == "ramp":
            return self._observe_ramp(last, config, p, se, level, loss_now)
        if phase == "range":
            return observe_range(self, last, loss_now)
        if last.diverged:  # a training window or a trial the loop rolled back
            return self._observe_diverged(last, config, phase)
        s.last_kept = last.snapshot
        keep_level(self, loss_now, trace)
        rate = p * n / last.seconds if last.seconds > 0 and math.isfinite(p) else math.nan  # per second
        rate_se = se * n / last.seconds if last.seconds > 0 and math.isfinite(se) else 0.0
        tpi = measure.seconds_per_iteration(trace)
        if math.isfinite(tpi) and len(trace):  # what a run costs beyond its iterations (in flight, start-up)
            s.tpi, s.overhead = tpi, max(0.0, last.seconds - len(trace) * tpi)
        if phase == "trial":
            s.explored += last.seconds
            s.trial["progress"], s.trial["progress_se"] = rate, rate_se
            s.phase = "after"
            log.record(
                "explore",
                "trial",
                last.config,
                f"{s.trial['why']}; {rate:.4g}/s",
                run=last.run,
                seconds=last.seconds,
                iterations=n,
                progress=rate,
                exploration=s.explored,
            )
            return
        if phase == "after":
            trial = s.trial
            before = s.before if s.before is not None else math.nan
            noise = trial_noise(trial.get("progress_se", 0.0), s.before_se, rate_se, before)
            adopt, why = decide.judge_trial(trial["progress"], before, rate, noise=noise)
            s.rejected[trial["key"]] = 0 if adopt else s.rejected.get(trial["key"], 0) + 1
            trial_config = RunConfig(**trial["config"])
            log.record(
                "explore",
                "adopt" if adopt else "reject",
                trial_config,
                why,
                chosen=adopt,
                progress=trial["progress"],
            )
            if adopt:
                config = trial_config.with_(momentum=config.momentum)
                s.config = config
                if s.plateau is None or not Plateau.from_dict(s.plateau).drops:
                    s.peak_lr = config.lr  # the cache remembers the rate before any plateau
            s.phase, s.trial = "train", None
        s.before, s.before_se, s.before_n = rate, rate_se, n
        observe_plateau(self, config, p, level, last)
        if s.stopped or isinstance(last.config.momentum, Schedule):
            return  # a restarted run's updates regress to a low total momentum: no feedback on them
        adjust_momentum(self, s.config, trace)

    def _observe_ramp(self, last: Outcome, config: RunConfig, p, se, level, loss_now) -> None:
        """A ramp window judged (`ramp.LrRamp.judge`): η doubled, kept, or the window undone."""
        s, log, n = self.s, self.fit.log, len(last.trace)
        ramp = LrRamp.from_dict(s.ramp)
        before_window, loss_before = s.last_kept or START, s.eval_loss
        blown = last.diverged or not math.isfinite(p)
        step = ramp.judge(p if not last.diverged else -math.inf, se, level, n)
        s.ramp = ramp.to_dict()
        s.restart = step.restore and blown  # the next run leaves the blown window's momentum behind
        s.config = config.with_(lr=step.lr)
        if step.restore and not last.diverged:
            log.kept.discard(last.run)  # the window is undone: its run is not in the model
            s.restore = before_window
        elif not step.restore:
            keep_level(self, loss_now, last.trace)
        if step.undo_look:  # the rate's first window (its loss rose) is undone with the second
            first = s.look
            log.kept.discard(first["run"])
            s.restore = s.last_kept = first["start"]
            s.eval_loss, s.batch_level = first["eval_loss"], None  # the earlier state's level: unknown
        look = ramp.second_look and not step.restore  # a first window kept for a second look
        s.look = {"run": last.run, "start": before_window, "eval_loss": loss_before} if look else None
        log.record(
            "ramp",
            ("rollback" if last.diverged else "undo") if step.restore else "window",
            s.config,  # the decision's: the η the fit goes on with
            step.reason,
            iterations=n,
            seconds=last.seconds,
            run=last.run,
            diverged=bool(last.diverged),
            chosen=True,
        )
        if not step.restore:
            s.last_kept = last.snapshot
        if step.done:
            self._end_ramp(ramp, s.config)

    def _observe_diverged(self, last: Outcome, config: RunConfig, phase: str) -> None:
        """A training window or a trial the loop rolled back: a trial abandoned, else η ÷ 3."""
        s, log = self.s, self.fit.log
        ceiling = s.lr_ceiling
        s.lr_ceiling = last.config.lr if ceiling is None else min(ceiling, last.config.lr)
        if phase == "trial":
            key = s.trial["key"]
            s.rejected[key] = s.rejected.get(key, 0) + 1
            s.phase, s.trial = "train", None
            log.record(
                "explore",
                "abandon",
                last.config,
                "the trial diverged: rolled back",
                diverged=True,
                run=last.run,
                seconds=last.seconds,
            )
        else:
            settled = s.plateau is not None and Plateau.from_dict(s.plateau).reference > 0
            lr, why = decide.back_off(config.lr, settled)
            s.config, s.restart = config.with_(lr=lr), True
            log.record("train", "rollback", s.config, why, diverged=True, run=last.run, chosen=True)

    def _measure(self, last: Outcome) -> tuple[float, float, float, float | None]:
        """(progress per iteration, its standard error, loss level, the evaluation loss after it).

        When the loop evaluated the run (its evaluation at the run's end state scored the tuner's
        fixed training samples, `MEASURED_SAMPLES`), progress is the fall of their log loss over
        the run, and the level their geometric mean: the same samples before and after, so only the
        weights changed (its uncertainty taken from the batch losses' slope, an upper bound).
        Otherwise the slope of the run's batch losses with its standard error
        (`ramp.progress_and_error`). The batch losses alone lag the state: each was computed on
        weights read before the group's last updates, so a window that leaves the weights worse can
        still show falling batch losses; the scored samples see it."""
        trace, n = last.trace, len(last.trace)
        before = self.s.eval_loss
        state = last.state
        measured = measured_loss(self.fit, state)
        if measured is not None and not last.diverged and before is not None and n > 0:
            now = float(measured)
            if not (now > 0 and math.isfinite(now)):
                return -math.inf, 0.0, math.nan, None
            losses = trace["loss"].to_numpy(dtype=float)
            se = progress_and_error(losses)[1] if len(losses) >= 3 else 0.0
            return (math.log(before) - math.log(now)) / n, se, math.sqrt(before * now), now
        losses = trace["loss"].to_numpy(dtype=float) if n else []
        if len(losses) < 2:
            return (math.nan if not last.diverged else -math.inf), 0.0, math.nan, None
        p, se = progress_and_error(losses)
        return p, se, window_level(losses), None

    def _end_ramp(self, ramp: LrRamp, config: RunConfig) -> None:
        s = self.s
        s.phase, s.peak_lr = "train", config.lr
        gamma = ramp.gamma if math.isfinite(ramp.gamma) else ramp.gamma_prior
        s.plateau = new_plateau(self, gamma).to_dict()
        self.fit.log.record(
            "ramp", "end", config, f"η = {config.lr:g} after {ramp.steps} doublings", chosen=True
        )

    # -- requests --------------------------------------------------------------------------------
    def _request(self) -> NextRun:
        s = self.s
        if self.resuming:  # a checkpoint's session: the run that was about to start
            self.resuming = False
            n = s.next
            config, share = RunConfig(**n["config"]), n.get("eval_share")
            return self._run(config, n["iterations"], n["phase"], CURRENT, n["seconds"], eval_share=share)
        config = s.config
        start = s.restore or CURRENT
        s.restore = None
        if s.phase == "range":
            return range_run(self, config, start)
        if s.phase == "ramp":
            ramp = s.ramp
            first_look = ramp["steps"] >= 1 and not ramp["second_look"]
            held = (s.look or {}).get("start")  # the ramp may still restore it
            config = restarted(self, config, start)
            return self._run(config, self.look if first_look else self.w, "ramp", start, hold=held)
        if s.phase == "train" and not s.restart:
            trial = self._trial(config)
            if trial is not None:
                return trial
        config = restarted(self, config, start)
        if s.phase == "train" and getattr(self.fit, "evaluates_in_run", False):
            return watched_run(self, config, start)
        return self._run(config, self.run_length, "train", start)

    def _trial(self, config: RunConfig) -> NextRun | None:
        """A trial when the cap allows one of at least half a window, cut to what is left of it."""
        s, fit = self.s, self.fit
        if s.before is None:
            return None
        # the cap's seconds, less what a run costs beyond its iterations (measured on the last window)
        allowed = trial_seconds(fit.log.elapsed, s.explored, self.trial_fraction) - 1.5 * s.overhead
        tpi = s.tpi
        if not (tpi is not None and allowed >= tpi * self.w / 2):
            return None
        n_trial = min(self.run_length, int(allowed / tpi))
        noise = predicted_noise(s.before_se, s.before_n, n_trial, s.before)
        if not resolvable(noise, s.before):  # it could be adopted only on noise: train instead
            if not s.unresolvable:
                why = (
                    f"no trial: {n_trial} iterations would measure ±{noise:.3g}/s against "
                    f"{s.before:.4g}/s, adoptable only beyond {MAX_TRIAL_GAIN:g}× it"
                    if s.before > 0
                    else f"no trial: no progress to compare one against ({s.before:.4g}/s)"
                )
                fit.log.record("explore", "skip", config, why)
            s.unresolvable = True
            return None
        s.unresolvable = False
        for key, g, lr in neighbours(config.n_groups, config.lr, self.candidates, s.turn, 2.0):
            s.turn += 1
            if s.rejected.get(key, 0) >= 2:
                continue
            if key.startswith("g") and self.n_groups is not None:
                continue
            if key.startswith("lr") and self.learning_rate is not None:
                continue
            if s.lr_ceiling is not None and lr >= s.lr_ceiling:
                continue
            trial = config.with_(n_groups=g, lr=lr)
            why = f"trial {key}: g={g}, η={lr:g} for at most {allowed:.3g} s ({self.trial_fraction:.0%} cap)"
            s.phase, s.trial = "trial", {"key": key, "config": asdict(trial), "why": why}
            return self._run(trial, self.run_length, "explore", CURRENT, seconds=allowed)
        return None

    def _run(
        self,
        config: RunConfig,
        iterations: int,
        phase: str,
        start: str,
        seconds: float | None = None,
        hold: str | None = None,
        eval_share: float | None = None,
    ):
        s, fit = self.s, self.fit
        budget = fit.log.budget(iterations=iterations, seconds=seconds)
        if budget is None:
            budget = Budget(iterations=1)  # never reached: next_run stops on an exhausted log first
        s.next = {"config": asdict(config), "iterations": iterations, "phase": phase, "seconds": seconds}
        if eval_share is not None:  # a watched run (`watched_run`)
            s.next["eval_share"] = eval_share
        checkpoint = None
        epoch = math.floor(fit.snapshot(start).batches_done / fit.n_batches)
        # no checkpoint while an older snapshot is held: a resumed loop would not have it
        may_save = getattr(fit, "checkpoints", False) and start == CURRENT and hold is None
        if may_save and epoch > s.checkpoint_epoch:
            s.checkpoint_epoch = epoch
            checkpoint = s.to_dict()
        return NextRun(
            config,
            budget,
            start=start,
            phase=phase,
            checkpoint=checkpoint,
            note={"lr": config.lr, "event": ""},
            loss_limit=True,  # a window that blows the loss up is rolled back, never kept (fitting.py)
            diverges=spike_rule(self),
            hold=hold,
            eval_share=eval_share,
        )

    def _stop(self, why: str) -> Stop:
        s = self.s
        config = s.config
        self.fit.log.record("auto", "stop", config, f"{why}; exploration {s.explored:.3g} s")
        if not why.startswith("budget") or s.phase != "ramp":
            remember(self, config)
        return Stop(why, config, session={**s.to_dict(), "finished": True})

    # -- set-up ----------------------------------------------------------------------------------


def watched_run(policy: AutoPolicy, config: RunConfig, start: str) -> NextRun:
    """A training run evaluated beside its groups while it trains (`dasknn.in_run`, at the
    loop's bounded share): as long as the fit's clock so far, at least `run_length` iterations'
    worth, to the epoch's end when the fit writes checkpoints. Its end is the next decision
    (plateau, momentum, a trial); the target is seen while it trains."""
    s, fit = policy.s, policy.fit
    tpi = s.tpi if s.tpi is not None and math.isfinite(s.tpi) else 0.0
    seconds = max(policy.run_length * tpi, fit.log.elapsed)
    iterations = None
    if getattr(fit, "checkpoints", False):
        iterations = fit.n_batches - fit.snapshot(CURRENT).batches_done % fit.n_batches
    return policy._run(config, iterations, "train", start, seconds=seconds, eval_share=EVAL_SHARE)


def start_range(policy: AutoPolicy) -> None:
    """With `lr_search="range"`, the ramp's windows give way to the range test (`optimizer.range_test`):
    segments of w iterations each raising η × 4 along a geometric schedule, from the prior's η."""
    s = policy.s
    if policy.lr_search != "range" or s.phase != "ramp":
        return
    test = RangeTest(s.config.lr, length=policy.w)
    s.phase, s.ramp, s.range = "range", None, test.to_dict()


def range_run(policy: AutoPolicy, config: RunConfig, start: str) -> NextRun:
    """The range test's next segment: one run of w iterations whose η ramps geometrically from the
    test's η, at the fit's iteration index (the schedule counts updates over the whole fit)."""
    test = RangeTest.from_dict(policy.s.range)
    begin = policy.fit.snapshot(start).iterations_done
    ramp = Schedule.geometric(test.lr, test.end_lr, test.length, begin=begin)
    run = policy._run(config.with_(lr=ramp), test.length, "ramp", start)
    return replace(run, note={"lr": test.end_lr, "event": ""})


def observe_range(policy: AutoPolicy, last: Outcome, loss_now: float | None) -> None:
    """A range-test segment judged from its batch losses (`RangeTest.observe`): ramp on, or η
    chosen; a segment that blew the loss up (or that the loop rolled back) is undone."""
    s, log = policy.s, policy.fit.log
    test = RangeTest.from_dict(s.range)
    trace = last.trace.sort_values("iteration", kind="stable") if len(last.trace) else last.trace
    lrs = [float(v) for v in trace["lr"]] if len(trace) else []
    losses = [float(v) for v in trace["loss"]] if len(trace) else []
    if last.diverged:  # rolled back by the loop's loss limit: a blow-up whatever the batch losses say
        lrs, losses = [*lrs, test.end_lr], [*losses, math.inf]
    verdict = test.observe(lrs, losses)
    s.range, s.restart = test.to_dict(), verdict.restore  # the next run leaves its momentum behind
    s.config = s.config.with_(lr=verdict.lr)
    if verdict.restore and not last.diverged:
        log.kept.discard(last.run)  # the segment is undone: its run is not in the model
        s.restore = s.last_kept or START
    elif not verdict.restore:
        s.last_kept = last.snapshot
        keep_level(policy, loss_now, trace)
    action = ("rollback" if last.diverged else "undo") if verdict.restore else "segment"
    log.record(
        "range", action, s.config, verdict.reason, iterations=len(trace),
        seconds=last.seconds, run=last.run, diverged=bool(last.diverged), chosen=True,
    )  # fmt: skip
    if verdict.done:
        s.phase, s.peak_lr = "train", verdict.lr
        s.plateau = new_plateau(policy).to_dict()
        log.record("range", "end", s.config, f"η = {verdict.lr:g}", chosen=True)


def restarted(policy: AutoPolicy, config: RunConfig, start: str) -> RunConfig:
    """`config`, with momentum restarted when the run follows one that blew the loss up
    (`AutoState.restart`): µ = 0 for the run's first update, which drops the momentum buffers the
    start state carries (built on the way to the blow-up, at a rate on the edge), then µ
    (`decide.back_off`: adaptive restart)."""
    s = policy.s
    if not s.restart:
        return config
    s.restart = False
    begin = policy.fit.snapshot(start).iterations_done
    return config.with_(momentum=Schedule.steps_of(0.0, {begin + 1: float(config.momentum)}))


def new_plateau(policy: AutoPolicy, gamma: float = 1.0) -> Plateau:
    """The plateau rule at the ramp's γ (without a ramp, a cached or pinned η: γ = 1, the ramp's
    prior)."""
    return Plateau(
        span=policy.span,
        fraction=policy.plateau_fraction,
        max_drops=policy.max_drops,
        gamma=gamma,
        patience=policy.plateau_patience,
    )


def observe_plateau(policy: AutoPolicy, config: RunConfig, p: float, level: float, last: Outcome) -> None:
    """Feed a kept training window to the plateau rule: η ÷ its factor on a plateau (unless η is
    pinned), the fit's end on convergence."""
    s = policy.s
    rule = new_plateau(policy) if s.plateau is None else Plateau.from_dict(s.plateau)
    step = rule.observe(p, len(last.trace), held_out(policy.fit), level)
    s.plateau = rule.to_dict()
    if step.action == "drop" and policy.learning_rate is None:
        s.config = config.with_(lr=config.lr / rule.factor)
        policy.fit.log.record("train", "plateau", s.config, step.reason, chosen=True, run=last.run)
    elif step.action == "stop":
        s.stopped = f"converged: {step.reason}"


def adjust_momentum(policy: AutoPolicy, config: RunConfig, trace: pd.DataFrame) -> None:
    """µ after a training window (unless pinned): YellowFin's feedback on the total momentum
    regressed from the trace's sampled conv updates, toward the prior's µ. At g = 1 one synchronous
    group has no implicit momentum and the total is µ itself (Omnivore §IV-B): a regressed total only
    adds its noise and bias (it read low at g = 1 on CIFAR-10 quick, so every reading raised µ), so
    µ is set to the target there."""
    if policy.momentum is not None:
        return
    s, log = policy.s, policy.fit.log
    if config.n_groups == 1:
        if config.momentum != s.target_momentum:
            s.config = config.with_(momentum=s.target_momentum)
            why = f"g = 1: no asynchrony, the total momentum is µ: µ {config.momentum:g} -> target"
            log.record("train", "momentum", s.config, why, chosen=True)
        return
    measured = trace_momentum(trace)
    mu, why = decide.steer_momentum(
        config.momentum, measured, s.target_momentum, policy.momentum_gain, policy.momentum_tolerance
    )
    if mu != config.momentum:
        s.config = config.with_(momentum=mu)
        log.record("train", "momentum", s.config, why, chosen=True, total_momentum=measured)


def regroup_on_change(policy: AutoPolicy, last: Outcome) -> None:
    """g decided again when the run ended on another number of conv workers (`decide.regroup`):
    the cluster grew or shrank under it. A trial under way is abandoned (A-B-A compares runs
    on one cluster)."""
    s, log = policy.s, policy.fit.log
    n, before = measure.workers_at_end(last.trace), s.n_workers
    if n is None or before is None or n == before:
        return
    policy.candidates, policy.model = at_workers(policy, n)
    config = s.config
    he = {g: policy.model.he(g) for g in policy.candidates}
    g, why = decide.regroup(he, n, before, config.n_groups, policy.n_groups)
    s.n_workers, s.config = n, config.with_(n_groups=g)
    if s.phase in ("trial", "after"):
        trial = RunConfig(**s.trial["config"])
        log.record("explore", "abandon", trial, "the cluster changed during the trial")
        s.phase, s.trial, s.before = "train", None, None
    log.record("cluster", "regroup", s.config, why, chosen=True, n_workers=n, run=last.run)


def worker_count(policy: AutoPolicy) -> int | None:
    """The conv workers N at the fit's start: given, the HE model's, else the engine's count."""
    engine = policy.fit.engine
    n = policy.n_workers or (policy.he_model.n_workers if policy.he_model else None)
    if n is None and callable(getattr(engine, "conv_worker_count", None)):
        n = engine.conv_worker_count()
    return n or getattr(engine, "n_workers", None)


def at_workers(policy: AutoPolicy, n: int) -> tuple[list[int], HEModel]:
    """The g a fit may use and the HE model once the cluster has `n` conv workers."""
    candidates = group_candidates(n, policy.max_groups or n)
    return [g for g in candidates if g <= n] or [1], replace(policy.model, n_workers=int(n))


def groups_and_model(policy: AutoPolicy) -> tuple[list[int], HEModel]:
    """The g a fit may use and the HE model: given, the simulated engine's timing, else the FLOP split."""
    fit = policy.fit
    engine = fit.engine
    n = worker_count(policy)
    candidates = group_candidates(n, policy.max_groups or n or 1)
    model = policy.he_model
    timing = getattr(engine, "timing", None)
    if model is None and isinstance(timing, HEModel):
        model = timing
    if model is None:
        model = HEModel.estimate(
            fit.net, fit.batch_size, n or 1, device_gflops=1.0, bandwidth_bytes_per_s=1e15
        )
    return [g for g in candidates if g <= model.n_workers] or [1], model


def prior_cache(policy: AutoPolicy) -> PriorCache | None:
    """The policy's prior cache, None when it is off or the job has no key."""
    if policy.prior_cache is False or policy.cache_key is None:
        return None
    path = default_cache_path() if policy.prior_cache is True else policy.prior_cache
    return None if path is None else PriorCache(path)


def start_prior(policy: AutoPolicy) -> Prior:
    """Where the fit starts: the cache's entry for this job, else the HE model and the solver."""
    cache = prior_cache(policy)
    cached = cache.get(policy.cache_key) if cache is not None else None
    if (
        cached is not None
        and policy.n_groups is None
        and policy.learning_rate is None
        and policy.momentum is None
    ):
        if cached.n_groups in policy.candidates:
            return cached
    g, g_why = groups_prior(policy.model, policy.candidates)
    if policy.n_groups is not None:
        g, g_why = policy.n_groups, f"n_groups = {policy.n_groups} given"
    lr, mu, source = solver_prior(policy.net_name or policy.fit.net, policy.solver)
    lr = policy.learning_rate or lr
    mu = mu if policy.momentum is None else policy.momentum
    return Prior(g, lr, mu, f"{g_why}; η, µ from {source}")


def remember(policy: AutoPolicy, config: RunConfig) -> None:
    """The configuration this fit reached (the ramp's peak η), for the next fit of the same job."""
    cache = prior_cache(policy)
    if cache is None:
        return
    try:
        cache.put(policy.cache_key, config.n_groups, policy.s.peak_lr, config.momentum)
    except OSError as err:  # a read-only cache folder costs the next fit its prior, not this fit
        policy.fit.log.record("auto", "cache", config, f"prior cache not written: {err}")


def spike_span(fit) -> int:
    """Batches a spike's mean spans: `decide.SPIKE_SAMPLES` samples, at least 3 batches."""
    return max(3, math.ceil(decide.SPIKE_SAMPLES / max(1, getattr(fit, "batch_size", 1))))


def keep_level(policy: AutoPolicy, loss_now: float | None, trace: pd.DataFrame) -> None:
    """A kept run's levels, which the next run's spike rule starts from: the tuner's samples' loss
    (`eval_loss`) and the mean of its last span of batch losses (`batch_level`, the trained
    weights' own level, which weight averaging's evaluations do not see)."""
    s = policy.s
    s.eval_loss = loss_now
    losses = trace.sort_values("iteration", kind="stable")["loss"].to_numpy(dtype=float) if len(trace) else []
    tail = [v for v in losses[-spike_span(policy.fit) :] if math.isfinite(v)]
    s.batch_level = sum(tail) / len(tail) if tail else None


def spike_rule(policy: AutoPolicy) -> Callable[[pd.DataFrame, float], bool]:
    """The run's own divergence rule (`NextRun.diverges`, `decide.spiked`): batch losses, averaged
    over `decide.SPIKE_SAMPLES` samples (at least 3 batches), above twice the level the run starts
    from and above ln(n_classes). The level is the highest of the tuner's samples' loss before the
    run, the mean of the last span of batch losses of the run it goes on from (`keep_level`), and
    its own first batch loss. The batch levels count because with weight averaging the samples
    score the average, while the batches run on the trained weights, noisier and higher: judged
    against the average's low loss, a run whose batches went on at their own level counted as a
    spike. The first batch counts for a run that starts from trained weights already at uniform
    guessing's loss (killed by the last update of the run before, unseen): it sits there, and
    every retry from that state would count as a spike, down to the loop's limit on rollbacks. A
    window at 2η that kills the net (the loss jumps in one update, then sits at uniform guessing's
    with the ReLUs dead) ends below the loop's end-of-run limit; kept, it left the ramp at the
    previous η with the dead net's momentum, and every later run at chance (experiments/README.md,
    bench_suite)."""
    before, level, fit = policy.s.eval_loss, policy.s.batch_level, policy.fit
    floor = getattr(fit, "chance_loss", math.inf)
    span = spike_span(fit)

    def diverges(seg: pd.DataFrame, score: float) -> bool:
        if not len(seg):
            return False
        first = float(seg["loss"].iloc[0])
        levels = [v for v in (before, level, first) if v is not None and math.isfinite(v)]
        if not levels:
            return False  # non-finite losses are the loop's own rule
        reference = max(levels)
        return decide.spiked(seg["loss"].to_numpy(dtype=float), reference, floor, span=span)

    return diverges


def held_out(fit) -> float | None:
    """The last evaluation's held-out accuracy (else the training accuracy), None before any."""
    history = getattr(fit, "history", None) or []
    if not history:
        return None
    row = history[-1]
    return row.get("val_accuracy", row.get("accuracy"))


def measured_loss(fit, state) -> float | None:
    """The loss of `state` on the tuner's fixed training samples, scored by the loop's last
    evaluation (`fitting.TrainingFigures.measured_loss`); None when it did not score them then."""
    figures = getattr(fit, "figures", None)
    return None if figures is None or state is None else figures.measured_loss(state)


def start_loss(fit) -> float | None:
    """The tuner's samples' loss of the starting state (the loop's start row), None without one."""
    value = measured_loss(fit, fit.snapshot(CURRENT))
    if value is None:
        return None
    value = float(value)
    return value if value > 0 and math.isfinite(value) else None
