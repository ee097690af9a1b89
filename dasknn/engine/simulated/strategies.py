"""The other papers' strategies in the simulator: the unmerged FC layout, Crossbow's SMA and
SparkNet's model averaging, each an event loop built on Omnivore's (`events.Simulation`).

- `UnmergedSimulation`: Omnivore appendix C's unmerged physical map (the MXNet/SINGA layout): every
  compute group runs the FC phase itself on FC weights pulled from an FC model server, and pushes
  its FC gradient there like the conv gradient, so the FC model is as stale as the conv model.
- `ReplicaSimulation`: k learners each train a whole replica (FC included, no FC server) and are
  synchronised every iteration by SMA (Crossbow §3.2, Alg. 1) or averaged every τ iterations
  (SparkNet's model averaging).

RALP's split (layer-placement §3) is a strategy choice both engines resolve:
`dasknn.engine.strategy.split_layer`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dasknn.engine.servers import ConvModelServer
from dasknn.engine.simulated.events import Batches, Simulation
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn.net import Net
from dasknn.nn.solver import SGD

__all__ = ["ReplicaSimulation", "UnmergedSimulation"]


class UnmergedSimulation(Simulation):
    """Omnivore's event loop with the unmerged physical map (Omnivore appendix C, Fig. 18).

    Each group pulls the conv AND the FC weights at its start, runs the FC phase on its own workers
    (`t_fc_worker` simulated seconds, no FIFO queue: FC compute is not shared), and pushes both
    gradients to their model servers. Trace rows gain `fc_staleness`. Runs start every group afresh
    from the state's weights (in-flight iterations of a previous run are not continued).
    """

    def __init__(self, engine, net: Net, X, y, config: RunConfig, k: int, state: TrainState, split=None):
        fresh = TrainState(
            params=state.params,
            momentum=state.momentum,
            batches_done=state.batches_done,
            iterations_done=state.iterations_done,
            extra={key: v for key, v in state.extra.items() if key != "simulator"},
        )
        super().__init__(engine, net, X, y, config, k, fresh, split=split)
        fc = self.fc_server.net
        fc_keys = set(fc.params)
        self.fc_model = ConvModelServer.of_phase(fc, config.weight_decay)
        self.fc_model.solver.load_state_dict(
            {
                "iter": state.iterations_done,
                "history": {key: v for key, v in state.momentum.items() if key in fc_keys},
            }
        )
        self.group_fc = [fc.copy() for _ in range(config.n_groups)]
        self.t_fc_worker = float(engine.t_fc_worker)

    def _start(self, t: float, grp: int) -> None:
        super()._start(t, grp)
        version, weights = self.fc_model.pull()
        self.groups[grp].update(fc_version_read=version, fc_weights=weights)

    def _fc_arrive(self, t: float, grp: int) -> None:
        self._schedule(t + self._sample(self.t_fc_worker), "fc_done", grp)

    def _fc_done(self, t: float, grp: int) -> None:
        acts, _, yb = self._forward(grp)
        gs = self.groups[grp]
        fc = self.group_fc[grp]
        fc.set_params(gs["fc_weights"])
        out = fc.train_step(
            acts, yb, rng=np.random.default_rng([self.config.seed, 5, gs["batch"]]), need_dx=True
        )
        gs.update(
            dacts=out["dx"],
            fc_grads=out["grads"],
            loss=float(out["loss"]),
            main_loss=float(out["main_loss"]),
            accuracy=float(out["accuracy"]),
        )
        self._schedule(t + (1.0 - self.engine.forward_fraction) * gs["t_conv"], "push", grp)

    def _push(self, t: float, grp: int) -> dict[str, Any]:
        gs = self.groups[grp]
        row = super()._push(t, grp)
        info = self.fc_model.push(
            gs["fc_grads"], gs["fc_version_read"], lr=self.config.lr, momentum=self.config.momentum
        )
        row["fc_staleness"] = info["staleness"]
        return row

    def train_state(self) -> TrainState:
        """Both phases' weights and momentum (FC from the FC model server) and the data cursor."""
        params = {**self.conv_server.params, **self.fc_model.params}
        momentum = {**self.conv_server.solver.history, **self.fc_model.solver.history}
        return TrainState(
            params={key: np.array(v, copy=True) for key, v in params.items()},
            momentum={key: np.array(v, copy=True) for key, v in momentum.items()},
            batches_done=self.cursor,
            iterations_done=self.iterations_done,
            extra=dict(self.extra),
        )


