"""The pieces of Omnivore's optimizer search: probes, their scores, the grid, the HE model from probes.

Omnivore §V-B (Algorithm 1) and appendix E. A probe is one short engine run of a
configuration from a checkpoint; its score is the smoothed loss at its end (the trailing mean of
the last 10 logged losses, `tradeoff.statistical.final_loss`, as in the reference implementation),
or, with a `SelectionLoss` scorer, the loss of its end weights on the selection part (samples set
aside from training): every probe is then judged on the same images, so the batch noise of
20-iteration probes does not pick the winner.
`SearchLog` keeps the time account: each run is charged its span in the engine's clock (its
wall-clock time on a real cluster, start-up included), so the returned trace counts the search.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dasknn.engine.checkpoint import healthy
from dasknn.engine.trace import Budget, RunConfig, TrainState, make_trace
from dasknn.tradeoff.hardware import HEModel, phase_costs, time_per_iteration
from dasknn.tradeoff.statistical import final_loss

__all__ = [
    "DECISION_COLUMNS",
    "Judge",
    "Probe",
    "Prober",
    "SearchLog",
    "SelectionLoss",
    "check",
    "check_optimize_args",
    "check_values",
    "clear_winner",
    "float_option",
    "group_candidates",
    "he_model_from_probe",
    "initial_groups",
    "int_option",
    "momentum_lr_grid",
    "state_hash",
]

TIME_RESOLUTION = 1e-9
"""The fraction of a time budget below which what is left of it counts as spent."""

DECISION_COLUMNS = tuple(
    "phase action n_groups lr momentum score window_loss iterations seconds time diverged chosen "
    "start_hash run reason".split()
)
"""One row per probe or decision. `score`: smoothed loss at the probe's end, or the selection loss
of its end weights when the optimizer has a `probe_score`; `window_loss`: mean training loss over
its last `winner_window` iterations; `iterations`: the probe's so far (a train epoch's);
`seconds`: time charged to the row's engine run (probe and extend rows add up to the search time);
`time`: the optimizer's clock after it; `chosen`: the winning probe, or a decision that sets the
training config (whose n_groups, lr, momentum it then holds); `start_hash`: digest of the state the
row's run started from; `run`: the engine run's index in the trace's `run` column(-1 for decisions)."""


