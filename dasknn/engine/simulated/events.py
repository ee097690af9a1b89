"""The simulator's event loop: g compute groups in one process, real SGD maths, a modeled clock
(docs/architecture.md, "The simulator's clock"; Omnivore §III-B, §IV-B). Each group iteration
reads the conv weights, runs the conv forward, joins the merged FC server's FIFO queue, runs the
conv backward and pushes one summed gradient; with k > 1 the batch is cut into k shards whose
gradients are summed. Which weight version each gradient is computed on follows from the event
order, and in-flight iterations ride in `TrainState.extra["simulator"]`, so continuing from a run's
state is exactly one longer run.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np
from tqdm import tqdm

from dasknn.data.augment import Augment
from dasknn.data.batching import BatchOrder
from dasknn.data.chunks import sample_chunks
from dasknn.engine.averaging import averaged_state, server_average, trained_weights
from dasknn.engine.control import Applied, Progress, Reschedule, TakeSnapshot, check_commands, ordered
from dasknn.engine.servers import ConvModelServer, FCServer
from dasknn.engine.streams import shard_rng
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn.net import Net

if TYPE_CHECKING:
    from dasknn.engine.simulated.engine import SimulatedEngine

__all__ = ["Batches", "Simulation", "conv_backward_shards", "conv_forward_shards", "shard_slices"]


def shard_slices(batch_size: int, k: int) -> list[slice]:
    """The k shards of a batch inside one compute group, sizes differing by at most one (§III-B)."""
    if not 1 <= int(k) <= int(batch_size):
        raise ValueError(
            f"cannot split a batch of {batch_size} images over {k} workers: a compute group needs "
            "a batch_size of at least its workers (n_workers / n_groups)"
        )
    bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(batch_size), k)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def conv_forward_shards(conv_net: Net, xb, slices: list[slice], seed: int = 0, batch: int = 0):
    """Conv-phase forward of each shard; returns (activations of the whole batch, per-shard caches).

    Shard i draws from `streams.shard_rng(seed, batch, i)`, as the Dask engine's shard i does."""
    outs = [conv_net.forward(xb[s], train=True, rng=shard_rng(seed, batch, i)) for i, s in enumerate(slices)]
    acts = outs[0][0] if len(outs) == 1 else np.concatenate([a for a, _ in outs])
    return acts, [c for _, c in outs]


def conv_backward_shards(conv_net: Net, dacts, caches: list, slices: list[slice]) -> dict[str, Any]:
    """Conv-phase backward of each shard; the k weight gradients summed into one (§III-B)."""
    total: dict[str, Any] = {}
    for s, cache in zip(slices, caches, strict=True):
        _, grads = conv_net.backward(dacts[s], cache)
        total = grads if not total else {key: total[key] + grads[key] for key in total}
    return total


