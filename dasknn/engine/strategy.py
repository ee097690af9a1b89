"""The strategy choice every engine honours: Omnivore's or another paper's layout, and where FC starts.

`Strategy` names the layout (Omnivore's compute groups, Crossbow's SMA, SparkNet's model
averaging), the physical map (merged or unmerged FC, Omnivore appendix C), the aggregation of a
group's gradients (FireCaffe's reduction tree or a parameter server) and the split between the
conv phase and the FC server. RALP's rule for that split (layer-placement §3) lives here, with the
choice, because both engines resolve `split="auto"` and may not import `dasknn.tradeoff`;
`dasknn.tradeoff.layer_placement` builds its byte reports on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dasknn.nn.net import Net

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "AGGREGATIONS",
    "PHYSICAL_MAPS",
    "STRATEGIES",
    "Strategy",
    "layer_costs",
    "ralp_split",
    "split_layer",
]

STRATEGIES = ("omnivore", "sma", "model_averaging")
PHYSICAL_MAPS = ("merged", "unmerged")
AGGREGATIONS = ("tree", "ps")


@dataclass(frozen=True)
class Strategy:
    """How an engine lays out and synchronises training; the default is Omnivore's.

    name: 'omnivore' (g asynchronous compute groups, Omnivore §III-B), 'sma' (Crossbow's synchronous
    model averaging, §3.2: n_groups learners, each with its own replica) or 'model_averaging'
    (SparkNet: replicas averaged every `tau` iterations).
    physical_map: 'merged' (FC compute and FC model on one server, never stale) or 'unmerged'
    (Omnivore appendix C, the MXNet/SINGA layout: FC compute on every conv worker, FC model on a
    model server, so FC is stale too).
    aggregation: how the k gradients of a group are summed: 'tree' (FireCaffe's reduction tree,
    branching factor `branching`) or 'ps' (all k at one place, the conv model server's worker).
    split: the first FC-server layer: None (the first InnerProduct, Omnivore §II-B), 'auto' (RALP's
    rule, layer-placement §3) or a layer name.
    alpha: SMA's correction factor (None: 1/k, Crossbow §3.2).
    learners: None (n_groups learners) or 'auto' (SMA / model averaging only: Crossbow §3.4's
    auto-tuner picks the number of learners from measured throughput, `engine.autotune`).
    """

    name: str = "omnivore"
    physical_map: str = "merged"
    aggregation: str = "tree"
    branching: int = 2
    split: str | None = None
    alpha: float | None = None
    tau: int = 1
    learners: str | None = None

    def __post_init__(self) -> None:
        for key, allowed in (
            ("name", STRATEGIES),
            ("physical_map", PHYSICAL_MAPS),
            ("aggregation", AGGREGATIONS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(f"strategy {key} must be one of {allowed}, got {getattr(self, key)!r}")
        if int(self.branching) < 2:
            raise ValueError(f"branching must be >= 2, got {self.branching}")
        if int(self.tau) < 1:
            raise ValueError(f"tau must be >= 1, got {self.tau}")
        if self.alpha is not None and not (math.isfinite(self.alpha) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.learners not in (None, "auto"):
            raise ValueError(f"learners must be None or 'auto', got {self.learners!r}")
        if self.learners == "auto" and not self.synchronous:
            raise ValueError("learners='auto' tunes the learners of 'sma' or 'model_averaging' only")

    @property
    def synchronous(self) -> bool:
        """True for the replica strategies (SMA, model averaging): no FC server, no asynchrony."""
        return self.name != "omnivore"

    def check_knobs(self, lr, momentum) -> None:
        """A ValueError when a replica strategy is given an η or µ schedule: schedules are applied
        by Omnivore's model servers at each update, and the replicas' solvers take constants."""
        from dasknn.engine.schedule import Schedule

        if self.synchronous and (isinstance(lr, Schedule) or isinstance(momentum, Schedule)):
            raise ValueError(
                f"strategy {self.name!r} takes a constant lr and momentum: η and µ schedules are "
                "applied by Omnivore's model servers (strategy 'omnivore')"
            )


def layer_costs(net: Net, batch_size: int) -> pd.DataFrame:
    """Per layer i: P_i (parameter bytes), O_i (output bytes of one batch) and RALP's cost_i.

    Layer-placement §3 Step 2: cost_i = O_i + Σ_{x≤i} P_x, the bytes a worker sends one way per
    iteration when the net is split after layer i. Index: layer name, in net order.
    """
    import pandas as pd  # imported on use: checking a Strategy (`dasknn train`, early) needs none

    b = int(batch_size)
    if b < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    s = net.summary()
    out = pd.DataFrame(
        {
            "type": s["type"],
            "omnivore_phase": s["phase"],
            "P": s["param_bytes"].astype(float),
            "O": s["activation_bytes"].astype(float) * b,
        },
        index=s.index,
    )
    out["P_cumulative"] = out["P"].cumsum()
    out["cost"] = out["O"] + out["P_cumulative"]
    return out


def ralp_split(net: Net, batch_size: int) -> str:
    """The first server-side layer under RALP's rule: the layer after argmin_i (O_i + Σ_{x≤i} P_x).

    Layer-placement §3. Candidates keep at least one layer on each side (the engines need a conv
    phase and an FC server); ties go to the earliest layer, which puts the most work on the server.
    Returns a layer name, ready for `Net.split_phases(at=...)`. On a graph net the candidates are
    the main path's layers, each costed by the split it makes: every blob crossing it (branches and
    auxiliary heads included) plus the parameters left on the workers.
    """
    if not net.is_chain:
        return _ralp_split_graph(net, int(batch_size))
    costs = layer_costs(net, batch_size)
    if len(costs) < 2:
        raise ValueError(f"net {net.name!r} has {len(costs)} layer(s); a split needs two")
    i = int(costs["cost"].iloc[:-1].to_numpy().argmin())
    return str(costs.index[i + 1])


def _ralp_split_graph(net: Net, batch_size: int) -> str:
    """RALP's rule on a graph: the main-path layer whose split moves the fewest bytes one way."""
    s = net.summary()
    itemsize = net.dtype.itemsize
    best = None
    for i in sorted(net.main_path())[1:]:
        conv, _, boundary = net._split_sets(net.layers[i].name)
        moved = sum(math.prod(net.blob_shapes[b]) for b in boundary) * itemsize * batch_size
        moved += float(s["param_bytes"].iloc[sorted(conv)].sum())
        if best is None or moved < best[0]:
            best = (moved, net.layers[i].name)
    if best is None:
        raise ValueError(f"net {net.name!r} has one layer on its main path; a split needs two")
    return best[1]


def split_layer(net: Net, strategy: Strategy, batch_size: int) -> str | None:
    """The layer where the FC phase starts: None (first InnerProduct), RALP's ('auto'), or as named."""
    if strategy.split == "auto":
        return ralp_split(net, batch_size)
    return strategy.split
