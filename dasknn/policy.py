"""What a training policy and the loop say to each other, and the fit's clock and records.

One loop (`dasknn.fitting.Loop`) runs every fit: it makes the engine runs, keeps the clock and
budgets, evaluates, rolls back a divergence (its one handler), checkpoints and calls the
callbacks. What to run next is a policy's answer (docs/architecture.md, "The loop and its
policies"): Omnivore's Algorithm 1 (`dasknn.optimizer.grid`), the online tuner
(`dasknn.optimizer.online`), fixed knobs (`dasknn.optimizer.fixed`). A policy never calls the
engine; it asks for runs and reads what they measured, as dask-ml's searches answer
`_additional_calls` and Caffe's solver wraps one step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dasknn.engine.control import RunControl
from dasknn.engine.trace import Budget, RunConfig, TrainState, make_trace
from dasknn.logs import TRACE

logger = logging.getLogger(__name__)

__all__ = [
    "CURRENT",
    "DECISION_COLUMNS",
    "START",
    "Fit",
    "NextRun",
    "Outcome",
    "Policy",
    "RunLog",
    "Stop",
]

CURRENT = "current"
"""The snapshot name of the fit's current state: the end of the last kept run (or the start)."""
START = "start"
"""The snapshot name of the state the fit (or a resumed fit) started from."""
DISCARDED = "discarded"
"""The trace's phase of iterations trained past the state a fit returned (`RunLog.discard_after`)."""
TIME_RESOLUTION = 1e-9
"""The fraction of a time budget below which what is left of it counts as spent."""


@dataclass(frozen=True)
class NextRun:
    """A policy's answer "run this next": one engine run of `config` for `budget`.

    `start`: `CURRENT`, `START` or the snapshot of an earlier run (`Outcome.snapshot`, "run<i>");
    the loop keeps the snapshots of the runs since the last kept one. `keep`: the run's iterations
    stay on the model (its end state becomes current, and the loop evaluates it: a history row, the
    callbacks, the target); False: a probe, discarded (only its snapshot stays, for the policy to
    continue or adopt). `phase`: the trace's phase column. `score`: the loop scores the end state
    (the selection part's loss, else the smoothed training loss of the run; its time charged to the
    clock) into `Outcome.score`. `diverges(trace, score)`: the policy's own divergence rule for
    this run, applied with the loop's (a trial abandoned when its score doubles). `checkpoint`: a
    JSON-able session to save with the current state before this run (the policy's own state,
    handed back to `Policy.begin` on resume). `note`: extra fields of the history row after it.
    `loss_limit`: the run also diverged when its training loss at its end exceeds
    `dasknn.fitting.DIVERGED_LOSS` × ln(n_classes) (fixed knobs and "auto" ask for it; grid and
    online judge their runs by their own scores). `hold`: the name of an earlier snapshot the loop
    keeps past this run even when the run is kept (the policy may still restore it: "auto"'s
    ramp, which may undo a kept window after the next one). `control`: a
    `dasknn.engine.control.RunControl` the engine polls while this run trains, to change its η and
    µ, keep and restore snapshots on the servers, or end it, without a new run (docs/architecture.md
    "Controlling a run"); what it did is in the run's trace, `attrs["control"]`. `eval_share`: None
    evaluates every kept run; a number (`EVAL_SHARE`, 5%) lets the loop evaluate this kept run only
    when the evaluations' measured cost so far, with one more, stays within that share of the fit's
    clock (docs/architecture.md "Evaluations at a bounded cost"); a run left unevaluated has no
    history row, its iterations count in the next row's training figures.
    """

    config: RunConfig
    budget: Budget
    start: str = CURRENT
    keep: bool = True
    phase: str = "train"
    score: bool = False
    diverges: Callable[[pd.DataFrame, float], bool] | None = None
    checkpoint: dict[str, Any] | None = None
    note: dict[str, Any] | None = None
    loss_limit: bool = False
    hold: str | None = None
    control: RunControl | None = None
    eval_share: float | None = None


