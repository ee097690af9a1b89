"""Layer placement: bytes per iteration of RALP's split, the first-FC split and plain data parallelism.

For LeNet, CIFAR-10 quick and CaffeNet; the first-FC split is Omnivore's (§II-B).

Mirrors RALP's Table 2 ("Transfer sizes of a 32-GPU training for one
step") and its rule (§3 Step 3): split after the layer i minimising O_i + Σ_{x≤i} P_x
(O_i: output bytes of a batch, P_x: parameter bytes), run the layers after it on the parameter
server, so the big FC weights never cross the network. The paper found RALP's transfer independent
of the model size: AlexNet 0.47 GB per step against Horovod's 3.23 GB (model 0.23 GB), VGG11 0.64
against 6.93 GB, but Inception-v3 (small FC part) 1.30 against 1.24 GB: no gain without skew.

Here (calculated, as the paper's table is): per worker and iteration, a split after layer i moves
2·(Σ_{x≤i} P_x + O_i) bytes (weights down and gradients up; activations up and their gradients
down); all-on-workers (a parameter server with every layer data parallel) 2·S for a model of S
bytes; a ring all-reduce (Horovod) 2·S·(W − 1) in total, the formula RALP uses. Each net at its
Caffe batch size (LeNet 64, CIFAR-10 quick 100, CaffeNet 256), for W = 8 and 32 workers.
Note: RALP's Horovod column equals 2·S·(W − 1) with W = 8 (2·0.23·7 = 3.22 GB), not W = 32 (14.3 GB).

What it found (float32, W = 8 / 32): CaffeNet (batch 256, 244 MB model) is split before fc6 by
both rules and moves 0.30 / 1.2 GB per iteration against 3.9 / 15.6 GB with every layer on the
workers and 3.4 / 15.1 GB for a ring all-reduce (RALP / ring 0.088 / 0.080; the paper's AlexNet
0.47 / 3.23 = 0.15): reproduces, same order. LeNet (split before ip1 by both rules): 4.9 / 19.7 MB
against 27.6 / 110 MB (0.18×). CIFAR-10 quick keeps its parameters in the conv layers (0.58 MB
model): RALP's rule can only split before ip2 and moves 1.04-1.19× the bytes of plain data
parallelism, no gain, like the paper's Inception-v3 (1.30 vs 1.24 GB); RALP's Step 2 skewness
filter would leave such a model alone.

    dasknn experiment layer_placement [--workers 8 32] [--tiny]

Writes experiments/results/layer_placement/{layer_placement.nc, layer_placement.png, table.md}.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.nn import zoo  # noqa: E402
from dasknn.tradeoff.layer_placement import placement_report  # noqa: E402
from experiments.common import Experiment, main_for, markdown_table, stamp  # noqa: E402

NAME = "layer_placement"
MIRRORS = "RALP Table 2"
VARIABLES = (
    "bytes_per_worker",
    "total_bytes",
    "vs_all_on_workers",
    "model_bytes",
    "P_workers",
    "O_split",
    "first_server_layer",
)
PLACEMENTS = ("ralp", "first_fc", "all_on_workers", "ring_allreduce")
NETS = {"LeNet": (zoo.lenet, 64), "CIFAR-10 quick": (zoo.cifar10_quick, 100), "CaffeNet": (zoo.caffenet, 256)}
TINY_NETS = ("LeNet", "CIFAR-10 quick")
PAPER_TABLE2_GB = {
    "Alexnet": (0.23, 3.23, 0.47),
    "Inception-v3": (0.09, 1.24, 1.30),
    "VGG11": (0.50, 6.93, 0.64),
}
"""RALP Table 2: (model size, Horovod, RALP) in GB per step, "32-GPU training"."""


def measure(nets: Sequence[str], workers: Sequence[int]) -> xr.Dataset:
    """Bytes per worker and in total per (net, placement[, workers]) from each net's layer sizes."""
    if not nets or not workers or min(workers) < 2:
        raise ValueError(f"need at least one net and worker counts >= 2; got {nets}, {workers}")
    unknown = set(nets) - set(NETS)
    if unknown:
        raise ValueError(f"unknown nets {sorted(unknown)}; available: {sorted(NETS)}")
    nn, npl, nw = len(nets), len(PLACEMENTS), len(workers)
    per_worker = np.full((nn, npl), np.nan)
    total = np.full((nn, nw, npl), np.nan)
    p_workers, o_split = np.zeros((nn, npl)), np.zeros((nn, npl))
    first = np.full((nn, npl), "", dtype=object)
    model, batch = np.zeros(nn), np.zeros(nn, np.int64)
    for ni, name in enumerate(nets):
        make, b = NETS[name]
        net = make()
        report = placement_report(net, b)
        s = float(report.loc["all_on_workers", "P_workers"])
        model[ni], batch[ni] = s, b
        for pi, placement in enumerate(PLACEMENTS[:3]):
            row = report.loc[placement]
            per_worker[ni, pi] = row["bytes_per_worker"]
            p_workers[ni, pi], o_split[ni, pi] = row["P_workers"], row["O_split"]
            first[ni, pi] = row["first_server_layer"] or "(none)"
            total[ni, :, pi] = row["bytes_per_worker"] * np.asarray(workers)
        for wi, w in enumerate(workers):  # Horovod's ring all-reduce, 2·S·(W − 1) per step (RALP §6)
            total[ni, wi, 3] = 2.0 * s * (w - 1)
        per_worker[ni, 3] = np.nan  # depends on W: 2·S·(W − 1)/W
        p_workers[ni, 3], first[ni, 3] = s, "(none)"
    ds = xr.Dataset(
        {
            "bytes_per_worker": (
                ("net", "placement"),
                per_worker,
                {"units": "B", "description": "bytes one worker sends + receives per iteration"},
            ),
            "total_bytes": (
                ("net", "workers", "placement"),
                total,
                {"units": "B", "description": "bytes over the network per iteration, all workers"},
            ),
            "vs_all_on_workers": (
                ("net", "workers", "placement"),
                total / total[:, :, 2:3],
                {"units": "1", "description": "total bytes over those of all layers on the workers"},
            ),
            "model_bytes": (("net",), model, {"units": "B", "description": "parameter bytes S"}),
            "P_workers": (
                ("net", "placement"),
                p_workers,
                {"units": "B", "description": "parameter bytes of the layers on the workers"},
            ),
            "O_split": (
                ("net", "placement"),
                o_split,
                {"units": "B", "description": "output bytes of the last worker layer, one batch"},
            ),
            "first_server_layer": (
                ("net", "placement"),
                first.astype(str),
                {"description": "first layer on the server ((none): all layers on the workers)"},
            ),
            "batch_size": (("net",), batch, {"units": "images", "description": "Caffe's batch size"}),
        },
        coords={"net": list(nets), "workers": np.asarray(workers, np.int64), "placement": list(PLACEMENTS)},
    )
    ds["workers"].attrs = {"units": "1", "description": "W, data-parallel workers"}
    return ds


