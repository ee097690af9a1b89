"""SGD with momentum and weight decay exactly as Caffe's, and Caffe's learning-rate policies.

The update, per parameter W with momentum buffer V (Caffe's SGDSolver, written with V's sign as in
the Omnivore paper): V ← µV − η·lr_mult·(∇ + λ·decay_mult·W);  W ← W + V.

Running statistics (BatchNorm's blobs, `Net.statistics`) are not learned: their "gradient" is a
batch's contribution, accumulated as W ← fraction·W + contribution with no rate, momentum or decay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dasknn.backend import array_module, to_device, to_numpy

LR_POLICIES = ("fixed", "step", "multistep", "inv", "poly", "exp", "sigmoid")


def learning_rate(
    it: int,
    base_lr: float,
    lr_policy: str = "fixed",
    gamma: float = 0.1,
    power: float = 1.0,
    stepsize: int = 1,
    stepvalue: Sequence[int] = (),
    max_iter: int | None = None,
) -> float:
    """The learning rate at iteration `it` under one of Caffe's policies (caffe.proto's formulas)."""
    if lr_policy == "fixed":
        return base_lr
    if lr_policy == "step":
        return base_lr * gamma ** (it // stepsize)
    if lr_policy == "multistep":
        return base_lr * gamma ** sum(1 for s in stepvalue if it >= s)
    if lr_policy == "exp":
        try:
            return base_lr * gamma**it
        except OverflowError:  # gamma > 1 for long enough: the rate grows without bound
            return math.inf
    if lr_policy == "inv":
        return base_lr * (1.0 + gamma * it) ** (-power)
    if lr_policy == "poly":
        if not max_iter:
            raise ValueError("lr_policy 'poly' needs max_iter")
        return base_lr * (1.0 - min(it, max_iter) / max_iter) ** power
    if lr_policy == "sigmoid":
        exponent = -gamma * (it - stepsize)
        return 0.0 if exponent > 700 else base_lr / (1.0 + math.exp(exponent))  # exp(709) overflows
    raise ValueError(f"unknown lr_policy {lr_policy!r}; expected one of {LR_POLICIES}")


UPDATE_BLOCK = 2**16
"""Values per block of `sgd_update`: its scratch and operands (256 KiB each in float32) stay in the
cache, where whole-array temporaries of a large layer (CaffeNet's fc6: 151 MB) would be written to
memory and read back once per operation."""


def sgd_update(w, v, grad, lr: float, momentum: float, weight_decay: float) -> None:
    """One in-place SGD step on one parameter: V ← µV − η(∇ + λW); W ← W + V.

    Computed block by block in the same operations and order (so the same rounding) as the
    whole-array expression, with one small scratch buffer instead of three full-size temporaries
    (on a GPU, one block: there the cost is a kernel launch per operation, not memory traffic)."""
    xp, dt = array_module(w), w.dtype.type
    flat_w, flat_v, flat_g = w.reshape(-1), v.reshape(-1), grad.reshape(-1)
    block = UPDATE_BLOCK if xp is np else max(flat_w.size, 1)
    scratch = xp.empty(min(block, flat_w.size), dtype=w.dtype)
    for start in range(0, flat_w.size, block):
        wb, vb, gb = (a[start : start + block] for a in (flat_w, flat_v, flat_g))
        tmp = scratch[: wb.size]
        vb *= dt(momentum)
        if weight_decay:
            xp.multiply(wb, dt(weight_decay), out=tmp)
            tmp += gb
            tmp *= dt(lr)
        else:
            xp.multiply(gb, dt(lr), out=tmp)
        vb -= tmp
        wb += vb


@dataclass
class SGD:
    """Caffe's SGD solver: momentum, weight decay, lr policy, per-parameter lr/decay multipliers.

    `step(params, grads)` updates the arrays in `params` in place and advances `iter`.
    `lr` and `momentum` may be overridden per step (the tuners and the servers do this).
    """

    base_lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_policy: str = "fixed"
    gamma: float = 0.1
    power: float = 1.0
    stepsize: int = 1
    stepvalue: tuple[int, ...] = ()
    max_iter: int | None = None
    lr_mult: dict[str, float] = field(default_factory=dict)
    decay_mult: dict[str, float] = field(default_factory=dict)
    statistics: dict[str, float] = field(default_factory=dict)
    iter: int = 0
    history: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.lr_policy not in LR_POLICIES:
            raise ValueError(f"unknown lr_policy {self.lr_policy!r}; expected one of {LR_POLICIES}")
        for key in ("base_lr", "momentum", "weight_decay"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key} must be a finite number >= 0, got {value}")
        self.stepvalue = tuple(int(s) for s in self.stepvalue)

    @classmethod
    def for_net(cls, net, **settings) -> SGD:
        """A solver with the net's per-parameter multipliers (Caffe's `param { lr_mult decay_mult }`)."""
        return cls(lr_mult=net.lr_mult, decay_mult=net.decay_mult, statistics=net.statistics, **settings)

    @classmethod
    def from_caffe(cls, settings: dict[str, Any], net=None) -> SGD:
        """A solver from Caffe solver settings (as `prototxt.read_solver` returns them)."""
        solver_type = str(settings.get("type", settings.get("solver_type", "SGD"))).upper()
        if solver_type != "SGD":
            raise ValueError(f"solver type {solver_type!r} is not supported; dasknn implements SGD")
        keys = ("base_lr", "momentum", "weight_decay", "lr_policy", "gamma", "power", "stepsize", "max_iter")
        kwargs = {k: settings[k] for k in keys if settings.get(k) is not None}
        if settings.get("stepvalue"):
            kwargs["stepvalue"] = tuple(settings["stepvalue"])
        if net is not None:
            return cls.for_net(net, **kwargs)
        return cls(**kwargs)

    def current_lr(self) -> float:
        return learning_rate(
            self.iter,
            self.base_lr,
            self.lr_policy,
            self.gamma,
            self.power,
            self.stepsize,
            self.stepvalue,
            self.max_iter,
        )

    def step(
        self,
        params: dict[str, Any],
        grads: dict[str, Any],
        lr: float | None = None,
        momentum: float | None = None,
    ) -> None:
        """Apply one update to every parameter that has a gradient (and accumulate every running
        statistic that has a contribution); advance the iteration."""
        lr = self.current_lr() if lr is None else lr
        momentum = self.momentum if momentum is None else momentum
        for key, grad in grads.items():
            w = params[key]
            if key in self.statistics:
                w *= w.dtype.type(self.statistics[key])
                w += grad
                continue
            v = self.history.get(key)
            if v is None:
                v = self.history[key] = array_module(w).zeros_like(w)
            sgd_update(
                w,
                v,
                grad,
                lr * self.lr_mult.get(key, 1.0),
                momentum,
                self.weight_decay * self.decay_mult.get(key, 1.0),
            )
        self.iter += 1

    def state_dict(self) -> dict[str, Any]:
        """Iteration and momentum buffers as numpy arrays (for checkpoints)."""
        return {"iter": self.iter, "history": {k: to_numpy(v).copy() for k, v in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any], like: dict[str, Any] | None = None) -> None:
        """Restore a `state_dict()`; each momentum buffer goes to the device of the parameter of its
        name in `like` (the net's live params; numpy when absent), with one copy."""
        self.iter = int(state["iter"])
        history = {}
        for k, v in state["history"].items():
            xp = array_module(like[k]) if like is not None and k in like else np
            history[k] = to_device(v, xp) if array_module(v) is not xp else v.copy()
        self.history = history
