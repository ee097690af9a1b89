"""The pieces of Omnivore's optimizer search: probes, their scores, the grid, the HE model from probes.

Omnivore §V-B (Algorithm 1) and appendix E. A probe is one short engine run of a
configuration from a checkpoint; its score is the smoothed loss at its end (the trailing mean of
the last 10 logged losses, `tradeoff.statistical.final_loss`, as in the reference implementation),
or, with a `SelectionLoss` scorer, the loss of its end weights on the selection part (samples set
aside from training): every probe is then judged on the same images, so the batch noise of
20-iteration probes does not pick the winner.
The loop (`dasknn.fitting.Loop`) makes the runs a `Prober` asks for and keeps the time account
(`dasknn.policy.RunLog`): each run is charged its span in the engine's clock (its wall-clock time
on a real cluster, start-up included), so the fit's trace counts the search.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.optimizer.options import SOME_COUNT, SOME_POSITIVE
from dasknn.policy import CURRENT, DECISION_COLUMNS, NextRun, Outcome, RunLog
from dasknn.rules import Option, checked_options
from dasknn.tradeoff.hardware import HEModel, phase_costs, time_per_iteration
from dasknn.tradeoff.statistical import final_loss

__all__ = [
    "DECISION_COLUMNS",
    "Judge",
    "Probe",
    "Prober",
    "Runs",
    "SelectionLoss",
    "Snapshots",
    "check",
    "check_optimize_args",
    "clear_winner",
    "group_candidates",
    "he_model_from_probe",
    "initial_groups",
    "mark_winner",
    "momentum_lr_grid",
    "record_probe",
    "state_hash",
]


# -- option checks ---------------------------------------------------------------------------------
def check(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless ok: the tuners' checks beyond their tables' rules (unknown
    names, an engine without `run`, options that must agree)."""
    if not ok:
        raise ValueError(message)


OPTIMIZE_LIMITS = (
    Option("time_budget", None, SOME_POSITIVE),
    Option("max_epochs", None, SOME_COUNT),
    Option("max_iterations", None, SOME_COUNT),
)
"""The budgets of a tuner's `optimize` (in the engine's clock; train epochs; updates, probes included)."""


def check_optimize_args(
    unknown: dict[str, Any], time_budget, max_epochs, max_iterations, should_stop, start
) -> dict[str, Any]:
    """The checks every optimizer's `optimize` makes of its arguments; returns the budgets
    {"time_budget", "max_epochs", "max_iterations"} checked (at least one given)."""
    check(not unknown, f"unknown option(s) {sorted(unknown)} for optimize")
    given = {"time_budget": time_budget, "max_epochs": max_epochs, "max_iterations": max_iterations}
    limits = checked_options(OPTIMIZE_LIMITS, given)
    check(
        any(v is not None for v in limits.values()),
        "give time_budget, max_epochs or max_iterations: should_stop alone may never stop",
    )
    check(should_stop is None or callable(should_stop), f"should_stop must be callable; got {should_stop!r}")
    check(start is None or isinstance(start, TrainState), f"start must be a TrainState; got {start!r}")
    return limits


# -- probes ----------------------------------------------------------------------------------------
def state_hash(state: TrainState) -> str:
    """A short digest of a state's weights and momentum buffers: equal digests, equal starts."""
    h = hashlib.sha1()
    for group in (state.params, state.momentum):
        for key in sorted(group):
            h.update(key.encode())
            h.update(np.ascontiguousarray(group[key]).tobytes())
    return h.hexdigest()[:12]


Judge = Callable[[pd.DataFrame, RunConfig], Sequence[float]]
"""Per-iteration losses a probe is judged by, from its trace and config (default: the `loss` column)."""