def table(ds: xr.Dataset) -> str:
    """Per (net, W): model MB, the split layers, and GB per iteration of each placement."""
    rows = []
    for net in ds["net"].values:
        for w in ds["workers"].values:
            sel = ds.sel(net=net, workers=w)
            tot = sel["total_bytes"]
            rows.append(
                {
                    "net (batch)": f"{net} ({int(sel['batch_size'])})",
                    "W": int(w),
                    "model MB": float(sel["model_bytes"]) / 1e6,
                    "RALP split before": str(sel["first_server_layer"].sel(placement="ralp").values),
                    "first-FC split before": str(sel["first_server_layer"].sel(placement="first_fc").values),
                    **{f"{p} GB": float(tot.sel(placement=p)) / 1e9 for p in PLACEMENTS},
                    "RALP / ring": float(tot.sel(placement="ralp") / tot.sel(placement="ring_allreduce")),
                }
            )
    ours = markdown_table(pd.DataFrame(rows))
    paper = pd.DataFrame(
        [
            {
                "model (RALP Table 2)": k,
                "model GB": s,
                "Horovod GB": h,
                "RALP GB": r,
                "2·S·(W−1), W = 8": 2 * s * 7,
                "2·S·(W−1), W = 32": 2 * s * 31,
            }
            for k, (s, h, r) in PAPER_TABLE2_GB.items()
        ]
    )
    return (
        ours + "\n\nThe paper's numbers, and its Horovod formula at W = 8 and 32:\n\n" + markdown_table(paper)
    )


def plot(ds: xr.Dataset, fig) -> None:
    """Total bytes per iteration per placement and net, at the largest W (log scale)."""
    ax = fig.add_subplot()
    w = int(ds["workers"].values[-1])
    nets = list(ds["net"].values)
    xs = np.arange(len(nets))
    width = 0.8 / len(PLACEMENTS)
    for i, p in enumerate(PLACEMENTS):
        vals = ds["total_bytes"].sel(workers=w, placement=p) / 1e6
        ax.bar(xs + (i - (len(PLACEMENTS) - 1) / 2) * width, vals, width, label=p)
    ax.set_yscale("log")
    ax.set_xticks(xs, nets)
    ax.set_ylabel(f"MB per iteration, W = {w} workers")
    ax.set_title("Bytes per iteration by layer placement (cf. RALP Table 2)")
    ax.legend(fontsize=8)


def run(tiny: bool = False, workers: Sequence[int] = (8, 32)) -> Experiment:
    """Compute the bytes for every net and W (tiny: LeNet and CIFAR-10 quick only)."""
    nets = TINY_NETS if tiny else tuple(NETS)
    workers = sorted({int(w) for w in workers})
    ds = stamp(measure(nets, workers), NAME, MIRRORS, tiny)
    w = workers[-1]
    notes = [
        "Calculated from each net's layer sizes (float32), as RALP's Table 2 is; RALP splits where "
        "O_i + Σ P_x is least; first_fc is Omnivore's split (§II-B); ring_allreduce is 2·S·(W − 1).",
        f"At W = {w}: RALP moves "
        + ", ".join(
            f"{net} {float(ds['vs_all_on_workers'].sel(net=net, workers=w, placement='ralp')):.3f}×"
            for net in ds["net"].values
        )
        + " the bytes of all layers on the workers.",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [(("--workers",), {"type": int, "nargs": "+", "default": [8, 32], "help": "worker counts W"})],
)

if __name__ == "__main__":
    sys.exit(main())
