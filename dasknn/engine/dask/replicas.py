"""Crossbow's SMA and SparkNet's model averaging on a Dask cluster (Crossbow §3.2, SparkNet).

k learners (`RunConfig.n_groups`), each a long-running task that holds its own model replica on its
worker (several learners per worker when k exceeds the workers: Crossbow §3.3); a central average
model z lives in an `AverageModel` actor. SMA (Crossbow §3.2, Alg. 1) synchronises every iteration:

    w_j ← w_j − γ∇ℓ_{B_j}(w_j) − α (w_j − z)     each learner: plain SGD and the correction, both
                                               from w_j before its step and the round's z
    z'  = z + Σ_j α (w_j − z) + µ (z − z_prev)     the actor, once all k replicas arrived

Model averaging (SparkNet) runs SGD with momentum on every replica and sets z = mean_j w_j, w_j ← z
every τ iterations. The maths, batch order (learner j of round r takes batch
`batches_done + r·k + j`), Trace rows and end state are those of the simulator's
`ReplicaSimulation`, so both engines train the same weights; here the clock is measured. The
driver's side, the run of the actor and the loops, is `replica_run`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dasknn.backend import array_module, device_scope, get_xp, to_device
from dasknn.engine.dask.batches import BatchReader
from dasknn.engine.dask.elastic import state_digest
from dasknn.nn.net import Net
from dasknn.nn.solver import SGD

__all__ = ["AverageModel", "LearnerSpec", "learner_loop", "learner_workers"]

LEARN_RNG_STREAM = 4  # a batch's dropout stream, as ReplicaSimulation draws it


class AverageModel:
    """The central average model z and the per-round barrier of the k learners (Crossbow §3.2).

    `synchronise(j, r, replica, history)` is a coroutine (it runs on the worker's event loop, so k
    learners can wait in it at once): it stores learner j's replica for round r and, when all k have
    arrived, computes the new z (SMA's update, or the mean for model averaging); every caller gets
    {"z", "z_read", "stop"} (`z_read`: the z the round's corrections are taken from; for SMA the
    replica sent is the one the learner's gradient was computed at). `stop` is the same for all k
    callers of a round: the budget is spent (last round, deadline) or the driver called `stop()`. At
    a hand-off (`stop(hand_off=True)`, docs/architecture.md "Elastic clusters") the learners hand
    their replicas in (`hand_in`), and `snapshot` / `restore` move the actor's exact state to the
    next segment's (`replica_run`).
    """

    def __init__(
        self,
        z: dict[str, np.ndarray],
        z_prev: dict[str, np.ndarray],
        n_learners: int,
        name: str,
        alpha: float,
        momentum: float,
        rounds: int | None,
        deadline: float | None,
        timeout: float,
    ) -> None:
        self.z = {k: np.array(v, copy=True) for k, v in z.items()}
        self.z_prev = {k: np.array(v, copy=True) for k, v in z_prev.items()}
        self.k, self.name, self.alpha, self.mu = int(n_learners), name, float(alpha), float(momentum)
        self.rounds, self.deadline, self.timeout = rounds, deadline, float(timeout)
        self.history: dict[str, np.ndarray] = {}
        self.synced_rounds = 0
        self.stopped = self.handing_off = False
        self.error: str | None = None
        self._slots: dict[int, dict[str, Any]] = {}
        self.handed_in: dict[int, tuple[dict[str, Any], str]] = {}  # learner → (replica, its digest)
        self.loaded: dict[int, str] = {}  # learner → digest of the replica it started from

    def stop(self, hand_off: bool = False) -> None:
        """Make the next synchronisation the last one (the driver's signal); with `hand_off` the
        learners then hand their replicas in (`hand_in`) for the run's next segment."""
        self.stopped = True
        self.handing_off = self.handing_off or bool(hand_off)

    def hand_in(self, j: int, replica: dict[str, Any], digest: str) -> None:
        """Learner j's replica (weights and solver state) at a hand-off, with its digest taken on
        the learner's worker."""
        self.handed_in[int(j)] = (replica, digest)

    def replicas(self) -> dict[int, tuple[dict[str, Any], str]]:
        """The replicas handed in: learner → (replica, digest)."""
        return dict(self.handed_in)

    def started_from(self, j: int, digest: str) -> None:
        """Learner j started from a replica handed over, whose digest on its new worker is `digest`."""
        self.loaded[int(j)] = digest

    def loaded_digests(self) -> dict[int, str]:
        """learner → the digest of the replica it started from (`started_from`)."""
        return dict(self.loaded)

    def snapshot(self) -> dict[str, Any]:
        """The exact state a hand-off moves: z, z_prev, the learners' mean momentum (model
        averaging) and the rounds synchronised so far."""
        return {
            "z": {k: v.copy() for k, v in self.z.items()},
            "z_prev": {k: v.copy() for k, v in self.z_prev.items()},
            "history": {k: np.array(v, copy=True) for k, v in self.history.items()},
            "synced_rounds": self.synced_rounds,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Hold a `snapshot()` taken from another AverageModel."""
        self.z = {k: np.array(v, copy=True) for k, v in state["z"].items()}
        self.z_prev = {k: np.array(v, copy=True) for k, v in state["z_prev"].items()}
        self.history = {k: np.array(v, copy=True) for k, v in state["history"].items()}
        self.synced_rounds = int(state["synced_rounds"])

    async def abort(self, reason: str) -> None:
        """Release every learner waiting at the barrier with an error (a learner failed)."""
        self.error = reason
        for slot in self._slots.values():
            slot["event"].set()

    def progress(self) -> int:
        """Synchronisations done so far."""
        return self.synced_rounds

    async def synchronise(self, j: int, r: int, replica: dict, history: dict | None = None) -> dict:
        """Learner j's replica of round r (SMA: before its step; model averaging: after it); returns
        the new z, the z the corrections were taken from and the stop flag."""
        if self.error is not None:
            raise RuntimeError(f"the run was aborted: {self.error}")
        slot = self._slots.setdefault(r, {"parts": {}, "event": asyncio.Event(), "reads": 0})
        slot["parts"][j] = (replica, history)
        if len(slot["parts"]) == self.k:
            self._combine(slot["parts"])
            done = self.rounds is not None and r + 1 >= self.rounds
            late = self.deadline is not None and time.time() >= self.deadline
            stop = bool(done or late or self.stopped)
            slot["result"] = {
                "z": self.z,
                "z_read": self.z_prev,
                "stop": stop,
                "hand_off": stop and self.handing_off,
            }
            self.synced_rounds += 1
            slot["event"].set()
        else:
            try:
                await asyncio.wait_for(slot["event"].wait(), self.timeout)
            except asyncio.TimeoutError:
                missing = sorted(set(range(self.k)) - set(slot["parts"]))
                raise TimeoutError(
                    f"learners {missing} did not reach the synchronisation of round {r} "
                    f"within {self.timeout:.0f} s"
                ) from None
        if self.error is not None:
            raise RuntimeError(f"the run was aborted: {self.error}")
        slot["reads"] += 1
        result = slot["result"]
        if slot["reads"] == self.k:
            del self._slots[r]
        return result

    def _combine(self, parts: dict[int, tuple]) -> None:
        replicas = [parts[j][0] for j in range(self.k)]
        if self.name == "model_averaging":
            self.z_prev = self.z
            self.z = {
                key: np.mean([w[key] for w in replicas], axis=0, dtype=z.dtype) for key, z in self.z.items()
            }
            histories = [parts[j][1] for j in range(self.k)]
            self.history = {key: np.mean([h[key] for h in histories], axis=0) for key in (histories[0] or {})}
            return
        a, mu = self.alpha, self.mu
        new = {}
        for key, z in self.z.items():
            corrections = sum(a * (w[key] - z) for w in replicas)
            new[key] = z + corrections + mu * (z - self.z_prev[key])
        self.z_prev, self.z = self.z, new

    def get_state(self) -> dict[str, Any]:
        """z, Caffe's momentum buffer (z − z_prev for SMA, the learners' mean for model averaging)."""
        if self.name == "model_averaging":
            momentum = {k: v.copy() for k, v in self.history.items()}
        else:
            momentum = {k: self.z[k] - self.z_prev[k] for k in self.z}
        return {
            "params": {k: v.copy() for k, v in self.z.items()},
            "momentum": momentum,
            "synced": self.synced_rounds,
        }


@dataclass(frozen=True)
class LearnerSpec:
    """What one learner's loop needs (the data fields are those `batches.BatchReader` reads)."""

    run_id: str
    learner: int
    n_learners: int
    worker: str
    device: str
    x_keys: tuple
    y_keys: tuple
    chunks: tuple[int, ...]
    batch_size: int
    seed: int
    first_batch: int
    rounds: int | None
    name: str
    alpha: float
    tau: int
    lr: float
    momentum: float
    weight_decay: float
    timeout: float
    first_round: int = 0
    replica: dict[str, Any] | None = None  # the weights and solver state to start from (None: z)


def learner_loop(spec: LearnerSpec, template: Net, average) -> list[dict[str, Any]]:
    """One learner: SGD on its own replica, synchronised through the AverageModel actor.

    Crossbow §3.1-3.2. Runs as a long-running task; the replica lives in this task's net. Returns
    the learner's Trace rows (absolute times); the rounds end when the actor says stop.
    """
    from distributed import get_client, secede

    client = get_client()
    secede()  # long-running: several learners share a worker, each in its own thread
    with device_scope(spec.device):  # this thread's CUDA device for the whole loop
        return _learn(spec, template, average, client)


def _learn(spec: LearnerSpec, template: Net, average, client) -> list[dict[str, Any]]:
    reader = BatchReader(client, spec)
    xp = get_xp(spec.device)
    net = template.copy().to(xp)
    solver = SGD.for_net(net, weight_decay=spec.weight_decay)
    if spec.replica is not None:  # handed over from the learner's previous worker, bit for bit
        net.set_params(spec.replica["params"])
        solver.load_state_dict(spec.replica["solver"], like=net.params)
        digest = state_digest(_replica(net, solver))
        average.started_from(spec.learner, digest).result(timeout=spec.timeout)
    averaging = spec.name == "model_averaging"
    step_momentum = spec.momentum if averaging else 0.0
    rows: list[dict[str, Any]] = []
    r = spec.first_round  # rounds count on from the run's previous segments
    while True:
        b = spec.first_batch + (r - spec.first_round) * spec.n_learners + spec.learner
        x, y = reader.get(b)
        t_start = time.time()
        rng = np.random.default_rng([spec.seed, LEARN_RNG_STREAM, b])
        loss, acc, grads = net.loss_and_grads(to_device(x, xp), to_device(y, xp), rng=rng)
        before = None if averaging else net.get_params()  # SMA's w_j: where the gradient was taken
        solver.step(net.params, grads, lr=spec.lr, momentum=step_momentum)
        result = {"stop": False}
        last = spec.rounds is not None and r + 1 >= spec.rounds
        if not averaging or (r + 1) % spec.tau == 0 or last:
            history = solver.state_dict()["history"] if averaging else None
            sent = net.get_params() if averaging else before
            result = average.synchronise(spec.learner, r, sent, history).result(timeout=spec.timeout)
            if averaging:
                _set(net, result["z"])
            else:
                _correct(net, before, result["z_read"], spec.alpha)
        rows.append(
            {
                "group": spec.learner,
                "batch": b,
                "t_start": t_start,
                "t_end": time.time(),
                "version_read": r,
                "version_written": r + 1,
                "staleness": 0,
                "loss": float(loss),
                "accuracy": float(acc),
                "n_images": int(x.shape[0]),
            }
        )
        r += 1
        if result["stop"]:
            if result.get("hand_off"):
                replica = _replica(net, solver)
                average.hand_in(spec.learner, replica, state_digest(replica)).result(timeout=spec.timeout)
            return rows


def _replica(net: Net, solver: SGD) -> dict[str, Any]:
    """A learner's replica as host arrays: its weights and its solver's state."""
    return {"params": net.get_params(), "solver": solver.state_dict()}


def _set(net: Net, z: dict[str, np.ndarray]) -> None:
    """w ← z on the replica's live arrays (model averaging)."""
    for key, w in net.params.items():
        w[...] = to_device(z[key], array_module(w))


def _correct(net: Net, before: dict[str, np.ndarray], z: dict[str, np.ndarray], alpha: float) -> None:
    """SMA's correction w ← w − α (w_before − z) on the replica's live arrays (Crossbow Alg. 1)."""
    for key, w in net.params.items():
        xp = array_module(w)
        w -= alpha * (to_device(before[key], xp) - to_device(z[key], xp))


def learner_workers(workers: dict[str, dict[str, Any]], n_learners: int) -> list[str]:
    """Learner j's worker: round-robin over the cluster's workers, so each holds ⌈k / N⌉ or fewer."""
    if not workers:
        raise RuntimeError("the cluster has no workers; start some with `dask worker <scheduler-address>`")
    addrs = sorted(workers)
    return [addrs[j % len(addrs)] for j in range(int(n_learners))]