EVAL_SHARE = 0.05
"""The share of a fit's clock its held-out evaluations may cost, for runs that ask the loop to bound
it (`NextRun.eval_share`)."""


@dataclass(frozen=True)
class Stop:
    """A policy's answer "the fit is done": `state` (`CURRENT` or a snapshot) is the model returned,
    `config` the knobs it goes on with (a later partial_fit), `session` the policy's final state."""

    reason: str
    config: RunConfig
    state: str = CURRENT
    session: dict[str, Any] | None = None


@dataclass
class Outcome:
    """What the loop measured of the run a policy asked for.

    `trace`: its rows on the fit's clock (`t_start`, `t_end`, `loss`, `accuracy`, …, `phase`,
    `run`); `state`: its end state (None if the engine raised); `snapshot`: that state's name for
    `NextRun.start`; `start_state`: the state it started from; `diverged`: the loop's verdict (a
    kept run that diverged was rolled back: the current state is its start); `seconds`: its charge
    on the clock; `score`: `NextRun.score`'s value (None when not asked, +inf if diverged); `stop`:
    the evaluation after a kept run asked to stop (target reached, or a callback)."""

    run: int
    request: NextRun
    trace: pd.DataFrame
    state: TrainState | None
    snapshot: str
    start_state: TrainState
    diverged: bool
    seconds: float
    score: float | None = None
    stop: bool = False

    @property
    def config(self) -> RunConfig:
        return self.request.config


class Fit(Protocol):
    """What a policy may read of the fit (the loop implements it): the clock and records, the data's
    size, the engine's description (never its `run`), and evaluations on request.

    `log`: the clock, budgets and decision rows (`RunLog`); `engine`: for its description only
    (`n_workers`, `timing`, `placement_`, `time_unit`); `net`: the net being trained (its shapes);
    `n_batches`: batches per pass over the training part; `batch_size`, `weight_decay`, `seed`: the
    fit's; `has_selection`: whether states can be scored on a selection part; `evaluates`: whether
    kept runs are evaluated (and may ask to stop: `Outcome.stop`); `checkpoints`: whether the fit
    writes checkpoints (a policy then hands its session with `NextRun.checkpoint`);
    `stop_at_start`: the evaluation of the starting state already asked to stop;
    `rollbacks_in_row`: the loop's count of kept runs rolled back in a row."""

    log: RunLog
    engine: Any
    net: Any
    n_batches: int
    batch_size: int
    weight_decay: float
    seed: int
    has_selection: bool
    evaluates: bool
    checkpoints: bool
    stop_at_start: bool
    rollbacks_in_row: int

    def snapshot(self, name: str) -> TrainState:
        """The state named `name` (`CURRENT`, `START` or a run's `snapshot`)."""
        ...

    def score(self, name: str) -> float:
        """The selection loss of a named state, +inf if not finite (NaN without a selection part);
        its time is charged to the clock."""
        ...

    def evaluate(self, fields: dict[str, Any]) -> bool:
        """Evaluate the current state now: a history row with `fields`; True when the fit should stop."""
        ...


class Policy(Protocol):
    """A training policy: given what was measured, return the next run or stop.

    The loop calls `begin(fit, resume)` once (`resume`: the `NextRun.checkpoint` session of the
    checkpoint a resumed fit goes on from, else None), then `next_run(None)`, and after every run
    `next_run(outcome)` with what that run measured (`Outcome`: its trace, end state and snapshot,
    divergence, charge, score, and whether the evaluation asked to stop). The policy reads the clock
    and budgets from `fit.log` (`elapsed`, `time_left()`, `budget(...)`, `exhausted()`), writes its
    decisions with `fit.log.record(...)`, and answers a `NextRun` or a `Stop`. Decisions are pure
    functions of the measurements (`dasknn.optimizer.decide`). Divergence is the loop's: a kept run
    that diverged arrives rolled back (`outcome.diverged`), and the policy picks what follows.
    """

    def begin(self, fit: Fit, resume: dict[str, Any] | None) -> None: ...

    def next_run(self, last: Outcome | None) -> NextRun | Stop: ...


