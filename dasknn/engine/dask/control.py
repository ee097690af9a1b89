"""A run control (`engine.control`) on the Dask engine: polled at every poll of the driver's watch,
its commands applied to the running servers by actor calls (docs/architecture.md "Controlling a
run"). A snapshot is a copy each server keeps beside its state; only one taken with `fetch` moves
to the driver (`DaskControl._fetch`).

A run that goes on in a new segment (a lost worker, a cluster change) gives the new servers the
run's changes of η and µ again; the snapshots the old servers kept are gone with them.
"""

from __future__ import annotations

import logging
import time

from dasknn.engine.control import (
    Applied,
    Progress,
    Reschedule,
    RunControl,
    TakeSnapshot,
    check_commands,
    ordered,
)
from dasknn.engine.dask.recovery import state_of
from dasknn.engine.trace import RunConfig, TrainState

logger = logging.getLogger(__name__)

__all__ = ["DaskControl"]


class DaskControl:
    """`control` applied to one Dask run of `config` that started at `t0` (`time.time()`)."""

    def __init__(self, control: RunControl, config: RunConfig, t0: float) -> None:
        self.control, self.config, self.t0 = control, config, t0
        self.applied: list[Applied] = []
        self.reschedules: list[Reschedule] = []
        self.rewound = 0  # iterations the restores went back
        self.seen = 0  # rows of the current segment the control has been given

    def start(self, seg) -> None:
        """A segment's servers are up: they count the run's restores and apply its changes of η, µ."""
        seg.rewound, self.seen = self.rewound, 0
        for cmd in self.reschedules:
            self._both(seg, "reschedule", cmd.lr, cmd.momentum, cmd.at)

    def poll(self, seg) -> None:
        """Give the control the run's progress and the rows drained since the last poll; apply what
        it answers (an `End` first: the groups stop, with no update lost, before the others)."""
        rows, self.seen = seg.rows[self.seen :], len(seg.rows)
        seconds = time.time() - self.t0
        position = seg.iterations0 + seg.version - self.rewound
        answer = self.control.poll(Progress(position, seg.version, seconds, rows))
        end, commands = ordered(check_commands(answer, self.config))
        if end is not None:
            seg.stop_groups()
        for cmd in commands:
            if isinstance(cmd, Reschedule):
                at = self._both(seg, "reschedule", cmd.lr, cmd.momentum, cmd.at)
                self.reschedules.append(Reschedule(cmd.lr, cmd.momentum, at))
            elif isinstance(cmd, TakeSnapshot):
                at = self._snapshot(seg, cmd.name)
                fetched = self._fetch(seg, cmd.name) if cmd.fetch else None
                if fetched is not None:
                    self._deliver(cmd.name, fetched)
            else:
                at, version = self._both(seg, "restore_snapshot", cmd.name)
                self.rewound += seg.iterations0 + version - self.rewound - at  # the server's count now
                seg.rewound = self.rewound
            self.applied.append(Applied(cmd, at, seconds))
        if end is not None:  # the updates the groups finished are drained after this poll
            at = seg._await(seg.conv_server.progress(), seg.placement.conv_server_worker)[0]
            self.applied.append(Applied(end, seg.iterations0 + at - self.rewound, seconds))

    def finish(self, seg) -> None:
        """Before the servers are kept for the next run: they forget this run's changes and
        snapshots (and the FC server takes steps again after an `End`)."""
        if self.applied:
            self._both(seg, "forget_control")

    def _snapshot(self, seg, name: str) -> int:
        """The FC server's state now, the conv model server's at the same count of updates (when
        the pushes of the iterations past the FC step have landed: `ConvModelServer.keep_snapshot`)."""
        p = seg.placement
        at = seg._await(seg.fc_server.keep_snapshot(name), p.fc_worker)
        return seg._await(seg.conv_server.keep_snapshot(name, at), p.conv_server_worker)

    def _deliver(self, name: str, state: TrainState) -> None:
        """Hand a fetched snapshot to the control (`fetched`), or a TypeError naming what it lacks."""
        fetched = getattr(self.control, "fetched", None)
        if fetched is None:
            who = type(self.control).__name__
            raise TypeError(f"{who} asked to fetch snapshot {name!r} but has no fetched(name, state)")
        fetched(name, state)

    def _fetch(self, seg, name: str) -> TrainState | None:
        """The snapshot `name` as a TrainState at the driver: the conv model server's copy once the
        update it waits for has landed, the FC server's, and the data cursor after the iterations
        it holds (the rows drained until then). None when that update will not come: the groups'
        loops all returned first, or the engine's timeout passed. The control is then not handed
        the snapshot (an evaluation skipped, asked for again at a later poll), where a TimeoutError
        had ended the whole fit."""
        p = seg.placement
        deadline = time.monotonic() + seg.engine.timeout
        while True:
            finished = all(f.done() for f in seg.loops)  # before the look: no update comes after it
            conv = seg._await(seg.conv_server.kept_state(name), p.conv_server_worker)
            if conv is not None:
                break
            if finished or time.monotonic() > deadline:
                logger.info("snapshot %r: the update it waits for did not come; not fetched", name)
                return None
            time.sleep(0.002)
        fc = seg._await(seg.fc_server.kept_state(name), p.fc_worker)
        seg._read(False)  # the rows of the updates the snapshot holds
        base = seg.snapshot.state
        state = state_of(conv, fc, base, seg.iterations0 - self.rewound)
        held = [r["batch"] + 1 for r in seg.rows if r["version_written"] <= int(conv["version"])]
        state.batches_done = max([base.batches_done, *held])
        return state

    def _both(self, seg, method: str, *args):
        """Call `method` on the conv model server, then on the FC server; the conv one's answer."""
        p = seg.placement
        out = seg._await(getattr(seg.conv_server, method)(*args), p.conv_server_worker)
        seg._await(getattr(seg.fc_server, method)(*args), p.fc_worker)
        return out
