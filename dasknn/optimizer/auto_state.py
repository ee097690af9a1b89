"""The "auto" tuner's state during a fit: one typed record, JSON-able for the checkpoints.

Follows PyTorch Lightning's loops (their progress in small dataclasses): what `AutoPolicy` knows
between two runs is the fields of `AutoState`, never a dict of strings. `to_dict` is the session a
checkpoint carries (`dasknn.policy.NextRun.checkpoint`); `from_dict` reads one back, and refuses
by name a session of another shape (written by a version whose state had other fields).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from dasknn.engine.trace import RunConfig

__all__ = ["AutoState", "PHASES"]

PHASES = ("ramp", "range", "train", "trial", "after")
"""Where the fit is: the η ramp, the range test (`lr_search="range"`), training windows, a trial,
or the window after a trial (A-B-A)."""
KIND = {"kind": "auto", "optimizer": "auto"}
"""How a checkpoint's session names the tuner that wrote it (the loop reads `kind`)."""
LOOP_FIELDS = ("elapsed", "iterations", "rollbacks_in_row", "charged", "kept", "budget_changed", "time_start")
"""What the loop adds to a session it checkpoints (`dasknn.fitting.Loop.save`, `restore`): its own."""


@dataclass
class AutoState:
    """What the "auto" tuner carries from run to run (`dasknn.optimizer.auto`).

    `phase` (`PHASES`); `config`: the knobs the fit goes on with; `target_momentum`: the prior's µ
    the momentum feedback steers to; `ramp`, `plateau`: the η ramp's and the plateau rule's own
    state (`LrRamp.to_dict`, `Plateau.to_dict`; None before they start); `peak_lr`: the rate the
    prior cache remembers; `explored`: seconds spent on trials; `turn`: which neighbour is tried
    next; `trial`: the trial under way (its key, config, reason, progress); `before`,
    `before_se`, `before_n`: the progress per second of the last training window, its standard
    error and iterations (the "A" of A-B-A); `restore`: the snapshot the next run starts from
    (an undone window's start); `next`: the run about to start (what a resumed fit runs first);
    `checkpoint_epoch`: the epoch of the last checkpoint; `rejected`: trials rejected in a row per
    key; `eval_loss`: the tuner's samples' loss at the last kept state; `batch_level`: the mean of
    the last batch losses of the run that reached it (`auto.keep_level`); `tpi`, `overhead`: seconds
    per iteration and a run's cost beyond its iterations; `lr_ceiling`: the lowest rate that
    diverged; `stopped`: why the fit ends ("" while it goes on); `n_workers`: the conv workers of
    the last run; `last_kept`: the snapshot of the last kept window; `look`: a raised rate's first
    window kept for a second look (its run, start and loss); `range`: the range test's state
    (`RangeTest.to_dict`, with `lr_search="range"`); `unresolvable`: the last trial
    skipped as too noisy to judge; `restart`: the next run restarts momentum (µ = 0 for its first
    update: the run before it blew the loss up, `decide.back_off`); `finished`: the session of a
    fit that ended.
    """

    phase: str
    config: RunConfig
    target_momentum: float
    ramp: dict[str, Any] | None
    plateau: dict[str, Any] | None
    peak_lr: float
    explored: float = 0.0
    turn: int = 0
    trial: dict[str, Any] | None = None
    before: float | None = None
    before_se: float = 0.0
    before_n: int = 0
    restore: str | None = None
    next: dict[str, Any] | None = None
    checkpoint_epoch: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    eval_loss: float | None = None
    batch_level: float | None = None
    tpi: float | None = None
    overhead: float = 0.0
    lr_ceiling: float | None = None
    stopped: str = ""
    n_workers: int | None = None
    last_kept: str | None = None
    look: dict[str, Any] | None = None
    range: dict[str, Any] | None = None
    unresolvable: bool = False
    restart: bool = False
    finished: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able session a checkpoint carries (a deep copy)."""
        return {**KIND, **asdict(self)}

    @classmethod
    def from_dict(cls, session: dict[str, Any]) -> AutoState:
        """The state of a checkpoint's session; a ValueError naming what does not fit this shape."""
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        kind = {k: session.get(k) for k in KIND}
        if kind != KIND:
            raise ValueError(f"the checkpoint's tuner session is {kind}, not the \"auto\" tuner's {KIND}")
        unknown = sorted(set(session) - names - set(KIND) - set(LOOP_FIELDS))
        missing = sorted(required - set(session))
        if unknown or missing:
            what = f"has fields {unknown} that" if unknown else f"lacks the fields {missing} that"
            raise ValueError(
                f"the checkpoint's \"auto\" tuner state {what} this version's AutoState "
                f"{'does not know' if unknown else 'needs'}: it was written by another version of "
                "dasknn; start a fresh fit (resume=False) or resume it with that version"
            )
        values = {k: v for k, v in session.items() if k in names}
        if values["phase"] not in PHASES:
            phase = values["phase"]
            raise ValueError(f'the checkpoint\'s "auto" tuner state has phase {phase!r}, not one of {PHASES}')
        values["config"] = RunConfig(**values["config"])
        return cls(**values)