class Batches:
    """The run's batches, X and y computed to numpy once.

    Batch b of the stream is slice b % per_epoch of epoch b // per_epoch's order (`BatchOrder`
    with the shuffle `window`), augmented with `augment` (drawn from (seed, b)), integer pixels made
    float32, as the Dask engine's workers do (`engine.dask.batches`).
    """

    def __init__(
        self, X, y, batch_size: int, seed: int, window: int = 1, augment: Augment | None = None
    ) -> None:
        chunks = X.chunks[0] if isinstance(X, da.Array) else None
        X, y = dask.compute(X, y)
        self.X, self.y = np.asarray(X), np.asarray(y)
        if self.X.shape[0] != self.y.shape[0]:
            raise ValueError(f"X has {self.X.shape[0]} samples but y has {self.y.shape[0]}")
        if chunks is None:
            chunks = sample_chunks(self.X.shape[0], self.X.shape[1:], batch_size)[0]
        self.order = BatchOrder(chunks, batch_size, seed, window)
        self.chunks, self.batch_size, self.seed = self.order.chunks, batch_size, seed
        self.per_epoch = self.order.n_batches
        self.augment = augment

    def get(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.order.indices(b)
        x = self.X[idx]
        if self.augment is not None:
            x = self.augment.train(x, self.seed, b)
        return (x.astype(np.float32) if x.dtype.kind in "biu" else x), self.y[idx]


class Simulation:
    """One run's event loop: servers, per-group conv nets, the FC queue, the clock."""

    def __init__(
        self,
        engine: SimulatedEngine,
        net: Net,
        X,
        y,
        config: RunConfig,
        k: int,
        state: TrainState,
        split: str | None = None,
    ) -> None:
        self.engine, self.config, self.k = engine, config, k
        self.slices = shard_slices(config.batch_size, k)
        self.t_conv_mean = engine.conv_time(k)
        self.data = Batches(X, y, config.batch_size, config.seed, engine.shuffle_window, engine.augment)
        sim = state.extra.get("simulator")
        conv = self._servers(net, config, state, split)
        self.group_nets = [conv.copy() for _ in range(config.n_groups)]
        signature = {
            "n_groups": config.n_groups,
            "group_size": k,
            "batch_size": config.batch_size,
            "seed": config.seed,
        }
        resume = sim is not None and sim["signature"] == signature
        self.signature = signature
        self.extra = {key: v for key, v in state.extra.items() if key not in ("simulator", "averaging")}
        self.iterations_done, self.cursor = state.iterations_done, state.batches_done
        self.clock = float(sim["clock"]) if sim else 0.0
        self.rng = np.random.default_rng([config.seed, 3, state.iterations_done])
        self.caches: dict[int, tuple] = {}
        self.diverged = False
        self.control = None  # a RunControl the event loop polls after every update (`engine.control`)
        self.applied: list[Applied] = []
        self.polled = 0  # the rows the control has seen
        self.rewound = 0  # iterations the restores went back: the state's count is iterations_done − rewound
        if resume:
            sim = copy.deepcopy(sim)
            self.seq, self.events, self.groups = sim["seq"], sim["events"], sim["groups"]
            heapq.heapify(self.events)
            self.fc_queue, self.fc_busy = deque(sim["fc_queue"]), sim["fc_busy"]
            self.rng.bit_generator.state = sim["rng"]
            self.fc_server.rng.bit_generator.state = sim["fc_rng"]
            for grp, gs in self.groups.items():
                self.group_nets[grp].set_params(gs["weights"])
        else:
            if "fc_rng" in state.extra:
                self.fc_server.rng.bit_generator.state = state.extra["fc_rng"]
            self.seq, self.events, self.groups = 0, [], {}
            self.fc_queue, self.fc_busy = deque(), None
            for grp in range(config.n_groups):
                self._schedule(self.clock, "start", grp)

    def _servers(self, net: Net, config: RunConfig, state: TrainState, split: str | None) -> Net:
        """The conv model server and the FC server at `state` (its weights, momentum and solver
        iterations; with the engine's averaging, the average it kept); returns the conv phase."""
        averages = getattr(self.engine, "averaging", None) is not None
        work = net.copy()
        work.set_params(trained_weights(state) if averages else state.params)  # training goes on from these
        conv, fc = work.split_phases(at=split)
        self.split = fc.layers[0].name if fc is not None else None
        if fc is None:
            raise ValueError(f"net {net.name!r} has no FC phase; the simulator needs a merged FC server")
        self.conv_server = ConvModelServer.of_phase(conv, config.weight_decay)
        self.fc_server = FCServer(fc, weight_decay=config.weight_decay, seed=config.seed)
        if averages:  # continue the state's average, or start one at its weights
            self.conv_server.average_weights(server_average(state, conv.params, "conv_count"))
            self.fc_server.average_weights(server_average(state, fc.params, "fc_count"))
        sim = state.extra.get("simulator")
        conv_mom = {key: v for key, v in state.momentum.items() if key in conv.params}
        fc_mom = {key: v for key, v in state.momentum.items() if key in fc.params}
        self.conv_server.solver.load_state_dict(
            {"iter": sim["conv_iter"] if sim else state.iterations_done, "history": conv_mom}
        )
        self.conv_server.version = sim["conv_version"] if sim else state.iterations_done
        if sim and "updates" in sim:  # the total-momentum measurement goes on where it was
            self.conv_server.updates.load(sim["updates"])
        self.fc_server.solver.load_state_dict(
            {"iter": sim["fc_iter"] if sim else state.iterations_done, "history": fc_mom}
        )
        return conv

    # -- events ----------------------------------------------------------------------------------
    def _schedule(self, t: float, kind: str, grp: int) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, grp))
        self.seq += 1

    def _sample(self, mean: float) -> float:
        """One duration around `mean`: fixed, gamma with the engine's CV, or exponential."""
        if mean <= 0 or self.engine.variability == "deterministic":
            return mean
        if self.engine.variability == "exponential":
            return float(self.rng.exponential(mean))
        cv = self.engine.cv
        return float(self.rng.gamma(1.0 / cv**2, mean * cv**2)) if cv > 0 else mean

    def _start(self, t: float, grp: int) -> None:
        version, weights = self.conv_server.pull()
        self.group_nets[grp].set_params(weights)
        t_conv = self._sample(self.t_conv_mean)
        self.groups[grp] = {
            "version_read": version,
            "weights": weights,
            "batch": self.cursor,
            "t_start": t,
            "t_conv": t_conv,
            "dacts": None,
            "loss": None,
            "accuracy": None,
        }
        self.cursor += 1
        self._schedule(t + self.engine.forward_fraction * t_conv, "fc_arrive", grp)

    def _fc_arrive(self, t: float, grp: int) -> None:
        self.fc_queue.append(grp)
        if self.fc_busy is None:
            self._serve(t)

    def _serve(self, t: float) -> None:
        self.fc_busy = self.fc_queue.popleft()
        self._schedule(t + self._sample(self.engine.t_fc), "fc_done", self.fc_busy)

    def _forward(self, grp: int) -> tuple:
        """The group's conv forward on its pulled weights (recomputed after a resume)."""
        if grp not in self.caches:
            gs = self.groups[grp]
            xb, yb = self.data.get(gs["batch"])
            acts, caches = conv_forward_shards(
                self.group_nets[grp], xb, self.slices, self.config.seed, gs["batch"]
            )
            self.caches[grp] = (acts, caches, yb)
        return self.caches[grp]

    def _fc_done(self, t: float, grp: int) -> None:
        acts, _, yb = self._forward(grp)
        out = self.fc_server.step(acts, yb, lr=self.config.lr, momentum=self.config.momentum)
        gs = self.groups[grp]
        gs.update(
            dacts=out["dacts"],
            loss=float(out["loss"]),
            main_loss=float(out["main_loss"]),
            accuracy=float(out["accuracy"]),
        )
        gs.update(grad_sq=out["grad_sq"], grad_sq_half=out["grad_sq_half"])
        self.fc_busy = None
        if self.fc_queue:
            self._serve(t)
        self._schedule(t + (1.0 - self.engine.forward_fraction) * gs["t_conv"], "push", grp)

    def _push(self, t: float, grp: int) -> dict[str, Any]:
        _, caches, _ = self._forward(grp)
        gs = self.groups.pop(grp)
        grads = conv_backward_shards(self.group_nets[grp], gs["dacts"], caches, self.slices)
        del self.caches[grp]
        info = self.conv_server.push(
            grads, gs["version_read"], lr=self.config.lr, momentum=self.config.momentum
        )
        self.iterations_done += 1
        self._schedule(t, "start", grp)
        epoch = gs["batch"] / self.data.per_epoch
        return {
            "group": grp,
            "iteration": self.iterations_done,
            "t_start": gs["t_start"],
            "t_end": t,
            **info,
            "loss": gs["loss"],
            "main_loss": gs["main_loss"],
            "accuracy": gs["accuracy"],
            "grad_sq": gs.get("grad_sq", math.nan),
            "grad_sq_half": gs.get("grad_sq_half", math.nan),
            "n_images": self.config.batch_size,
            "epoch": epoch,
            "batch": gs["batch"],
        }

    def advance(self, budget: Budget) -> list[dict[str, Any]]:
        """Process events until the budget is spent; returns one trace row per pushed update."""
        t0, limit = self.clock, math.inf if budget.seconds is None else self.clock + budget.seconds
        handlers = {"start": self._start, "fc_arrive": self._fc_arrive, "fc_done": self._fc_done}
        rows: list[dict[str, Any]] = []
        total = budget.iterations if budget.iterations is not None else budget.seconds
        unit = "it" if budget.iterations is not None else "sim s"
        with tqdm(total=total, unit=unit, disable=not self.engine.verbose, delay=2.0, leave=False) as bar:
            while self.events and self.events[0][0] <= limit:
                t, _, kind, grp = heapq.heappop(self.events)
                if budget.iterations is None:
                    bar.update(t - self.clock)
                self.clock = t
                if kind != "push":
                    handlers[kind](t, grp)
                    continue
                rows.append(self._push(t, grp))
                if budget.iterations is not None:
                    bar.update(1)
                if not math.isfinite(rows[-1]["loss"]):
                    self.diverged = True
                    break
                if self.control is not None and self._polled(rows, t - t0):
                    break
                if budget.exhausted(t - t0, len(rows)) or self.engine.past_wall_deadline():
                    break
            else:
                if math.isfinite(limit):
                    bar.update(limit - self.clock if budget.iterations is None else 0)
                    self.clock = limit
        return rows

    # -- a run control (`engine.control`) ---------------------------------------------------------
    def _polled(self, rows: list[dict[str, Any]], seconds: float) -> bool:
        """Poll the control after the update `rows[-1]` and apply its commands, all before the next
        event; True when one of them ends the run."""
        new, self.polled = rows[self.polled :], len(rows)
        position = self.iterations_done - self.rewound
        commands = check_commands(self.control.poll(Progress(position, len(rows), seconds, new)), self.config)
        end, commands = ordered(commands)
        for cmd in commands:
            if isinstance(cmd, Reschedule):
                at = self.conv_server.reschedule(cmd.lr, cmd.momentum, cmd.at)
                self.fc_server.reschedule(cmd.lr, cmd.momentum, cmd.at)
            elif isinstance(cmd, TakeSnapshot):
                if cmd.fetch:
                    raise ValueError(
                        f"TakeSnapshot({cmd.name!r}, fetch=True): the simulated engine keeps snapshots "
                        "but does not fetch them (its clock evaluates at the ends of runs)"
                    )
                at = self.conv_server.keep_snapshot(cmd.name, self.fc_server.keep_snapshot(cmd.name))
            else:
                at, _ = self.conv_server.restore_snapshot(cmd.name)
                self.fc_server.restore_snapshot(cmd.name)
                self.rewound += self.iterations_done - self.rewound - at
            self.applied.append(Applied(cmd, at, seconds))
        if end is not None:
            self.applied.append(Applied(end, self.iterations_done - self.rewound, seconds))
        return end is not None

    # -- state -----------------------------------------------------------------------------------
    def train_state(self) -> TrainState:
        """Weights and momentum of both phases, the data cursor, and the in-flight iterations; with
        averaging, `params` are the average and `extra["averaging"]` the weights and the counts."""
        params = {**self.conv_server.params, **self.fc_server.net.get_params()}
        extra = dict(self.extra)
        if self.conv_server.average is not None:
            weights = {key: np.array(v, copy=True) for key, v in params.items()}
            conv, fc = self.conv_server.average.state(), self.fc_server.average.state()
            params, extra["averaging"] = averaged_state(weights, conv, fc)
        momentum = {**self.conv_server.solver.history, **self.fc_server.solver.history}
        sim = {
            "signature": dict(self.signature),
            "clock": self.clock,
            "seq": self.seq,
            "events": sorted(self.events),
            "groups": self.groups,
            "fc_queue": list(self.fc_queue),
            "fc_busy": self.fc_busy,
            "rng": self.rng.bit_generator.state,
            "fc_rng": self.fc_server.rng.bit_generator.state,
            "conv_version": self.conv_server.version,
            "conv_iter": self.conv_server.solver.iter,
            "fc_iter": self.fc_server.solver.iter,
            "updates": self.conv_server.updates.state(),
        }
        return TrainState(
            params={key: np.array(v, copy=True) for key, v in params.items()},
            momentum={key: np.array(v, copy=True) for key, v in momentum.items()},
            batches_done=self.cursor,
            iterations_done=self.iterations_done - self.rewound,
            extra={**extra, "fc_rng": copy.deepcopy(sim["fc_rng"]), "simulator": copy.deepcopy(sim)},
        )
