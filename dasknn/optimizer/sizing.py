"""How many workers a fit can use productively: goodput-sized clusters (Pollux, Qiao et al. OSDI'21).

Pollux gives a job more workers only while they make it faster in useful samples per second
(goodput = throughput × statistical efficiency, `decide.goodput`). Here the throughput at N
workers is Omnivore's HE model (`tradeoff.hardware.HEModel`, §IV-B) with N conv devices, at the
best g for N (or a pinned one), and the efficiency is `decide.efficiency` with the measured
gradient noise scale. `productive_workers` is the pure decision; `GoodputAdaptive` makes it the
target of dask's `Adaptive`, so `cluster.adapt(Adaptive=GoodputAdaptive, ...)` grows the cluster
while workers speed training and no further (docs/architecture.md, "Elastic clusters").
"""

from __future__ import annotations

import math
from dataclasses import replace

from distributed.deploy.adaptive import Adaptive

from dasknn.optimizer.decide import goodput
from dasknn.tradeoff.hardware import HEModel

__all__ = ["MIN_GAIN", "GoodputAdaptive", "goodput_by_size", "productive_workers"]

MIN_GAIN = 0.1
"""An added worker must add at least this fraction of what an average worker gives now."""


def goodput_by_size(
    model: HEModel, batch_size: int, noise_scale: float, max_workers: int, n_groups: int | None = None
) -> dict[int, float]:
    """N → the predicted goodput (useful samples/s) with N conv workers, for N = 1..max_workers.

    Each N uses the g of highest goodput among 1..N (Omnivore's optimizer would choose it), or
    `n_groups` when pinned (at most N: fewer workers mean fewer groups, as the engines re-plan)."""
    out = {}
    for n in range(1, int(max_workers) + 1):
        at_n = replace(model, n_workers=n)
        gs = [min(int(n_groups), n)] if n_groups is not None else range(1, n + 1)
        out[n] = max(goodput(at_n.he(g), noise_scale, batch_size, g) for g in gs)
    return out


def productive_workers(
    model: HEModel,
    batch_size: int,
    noise_scale: float,
    max_workers: int,
    n_groups: int | None = None,
    minimum: int = 1,
    min_gain: float = MIN_GAIN,
) -> tuple[int, str, dict[int, float]]:
    """(N, why, goodput at each N): the most workers that still speed training.

    From `minimum`, the size grows to the next N' whose goodput gain per added worker,
    (G(N') − G(N)) / (N' − N), is at least `min_gain` × G(N) / N (an average worker's share now);
    looking past sizes that add nothing on their own (N // g leaves a worker idle until the next
    multiple). Where the FC server saturates (HE(g) = t_fc) or the efficiency falls as fast as
    the throughput rises, no N' qualifies and the size stops there."""
    if int(max_workers) < 1 or not 1 <= int(minimum) <= int(max_workers):
        raise ValueError(
            f"need 1 <= minimum <= max_workers; got minimum={minimum}, max_workers={max_workers}"
        )
    if not (math.isfinite(min_gain) and min_gain > 0):
        raise ValueError(f"min_gain must be a finite number > 0, got {min_gain}")
    values = goodput_by_size(model, batch_size, noise_scale, max_workers, n_groups)
    n = int(minimum)
    while True:
        floor = min_gain * values[n] / n
        better = [m for m in range(n + 1, int(max_workers) + 1) if (values[m] - values[n]) / (m - n) >= floor]
        if not better:
            break
        n = better[0]
    why = f"goodput {values[n]:.4g} samples/s at N={n}"
    if n < int(max_workers):
        why += f"; more workers add less than {min_gain:.0%} of an average worker's share each"
    return n, why, values


class GoodputAdaptive(Adaptive):
    """Dask's adaptive scaling sized by goodput: the cluster grows only while workers speed training.

    The target size is the largest at which each added worker still adds at least ``min_gain`` of
    an average worker's share of the goodput, as the hardware efficiency model (and the gradient
    noise scale, when measured) predicts, as Pollux sizes its jobs. A running fit hands its roles
    over before a worker leaves.

    Parameters
    ----------
    cluster : distributed.deploy.Cluster
        The cluster to scale (``cluster.adapt`` passes it).
    model : HEModel
        The hardware efficiency model: the time per iteration at each number of conv workers
        (N conv devices = N workers; with a worker dedicated to the FC server, ask for one more).
    batch_size : int
        The fit's batch size.
    noise_scale : float, default nan
        The gradient noise scale, when measured (nan: throughput alone).
    n_groups : int, optional
        The compute groups of the fit, when pinned.
    min_gain : float, default 0.1
        The share of an average worker's goodput a worker must add.
    **kwargs
        Dask's ``Adaptive`` options; ``maximum`` (required, finite) bounds the sizes considered.

    Examples
    --------
    >>> from dasknn.optimizer.sizing import GoodputAdaptive
    >>> from dasknn.tradeoff.hardware import HEModel
    >>> model = HEModel(T_cc=0.8, T_nc=0.01, t_fc=0.05, n_workers=1)
    >>> cluster.adapt(Adaptive=GoodputAdaptive, model=model, batch_size=256,   # doctest: +SKIP
    ...               minimum=1, maximum=32)
    """

    def __init__(
        self,
        cluster,
        *,
        model: HEModel,
        batch_size: int,
        noise_scale: float = math.nan,
        n_groups: int | None = None,
        min_gain: float = MIN_GAIN,
        **kwargs,
    ) -> None:
        super().__init__(cluster, **kwargs)
        if not math.isfinite(self.maximum):
            raise ValueError("GoodputAdaptive needs a finite maximum: the largest cluster it may ask for")
        self.model, self.batch_size, self.noise_scale = model, int(batch_size), float(noise_scale)
        self.n_groups, self.min_gain = n_groups, float(min_gain)
        self.why = ""

    def update(self, model: HEModel | None = None, noise_scale: float | None = None) -> None:
        """New measurements: the next target uses them."""
        if model is not None:
            self.model = model
        if noise_scale is not None:
            self.noise_scale = float(noise_scale)

    async def target(self) -> int:
        n, self.why, _ = productive_workers(
            self.model,
            self.batch_size,
            self.noise_scale,
            int(self.maximum),
            self.n_groups,
            minimum=max(1, int(self.minimum)),
            min_gain=self.min_gain,
        )
        return n