class SelectionLoss:
    """A probe score: the mean loss of a state's weights on the selection part (test mode).

    Probes judged by their last training losses see different batches, and at 20 iterations the
    batch noise can exceed the difference between configurations; a fixed sample removes that
    noise from the comparison. The samples are never trained on, and are not the validation data
    that held-out accuracy is reported on (`dasknn.data.split`), so no choice is made on those.
    `n_samples` lets the optimizer charge the forward passes to a simulated clock. `statistics`:
    what recomputes a BatchNorm net's running statistics for the weights it scores
    (`nn.scoring.Statistics`, shared with the fit's held-out scores), else they are scored as held."""

    def __init__(self, net, X, y, batch_size: int = 256, statistics=None) -> None:
        X, y = np.asarray(X), np.asarray(y)
        check(
            X.ndim >= 2 and len(X) == len(y) and len(y) > 0,
            f"SelectionLoss needs matching X, y; got {X.shape}, {y.shape}",
        )
        self.net, self.X, self.y, self.batch_size = net.copy(), X, y, int(batch_size)
        self.n_samples, self.statistics = len(y), statistics

    def __call__(self, state: TrainState) -> float:
        from dasknn.nn.train import evaluate

        self.net.set_params(state.params if self.statistics is None else self.statistics(state.params))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            loss, _ = evaluate(self.net, self.X, self.y, self.batch_size)
        return float(loss) if math.isfinite(loss) else math.inf


@dataclass
class Probe:
    """A configuration run from a checkpoint (and possibly extended): its trace and end state."""

    config: RunConfig
    start_hash: str
    phase: str = "search"
    judge: Judge | None = None
    trace: pd.DataFrame = field(default_factory=pd.DataFrame)
    state: TrainState | None = None
    diverged: bool = False
    runs: list[int] = field(default_factory=list)
    selection_loss: float | None = None  # the probe_score of its end state, when the optimizer has one

    def losses(self) -> np.ndarray:
        if self.diverged or len(self.trace) == 0:
            return np.array([math.inf])
        if self.judge is None:
            return self.trace["loss"].to_numpy(dtype=float)
        return np.asarray(self.judge(self.trace, self.config), dtype=float)

    @property
    def score(self) -> float:
        """The selection loss of the end state when scored, else the smoothed training loss at the end
        (mean of the last 10 losses); +inf if diverged or empty."""
        if self.selection_loss is not None and not self.diverged:
            return self.selection_loss
        value = final_loss(self.losses())
        return value if math.isfinite(value) else math.inf

    def judged(self, window: int) -> float:
        """What the clear-winner test compares: the selection loss, else `window_loss(window)`."""
        if self.selection_loss is not None and not self.diverged:
            return self.selection_loss
        return self.window_loss(window)

    def window_loss(self, window: int) -> float:
        """Mean loss over the last `window` iterations (the clear-winner test); +inf if diverged."""
        value = float(self.losses()[-int(window) :].mean())
        return value if math.isfinite(value) else math.inf


def momentum_lr_grid(
    lr_last: float, momentum_last: float, momentum_grid: Sequence[float]
) -> list[tuple[float, float]]:
    """(momentum, lr) pairs: µ ∈ grid × η ∈ {η*_last, η*_last/10}, no µ > µ*_last at η*_last.

    Omnivore appendix E-D: the pruning rule, "as the run progresses, the optimal total
    momentum decreases".
    """
    pairs = [(float(m), float(lr_last)) for m in momentum_grid if m <= momentum_last + 1e-12]
    return pairs + [(float(m), float(lr_last) / 10) for m in momentum_grid]


def clear_winner(probes: Sequence[Probe], threshold: float, window: int) -> tuple[Probe, list[Probe]]:
    """The lowest-score probe and those it does not clearly beat (Omnivore appendix E-D).

    The winner is clear when its mean loss over the last `window` iterations (its selection loss
    when scored) is at least `threshold` (5%) below every other finite probe's; the others are
    returned as tied.
    """
    winner = min(probes, key=lambda p: p.score)
    best = winner.judged(window)
    tied = [
        p
        for p in probes
        if p is not winner and math.isfinite(p.judged(window)) and best > (1 - threshold) * p.judged(window)
    ]
    return winner, tied


def group_candidates(n_workers: int | None, max_groups: int) -> list[int]:
    """The g the optimizer may use: divisors of N up to max_groups, then N·2^j up to max_groups
    (groups sharing workers); powers of two up to max_groups when N is unknown."""
    if n_workers is None:
        return [2**j for j in range(int(math.log2(max_groups)) + 1)]
    out = [g for g in range(1, min(n_workers, max_groups) + 1) if n_workers % g == 0]
    g = 2 * n_workers
    while g <= max_groups:
        out.append(g)
        g *= 2
    return out


