"""Control of a running engine run: the commands a loop may give while the groups train.

docs/architecture.md "Controlling a run". An engine run given a `RunControl` polls it at the
iteration boundaries it already has (the simulator after every update, in its event loop; the Dask
driver at every poll of its watch) with the run's `Progress`, and applies the commands it answers
without stopping the groups or starting a new run:

- `Reschedule`: η and/or µ become a new schedule from an iteration index on (on each server at its
  own index; one already passed takes effect at the server's next update);
- `TakeSnapshot`: both servers copy their state under a name, where they run (no weights move to
  the driver, unless the command asks to `fetch` it: then the control's `fetched(name, state)`
  receives it, the weights, momentum and counts of the snapshot, for the loop to score beside the
  running groups);
- `Restore`: both servers go back to a snapshot's weights, momentum and solver iteration (the
  schedules' position); the data goes on where it is and the groups keep running, so an update in
  flight across a restore lands on the restored weights as a stale one;
- `End`: the run ends now. It takes effect before the other commands of the same poll: the groups
  stop first, then the others apply to the stopped servers, so `[Restore(name), End()]` ends the
  run in exactly the state `name` took.

What each command did is in the run's trace, `attrs["control"]`: one dict per command with the
iteration index it took effect at (`Applied.as_dict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dasknn.engine.schedule import Schedule

__all__ = [
    "Applied",
    "Command",
    "End",
    "Progress",
    "Reschedule",
    "Restore",
    "RunControl",
    "TakeSnapshot",
    "check_commands",
    "ordered",
]


@dataclass(frozen=True)
class Reschedule:
    """η (`lr`) and/or µ (`momentum`) become these (a float or a `Schedule`; None keeps the run's)
    for the updates with iteration index >= `at` (None: from the next update)."""

    lr: float | Schedule | None = None
    momentum: float | Schedule | None = None
    at: int | None = None


@dataclass(frozen=True)
class TakeSnapshot:
    """Both servers keep a copy of their state under `name` (replacing one of that name). With
    `fetch`, the engine also hands that state to the control, as a `TrainState`, by its
    `fetched(name, state)` (the one command that moves weights to the driver: to score them beside
    the running groups)."""

    name: str
    fetch: bool = False


@dataclass(frozen=True)
class Restore:
    """Both servers go back to the state `TakeSnapshot(name)` kept in this run."""

    name: str


@dataclass(frozen=True)
class End:
    """End the run now (before the other commands of the same poll take effect)."""

    reason: str = ""


Command = Reschedule | TakeSnapshot | Restore | End


@dataclass(frozen=True)
class Progress:
    """What a poll tells the control: `iteration`, the state's iteration count now (the schedules'
    position: it goes back at a restore); `updates`, the updates this run applied; `seconds`, the
    run's time on its engine's clock; `rows`, the trace rows (dicts) logged since the last poll."""

    iteration: int
    updates: int
    seconds: float
    rows: Sequence[dict[str, Any]] = ()


@dataclass(frozen=True)
class Applied:
    """A command as the run applied it: `iteration`, the conv model server's iteration index from
    which it holds (a snapshot: the one it took; a restore: the one it went back to), `seconds` the
    run's clock then."""

    command: Command
    iteration: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        cmd = self.command
        out: dict[str, Any] = {"command": type(cmd).__name__, "iteration": self.iteration}
        out["seconds"] = self.seconds
        for name in ("name", "reason", "at"):
            if hasattr(cmd, name):
                out[name] = getattr(cmd, name)
        if getattr(cmd, "fetch", False):
            out["fetch"] = True
        for name in ("lr", "momentum"):
            value = getattr(cmd, name, None)
            if value is not None:
                out[name] = value.to_dict() if isinstance(value, Schedule) else value
        return out


class RunControl(Protocol):
    """What an engine run polls: `poll(progress)` answers the commands to apply now (maybe none).
    A control that answers `TakeSnapshot(name, fetch=True)` also has `fetched(name, state)`, which
    the engine calls with the snapshot's `TrainState` before its next poll."""

    def poll(self, progress: Progress) -> Sequence[Command]: ...


def check_commands(commands: Sequence[Command], config) -> list[Command]:
    """`commands` as a list, or a ValueError naming the first that is not a command or whose η or µ
    breaks their rules (checked as `RunConfig` checks them, on `config` with the new values)."""
    out = list(commands or ())
    for n, cmd in enumerate(out):
        if not isinstance(cmd, (Reschedule, TakeSnapshot, Restore, End)):
            raise ValueError(
                f"a run control answered {cmd!r}, not a Reschedule, TakeSnapshot, Restore or End"
            )
        if isinstance(cmd, Reschedule):
            if cmd.at is not None and (isinstance(cmd.at, bool) or int(cmd.at) != cmd.at or cmd.at < 0):
                raise ValueError(f"Reschedule.at must be an iteration index >= 0 or None, got {cmd.at!r}")
            changes = {k: v for k, v in (("lr", cmd.lr), ("momentum", cmd.momentum)) if v is not None}
            new = config.with_(**changes)  # raises on a value outside the rules of η and µ
            lr = None if cmd.lr is None else new.lr
            momentum = None if cmd.momentum is None else new.momentum
            out[n] = Reschedule(lr, momentum, None if cmd.at is None else int(cmd.at))
    return out


def ordered(commands: Sequence[Command]) -> tuple[End | None, list[Command]]:
    """(the first `End` or None, the other commands in their order): an `End` takes effect first."""
    end = next((c for c in commands if isinstance(c, End)), None)
    return end, [c for c in commands if not isinstance(c, End)]
