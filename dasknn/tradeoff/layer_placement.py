"""Where to cut a net between the workers and the server: RALP's layer placement, and FireCaffe's
gradient aggregation, as byte and time models.

RALP (layer-placement.txt §3, "Step 2") splits after the layer i minimising
cost_i = O_i + Σ_{x ≤ i} P_x (P_x a layer's parameter bytes, O_i its output bytes for one batch);
Omnivore §II-B splits at the first fully connected layer, and `placement_report` compares both
with plain data parallelism. Inside a group (FireCaffe §6) a parameter server receives all p
gradients, |∇W|·p / BW, where a reduction tree of branching b takes |∇W|·2·(b − 1)·ceil(log_b p) / BW
(b = 2: FireCaffe's Eq. 4). The rule itself (`layer_costs`, `ralp_split`) sits in
`dasknn.engine.strategy`, re-exported here.
"""

from __future__ import annotations

import math

import pandas as pd

from dasknn.engine.strategy import layer_costs, ralp_split
from dasknn.tradeoff.hardware import t_parameter_server, t_reduction_tree

__all__ = [
    "AGGREGATIONS",
    "layer_costs",
    "placement_report",
    "ralp_split",
    "t_aggregation",
    "tree_depth",
]

AGGREGATIONS = ("tree", "ps")


def placement_report(net, batch_size: int, n_workers: int = 1) -> pd.DataFrame:
    """Predicted bytes per iteration of RALP's split, Omnivore's first-FC split, and all-on-workers.

    Per worker and iteration, both directions: a split after layer i moves 2·(Σ_{x≤i} P_x + O_i)
    (weights down, gradients up; activations up, their gradients down); all-on-workers moves
    2·Σ P (weights and gradients of the whole net). `total_bytes` multiplies by `n_workers`.
    Columns: first_server_layer, P_workers, O_split, bytes_per_worker, total_bytes, vs_all_on_workers.
    """
    costs = layer_costs(net, batch_size)
    names = list(costs.index)
    first_fc = names[net.split_point()] if net.split_point() < len(names) else None
    rows = {}
    for label, at in (("ralp", ralp_split(net, batch_size)), ("first_fc", first_fc)):
        if at is None:
            continue
        last = costs.iloc[names.index(at) - 1]
        rows[label] = {
            "first_server_layer": at,
            "P_workers": last["P_cumulative"],
            "O_split": last["O"],
        }
    rows["all_on_workers"] = {
        "first_server_layer": None,
        "P_workers": float(costs["P"].sum()),
        "O_split": 0.0,
    }
    report = pd.DataFrame.from_dict(rows, orient="index")
    report["bytes_per_worker"] = 2.0 * (report["P_workers"] + report["O_split"])
    report["total_bytes"] = report["bytes_per_worker"] * int(n_workers)
    report["vs_all_on_workers"] = (
        report["bytes_per_worker"] / report.loc["all_on_workers", "bytes_per_worker"]
    )
    report.index.name = "placement"
    report.attrs.update({"net": net.name, "batch_size": int(batch_size), "unit": "bytes per iteration"})
    return report


def tree_depth(p: int, branching: int = 2) -> int:
    """Levels of a reduction tree over p gradients with branching factor b: ceil(log_b p) (FireCaffe §6.2)."""
    p, b = int(p), int(branching)
    if p < 1 or b < 2:
        raise ValueError(f"need p >= 1 and branching >= 2, got p={p}, branching={b}")
    depth, width = 0, p
    while width > 1:
        width = math.ceil(width / b)
        depth += 1
    return depth


def t_aggregation(
    grad_bytes: float, p: int, bandwidth_bytes_per_s: float, aggregation: str = "tree", branching: int = 2
) -> float:
    """Time to sum p gradients of `grad_bytes` each: parameter server or reduction tree (FireCaffe §6).

    'ps': |∇W|·p / BW (Eq. 3). 'tree': each level, a node receives b − 1 gradients and later sends
    the sum back down, |∇W|·2·(b − 1)·ceil(log_b p) / BW; for b = 2 and p a power of two this is
    FireCaffe's Eq. 4, |∇W|·2·log2(p) / BW.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "ps":
        return t_parameter_server(grad_bytes, p, bandwidth_bytes_per_s)
    depth = tree_depth(p, branching)
    if int(branching) == 2 and 2**depth == int(p):
        return t_reduction_tree(grad_bytes, p, bandwidth_bytes_per_s)
    return float(grad_bytes) * 2.0 * (int(branching) - 1) * depth / float(bandwidth_bytes_per_s)