DECISION_COLUMNS = tuple(
    "phase action n_groups lr momentum score window_loss iterations seconds time diverged chosen "
    "start_hash run reason".split()
)
"""One row per probe or decision. `score`: smoothed loss at the probe's end, or the selection loss
of its end weights when the tuner has a `probe_score`; `window_loss`: mean training loss over
its last `winner_window` iterations; `iterations`: the probe's so far (a train epoch's);
`seconds`: time charged to the row's engine run (probe and extend rows add up to the search time);
`time`: the fit's clock after it; `chosen`: the winning probe, or a decision that sets the
training config (whose n_groups, lr, momentum it then holds); `start_hash`: digest of the state the
row's run started from; `run`: the engine run's index in the trace's `run` column(-1 for decisions)."""


class RunLog:
    """A fit's clock and budgets, its engine runs (stitched into one trace) and its decision rows.

    The loop (`dasknn.fitting.Loop`) owns it and adds every run; a policy reads the clock
    (`elapsed`, `time_left`, `budget`, `exhausted`) and writes its decision rows (`record`)."""

    def __init__(self, time_budget: float | None, max_iterations: int | None):
        self.time_budget, self.max_iterations = time_budget, max_iterations
        self.elapsed, self.iterations = 0.0, 0
        self.traces: list[pd.DataFrame] = []
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
        """`iterations`/`seconds` clipped to what is left of the fit's budgets; None if spent."""
        if self.exhausted() or (seconds is not None and not seconds > 0):
            return None
        if self.time_budget is not None:
            seconds = self.time_left() if seconds is None else min(seconds, self.time_left())
        if self.max_iterations is not None:
            left = self.max_iterations - self.iterations
            iterations = left if iterations is None else min(iterations, left)
        return Budget(seconds=seconds, iterations=iterations)

    def restore(self, session: dict[str, Any]) -> None:
        """The clock, budgets spent, runs and decisions of a policy's checkpointed `session`
        (its "trace" and "decisions" included), so that a resumed policy goes on where it was."""
        self.elapsed, self.iterations = float(session["elapsed"]), int(session["iterations"])
        self.charged, self.kept = [float(c) for c in session["charged"]], {int(r) for r in session["kept"]}
        trace = session["trace"]
        runs = trace["run"].to_numpy() if "run" in trace else []
        self.traces = [
            trace[runs == i].drop(columns=["kept"], errors="ignore") for i in range(len(self.charged))
        ]
        self.attrs.update(trace.attrs)
        self.rows = session["decisions"].to_dict("records")

    def adopt(self, trace: pd.DataFrame, decisions: pd.DataFrame, elapsed: float) -> None:
        """Go on from earlier records (a previous fit's, or a checkpoint's without per-run charges):
        its runs keep their ids, later runs number on, the clock goes on from `elapsed`."""
        runs = trace["run"].to_numpy() if "run" in trace and len(trace) else None
        if runs is None:
            self.traces = [trace] if len(trace) else []
        else:
            self.traces = [
                trace[runs == i].drop(columns=["kept"], errors="ignore") for i in range(int(runs.max()) + 1)
            ]
            self.kept = (
                {int(r) for r in trace.loc[trace["kept"].astype(bool), "run"]} if "kept" in trace else set()
            )
        self.charged = [math.nan] * len(self.traces)
        self.rows = decisions.to_dict("records")
        self.attrs.update(trace.attrs)
        self.elapsed = float(elapsed)

    # -- runs ----------------------------------------------------------------------------------
    def add_run(self, trace: pd.DataFrame, seconds: float, phase: str) -> tuple[pd.DataFrame, int]:
        """A run's trace onto the fit's clock, charged `seconds` (its iterations end at the clock's
        new time); returns (the trace on the clock, with `phase` and `run`; the run's index)."""
        span = float(trace["t_end"].max() - trace["t_start"].min()) if len(trace) else 0.0
        run_id = len(self.traces)
        seg = trace.copy()
        if len(seg):
            shift = self.elapsed + (seconds - span) - float(trace["t_start"].min())
            seg["t_start"] += shift
            seg["t_end"] += shift
        seg["phase"], seg["run"] = phase, run_id
        self.traces.append(seg)
        self.charged.append(seconds)
        # the engine's description (engine, time unit, strategy, …); not one run's own events
        own = ("diverged", "recoveries", "worker_events")
        self.attrs.update({k: v for k, v in trace.attrs.items() if k not in own})
        self.elapsed += seconds
        self.iterations += len(trace)
        return seg, run_id

    def charge(self, seconds: float) -> None:
        """Time spent between engine runs (scoring a probe) on the fit's clock."""
        self.elapsed += max(0.0, float(seconds))

    def discard_after(self, iteration: int) -> None:
        """The kept runs' iterations past `iteration` are not in the model (the fit returns the state
        an evaluation scored while they trained): their phase becomes "discarded", `kept` False."""
        for run in self.kept:
            seg = self.traces[run]
            if "iteration" in seg:
                seg.loc[seg["iteration"] > iteration, "phase"] = DISCARDED

    def trace(self) -> pd.DataFrame:
        """Every run so far, end to end on the fit's clock, with `phase`, `run` and `kept` (the
        kept runs' iterations in the model: not those `discard_after` marked)."""
        frames = [s for s in self.traces if len(s)]
        df = pd.concat(frames, ignore_index=True) if frames else make_trace([], "unknown")
        df["phase"] = df["phase"] if "phase" in df else pd.Series(dtype=object)
        df["run"] = df["run"] if "run" in df else pd.Series(dtype=int)
        df["kept"] = df["run"].isin(self.kept) & (df["phase"] != DISCARDED)
        df.attrs = {"engine": "unknown", "time_unit": "s", **self.attrs}
        return df

    # -- decisions -------------------------------------------------------------------------------
    def record(self, phase: str, action: str, config: RunConfig, reason: str, **values: Any) -> None:
        """One decision row (DECISION_COLUMNS), logged (`dasknn.logs`: probes at TRACE, the rest at DEBUG)."""
        row = {key: np.nan for key in DECISION_COLUMNS}
        row.update(
            phase=phase, action=action, n_groups=config.n_groups, lr=config.lr, momentum=config.momentum
        )
        row.update(time=self.elapsed, diverged=False, chosen=False, start_hash="", run=-1, reason=reason)
        row.update(values)
        self.rows.append(row)
        logger.log(
            TRACE if action in ("probe", "extend") else logging.DEBUG,
            "tuner t=%.4g: %s %s: g=%s lr=%g momentum=%g score=%.4g; %s",
            row["time"], phase, action, config.n_groups, config.lr, config.momentum, row["score"], reason,
        )  # fmt: skip

    def chosen_config(self, default: RunConfig) -> RunConfig:
        """The knobs of the last decision row that set the training config (`chosen`), else `default`."""
        for row in reversed(self.rows):
            if row.get("chosen") is True or row.get("chosen") == 1:
                return default.with_(
                    n_groups=int(row["n_groups"]), lr=float(row["lr"]), momentum=float(row["momentum"])
                )
        return default

    def decisions(self) -> pd.DataFrame:
        """DECISION_COLUMNS, then any measured numbers the rows carry (the online tuner's)."""
        extra = list(dict.fromkeys(k for row in self.rows for k in row if k not in DECISION_COLUMNS))
        return pd.DataFrame(self.rows, columns=[*DECISION_COLUMNS, *extra])
