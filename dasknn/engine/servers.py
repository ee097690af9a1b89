"""Omnivore's servers: the conv model server and the merged FC server (Omnivore §III-B, appendix C).

Plain classes, usable in one process (the simulator, tests) and wrapped as dask actors by the Dask
engine. Both apply Caffe's SGD (`dasknn.nn.solver.SGD`), with the learning rate and momentum of
each call, so the tuner can change them between probes. Each may be a `Schedule`, which the
server evaluates at its solver's iteration index (the updates it applied before, over the fit), so
η and µ change inside a run at the update the schedule says, on either engine. Either may keep
an exponential moving average of its weights beside them (`average_weights`,
`engine.averaging.WeightAverage`), updated at each update and carried by its state and snapshots.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from dasknn.backend import device_scope, to_device, to_numpy
from dasknn.engine.averaging import WeightAverage
from dasknn.engine.schedule import Schedule, value_at
from dasknn.nn.loss import softmax
from dasknn.nn.net import Net
from dasknn.nn.solver import SGD

MOMENTUM_SAMPLE = 256
"""Conv weights sampled (fixed, seeded) to measure the total momentum from consecutive updates."""


class ParameterSample:
    """A fixed, seeded sample of `size` coordinates across a weight dict's arrays (the same ones at
    every read, so successive reads form a trajectory)."""

    def __init__(self, params: dict[str, Any], size: int = MOMENTUM_SAMPLE, seed: int = 0) -> None:
        if int(size) < 1:
            raise ValueError(f"the sample needs at least 1 coordinate, got {size}")
        names = sorted(params)
        sizes = np.array([int(np.prod(np.shape(params[k]))) for k in names])
        total = int(sizes.sum())
        flat = np.random.default_rng(seed).choice(total, size=min(int(size), total), replace=False)
        edges = np.concatenate([[0], np.cumsum(sizes)])
        self.index = {
            k: np.sort(flat[(flat >= edges[i]) & (flat < edges[i + 1])] - edges[i])
            for i, k in enumerate(names)
        }
        self.index = {k: i for k, i in self.index.items() if len(i)}

    def read(self, params: dict[str, Any]) -> np.ndarray:
        """The sampled coordinates of `params`, as one float64 vector."""
        return np.concatenate(
            [np.asarray(params[k], dtype=np.float64).ravel()[i] for k, i in self.index.items()]
        )


class UpdateCorrelation:
    """Consecutive updates of a `ParameterSample`, their slow drift removed: per update
    `update_dot` = e_t·e_{t−1} and `update_sq` = |e_{t−1}|², where e_t = Δw_t − m and m is a running
    mean of the updates over ~`horizon` updates (the drift of the gradient, which makes consecutive
    updates alike at any µ). NaN until the mean has seen `horizon` updates. Their sums over a
    segment give the regressed total momentum Σ dot / Σ sq (YellowFin's measurement,
    `optimizer.momentum`)."""

    def __init__(self, params: dict[str, Any], size: int = MOMENTUM_SAMPLE, horizon: int = 50) -> None:
        self.sample = ParameterSample(params, size) if params else None
        self.horizon = int(horizon)
        self.last: np.ndarray | None = None
        self.mean: np.ndarray | None = None
        self.last_dev: np.ndarray | None = None
        self.seen = 0

    def update(self, params: dict[str, Any]) -> dict[str, float]:
        out = {"update_dot": float("nan"), "update_sq": float("nan")}
        if self.sample is None:
            return out
        w = self.sample.read(params)
        if self.last is not None:
            delta = w - self.last
            self.seen += 1
            if self.mean is None:
                self.mean = delta.copy()
            dev = delta - self.mean
            if self.last_dev is not None and self.seen > self.horizon:
                out = {
                    "update_dot": float(dev @ self.last_dev),
                    "update_sq": float(self.last_dev @ self.last_dev),
                }
            self.last_dev = dev
            self.mean += (delta - self.mean) / min(self.seen, self.horizon)
        self.last = w
        return out

    def state(self) -> dict[str, Any]:
        """What continues the measurement exactly in a later run (`load`)."""
        copy = lambda a: None if a is None else a.copy()  # noqa: E731
        return {
            "last": copy(self.last),
            "mean": copy(self.mean),
            "last_dev": copy(self.last_dev),
            "seen": self.seen,
        }

    def load(self, state: dict[str, Any]) -> None:
        for key in ("last", "mean", "last_dev"):
            value = state.get(key)
            setattr(self, key, None if value is None else np.array(value, dtype=np.float64))
        self.seen = int(state.get("seen", 0))


class Knobs:
    """The changes of η and µ a run control made (`engine.control.Reschedule`), over the knobs each
    update is called with: from its index `at` on, a change's η (µ) replaces the call's; a later
    change with the same or a lower `at` wins from its own `at` on."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, Any, Any]] = []

    def add(self, lr, momentum, at: int | None, now: int) -> int:
        """Record a change from index `at` (at least `now`, the next update's); returns that index."""
        at = now if at is None else max(int(at), now)
        self.changes.append((at, lr, momentum))
        self.changes.sort(key=lambda c: c[0])  # stable: of two at one index, the later wins
        return at

    def values(self, lr, momentum, i: int) -> tuple[float, float]:
        """η and µ for the update with index `i`."""
        for at, new_lr, new_momentum in self.changes:
            if at > i:
                break
            lr = lr if new_lr is None else new_lr
            momentum = momentum if new_momentum is None else new_momentum
        return value_at(lr, i), value_at(momentum, i)


