"""Planted behaviour for the optimizer tests: a small real problem, an engine that raises on
divergence as the DaskEngine does, and probe losses that follow Omnivore's implicit-momentum theory."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState
from dasknn.nn.layers import Convolution, InnerProduct, Pooling, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff.statistical import implicit_momentum


def small_net(seed: int = 0) -> Net:
    """A conv phase and a two-layer FC phase on 8×8 digits: a few ms per iteration."""
    layers = [
        Convolution("conv1", 8, 3),
        ReLU("relu1"),
        Pooling("pool1", "max", 2, stride=2),
        InnerProduct("ip1", 32),
        ReLU("relu2"),
        InnerProduct("ip2", 10),
    ]
    return Net(layers, (1, 8, 8), name="small", seed=seed)


class RaisingEngine(SimulatedEngine):
    """The simulator, except that a run for which `raises(config, budget)` is true raises
    FloatingPointError (as a DaskEngine run whose loss overflows does) before training."""

    def __init__(self, *args, raises: Callable[[RunConfig, Budget], bool], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.raises = raises

    def run(self, net, X, y, config: RunConfig, budget: Budget, start: TrainState | None = None) -> RunResult:
        if self.raises(config, budget):
            raise FloatingPointError(f"loss overflowed (n_groups={config.n_groups}, lr={config.lr})")
        return super().run(net, X, y, config, budget, start)


def implicit_momentum_losses(optimal_total: float = 0.6, best_lr: float = 0.1):
    """Probe losses planted by Omnivore Theorem 1: with g groups the best explicit momentum is
    max(0, optimal_total − (1 − 1/g)); the loss grows with the distance from it, and with the
    distance of lr from `best_lr` in decades. Constant per probe, so every comparison is exact."""

    def losses(trace: pd.DataFrame, config: RunConfig) -> np.ndarray:
        best_momentum = max(0.0, optimal_total - implicit_momentum(config.n_groups))
        value = 1.0 + abs(config.momentum - best_momentum) + abs(np.log10(config.lr / best_lr))
        return np.full(len(trace), value)

    return losses