def he_model_from_probe(
    trace: pd.DataFrame, net, batch_size: int, n_workers: int | None
) -> tuple[HEModel, str]:
    """The HE model from a g = 1 probe: time per iteration = t_conv(N) + t_fc (Omnivore §IV-B, appendix D-D).

    t_fc is the engine's own (a `t_fc` trace column's mean, else `attrs["t_fc"]`), else split off by
    the FLOP fractions of `phase_costs` (conv on N devices, FC on one, same speed). One measurement
    cannot separate the conv network time, so T_nc = 0 (compute-bound conv). N unknown: N = 1.
    """
    n = 1 if n_workers is None else int(n_workers)
    tpi = time_per_iteration(trace)
    if not (math.isfinite(tpi) and tpi > 0):
        raise ValueError(f"cannot build an HE model: time per iteration at g = 1 is {tpi}")
    if "t_fc" in trace.columns:
        t_fc, source = float(trace["t_fc"].mean()), "the trace's t_fc column"
    elif "t_fc" in trace.attrs:
        t_fc, source = float(trace.attrs["t_fc"]), "the engine's t_fc"
    else:
        c = phase_costs(net, batch_size)
        t_fc = tpi * c["fc_flops"] / (c["conv_flops"] / n + c["fc_flops"])
        source = "the FLOP split of phase_costs"
    t_conv = max(tpi - t_fc, 0.0)
    model = HEModel(T_cc=t_conv * n, T_nc=0.0, t_fc=min(t_fc, tpi), n_workers=n)
    return model, f"time per iteration at g=1 {tpi:.4g}; t_fc {model.t_fc:.4g} from {source}"


def initial_groups(model: HEModel, candidates: Sequence[int], fixed_workers: bool) -> tuple[int, str]:
    """The smallest candidate g that saturates the FC server, else the largest (Omnivore §V-B).

    `fixed_workers`: the N devices are split into g groups (k = N // g); otherwise each group has
    its own device (t_conv does not change with g).
    """
    for g in candidates:
        if fixed_workers and g > model.n_workers:
            break
        t_conv = model.t_conv(model.group_size(g) if fixed_workers else 1)
        if t_conv + model.t_fc < g * model.t_fc:
            return (
                g,
                f"smallest g saturating the FC server: t_conv + t_fc = {t_conv + model.t_fc:.4g} < g·t_fc",
            )
    return max(candidates), "the FC server never saturates: start at the largest g (Algorithm 1, g = CG)"


def record_probe(
    log: RunLog, action: str, probe: Probe, reason: str, window: int, start_hash: str = ""
) -> None:
    """A probe's decision row: its score, window loss, iterations, charge and run."""
    log.record(
        probe.phase,
        action,
        probe.config,
        reason,
        score=probe.score,
        window_loss=probe.window_loss(window),
        iterations=len(probe.trace),
        seconds=log.charged[probe.runs[-1]],
        diverged=probe.diverged,
        start_hash=start_hash or probe.start_hash,
        run=probe.runs[-1],
    )


def mark_winner(log: RunLog, probe: Probe) -> None:
    """Flag the winning probe's rows; its runs stay on the model's path (`kept` in the trace)."""
    log.kept.update(probe.runs)
    for row in log.rows:
        if row["run"] in probe.runs:
            row["chosen"] = True


Runs = Generator[NextRun, Outcome, Any]
"""A policy's steps as a generator: it yields the runs it asks for and is sent what they measured."""


class Snapshots:
    """The policy's side of named snapshots: the states the loop handed back, by name, so that a
    step can ask to start from a state it holds (`name`)."""

    def __init__(self) -> None:
        self.names: dict[str, TrainState] = {}

    def name(self, state: TrainState) -> str:
        """The snapshot name of `state` (a state the loop handed back), else the current state."""
        return next((n for n, s in self.names.items() if s is state), CURRENT)

    def seen(self, out: Outcome) -> None:
        """Remember a run's end state; after a kept run the older snapshots are gone (the loop's rule)."""
        if out.request.keep and not out.diverged:
            self.names = {n: s for n, s in self.names.items() if s is out.start_state}
        if out.state is not None:
            self.names[out.snapshot] = out.state