class ConvModelServer:
    """Conv-phase weights, their momentum buffers and a version counter.

    It also keeps BatchNorm's running statistics (`Net.statistics`) as plain blobs beside the
    weights: a push carries the sum of the group's shards' contributions, accumulated as
    blob ← moving_average_fraction·blob + contribution (no rate, momentum or decay), so groups'
    statistics combine in the order their updates arrive, exactly as their gradients do.

    `pull()` returns (version, weights); `push(grads, version_read, lr, momentum)` applies ONE update
    (a compute group's summed gradient) and returns its staleness: the number of updates other groups
    wrote between this group's read and its write, S = v' − v − 1 (Omnivore §III-B).

    For the Dask engine the server also keeps the log of the updates it applied (a push with a
    `row` appends that Trace row, `drain()` hands the log to the driver), so the Trace holds exactly
    the updates that are in the model even when a group's worker dies; `claim(group)` lets one loop
    per compute group run (dask may run a task again), and after `stop()` pushes are refused.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        lr_mult: dict[str, float] | None = None,
        decay_mult: dict[str, float] | None = None,
        weight_decay: float = 0.0,
        statistics: dict[str, float] | None = None,
    ) -> None:
        self.params = {k: np.array(v, copy=True) for k, v in params.items()}
        self.solver = SGD(
            weight_decay=weight_decay,
            lr_mult=dict(lr_mult or {}),
            decay_mult=dict(decay_mult or {}),
            statistics=dict(statistics or {}),
        )
        self.version = 0
        self.stopped = False
        self.log: list[dict[str, Any]] = []
        self.claimed: set[int] = set()
        self._lock = threading.RLock()  # push_pull holds it across push and pull
        self.updates = UpdateCorrelation(self.params)
        self.knobs = Knobs()
        self.kept: dict[str, dict[str, Any]] = {}  # the run control's snapshots, by name
        self.pending: dict[str, int] = {}  # snapshots to take at an iteration still ahead
        self.average: WeightAverage | None = None  # the weights' average, when the run keeps one

    @classmethod
    def of_phase(cls, phase: Net, weight_decay: float = 0.0) -> ConvModelServer:
        """The server of a net's phase (`Net.split_phases`): its weights, its layers' lr and decay
        multipliers and running statistics."""
        return cls(phase.get_params(), phase.lr_mult, phase.decay_mult, weight_decay, phase.statistics)

    def average_weights(self, state: dict[str, Any] | None = None) -> None:
        """Keep an average of the weights from now on: from the weights held now (count 0), or
        continuing `state` (`WeightAverage.state()`)."""
        with self._lock:
            self.average = WeightAverage(self.params) if state is None else WeightAverage.from_state(state)

    def stop(self) -> None:
        """Tell every compute group to stop: later pushes are refused, so the weights stay as they are."""
        with self._lock:
            self.stopped = True

    def new_run(self, version: int = 0) -> None:
        """Begin another run on the weights, momentum and update measurement held now (the Dask
        engine keeps its servers between runs: a new η or µ is an argument of each push, not a
        restart): pushes accepted again, no group's loop claimed, the log empty, versions counted
        from `version`."""
        with self._lock:
            self.stopped, self.claimed, self.log = False, set(), []
            self.version = int(version)
            self.forget_control()

    # -- a run control's commands (`engine.control`) -----------------------------------------------
    def reschedule(self, lr, momentum, at: int | None) -> int:
        """η and/or µ from index `at` on (`Knobs.add`); returns the index it holds from."""
        with self._lock:
            return self.knobs.add(lr, momentum, at, self.solver.iter)

    def keep_snapshot(self, name: str, at: int | None = None) -> int:
        """Keep the weights, momentum and solver iteration under `name`: now, or, when `at` is
        ahead, right after the update that brings the solver's iteration to `at` (the FC server's,
        whose step of an iteration comes before its push: the two then hold the same count of
        updates); returns that iteration."""
        with self._lock:
            if at is not None and int(at) > self.solver.iter:
                self.kept.pop(name, None)
                self.pending[name] = int(at)
                return int(at)
            self.pending.pop(name, None)
            self.kept[name] = self._state()
            return self.solver.iter

    def restore_snapshot(self, name: str) -> tuple[int, int]:
        """Go back to the weights, momentum and solver iteration kept under `name` (the version,
        which counts this run's updates for their staleness, goes on); returns (that iteration,
        the version now)."""
        with self._lock:
            if name not in self.kept:
                why = f"its update {self.pending[name]} never came" if name in self.pending else "none taken"
                raise KeyError(f"the conv model server keeps no snapshot {name!r} ({why})")
            state = self.kept[name]
            self.params = {k: v.copy() for k, v in state["params"].items()}
            self.solver.load_state_dict(state["solver"])
            self._load_average(state)
            self.updates = UpdateCorrelation(self.params)  # no update spans a restore
            return self.solver.iter, self.version

    def kept_state(self, name: str) -> dict[str, Any] | None:
        """The state kept under `name` (`_state`'s form, its version the count of updates then);
        None while it waits for its update (`keep_snapshot` with `at` ahead)."""
        with self._lock:
            if name in self.kept:
                return self.kept[name]
            if name in self.pending:
                return None
            raise KeyError(f"the conv model server keeps no snapshot {name!r} (none taken)")

    def _take_pending(self) -> None:
        for name in [n for n, at in self.pending.items() if at == self.solver.iter]:
            del self.pending[name]
            self.kept[name] = self._state()

    def forget_control(self) -> None:
        """Drop the run control's changes of η and µ and its snapshots (a new run's own knobs rule)."""
        self.knobs, self.kept, self.pending = Knobs(), {}, {}

    def claim(self, group: int) -> bool:
        """Register compute group `group`'s loop; False if one already ran for it or the server stopped."""
        with self._lock:
            if self.stopped or group in self.claimed:
                return False
            self.claimed.add(int(group))
            return True

    def drain(self, with_state: bool = False) -> dict[str, Any]:
        """{"version", "stopped", "rows"}: the logged Trace rows since the last drain (the log is
        emptied), and with `with_state` the "state" (`get_state()`) read at the same moment."""
        with self._lock:
            rows, self.log = self.log, []
            out = {"version": self.version, "stopped": self.stopped, "rows": rows}
            if with_state:
                out["state"] = self._state()
            return out

    def progress(self) -> tuple[int, bool]:
        """(updates applied so far, stopped?) for progress bars and stop checks."""
        return self.version, self.stopped

    def pull(self) -> tuple[int, dict[str, np.ndarray]]:
        """The current version number and a copy of the weights."""
        with self._lock:
            return self.version, {k: v.copy() for k, v in self.params.items()}

    def push(
        self,
        grads: dict[str, Any],
        version_read: int,
        lr: float | Schedule,
        momentum: float | Schedule,
        row: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Apply one group's update; returns {"version_read", "version_written", "staleness", "lr",
        "momentum"} (the η and µ it applied).

        With `row` (a Trace row's other fields) the row, completed with those and `t_end`, is logged
        and returned. After `stop()` the update is refused and None returned.
        """
        unknown = set(grads) - set(self.params)
        if unknown:
            raise KeyError(f"conv model server has no parameters {sorted(unknown)}")
        with self._lock:
            if self.stopped:
                return None
            host = {k: np.asarray(g) for k, g in grads.items()}  # the shards send host arrays
            lr, momentum = self.knobs.values(lr, momentum, self.solver.iter)
            self.solver.step(self.params, host, lr=lr, momentum=momentum)
            if self.average is not None:
                self.average.update(self.params)
            self.version += 1
            if self.pending:
                self._take_pending()
            written = self.version
            out = {
                "version_read": version_read,
                "version_written": written,
                "staleness": written - version_read - 1,
                "lr": lr,
                "momentum": momentum,
                **self.updates.update(self.params),
            }
            if row is not None:
                out = {**row, **out, "t_end": time.time()}
                self.log.append(out)
        return out

    def push_pull(
        self,
        grads: dict[str, Any],
        version_read: int,
        lr: float | Schedule,
        momentum: float | Schedule,
        row: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any] | None, tuple[int, dict[str, np.ndarray]] | None]:
        """`push`, then `pull` at once, in one call: (what `push` returns, (version, weights)), or
        (None, None) after `stop()`. A group's next iteration starts from the model its own update
        made (no other group's update falls between the two), and a remote group saves a round
        trip per iteration."""
        with self._lock:
            out = self.push(grads, version_read, lr, momentum, row)
            return (None, None) if out is None else (out, self.pull())

    def get_state(self) -> dict[str, Any]:
        """Weights, momentum buffers, version and, when the server keeps one, the weights'
        "average" (a snapshot for checkpoints and probes)."""
        with self._lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        state = {
            "params": {k: v.copy() for k, v in self.params.items()},
            "solver": self.solver.state_dict(),
            "version": self.version,
        }
        if self.average is not None:
            state["average"] = self.average.state()
        return state

    def _load_average(self, state: dict[str, Any]) -> None:
        """The average a state holds (none when it holds none)."""
        self.average = WeightAverage.from_state(state["average"]) if "average" in state else None

    def set_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.params = {k: np.array(v, copy=True) for k, v in state["params"].items()}
            self.solver.load_state_dict(state["solver"])
            self._load_average(state)
            self.version = int(state["version"])
            self.updates = UpdateCorrelation(self.params)  # no update spans a restore


NOISE_EVERY = 4
"""The FC server measures the squared gradient norms of the gradient noise scale every NOISE_EVERY-th
batch (one more FC backward on half of the batch each time)."""


def grad_norms(net: Net, dheads: dict[str, Any], caches, grads: dict[str, Any]) -> tuple[float, float]:
    """(|G_B|², mean of |G_B/2|² over the two halves) of one batch's FC-phase gradient.

    The two-batch-size estimator of the gradient noise scale (McCandlish et al. 2018, appendix A)
    needs only these squared norms. The loss is a mean over the B samples, so the backward of the
    loss heads' gradients with one half zeroed is that half's sum over B; rescaled, each half is an
    estimate of the gradient from B/2 samples. Running statistics (`Net.statistics`) are not
    gradients and are left out.
    """
    n = next(iter(dheads.values())).shape[0]
    half = n // 2
    if half < 1:
        return float("nan"), float("nan")
    first = {}
    for blob, d in dheads.items():
        first[blob] = d.copy()
        first[blob][half:] = 0
    _, g_first = net.backward(first, caches)
    learned = [k for k in g_first if k not in net.statistics]
    big = sum(float((grads[k] * grads[k]).sum()) for k in learned)
    a = sum(float(((g_first[k] * (n / half)) ** 2).sum()) for k in learned)
    b = sum(float((((grads[k] - g_first[k]) * (n / (n - half))) ** 2).sum()) for k in learned)
    return big, (a + b) / 2


class FCServer:
    """The merged FC server: FC compute and FC model on one machine (Omnivore §III-B).

    `step(acts, labels, lr, momentum)` runs, for one batch, FC forward, SoftmaxWithLoss, accuracy,
    FC backward and the FC update, and returns the gradient w.r.t. the activations. Calls are
    serialised (one batch at a time), so the FC model is never stale. Every NOISE_EVERY-th batch it
    also returns the squared gradient norms of the whole batch and of its halves (`grad_sq`,
    `grad_sq_half`, `grad_norms`): what the gradient noise scale is estimated from.

    The FC model and its momentum live on `device` ('cpu', 'gpu' or 'gpu:N': CuPy on a GPU worker),
    and a step moves only the activations and labels in and d(activations) out. Its dropout draws
    from the host generator `rng` (`dasknn.nn.randomness`), and `get_state` is numpy on the host,
    so snapshots and checkpoints do not depend on the device. With device 'cpu' the server computes
    on `fc_net` itself; on a GPU, on a device copy of it.
    """

    def __init__(self, fc_net: Net, weight_decay: float = 0.0, seed: int = 0, device: str = "cpu") -> None:
        self.device = device
        with device_scope(device) as xp:
            self.xp = xp
            self.net = fc_net if xp is np else fc_net.copy().to(xp)
        self.solver = SGD.for_net(fc_net, weight_decay=weight_decay)
        self.rng = np.random.default_rng([seed, 2])
        self.version = 0
        self.stopped = False
        self._lock = threading.Lock()
        self.knobs = Knobs()
        self.kept: dict[str, dict[str, Any]] = {}  # the run control's snapshots, by name
        self.average: WeightAverage | None = None  # the FC weights' average, on the device

    def average_weights(self, state: dict[str, Any] | None = None) -> None:
        """As the conv model server's: an average of the FC weights from now on, or continuing `state`."""
        with self._lock, device_scope(self.device):
            if state is None:
                self.average = WeightAverage(self.net.params)
            else:
                self.average = WeightAverage.from_state(state, self.xp)

    def stop(self) -> None:
        """Refuse later steps (the driver's signal before it reads the state to recover from)."""
        with self._lock:
            self.stopped = True

    def step(self, acts, labels, lr: float | Schedule, momentum: float | Schedule) -> dict[str, Any] | None:
        """One batch through the FC phase; returns {"dacts", "loss" (weighted total over the loss
        heads), "main_loss", "accuracy" (main head), "version"}, or None once stopped. A `Schedule`
        is evaluated at the FC solver's iteration index."""
        with self._lock, device_scope(self.device):
            if self.stopped:
                return None
            acts, labels = to_device(acts, self.xp), to_device(np.asarray(labels), self.xp)
            heads, caches = self.net.forward_heads(acts, train=True, rng=self.rng)
            out = self.net.loss(heads, labels)
            dheads = out.pop("dheads")
            dacts, grads = self.net.backward(dheads, caches, need_dx=True)
            norms = (float("nan"), float("nan"))
            if self.solver.iter % NOISE_EVERY == 0:
                norms = grad_norms(self.net, dheads, caches, grads)
            lr, momentum = self.knobs.values(lr, momentum, self.solver.iter)
            self.solver.step(self.net.params, grads, lr=lr, momentum=momentum)
            if self.average is not None:
                self.average.update(self.net.params)
            self.version += 1
            return {
                "dacts": to_numpy(dacts),
                "loss": float(out["loss"]),
                "main_loss": float(out["main_loss"]),
                "accuracy": float(out["accuracy"]),
                "version": self.version,
                "grad_sq": norms[0],
                "grad_sq_half": norms[1],
            }

    def predict_proba(self, acts) -> np.ndarray:
        """Class probabilities for conv-phase activations (test mode, no update)."""
        with self._lock, device_scope(self.device):
            logits, _ = self.net.forward(to_device(acts, self.xp), train=False)
            return to_numpy(softmax(logits))

    def get_state(self) -> dict[str, Any]:
        """Weights, momentum buffers (numpy, on the host), version, the dropout rng's state and,
        when the server keeps one, the weights' "average" (`WeightAverage.state()`)."""
        with self._lock, device_scope(self.device):
            state = {
                "params": self.net.get_params(),
                "solver": self.solver.state_dict(),
                "version": self.version,
                "rng": self.rng.bit_generator.state,
            }
            if self.average is not None:
                state["average"] = self.average.state()
            return state

    # -- a run control's commands (`engine.control`), as the conv model server's --------------------
    def reschedule(self, lr, momentum, at: int | None) -> int:
        with self._lock:
            return self.knobs.add(lr, momentum, at, self.solver.iter)

    def keep_snapshot(self, name: str) -> int:
        """Keep the weights, momentum, solver iteration and dropout rng under `name` (on the host)."""
        state = self.get_state()
        with self._lock:
            self.kept[name] = state
            return int(state["solver"]["iter"])

    def kept_state(self, name: str) -> dict[str, Any]:
        """The state kept under `name` (`get_state`'s form)."""
        with self._lock:
            if name not in self.kept:
                raise KeyError(f"the FC server keeps no snapshot {name!r}")
            return self.kept[name]

    def restore_snapshot(self, name: str) -> int:
        """Go back to the state kept under `name`, but the version (the steps this server took)."""
        if name not in self.kept:
            raise KeyError(f"the FC server keeps no snapshot {name!r}")
        self.set_state({**self.kept[name], "version": self.version})
        return int(self.kept[name]["solver"]["iter"])

    def forget_control(self) -> None:
        """Drop the run control's changes and snapshots, and take steps again (a kept server after
        the control ended its run: `stop` was its End)."""
        with self._lock:
            self.knobs, self.kept, self.stopped = Knobs(), {}, False

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a `get_state()`; weights and momentum move to the server's device."""
        with self._lock, device_scope(self.device):
            self.net.set_params(state["params"])
            self.solver.load_state_dict(state["solver"], like=self.net.params)
            self.version = int(state["version"])
            self.rng.bit_generator.state = state["rng"]
            average = state.get("average")
            self.average = None if average is None else WeightAverage.from_state(average, self.xp)