class ReplicaSimulation:
    """k learners with their own replicas, synchronised by SMA or model averaging; a modeled clock.

    Crossbow §3.2, Alg. 1 (SMA), per iteration with central average model z and replicas w_j:

        g_j = γ∇ℓ_{B_j}(w_j)                     learning task: a plain SGD step on the replica
        c_j = α (w_j − z)                        correction, from the same w_j and this round's z
        w_j ← w_j − g_j − c_j                    (α = 1/k by default)
        z'  = z + Σ_j c_j + µ (z − z_prev)       the average model: Polyak momentum on z only

    The replicas carry no momentum of their own; z moves by the corrections, so with α = 1/k it
    follows the mean of the replicas one round behind, and µ acts on z alone (Crossbow §3.2).
    `model_averaging` (SparkNet): every replica runs SGD with its own momentum, and every τ
    iterations z = mean_j w_j, w_j ← z.

    Learner j of iteration r takes batch `batches_done + r·k + j`. An iteration takes, in simulated
    seconds, the slowest learner's t_conv(N // k) + t_fc_worker, plus `t_sync` when it synchronises.
    Each learner's batch is one Trace row (staleness 0; the version is z's). The returned state holds
    z as the weights and z − z_prev as the momentum (Caffe's V); each run starts its replicas at z,
    as Crossbow restarts SMA from the latest average model (§3.2).
    """

    def __init__(self, engine, net: Net, X, y, config: RunConfig, k: int, state: TrainState) -> None:
        self.engine, self.config, self.k = engine, config, k
        self.strategy: Strategy = engine.strategy
        self.n_learners = int(config.n_groups)
        self.t_conv_mean = engine.conv_time(k)
        self.data = Batches(X, y, config.batch_size, config.seed, engine.shuffle_window, engine.augment)
        self.net = net.copy()
        self.net.set_params(state.params)
        self.z = {key: np.array(v, copy=True) for key, v in state.params.items()}
        self.z_prev = {
            key: self.z[key] - state.momentum[key] if key in state.momentum else self.z[key].copy()
            for key in self.z
        }
        self.replicas = [{key: v.copy() for key, v in self.z.items()} for _ in range(self.n_learners)]
        self.solvers = [
            SGD.for_net(self.net, weight_decay=config.weight_decay) for _ in range(self.n_learners)
        ]
        self.alpha = self.strategy.alpha if self.strategy.alpha is not None else 1.0 / self.n_learners
        self.iterations_done, self.cursor = state.iterations_done, state.batches_done
        self.extra = {key: v for key, v in state.extra.items() if key != "simulator"}
        self.rounds = 0
        self.clock = 0.0
        self.rng = np.random.default_rng([config.seed, 6, state.iterations_done])
        self.diverged = False

    def _learn(self, j: int) -> tuple[float, float, dict[str, np.ndarray]]:
        """Learner j's batch on its replica: an SGD step (momentum only for model averaging).
        Returns the loss, the accuracy and the replica as it was before the step (SMA's w_j)."""
        xb, yb = self.data.get(self.cursor + j)
        before = {key: v.copy() for key, v in self.replicas[j].items()}
        self.net.set_params(self.replicas[j])
        rng = np.random.default_rng([self.config.seed, 4, self.cursor + j])
        loss, acc, grads = self.net.loss_and_grads(xb, yb, rng=rng)
        momentum = self.config.momentum if self.strategy.name == "model_averaging" else 0.0
        self.solvers[j].step(self.replicas[j], grads, lr=self.config.lr, momentum=momentum)
        return float(loss), float(acc), before

    def _synchronise(self, before: list[dict[str, np.ndarray]]) -> bool:
        """SMA every iteration (`before`: each replica at its gradient's point); model averaging
        every τ. Returns whether it synchronised."""
        if self.strategy.name == "model_averaging":
            if (self.rounds + 1) % self.strategy.tau:
                return False
            for key in self.z:
                self.z[key] = np.mean([w[key] for w in self.replicas], axis=0, dtype=self.z[key].dtype)
                for w in self.replicas:
                    w[key] = self.z[key].copy()
            return True
        for key, z in self.z.items():
            corrections = [self.alpha * (w[key] - z) for w in before]
            for w, c in zip(self.replicas, corrections, strict=True):
                w[key] -= c
            z_new = z + sum(corrections) + self.config.momentum * (z - self.z_prev[key])
            self.z_prev[key], self.z[key] = z, z_new
        return True

    def advance(self, budget: Budget) -> list[dict[str, Any]]:
        """Run synchronous iterations until the budget is spent; one Trace row per learner batch."""
        limit = math.inf if budget.seconds is None else budget.seconds
        rows: list[dict[str, Any]] = []
        t_step = self.t_conv_mean + self.engine.t_fc_worker
        while True:
            durations = [self._sample(t_step) for _ in range(self.n_learners)]
            synced_cost = self.engine.t_sync
            if self.strategy.name == "model_averaging" and (self.rounds + 1) % self.strategy.tau:
                synced_cost = 0.0
            t_end = self.clock + max(durations) + synced_cost
            if t_end > limit:
                self.clock = limit
                break
            results = [self._learn(j) for j in range(self.n_learners)]
            self._synchronise([before for _, _, before in results])
            for j, (loss, acc, _) in enumerate(results):
                self.iterations_done += 1
                rows.append(self._row(j, loss, acc, t_end))
            self.cursor += self.n_learners
            self.rounds += 1
            self.clock = t_end
            if not all(math.isfinite(r["loss"]) for r in rows[-self.n_learners :]):
                self.diverged = True
                break
            if budget.exhausted(self.clock, len(rows)) or self.engine.past_wall_deadline():
                break
        return rows

    def _sample(self, mean: float) -> float:
        return Simulation._sample(self, mean)

    def _row(self, j: int, loss: float, acc: float, t_end: float) -> dict[str, Any]:
        batch = self.cursor + j
        return {
            "group": j,
            "iteration": self.iterations_done,
            "t_start": self.clock,
            "t_end": t_end,
            "version_read": self.rounds,
            "version_written": self.rounds + 1,
            "staleness": 0,
            "loss": loss,
            "accuracy": acc,
            "lr": self.config.lr,
            "momentum": self.config.momentum,
            "n_images": self.config.batch_size,
            "epoch": batch / self.data.per_epoch,
            "batch": batch,
        }

    def train_state(self) -> TrainState:
        """z as the weights, z − z_prev as Caffe's momentum buffer V, and the data cursor.

        Model averaging returns the average of the replicas as they are now (the last τ-period may
        be unfinished) and the learners' mean momentum buffer.
        """
        if self.strategy.name == "model_averaging":
            self.z = {
                key: np.mean([w[key] for w in self.replicas], axis=0, dtype=z.dtype)
                for key, z in self.z.items()
            }
            momentum = {
                key: np.mean([s.history[key] for s in self.solvers], axis=0)
                for key in self.solvers[0].history
            }
        else:
            momentum = {key: self.z[key] - self.z_prev[key] for key in self.z}
        return TrainState(
            params={key: np.array(v, copy=True) for key, v in self.z.items()},
            momentum=momentum,
            batches_done=self.cursor,
            iterations_done=self.iterations_done,
            extra=dict(self.extra),
        )
