"""Schedules of η and µ over a run's iterations, applied by the model servers at each update.

A `Schedule` is an immutable value of the iteration index i: the number of updates the server
applied before this one, counted over the whole fit (the solver's `iter`, Caffe's convention: the
update written as the Trace's `iteration` n uses i = n − 1). Both engines' servers evaluate it at the
same index, so a schedule changes η or µ at the same update on the simulator and on the cluster.
A float is the constant schedule. Schedules travel as plain JSON-safe dicts (`to_dict`,
`from_dict`): in checkpoints and to the Dask engine's actors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "Schedule", "value_at"]

KINDS = ("constant", "geometric", "linear", "cosine", "steps")
"""What a schedule does: stay at `start`; move from `start` to `end` over `length` iterations from
`begin` (geometric: by a constant factor, linear, cosine: half a cosine wave); or jump to each of
`steps`' values at its iteration."""

_FIELDS = {
    "constant": {"kind", "start"},
    "geometric": {"kind", "start", "end", "length", "begin"},
    "linear": {"kind", "start", "end", "length", "begin"},
    "cosine": {"kind", "start", "end", "length", "begin"},
    "steps": {"kind", "start", "steps"},
}


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"schedule {name} must be a finite number, got {value!r}")
    return float(value)


def _count(name: str, value: Any, low: int) -> int:
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or int(value) < low:
        raise ValueError(f"schedule {name} must be an integer >= {low}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Schedule:
    """η or µ as a function of the iteration index; build one with the class methods.

    Parameters
    ----------
    kind : str
        One of `KINDS`.
    start : float
        The value at (and before) `begin`; for "steps", the value before the first step.
    end : float, optional
        The value reached after `length` iterations ("geometric", "linear", "cosine"), kept after.
    length : int
        Iterations the move takes (>= 1).
    begin : int
        Iteration index the move starts at (>= 0), so a schedule can start where a fit is.
    steps : tuple of (int, float)
        ("steps") the iteration index at which each value starts, increasing.

    Examples
    --------
    >>> s = Schedule.steps_of(0.1, {100: 0.01})
    >>> s.value(99), s.value(100)
    (0.1, 0.01)
    >>> Schedule.from_dict(Schedule.linear(0.1, 0.0, 10).to_dict()).value(5)
    0.05
    """

    kind: str
    start: float
    end: float | None = None
    length: int = 0
    begin: int = 0
    steps: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"schedule kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("start", _number("start", self.start))
        if self.kind in ("constant", "steps"):
            if self.end is not None or self.length or self.begin:
                raise ValueError(f"a {self.kind} schedule takes no end, length or begin")
        else:
            set_("end", _number("end", self.end))
            set_("length", _count("length", self.length, 1))
            set_("begin", _count("begin", self.begin, 0))
            if self.kind == "geometric" and not (self.start > 0 and self.end > 0):
                raise ValueError(
                    f"a geometric schedule's start and end must be > 0, got {self.start}, {self.end}"
                )
        if self.kind != "steps":
            if self.steps:
                raise ValueError(f"a {self.kind} schedule takes no steps")
            return
        self._check_steps()

    def _check_steps(self) -> None:
        try:
            pairs = tuple((k, v) for k, v in self.steps)
        except (TypeError, ValueError):
            raise ValueError(f"schedule steps must be (iteration, value) pairs, got {self.steps!r}") from None
        if not pairs:
            raise ValueError("a steps schedule needs at least one (iteration, value) step")
        steps = tuple((_count("step iteration", k, 0), _number("step value", v)) for k, v in pairs)
        at = [k for k, _ in steps]
        if any(b <= a for a, b in zip(at, at[1:], strict=False)):
            raise ValueError(f"schedule step iterations must increase, got {at}")
        object.__setattr__(self, "steps", steps)

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def constant(cls, value: float) -> Schedule:
        """`value` at every iteration."""
        return cls("constant", value)

    @classmethod
    def geometric(cls, start: float, end: float, length: int, begin: int = 0) -> Schedule:
        """From `start` to `end` by a constant factor per iteration over `length` iterations (a
        warm-up ramp when end > start)."""
        return cls("geometric", start, end, length, begin)

    @classmethod
    def linear(cls, start: float, end: float, length: int, begin: int = 0) -> Schedule:
        """From `start` to `end` in equal steps over `length` iterations."""
        return cls("linear", start, end, length, begin)

    @classmethod
    def cosine(cls, start: float, end: float, length: int, begin: int = 0) -> Schedule:
        """From `start` to `end` along half a cosine wave over `length` iterations (SGDR's decay)."""
        return cls("cosine", start, end, length, begin)

    @classmethod
    def steps_of(cls, start: float, steps: dict[int, float] | tuple) -> Schedule:
        """`start`, then each value of `steps` ({iteration: value}) from its iteration on."""
        pairs = sorted(steps.items()) if isinstance(steps, dict) else tuple(steps)
        return cls("steps", start, steps=tuple(pairs))

    # -- values ----------------------------------------------------------------------------------
    def value(self, i: int) -> float:
        """The value the update with iteration index `i` applies."""
        if self.kind == "constant":
            return self.start
        if self.kind == "steps":
            out = self.start
            for k, v in self.steps:
                if i < k:
                    break
                out = v
            return out
        t = min(max(i - self.begin, 0), self.length) / self.length
        if self.kind == "linear":
            return self.start + (self.end - self.start) * t
        if self.kind == "cosine":
            return self.end + (self.start - self.end) * (1.0 + math.cos(math.pi * t)) / 2.0
        return self.start * (self.end / self.start) ** t

    def values(self) -> tuple[float, ...]:
        """Every value the schedule passes through at its ends and steps: the others lie between
        them, so a rule checked on these holds at every iteration."""
        if self.kind == "constant":
            return (self.start,)
        if self.kind == "steps":
            return (self.start, *(v for _, v in self.steps))
        return (self.start, self.end)

    # -- plain form ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The schedule as a JSON-safe dict (`from_dict` reads it back equal)."""
        out = {"kind": self.kind, "start": self.start}
        if self.kind == "steps":
            out["steps"] = [[k, v] for k, v in self.steps]
        elif self.kind != "constant":
            out.update(end=self.end, length=self.length, begin=self.begin)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        """A schedule from `to_dict`'s form (or a dataclass `asdict` of one); a ValueError naming a
        missing or unknown field."""
        if not isinstance(d, dict):
            raise ValueError(f"a schedule must be a dict with a kind, got {d!r}")
        kind = d.get("kind")
        if kind not in KINDS:
            raise ValueError(f"schedule kind must be one of {', '.join(KINDS)}, got {kind!r}")
        unknown = set(d) - {"kind", "start", "end", "length", "begin", "steps"}
        if unknown:
            raise ValueError(f"a schedule has no field {', '.join(sorted(unknown))}")
        missing = _FIELDS[kind] - {"begin"} - set(d)
        if missing:
            raise ValueError(f"a {kind} schedule needs {', '.join(sorted(missing))}")
        steps = d.get("steps") or ()
        return cls(kind, d["start"], d.get("end"), d.get("length") or 0, d.get("begin") or 0, tuple(steps))


def value_at(knob: float | Schedule, i: int) -> float:
    """The value of η or µ (a float or a `Schedule`) for the update with iteration index `i`."""
    return knob.value(i) if isinstance(knob, Schedule) else knob
