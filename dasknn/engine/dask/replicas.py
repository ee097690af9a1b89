"""Crossbow's SMA and SparkNet's model averaging on a Dask cluster (Crossbow §3.2, SparkNet).

k learners (`RunConfig.n_groups`), each a long-running task that holds its own model replica on its
worker (several learners per worker when k exceeds the workers: Crossbow §3.3); a central average
model z lives in an `AverageModel` actor. SMA (Crossbow §3.2, Alg. 1) synchronises every iteration:

    w_j ← w_j − γ∇ℓ_{B_j}(w_j)                each learner, plain SGD on its replica
    z'  = z + Σ_j α (w_j − z) + µ (z − z_prev)  the actor, once all k replicas arrived
    w_j ← w_j − α (w_j − z')                  each learner, toward the new average

Model averaging (SparkNet) runs SGD with momentum on every replica and sets z = mean_j w_j, w_j ← z
every τ iterations. The maths, batch order (learner j of round r takes batch
`batches_done + r·k + j`), Trace rows and end state are those of the simulator's
`ReplicaSimulation`, so both engines train the same weights; here the clock is measured.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from dasknn.backend import array_module, device_scope, get_xp, to_device
from dasknn.engine.dask import tasks
from dasknn.engine.dask.actors import submit_actor, submit_pinned
from dasknn.engine.dask.batches import BatchReader
from dasknn.engine.dask.placement import Placement, worker_devices
from dasknn.engine.dask.runs import cluster_workers, engine_client, persist_data, wait_for_loops
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState, make_trace, on_run_clock
from dasknn.nn.net import Net
from dasknn.nn.solver import SGD

__all__ = ["AverageModel", "LearnerSpec", "learner_loop", "learner_workers", "run_replicas"]

LEARN_RNG_STREAM = 4  # a batch's dropout stream, as ReplicaSimulation draws it


class AverageModel:
    """The central average model z and the per-round barrier of the k learners (Crossbow §3.2).

    `synchronise(j, r, replica, history)` is a coroutine (it runs on the worker's event loop, so k
    learners can wait in it at once): it stores learner j's replica for round r and, when all k have
    arrived, computes the new z (SMA's update, or the mean for model averaging); every caller gets
    {"z", "stop"}. `stop` is the same for all k callers of a round: the budget is spent (last round,
    deadline) or the driver called `stop()`.
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
        self.stopped = False
        self.error: str | None = None
        self._slots: dict[int, dict[str, Any]] = {}

    def stop(self) -> None:
        """Make the next synchronisation the last one (the driver's signal)."""
        self.stopped = True

    async def abort(self, reason: str) -> None:
        """Release every learner waiting at the barrier with an error (a learner failed)."""
        self.error = reason
        for slot in self._slots.values():
            slot["event"].set()

    def progress(self) -> int:
        """Synchronisations done so far."""
        return self.synced_rounds

    async def synchronise(self, j: int, r: int, replica: dict, history: dict | None = None) -> dict:
        """Learner j's replica after its step of round r; returns the new z and the stop flag."""
        if self.error is not None:
            raise RuntimeError(f"the run was aborted: {self.error}")
        slot = self._slots.setdefault(r, {"parts": {}, "event": asyncio.Event(), "reads": 0})
        slot["parts"][j] = (replica, history)
        if len(slot["parts"]) == self.k:
            self._combine(slot["parts"])
            done = self.rounds is not None and r + 1 >= self.rounds
            late = self.deadline is not None and time.time() >= self.deadline
            slot["result"] = {"z": self.z, "stop": bool(done or late or self.stopped)}
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
    averaging = spec.name == "model_averaging"
    step_momentum = spec.momentum if averaging else 0.0
    rows: list[dict[str, Any]] = []
    r = 0
    while True:
        b = spec.first_batch + r * spec.n_learners + spec.learner
        x, y = reader.get(b)
        t_start = time.time()
        rng = np.random.default_rng([spec.seed, LEARN_RNG_STREAM, b])
        loss, acc, grads = net.loss_and_grads(to_device(x, xp), to_device(y, xp), rng=rng)
        solver.step(net.params, grads, lr=spec.lr, momentum=step_momentum)
        result = {"stop": False}
        last = spec.rounds is not None and r + 1 >= spec.rounds
        if not averaging or (r + 1) % spec.tau == 0 or last:
            history = solver.state_dict()["history"] if averaging else None
            result = average.synchronise(spec.learner, r, net.get_params(), history).result(
                timeout=spec.timeout
            )
            _correct(net, result["z"], 1.0 if averaging else spec.alpha)
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
            return rows


def _correct(net: Net, z: dict[str, np.ndarray], alpha: float) -> None:
    """w ← w − α (w − z') on the replica's live arrays (α = 1: w ← z', model averaging)."""
    for key, w in net.params.items():
        target = to_device(z[key], array_module(w))
        if alpha == 1.0:
            w[...] = target
        else:
            w -= alpha * (w - target)


def learner_workers(workers: dict[str, dict[str, Any]], n_learners: int) -> list[str]:
    """Learner j's worker: round-robin over the cluster's workers, so each holds ⌈k / N⌉ or fewer."""
    if not workers:
        raise RuntimeError("the cluster has no workers; start some with `dask worker <scheduler-address>`")
    addrs = sorted(workers)
    return [addrs[j % len(addrs)] for j in range(int(n_learners))]


def _rounds(budget: Budget, k: int) -> int | None:
    return None if budget.iterations is None else -(-int(budget.iterations) // k)


def run_replicas(
    engine,
    net: Net,
    X,
    y,
    config: RunConfig,
    budget: Budget,
    start: TrainState | None = None,
    strategy: Strategy | None = None,
) -> RunResult:
    """DaskEngine.run for 'sma' and 'model_averaging': k = n_groups learners, z in an actor.

    Crossbow §3.2 / SparkNet. An iterations budget runs ⌈iterations / k⌉ rounds (every learner
    takes a batch per round); a seconds budget ends at the first synchronisation after the deadline
    (for model averaging the replicas always end averaged). Sets z as the final weights on `net`.
    """
    strategy = strategy if strategy is not None else engine.strategy
    if not strategy.synchronous:
        raise ValueError(f"run_replicas runs 'sma' or 'model_averaging', got {strategy.name!r}")
    k = int(config.n_groups)
    client = engine_client(engine)
    data = persist_data(engine, client, X, y, config)
    workers = cluster_workers(client)
    where = learner_workers(workers, k)
    home = sorted(workers)[0]
    engine.placement_ = _learners_placement(workers, where, home)
    client.run(tasks.prepare_worker, engine.blas_threads)
    state = start.copy() if start is not None else TrainState.from_net(net)
    alpha = strategy.alpha if strategy.alpha is not None else 1.0 / k
    t0 = time.time()
    deadline = None if budget.seconds is None else t0 + budget.seconds
    average, z = _start_average(
        engine, client, state, k, strategy, config.momentum, alpha, budget, deadline, home
    )
    work = net.copy()
    work.set_params(z)
    template = client.scatter(work, broadcast=True, hash=False)
    roles: dict[str, list[str]] = {home: ["average model z"]}
    for j, w in enumerate(where):
        roles.setdefault(w, []).append(f"learner {j}")
    specs = _learner_specs(engine, where, data, config, budget, strategy, alpha, state.batches_done)
    loops = [
        submit_pinned(client, learner_loop, spec, template, average, worker=spec.worker) for spec in specs
    ]
    try:
        rows = wait_for_loops(
            engine,
            client,
            loops,
            roles,
            budget,
            t0,
            progress=lambda: k * average.progress().result(timeout=engine.timeout),
        )
        end = average.get_state().result(timeout=engine.timeout)
    except BaseException as err:
        try:
            average.abort(f"{type(err).__name__}: {err}").result(timeout=engine.timeout)
        finally:
            raise err
    finally:
        client.cancel(loops)
    rows.sort(key=lambda row: (row["version_read"], row["group"]))
    end_state = TrainState(
        params=end["params"],
        momentum=end["momentum"],
        batches_done=state.batches_done + len(rows),
        iterations_done=state.iterations_done + len(rows),
        extra=dict(state.extra),
    )
    net.set_params(end_state.params)
    on_run_clock(rows, t0, config, data.X.shape[0])
    for i, row in enumerate(rows):
        row["iteration"] = state.iterations_done + i + 1
    return RunResult(trace=_replicas_trace(rows, roles, where, config, strategy, alpha), state=end_state)


def _start_average(
    engine,
    client,
    state: TrainState,
    k: int,
    strategy: Strategy,
    momentum: float,
    alpha: float,
    budget: Budget,
    deadline: float | None,
    home: str,
):
    """The AverageModel actor on worker `home`, its z the weights of `state` and z_prev those less
    `state`'s momentum (Caffe's buffer, z − z_prev); returns the actor and z."""
    z = {key: np.asarray(v) for key, v in state.params.items()}
    z_prev = {key: z[key] - state.momentum[key] if key in state.momentum else z[key] for key in z}
    avg_future = submit_actor(
        client,
        AverageModel,
        z,
        z_prev,
        k,
        strategy.name,
        alpha,
        momentum,
        _rounds(budget, k),
        deadline,
        engine.timeout,
        worker=home,
    )
    return avg_future.result(timeout=engine.timeout), z


def _learners_placement(workers: dict[str, dict[str, Any]], where: list[str], home: str) -> Placement:
    """The run's placement: learner j alone in group j on worker `where[j]`, z on `home`."""
    return Placement(
        fc_worker=home,
        conv_server_worker=home,
        groups=[[w] for w in where],
        shares={w: 1.0 for w in where},
        devices=worker_devices(workers),
        oversubscribed=len(where) > len(workers),
    )


def _learner_specs(
    engine,
    where: list[str],
    data,
    config: RunConfig,
    budget: Budget,
    strategy: Strategy,
    alpha: float,
    first_batch: int,
) -> list[LearnerSpec]:
    """What each of the k = len(where) learners' loops needs, learner j on worker `where[j]`."""
    k, run_id = len(where), uuid.uuid4().hex
    return [
        LearnerSpec(
            run_id=run_id,
            learner=j,
            n_learners=k,
            worker=w,
            device=engine.placement_.devices[w],
            x_keys=data.x_keys,
            y_keys=data.y_keys,
            chunks=data.chunks,
            batch_size=config.batch_size,
            seed=config.seed,
            first_batch=first_batch,
            rounds=_rounds(budget, k),
            name=strategy.name,
            alpha=alpha,
            tau=int(strategy.tau),
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            timeout=engine.timeout,
        )
        for j, w in enumerate(where)
    ]


def _replicas_trace(
    rows: list[dict[str, Any]],
    roles: dict,
    where: list[str],
    config: RunConfig,
    strategy: Strategy,
    alpha: float,
):
    """The run's Trace: its rows, with the learners' placement and SMA's (or averaging's) knobs."""
    return make_trace(
        rows,
        "dask",
        n_groups=len(where),
        placement=str(roles),
        batch_size=config.batch_size,
        strategy=strategy.name,
        learners_per_worker=max(where.count(w) for w in set(where)),
        alpha=alpha,
        tau=int(strategy.tau),
        diverged=not all(math.isfinite(row["loss"]) for row in rows),
    )
