"""Weight averaging in the model servers: an exponential moving average of the weights, kept beside
them and updated at each update (Polyak averaging without a horizon; docs/architecture.md,
"Weight averaging").

The average's decay ramps up with the count of updates t it has taken, d_t = min(β, (1 + t) /
(10 + t)) (the warm-up of TensorFlow's `ExponentialMovingAverage` with `num_updates`): early on the
average follows the weights closely (d_0 = 0.1), and until d_t reaches β it spans about the last
tenth of the updates, whatever the fit's length, so no horizon is needed. The engines score, return
and save the average; training goes on from the weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.backend import to_device, to_numpy

if TYPE_CHECKING:
    from dasknn.engine.strategy import Strategy
    from dasknn.engine.trace import TrainState

AVERAGING = ("ema",)
"""The weight averages a server keeps (None: none)."""
EMA_DECAY = 0.999
"""β, the largest decay of the average: an average over about the last 1,000 updates at most."""


def check_averaging(averaging: Any, strategy: Strategy | None = None) -> str | None:
    """`averaging` as given (None or one of `AVERAGING`), or a ValueError naming the choices; with
    a `strategy`, one that keeps an average: Omnivore's compute groups on the merged map (SMA, model
    averaging and the unmerged map keep none)."""
    if averaging is not None and averaging not in AVERAGING:
        raise ValueError(f"averaging must be None or one of {AVERAGING}, got {averaging!r}")
    groups = strategy is None or (not strategy.synchronous and strategy.physical_map == "merged")
    if averaging is not None and not groups:
        raise ValueError(
            f"averaging={averaging!r} runs on Omnivore's compute groups on the merged map; "
            f"strategy {strategy.name!r} on the {strategy.physical_map} map keeps no average"
        )
    return averaging


def ema_decay(count: int, decay: float = EMA_DECAY) -> float:
    """d_t: the decay of the update that follows `count` averaged updates."""
    return min(decay, (1.0 + count) / (10.0 + count))


class WeightAverage:
    """An exponential moving average of a weight dict, a ← d_t·a + (1 − d_t)·w after each update.

    It starts at the weights it is given (count 0), or at a `state()` it continues exactly. Arrays
    stay on the weights' device (`xp`); `state()` is numpy on the host.
    """

    def __init__(self, params: dict[str, Any], count: int = 0, decay: float = EMA_DECAY) -> None:
        self.params = {k: v.copy() for k, v in params.items()}
        self.count = int(count)
        self.decay = float(decay)

    @classmethod
    def from_state(cls, state: dict[str, Any], xp=np, decay: float = EMA_DECAY) -> WeightAverage:
        """The average a `state()` holds, its arrays on `xp`'s device."""
        params = {k: to_device(np.asarray(v), xp) for k, v in state["params"].items()}
        return cls(params, int(state["count"]), decay)

    def update(self, params: dict[str, Any]) -> None:
        """Take the weights after one more update into the average."""
        d = ema_decay(self.count, self.decay)
        for k, a in self.params.items():
            a *= d
            a += (1.0 - d) * params[k]
        self.count += 1

    def state(self) -> dict[str, Any]:
        """{"params", "count"}: numpy copies on the host, what continues the average exactly."""
        return {"params": {k: np.array(to_numpy(v), copy=True) for k, v in self.params.items()},
                "count": self.count}  # fmt: skip


def trained_weights(state: TrainState) -> dict[str, Any]:
    """The weights training goes on from in a TrainState `state`: its `extra["averaging"]["weights"]`
    when it holds an average (its `params` are then the average), else its `params`."""
    kept = state.extra.get("averaging")
    return state.params if kept is None else kept["weights"]


def server_average(state: TrainState, keys: Iterable[str], count: str) -> dict[str, Any]:
    """The `WeightAverage.state()` of the server holding `keys` that continues `state`'s average
    (`count`: "conv_count" or "fc_count"), or starts one at its weights (count 0) when it holds none."""
    kept = state.extra.get("averaging")
    return {"params": {k: state.params[k] for k in keys}, "count": 0 if kept is None else int(kept[count])}


def averaged_state(
    weights: dict[str, Any], conv: dict[str, Any], fc: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, extra["averaging"]) of a TrainState whose servers hold `weights` and the averages
    `conv` and `fc` (`WeightAverage.state()`s): the params are the average, and the extra holds
    the weights and the averages' counts, what continues both exactly."""
    kept = {"weights": weights, "conv_count": int(conv["count"]), "fc_count": int(fc["count"])}
    return {**conv["params"], **fc["params"]}, kept