# -- option checks ---------------------------------------------------------------------------------
def check(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless ok: the one gate for the optimizer's options."""
    if not ok:
        raise ValueError(message)


def check_values(
    values: Sequence[float], name: str, ok: Callable[[float], bool], rule: str
) -> tuple[float, ...]:
    """A non-empty grid of finite values that each satisfy `ok` (described by `rule`), as floats."""
    values = tuple(float(v) for v in values)
    check(len(values) > 0, f"{name} must not be empty")
    bad = [v for v in values if not (math.isfinite(v) and ok(v))]
    check(not bad, f"{name} values must be {rule}; got {bad}")
    return values


def int_option(value: Any, name: str, minimum: int = 1) -> int | None:
    """None, or an integer >= minimum."""
    if value is None:
        return None
    check(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        f"{name} must be an integer >= {minimum} or None; got {value!r}",
    )
    return int(value)


def float_option(value: Any, name: str) -> float | None:
    """None, or a finite number > 0."""
    if value is None:
        return None
    check(
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0,
        f"{name} must be a finite number > 0 or None; got {value!r}",
    )
    return float(value)


# -- probes ----------------------------------------------------------------------------------------
def check_optimize_args(
    unknown: dict[str, Any], time_budget, max_epochs, max_iterations, should_stop, start, on_epoch
) -> dict[str, Any]:
    """The checks every optimizer's `optimize` makes of its arguments; returns the budgets
    {"time_budget", "max_epochs", "max_iterations"} checked (at least one given)."""
    check(not unknown, f"unknown option(s) {sorted(unknown)} for optimize")
    limits = {
        "time_budget": float_option(time_budget, "time_budget"),
        "max_epochs": int_option(max_epochs, "max_epochs"),
        "max_iterations": int_option(max_iterations, "max_iterations"),
    }
    check(
        any(v is not None for v in limits.values()),
        "give time_budget, max_epochs or max_iterations: should_stop alone may never stop",
    )
    check(should_stop is None or callable(should_stop), f"should_stop must be callable; got {should_stop!r}")
    check(start is None or isinstance(start, TrainState), f"start must be a TrainState; got {start!r}")
    check(on_epoch is None or callable(on_epoch), f"on_epoch must be callable; got {on_epoch!r}")
    return limits


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
    `n_samples` lets the optimizer charge the forward passes to a simulated clock."""

    def __init__(self, net, X, y, batch_size: int = 256) -> None:
        X, y = np.asarray(X), np.asarray(y)
        check(
            X.ndim >= 2 and len(X) == len(y) and len(y) > 0,
            f"SelectionLoss needs matching X, y; got {X.shape}, {y.shape}",
        )
        self.net, self.X, self.y, self.batch_size = net.copy(), X, y, int(batch_size)
        self.n_samples = len(y)

    def __call__(self, state: TrainState) -> float:
        from dasknn.nn.train import evaluate

        self.net.set_params(state.params)
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


def _one_iteration(engine, config: RunConfig, budget: Budget) -> float:
    """What a simulated run that raised is charged: the modelled time of the one iteration in which
    it failed (conv phase of a group of N/g workers plus the FC step), at most its seconds budget;
    never the wall clock, so the charge is the same on any machine. The whole seconds budget would
    charge an iteration-bounded trial the rest of the run."""
    conv_time = getattr(engine, "conv_time", None)
    if conv_time is None:
        return budget.seconds or 0.0
    k = max(1, (getattr(engine, "n_workers", None) or config.n_groups) // config.n_groups)
    seconds = float(conv_time(k)) + float(getattr(engine, "t_fc", 0.0))
    return seconds if budget.seconds is None else min(seconds, budget.seconds)


class SearchLog:
    """The optimizer's clock, budgets, engine runs (stitched into one trace) and decision rows."""

    def __init__(
        self, engine, net, X, y, time_budget: float | None, max_iterations: int | None, verbose: int = 0
    ):
        self.engine, self.net, self.X, self.y = engine, net, X, y
        self.time_budget, self.max_iterations, self.verbose = time_budget, max_iterations, verbose
        self.elapsed, self.iterations = 0.0, 0
        self.segments: list[pd.DataFrame] = []
        self.charged: list[float] = []
        self.rows: list[dict[str, Any]] = []
        self.kept: set[int] = set()
        self.attrs: dict[str, Any] = {}

    # -- budgets ---------------------------------------------------------------------------------
    def exhausted(self) -> bool:
        return (self.time_budget is not None and self.time_left() <= 0) or (
            self.max_iterations is not None and self.iterations >= self.max_iterations
        )

    def time_left(self) -> float:
        """Seconds left of the time budget; a remainder below `TIME_RESOLUTION` of the budget is none
        (a float remainder of a sum of charges, such as 1e-17 s, cannot advance the clock: each run
        charged it would leave the clock where it was, and a loop of such runs would never end)."""
        if self.time_budget is None:
            return math.inf
        left = self.time_budget - self.elapsed
        return left if left > TIME_RESOLUTION * self.time_budget else 0.0

    def budget(self, iterations: int | None = None, seconds: float | None = None) -> Budget | None:
        """`iterations`/`seconds` clipped to what is left of the optimizer's budgets; None if spent."""
        if self.exhausted() or (seconds is not None and not seconds > 0):
            return None
        if self.time_budget is not None:
            seconds = self.time_left() if seconds is None else min(seconds, self.time_left())
        if self.max_iterations is not None:
            left = self.max_iterations - self.iterations
            iterations = left if iterations is None else min(iterations, left)
        return Budget(seconds=seconds, iterations=iterations)

    def restore(self, session: dict[str, Any]) -> None:
        """The clock, budgets spent, runs and decisions of an optimizer's checkpointed `session`
        (its "trace" and "decisions" included), so that a resumed optimizer goes on where it was."""
        self.elapsed, self.iterations = float(session["elapsed"]), int(session["iterations"])
        self.charged, self.kept = [float(c) for c in session["charged"]], {int(r) for r in session["kept"]}
        trace = session["trace"]
        runs = trace["run"].to_numpy() if "run" in trace else []
        self.segments = [
            trace[runs == i].drop(columns=["kept"], errors="ignore") for i in range(len(self.charged))
        ]
        self.attrs.update(trace.attrs)
        self.rows = session["decisions"].to_dict("records")

    # -- runs ------------------------------------------------------------------------------------
    def run(self, config: RunConfig, budget: Budget, start: TrainState, phase: str):
        """One engine run charged to the clock: (its trace on the optimizer's clock, end state or None,
        diverged, seconds, run id).

        Charged: the run's span in the engine's clock, or on a real clock its wall time (start-up
        included); a run with no iteration done its seconds budget; a raising run its wall time
        (on a simulated clock its seconds budget: nothing read from the wall clock is charged there).
        A FloatingPointError, a non-finite loss, `attrs["diverged"]` or weights that are non-finite
        or beyond `checkpoint.WEIGHT_LIMIT` is divergence.
        """
        t0 = time.perf_counter()
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is an outcome here, not news
                result = self.engine.run(self.net, self.X, self.y, config, budget, start=start)
        except FloatingPointError:
            result = None
        wall = time.perf_counter() - t0
        trace = make_trace([], "unknown") if result is None else result.trace
        state = None if result is None else result.state
        losses = trace["loss"].to_numpy(dtype=float)
        diverged = state is None or bool(trace.attrs.get("diverged")) or not np.isfinite(losses).all()
        diverged = diverged or not healthy(state)  # exploding weights
        span = float(trace["t_end"].max() - trace["t_start"].min()) if len(trace) else 0.0
        simulated = getattr(self.engine, "time_unit", None) == "simulated s"
        if trace.attrs.get("time_unit") == "simulated s":
            seconds = span
        elif simulated:  # a raising simulated run: one modelled iteration, never the wall clock
            seconds = _one_iteration(self.engine, config, budget)
        else:
            seconds = max(span, wall)
        if result is not None and not len(trace) and budget.seconds is not None:
            seconds = max(seconds, budget.seconds)  # the engine waited out its budget
        run_id = len(self.segments)
        seg = trace.copy()
        if len(seg):
            shift = self.elapsed + (seconds - span) - float(trace["t_start"].min())
            seg["t_start"] += shift
            seg["t_end"] += shift
        seg["phase"], seg["run"] = phase, run_id
        self.segments.append(seg)
        self.charged.append(seconds)
        self.attrs.update({k: v for k, v in trace.attrs.items() if k in ("engine", "time_unit")})
        self.elapsed += seconds
        self.iterations += len(trace)
        return seg, state, diverged, seconds, run_id

    def charge(self, seconds: float) -> None:
        """Time spent between engine runs (scoring a probe) on the optimizer's clock."""
        self.elapsed += max(0.0, float(seconds))

    def trace(self) -> pd.DataFrame:
        """Every run so far, end to end on the optimizer's clock, with `phase`, `run` and `kept`."""
        frames = [s for s in self.segments if len(s)]
        df = pd.concat(frames, ignore_index=True) if frames else make_trace([], "unknown")
        df["phase"] = df["phase"] if "phase" in df else pd.Series(dtype=object)
        df["run"] = df["run"] if "run" in df else pd.Series(dtype=int)
        df["kept"] = df["run"].isin(self.kept)
        df.attrs = {"engine": "unknown", "time_unit": "s", **self.attrs}
        return df

    # -- decisions -------------------------------------------------------------------------------
    def record(self, phase: str, action: str, config: RunConfig, reason: str, **values: Any) -> None:
        """One decision row (DECISION_COLUMNS), printed when verbose (probes only from verbose 2)."""
        row = {key: np.nan for key in DECISION_COLUMNS}
        row.update(
            phase=phase, action=action, n_groups=config.n_groups, lr=config.lr, momentum=config.momentum
        )
        row.update(time=self.elapsed, diverged=False, chosen=False, start_hash="", run=-1, reason=reason)
        row.update(values)
        self.rows.append(row)
        if self.verbose >= (2 if action in ("probe", "extend") else 1):
            print(
                f"[omnivore t={row['time']:.4g}] {phase} {action}: g={config.n_groups} lr={config.lr:g} "
                f"momentum={config.momentum:g} score={row['score']:.4g}; {reason}"
            )

    def record_probe(self, action: str, probe: Probe, reason: str, window: int, start_hash: str = "") -> None:
        self.record(
            probe.phase,
            action,
            probe.config,
            reason,
            score=probe.score,
            window_loss=probe.window_loss(window),
            iterations=len(probe.trace),
            seconds=self.charged[probe.runs[-1]],
            diverged=probe.diverged,
            start_hash=start_hash or probe.start_hash,
            run=probe.runs[-1],
        )

    def mark_winner(self, probe: Probe) -> None:
        """Flag the winning probe's rows; its runs stay on the model's path (`kept` in the trace)."""
        self.kept.update(probe.runs)
        for row in self.rows:
            if row["run"] in probe.runs:
                row["chosen"] = True

    def decisions(self) -> pd.DataFrame:
        """DECISION_COLUMNS, then any measured numbers the rows carry (the online optimizer's)."""
        extra = list(dict.fromkeys(k for row in self.rows for k in row if k not in DECISION_COLUMNS))
        return pd.DataFrame(self.rows, columns=[*DECISION_COLUMNS, *extra])


@dataclass
class Prober:
    """Runs probes from a checkpoint and picks the winner (Omnivore appendix E-D)."""

    log: SearchLog
    length: Callable[[int], tuple[int | None, float | None]]
    threshold: float = 0.05
    window: int = 50
    max_extensions: int = 1
    judge: Judge | None = None
    scorer: Callable[[TrainState], float] | None = None

    def probe(
        self, config: RunConfig, start: TrainState, phase: str, reason: str, repeats: int = 1
    ) -> Probe | None:
        """`config` from `start` for `repeats` probe lengths; None if the budget is spent."""
        iterations, seconds = self.length(config.n_groups)
        budget = self.log.budget(iterations and iterations * repeats, seconds and seconds * repeats)
        if budget is None:
            return None
        p = Probe(config, state_hash(start), phase, self.judge)
        self.advance(p, start, budget)
        self.log.record_probe("probe", p, reason, self.window)
        return p

    def grid(
        self,
        config: RunConfig,
        points: Sequence[tuple[float, float]],
        start: TrainState,
        phase: str,
        label: str = "",
        early_stop: bool = False,
    ) -> list[Probe]:
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
            p = self.probe(c, start, phase, f"{label}grid point {i + 1} of {len(order)}")
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

    def extend(self, p: Probe) -> None:
        """Run a probe one probe length further from its own end state."""
        budget = self.log.budget(*self.length(p.config.n_groups))
        if budget is None or p.diverged or p.state is None:
            return
        start_hash = state_hash(p.state)
        self.advance(p, p.state, budget)
        self.log.record_probe("extend", p, "no clear winner: probe longer", self.window, start_hash)

    def advance(self, p: Probe, start: TrainState, budget: Budget) -> None:
        seg, p.state, diverged, _, run = self.log.run(p.config, budget, start, p.phase)
        p.trace = seg if not len(p.trace) else pd.concat([p.trace, seg], ignore_index=True)
        p.diverged = p.diverged or diverged
        p.runs.append(run)
        if self.scorer is not None and not p.diverged and p.state is not None:
            t0 = time.perf_counter()
            p.selection_loss = self.scorer(p.state)
            self.log.charge(self.scoring_seconds(time.perf_counter() - t0, seg))

    def scoring_seconds(self, wall: float, seg: pd.DataFrame) -> float:
        """The clock's charge for scoring a probe: its wall time, or on a simulated clock the
        forward passes over the scorer's samples, a third of an iteration's time per batch."""
        if self.log.attrs.get("time_unit") != "simulated s":
            return wall
        n = getattr(self.scorer, "n_samples", None)
        if not n or not len(seg):
            return 0.0
        per_iteration = float((seg["t_end"] - seg["t_start"]).median())
        return per_iteration / 3 * n / max(1, int(seg["n_images"].median()) if "n_images" in seg else 1)

    def pick(self, probes: list[Probe]) -> tuple[Probe, int, str]:
        """The lowest score; tied probes run longer, up to `max_extensions` times.

        Returns (winner, probe lengths it ran, why).
        """
        winner, tied = clear_winner(probes, self.threshold, self.window)
        extensions = 0
        while tied and extensions < self.max_extensions:
            for p in [winner, *tied]:
                self.extend(p)
            extensions += 1
            winner, tied = clear_winner([winner, *tied], self.threshold, self.window)
        if tied:
            return winner, 1 + extensions, f"no clear winner after {extensions} extension(s): lowest score"
        over = "on the selection loss" if self.scorer is not None else f"over {self.window} iterations"
        return winner, 1 + extensions, f"clear winner ({self.threshold:.0%} {over})"
