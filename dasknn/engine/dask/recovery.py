"""Fault tolerance of the Dask engine: server snapshots, and what a recovery records.

The driver keeps the latest snapshot of both servers (conv weights, momentum and version; FC
weights, momentum and dropout rng) as a `TrainState`. When a worker holding a server dies, the run
goes back to that snapshot on the surviving workers; the updates written after it are lost and
done again ("redone"). When only a conv worker dies, the servers are alive and nothing is redone.
Omnivore's servers hold all the model state (§III-B), so they are all a snapshot needs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dasknn.engine.averaging import averaged_state, server_average, trained_weights
from dasknn.engine.dask.placement import Placement
from dasknn.engine.trace import TrainState

#: what an error looks like when the worker behind a task, an actor or a connection went away
_LOSS_NAMES = (
    "KilledWorker",
    "CancelledError",
    "FutureCancelledError",
    "FuturesCancelledError",  # distributed.wait on loops the scheduler forgot with their workers
    "CommClosedError",
    "StreamClosedError",
)
_LOSS_TEXT = (
    "Worker holding Actor was lost",
    "cannot be reached",
    "Timed out trying to connect",
    "not running",
    "already forgotten",
)


class ClusterError(RuntimeError):
    """The Dask cluster failed under a run: a worker or the scheduler was lost or cannot be reached."""


class WorkerLostError(ClusterError):
    """Raised when a worker a fit depends on left the cluster (or stopped answering) and the fit
    cannot go on: no worker left, or the recoveries ran out."""


class SchedulerError(ClusterError):
    """The scheduler cannot be reached, or stopped answering during the fit (its address is named)."""


def scheduler_connected(client) -> bool:
    """Whether `client` still holds its connection to the scheduler. A client that lost it
    ("connecting", "closing", "closed", "failed") would hold any call for its whole reconnection
    window (`distributed.comm.timeouts.connect`) before failing, so callers ask this first."""
    return client.status in ("running", "newly-created")


def lost_error(
    lost: dict[str, list[str]],
    version: int,
    n_recoveries: int,
    max_recoveries: int,
    alive: dict[str, Any],
    placement: Placement,
    iterations0: int = 0,
) -> WorkerLostError:
    """The error that ends a run: which workers (and roles) were lost, and why there is no recovery.

    `version`: the updates of this run the driver has seen (a lower bound); `iterations0`: the
    iterations trained before this run (a fit runs the engine many times)."""
    if not alive:
        lost = {**placement.roles(), **lost}
        why = "no worker is left in the cluster"
    elif max_recoveries == 0:
        why = "recovery is off (max_recoveries=0)"
    else:
        why = f"{n_recoveries} recoveries already (max_recoveries={max_recoveries})"
    what = "; ".join(f"worker {w} ({', '.join(roles)})" for w, roles in lost.items())
    return WorkerLostError(
        f"{what} left the cluster after at least {version} updates of this run "
        f"({iterations0 + version} iterations of training in all); {why}, so the run stops"
    )


def is_worker_loss(err: BaseException) -> bool:
    """True when `err` is what dask raises when a worker (or the actor it held) is gone."""
    for e in (err, err.__cause__, err.__context__):
        if e is None:
            continue
        if isinstance(e, (ConnectionError, OSError, TimeoutError)) or type(e).__name__ in _LOSS_NAMES:
            return True
        if any(text in str(e) for text in _LOSS_TEXT):
            return True
    return False


def lost_workers(placement: Placement, alive: set[str] | dict[str, Any]) -> dict[str, list[str]]:
    """worker → its roles, for every worker of `placement` that is not in `alive`."""
    return {w: roles for w, roles in placement.roles().items() if w not in alive}


@dataclass
class Snapshot:
    """Both servers' state at one conv model version, kept on the driver.

    `version` counts the updates of this run (the conv model server's version); `state` is the
    complete TrainState (its `iterations_done` includes the iterations before the run).
    """

    state: TrainState
    version: int
    time: float = field(default_factory=time.time)


def conv_server_state(
    state: TrainState, conv_keys: set[str], version: int, averaging: bool = False
) -> dict[str, Any]:
    """The `ConvModelServer.set_state` dict for the conv-phase part of `state`; with `averaging`,
    its weights are those training goes on from and it continues (or starts) the average."""
    weights = trained_weights(state) if averaging else state.params
    out = {
        "params": {k: v for k, v in weights.items() if k in conv_keys},
        "solver": {
            "iter": state.iterations_done,
            "history": {k: v for k, v in state.momentum.items() if k in conv_keys},
        },
        "version": int(version),
    }
    if averaging:
        out["average"] = server_average(state, [k for k in state.params if k in conv_keys], "conv_count")
    return out


def fc_server_state(
    state: TrainState, fc_state: dict[str, Any], conv_keys: set[str], averaging: bool = False
) -> dict[str, Any]:
    """`fc_state` (an `FCServer.get_state()`) with the FC part of `state`: weights, momentum, rng;
    with `averaging`, the average too (as `conv_server_state`), else none."""
    weights = trained_weights(state) if averaging else state.params
    fc_keys = [k for k in state.params if k not in conv_keys]
    return {
        **fc_state,
        "params": {k: weights[k] for k in fc_keys},
        "solver": {
            "iter": state.iterations_done,
            "history": {k: v for k, v in state.momentum.items() if k not in conv_keys},
        },
        "rng": state.extra.get("fc_rng", fc_state["rng"]),
        "average": server_average(state, fc_keys, "fc_count") if averaging else None,
    }


def state_of(conv: dict[str, Any], fc: dict[str, Any], base: TrainState, iterations0: int) -> TrainState:
    """The TrainState the servers hold: `conv`, `fc` are their `get_state()`s, `base` the run's start.

    `iterations0` is `base.iterations_done` at the start of the run; the conv version counts since.
    When the servers keep an average of their weights, the state's `params` are the average and
    its `extra["averaging"]` the weights and the counts (`averaging.averaged_state`).
    """
    params = {**conv["params"], **fc["params"]}
    extra = {k: v for k, v in base.extra.items() if k != "averaging"}
    if conv.get("average") is not None:
        params, extra["averaging"] = averaged_state(params, conv["average"], fc["average"])
    return TrainState(
        params=params,
        momentum={**conv["solver"]["history"], **fc["solver"]["history"]},
        batches_done=base.batches_done,
        iterations_done=iterations0 + int(conv["version"]),
        extra={**extra, "fc_rng": fc["rng"]},
    )


@dataclass
class Recovery:
    """One recovery from a lost worker, as the Trace records it (`trace.attrs["recoveries"]`).

    time: seconds since the run started when the loss was noticed; worker: the lost address(es);
    roles: what they did; iterations_redone: updates written after the snapshot and lost (a lower
    bound: those the driver had seen); seconds: from noticing the loss to the groups running again;
    n_workers: the conv workers N left (a dedicated FC worker not counted).
    """

    time: float
    worker: str
    roles: list[str]
    iterations_redone: int
    n_groups_before: int
    n_groups_after: int
    from_snapshot: bool
    snapshot_version: int
    seconds: float = float("nan")
    placement: str = ""
    n_workers: int = -1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resume_batches(state: TrainState, rows: list[dict[str, Any]]) -> int:
    """The data cursor after the kept `rows`: one past the last batch they trained on."""
    if not rows:
        return state.batches_done
    return max(state.batches_done, int(np.max([r["batch"] for r in rows])) + 1)