@dataclass
class Prober:
    """Runs probes from a checkpoint and picks the winner (Omnivore appendix E-D)."""

    log: RunLog
    length: Callable[[int], tuple[int | None, float | None]]
    threshold: float = 0.05
    window: int = 50
    max_extensions: int = 1
    judge: Judge | None = None
    scored: bool = False
    snapshots: Snapshots = field(default_factory=Snapshots)

    def run(
        self, config: RunConfig, budget: Budget, start: TrainState, phase: str, keep: bool = False
    ) -> Runs:
        """Ask the loop for one run of `config` from `start`; returns its `Outcome`."""
        request = NextRun(
            config,
            budget,
            start=self.snapshots.name(start),
            keep=keep,
            phase=phase,
            score=self.scored and not keep,
        )
        out = yield request
        self.snapshots.seen(out)
        return out

    def probe(self, config: RunConfig, start: TrainState, phase: str, reason: str, repeats: int = 1) -> Runs:
        """`config` from `start` for `repeats` probe lengths; None if the budget is spent."""
        iterations, seconds = self.length(config.n_groups)
        budget = self.log.budget(iterations and iterations * repeats, seconds and seconds * repeats)
        if budget is None:
            return None
        p = Probe(config, state_hash(start), phase, self.judge)
        yield from self.advance(p, start, budget)
        record_probe(self.log, "probe", p, reason, self.window)
        return p

    def grid(
        self,
        config: RunConfig,
        points: Sequence[tuple[float, float]],
        start: TrainState,
        phase: str,
        label: str = "",
        early_stop: bool = False,
    ) -> Runs:
        """Probe `config` at each (momentum, lr) of `points` from `start`; stops when the budget does.

        `early_stop`: each rate's momenta run from the highest down and stop at the first one whose
        score is worse than the one before (the cold start's rule for η, applied to µ); a "skip"
        decision row names the momenta left out."""
        order = list(points)
        if early_stop:
            by_lr: dict[float, list[float]] = {}
            for m, lr in points:
                by_lr.setdefault(lr, []).append(m)
            order = [(m, lr) for lr, ms in by_lr.items() for m in sorted(ms, reverse=True)]
        probes: list[Probe] = []
        prev: Probe | None = None
        skipped: set[float] = set()
        for i, (momentum, lr) in enumerate(order):
            if lr in skipped:
                continue
            c = config.with_(lr=lr, momentum=momentum)
            p = yield from self.probe(c, start, phase, f"{label}grid point {i + 1} of {len(order)}")
            if p is None:
                break
            probes.append(p)
            # worse than a finite predecessor; after a diverged one a lower momentum may still converge
            worse = (
                prev is not None
                and prev.config.lr == lr
                and not prev.diverged
                and (p.diverged or p.score > prev.score)
            )
            if early_stop and worse:
                skipped.add(lr)
                rest = [m for m, r in order[i + 1 :] if r == lr]
                if rest:
                    why = (
                        f"µ={momentum:g} is worse than µ={prev.config.momentum:g} at lr={lr:g}: "
                        f"not probed: µ={', '.join(f'{m:g}' for m in rest)}"
                    )
                    self.log.record(phase, "skip", c, why, score=p.score)
            prev = p
        return probes

    def extend(self, p: Probe) -> Runs:
        """Run a probe one probe length further from its own end state."""
        budget = self.log.budget(*self.length(p.config.n_groups))
        if budget is None or p.diverged or p.state is None:
            return
        start_hash = state_hash(p.state)
        yield from self.advance(p, p.state, budget)
        record_probe(self.log, "extend", p, "no clear winner: probe longer", self.window, start_hash)

    def advance(self, p: Probe, start: TrainState, budget: Budget) -> Runs:
        """Run the probe on from `start`; the loop scores its end state when probes are scored."""
        out = yield from self.run(p.config, budget, start, p.phase)
        p.trace = out.trace if not len(p.trace) else pd.concat([p.trace, out.trace], ignore_index=True)
        p.state = out.state
        p.diverged = p.diverged or out.diverged
        p.runs.append(out.run)
        if self.scored and not p.diverged and p.state is not None:
            p.selection_loss = out.score

    def pick(self, probes: list[Probe]) -> Runs:
        """The lowest score; tied probes run longer, up to `max_extensions` times.

        Returns (winner, probe lengths it ran, why).
        """
        winner, tied = clear_winner(probes, self.threshold, self.window)
        extensions = 0
        while tied and extensions < self.max_extensions:
            for p in [winner, *tied]:
                yield from self.extend(p)
            extensions += 1
            winner, tied = clear_winner([winner, *tied], self.threshold, self.window)
        if tied:
            return winner, 1 + extensions, f"no clear winner after {extensions} extension(s): lowest score"
        over = "on the selection loss" if self.scored else f"over {self.window} iterations"
        return winner, 1 + extensions, f"clear winner ({self.threshold:.0%} {over})"
