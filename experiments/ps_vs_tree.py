"""Parameter server vs reduction tree: gradient aggregation in a compute group, predicted and measured.

Mirrors FireCaffe §6 (Eq. 3 and 4, Fig. 4): summing p workers' gradients of
|∇W| bytes at one parameter server takes |∇W|·p / BW (Eq. 3), in a binary reduction tree
|∇W|·2·log2(p) / BW (Eq. 4, the sum going up and back down). The paper found the parameter server's
time growing linearly in p and the tree's logarithmically (Fig. 4, Network-in-Network, 30 MB of
gradients per worker, up to 128 GPUs), hence FireCaffe's reduction trees.

Here, on a LocalCluster of k worker processes with one thread each (k = 2, 3, 4 on this 2-core
machine: the workers oversubscribe the cores, and "network" transfers are localhost TCP that
also need CPU):

- the gradient sum alone: k gradient dicts (LeNet's conv gradient, 0.1 MB, and CaffeNet's,
  9.3 MB) each on its own worker, summed by `dasknn.engine.dask.tasks.aggregate` as the DaskEngine does:
  'ps' sends all k to one worker (the conv model server's; it holds one of them), 'tree' sums
  pairwise. Median wall time until the sum exists on the cluster.
- its prediction: one transfer of the gradient between two workers is timed (t₁, which includes
  dask's task overhead; BW = |∇W| / t₁). The one-way sum that `aggregate` does takes (k − 1)·t₁
  ('ps': k − 1 gradients arrive at one worker) or ceil(log2 k)·t₁ ('tree'); FireCaffe's Eq. 3/4,
  which also count the way back down, give k·t₁ and 2·log2(k)·t₁. Both are stored, and Eq. 3/4 are
  extrapolated to p = 2..128 at the measured BW.
- time per iteration of one compute group of k workers (n_groups = 1) training LeNet on the digits
  with the DaskEngine, `Strategy(aggregation='ps')` vs 'tree'.

What it found (2-core AMD EPYC shared with other jobs, load average ~6, medians of 15; 66 s):
one hop t₁ is ~11 ms for LeNet's 0.1 MB (task overhead: "9 MB/s") and ~22 ms for CaffeNet's
9.3 MB (423 MB/s). The parameter server's sum hardly grew with k (CaffeNet: 25, 37, 39 ms for
k = 2, 3, 4; LeNet: 12 ms throughout), below even the one-way model's (k − 1)·t₁, because dask
fetches the k − 1 gradients concurrently and localhost has no per-node link for them to queue on;
the tree's two serial levels (a task round trip each) took 54-58 ms (LeNet 22-24 ms). So ps / tree
was 0.96, 0.68, 0.67 where Eq. 3/4 predict 1.00, 0.95, 1.00: does not reproduce at k ≤ 4 on one
machine, whose premise (every node its own link of bandwidth BW, the server's the bottleneck) does
not hold here; Eq. 3/4 at the measured BW extrapolate to ps 9.1× slower than the tree at p = 128.
DaskEngine, LeNet, one group of k: ps 0.102, 0.129, 0.133 s per iteration, tree 0.112, 0.125,
0.174 s: the 0.1 MB conv gradient is a small part of an iteration; equal within noise up to k = 3.

With `--links RATE ...` (Mbit/s; needs root and iproute2, `experiments/netns_cluster.py`) each worker
runs in its own network namespace, joined to a bridge by a veth pair shaped both ways by `tc`'s token
bucket: every node has its own link of bandwidth BW, Eq. 3/4's premise. One cluster of 8 workers,
each rate in turn, k = 2, 4, 8 of them per point, CaffeNet's 9.3 MB conv gradient, medians of 5;
`--rounds` repeats the sweep for a spread. FireCaffe's numbers: ps ∝ p, tree ∝ log p, the tree
ahead at scale (Eq. 3/4: ps/tree 1.00, 1.00, 1.33 at p = 2, 4, 8). Ours (100 and 400 Mbit/s,
3 rounds, median [range], the 2-core machine at load 12-20 from other jobs, 2,011 s): at 100 Mbit/s
the parameter server's sum took 0.995, 2.65, 5.90 s for k = 2, 4, 8 and the tree's 0.925, 1.94,
3.16 s: ps/tree 1.08 [1.05, 1.13], 1.37 [1.17, 1.42], 1.85 [1.82, 2.15], and from k = 2 to 8 ps
grew 6.06× [4.0, 6.37] (the one-way sum's k − 1: 7×) and the tree 3.04× [2.47, 3.63] (log2: 3×).
At 400 Mbit/s ps/tree was 0.71 [0.71, 0.96], 0.98 [0.76, 0.98], 1.27 [1.16, 1.45]: the tree wins at
k = 8 only, since each of its levels adds a scheduler round trip and CPU time on 8 one-thread
workers sharing 2 loaded cores, which weighs more when a hop takes 0.19 s on the link.

    dasknn experiment ps_vs_tree [--workers 2 3 4] [--repeats 15] [--iterations 20] [--tiny]
    dasknn experiment ps_vs_tree --links 100 400 [--workers 2 4 8] [--repeats 5] [--rounds 3]

Writes experiments/results/ps_vs_tree/{ps_vs_tree.nc, ps_vs_tree.png, table.md}.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.nn import zoo  # noqa: E402
from dasknn.tradeoff.hardware import t_parameter_server, t_reduction_tree  # noqa: E402
from dasknn.tradeoff.layer_placement import AGGREGATIONS, tree_depth  # noqa: E402
from experiments.common import Experiment, main_for, markdown_table, stamp  # noqa: E402

NAME = "ps_vs_tree"
MIRRORS = "FireCaffe Eq. 3/4 (Fig. 4)"
VARIABLES = (
    "sum_time_s",
    "predicted_oneway_s",
    "predicted_eq_s",
    "transfer_s",
    "grad_bytes",
    "bandwidth",
    "iter_time_s",
    "extrapolated_s",
)
PAYLOADS = {"lenet_conv": zoo.lenet, "caffenet_conv": zoo.caffenet}
EXTRAPOLATE_P = (2, 4, 8, 16, 32, 64, 128)


def conv_gradient(payload: str) -> dict[str, np.ndarray]:
    """A gradient dict shaped like the conv phase's parameters of the payload's net (random values)."""
    conv, _ = PAYLOADS[payload]().split_phases()
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(v.shape, dtype=np.float32) for k, v in conv.get_params().items()}


def _nbytes(grad: dict[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in grad.values()))


def _median(samples: list[float]) -> float:
    return float(np.median(samples)) if samples else float("nan")


def time_transfer(client, workers: list[str], grad: dict, repeats: int) -> float:
    """Median time for a task on workers[1] to receive one gradient held by workers[0] (t1).

    The task is `sum_grads` of that one gradient (a copy): one hop of a tree, a node's receive and
    its sum task, as `aggregate` runs it.
    """
    from distributed import wait

    from dasknn.engine.dask.tasks import sum_grads

    sources = client.scatter([grad] * (repeats + 1), workers=[workers[0]], hash=False)
    wait(sources)
    samples = []
    for src in sources:  # a fresh copy each time: workers[1] must not hold it already
        t0 = time.perf_counter()
        dst = client.submit(sum_grads, src, workers=[workers[1]], allow_other_workers=False, pure=False)
        wait(dst)
        samples.append(time.perf_counter() - t0)
        del dst
    del sources
    return _median(samples[1:])  # the first one warms the connection up


def time_sum(client, workers: list[str], grad: dict, aggregation: str, repeats: int) -> float:
    """Median time until `aggregate` has the sum of k = len(workers) gradients, one per worker."""
    from distributed import wait

    from dasknn.engine.dask.tasks import aggregate

    copies = [client.scatter([grad] * (repeats + 1), workers=[w], hash=False) for w in workers]
    wait([f for c in copies for f in c])
    samples = []
    for parts in zip(*copies, strict=True):
        t0 = time.perf_counter()
        total = aggregate(client, list(parts), aggregation, 2, ps_worker=workers[0])
        wait(total)
        samples.append(time.perf_counter() - t0)
        del total
    del copies
    return _median(samples[1:])


def time_engine(client, aggregation: str, iterations: int) -> float:
    """Time per iteration of one group of all the cluster's workers training LeNet on the digits.

    Both aggregations run the remote shards as tasks (`shard_calls="tasks"`), the transport 'ps'
    always uses, so the two differ in how the gradients are summed only."""
    from dasknn.data import load
    from dasknn.engine.dask import DaskEngine
    from dasknn.engine.strategy import Strategy
    from dasknn.engine.trace import Budget, RunConfig
    from dasknn.tradeoff.hardware import time_per_iteration

    X, y = load("digits", size=28, batch_size=64)
    engine = DaskEngine(client, strategy=Strategy(aggregation=aggregation), timeout=60, shard_calls="tasks")
    config = RunConfig(n_groups=1, lr=0.01, momentum=0.9, batch_size=64)
    trace = engine.run(zoo.lenet(seed=0), X, y, config, Budget(iterations=iterations)).trace
    return time_per_iteration(trace, warmup=min(2, iterations - 2))


def measure(ks: Sequence[int], payloads: Sequence[str], repeats: int, iterations: int) -> xr.Dataset:
    """Measured and predicted gradient-sum times per (payload, k, aggregation), and engine iterations."""
    from dasknn.engine.dask import cluster_workers, local_client

    if not ks or min(ks) < 2 or repeats < 1 or iterations < 0 or 0 < iterations < 3:
        raise ValueError(
            f"need k >= 2, repeats >= 1 and iterations 0 or >= 3; got {ks}, {repeats}, {iterations}"
        )
    unknown = set(payloads) - set(PAYLOADS)
    if unknown:
        raise ValueError(f"unknown payloads {sorted(unknown)}; available: {sorted(PAYLOADS)}")
    grads = {p: conv_gradient(p) for p in payloads}
    npay, nk, na = len(payloads), len(ks), len(AGGREGATIONS)
    sums = np.full((npay, nk, na), np.nan)
    transfer = np.full((npay, nk), np.nan)
    iters = np.full((nk, na), np.nan)
    for ki, k in enumerate(ks):
        with local_client(n_workers=k, threads_per_worker=1) as client:
            workers = sorted(cluster_workers(client))
            client.run(importlib.import_module, "dasknn.engine.dask.tasks")  # all workers at once
            for pi, p in enumerate(payloads):
                transfer[pi, ki] = time_transfer(client, workers, grads[p], repeats)
                for ai, aggregation in enumerate(AGGREGATIONS):
                    sums[pi, ki, ai] = time_sum(client, workers, grads[p], aggregation, repeats)
            if iterations:
                for ai, aggregation in enumerate(AGGREGATIONS):
                    iters[ki, ai] = time_engine(client, aggregation, iterations)
    grad_bytes = np.array([_nbytes(grads[p]) for p in payloads], float)
    t1 = np.nanmedian(transfer, axis=1)  # one transfer's time per payload, over the clusters
    bandwidth = grad_bytes / t1
    hops = {"ps": [k - 1 for k in ks], "tree": [tree_depth(k, 2) for k in ks]}
    oneway = np.stack([np.outer(t1, hops[a]) for a in AGGREGATIONS], axis=-1)
    model = {"ps": t_parameter_server, "tree": t_reduction_tree}  # FireCaffe Eq. 3 and Eq. 4
    eq = np.array(
        [[[model[a](grad_bytes[i], k, bandwidth[i]) for a in AGGREGATIONS] for k in ks] for i in range(npay)]
    )
    ext = np.array(
        [
            [[model[a](grad_bytes[i], p, bandwidth[i]) for a in AGGREGATIONS] for p in EXTRAPOLATE_P]
            for i in range(npay)
        ]
    )
    dims = ("payload", "k", "aggregation")
    ds = xr.Dataset(
        {
            "sum_time_s": (dims, sums, {"units": "s", "description": "measured: k gradients to their sum"}),
            "predicted_oneway_s": (
                dims,
                oneway,
                {"units": "s", "description": "t1 × serial transfers: ps k − 1, tree ceil(log2 k)"},
            ),
            "predicted_eq_s": (
                dims,
                eq,
                {
                    "units": "s",
                    "description": "FireCaffe Eq. 3 (ps: |∇W|·k/BW) and 4 (tree: |∇W|·2·log2 k/BW)",
                },
            ),
            "transfer_s": (
                ("payload", "k"),
                transfer,
                {"units": "s", "description": "t1: one gradient from one worker to another (task included)"},
            ),
            "grad_bytes": (("payload",), grad_bytes, {"units": "B", "description": "|∇W| of the conv phase"}),
            "bandwidth": (
                ("payload",),
                bandwidth,
                {"units": "B/s", "description": "|∇W| / t1 (median over the clusters)"},
            ),
            "iter_time_s": (
                ("k", "aggregation"),
                iters,
                {"units": "s", "description": "DaskEngine time per iteration, LeNet, one group of k"},
            ),
            "extrapolated_s": (
                ("payload", "p", "aggregation"),
                ext,
                {"units": "s", "description": "Eq. 3 / 4 at the measured bandwidth for p workers"},
            ),
        },
        coords={
            "payload": list(payloads),
            "k": np.asarray(ks, np.int64),
            "aggregation": list(AGGREGATIONS),
            "p": np.asarray(EXTRAPOLATE_P, np.int64),
        },
    )
    ds["k"].attrs = {"units": "1", "description": "workers of the group (LocalCluster processes, 1 thread)"}
    ds.attrs.update(repeats=repeats, iterations=iterations, oversubscribed=int(max(ks) > 2))
    return ds


def table(ds: xr.Dataset) -> str:
    """One row per (payload, k): measured and predicted ps and tree times, and the engine's."""
    rows = []
    for p in ds["payload"].values:
        for k in ds["k"].values:
            sel = ds.sel(payload=p, k=k)
            row = {"gradient": f"{p} ({float(sel['grad_bytes']) / 1e6:.2f} MB)", "k": int(k)}
            for a in ("ps", "tree"):
                row[f"{a} measured ms"] = 1e3 * float(sel["sum_time_s"].sel(aggregation=a))
                row[f"{a} one-way model ms"] = 1e3 * float(sel["predicted_oneway_s"].sel(aggregation=a))
                row[f"{a} Eq. {3 if a == 'ps' else 4} ms"] = 1e3 * float(
                    sel["predicted_eq_s"].sel(aggregation=a)
                )
            row["ps / tree measured"] = float(
                sel["sum_time_s"].sel(aggregation="ps") / sel["sum_time_s"].sel(aggregation="tree")
            )
            rows.append(row)
    out = markdown_table(pd.DataFrame(rows))
    if np.isfinite(ds["iter_time_s"].values).any():
        eng = pd.DataFrame(
            [
                {
                    "k (LeNet, one group)": int(k),
                    "ps s/iter": float(ds["iter_time_s"].sel(k=k, aggregation="ps")),
                    "tree s/iter": float(ds["iter_time_s"].sel(k=k, aggregation="tree")),
                }
                for k in ds["k"].values
            ]
        )
        out += "\n\nDaskEngine, time per iteration:\n\n" + markdown_table(eng)
    return out


def plot(ds: xr.Dataset, fig) -> None:
    """(a) measured vs predicted sum time against k; (b) Eq. 3/4 extrapolated to p = 128."""
    fig.set_size_inches(11, 4.2)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    p = ds["payload"].values[-1]
    sel = ds.sel(payload=p)
    for a, color in (("ps", "C0"), ("tree", "C1")):
        ax1.plot(
            ds["k"], 1e3 * sel["sum_time_s"].sel(aggregation=a), "o-", color=color, label=f"{a} measured"
        )
        ax1.plot(
            ds["k"],
            1e3 * sel["predicted_oneway_s"].sel(aggregation=a),
            "--",
            color=color,
            label=f"{a} one-way",
        )
        ax1.plot(
            ds["k"], 1e3 * sel["predicted_eq_s"].sel(aggregation=a), ":", color=color, label=f"{a} Eq. 3/4"
        )
    ax1.set_xlabel("k workers")
    ax1.set_ylabel("ms to sum the gradients")
    ax1.set_title(f"(a) {p}, {float(sel['grad_bytes']) / 1e6:.1f} MB")
    ax1.legend(fontsize=7)
    for a, style in (("ps", "o-"), ("tree", "s-")):
        ax2.plot(ds["p"], sel["extrapolated_s"].sel(aggregation=a), style, label=a)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("p workers")
    ax2.set_ylabel("s (Eq. 3 / 4 at the measured BW)")
    ax2.set_title("(b) extrapolated (cf. FireCaffe Fig. 4)")
    ax2.legend()


def _by_host(addresses) -> list[str]:
    """Worker addresses in the order of their IPv4 hosts (namespace order in `netns_client`)."""
    return sorted(addresses, key=lambda a: tuple(int(x) for x in a.split("//")[1].split(":")[0].split(".")))


def measure_links(
    ks: Sequence[int], rates_mbit: Sequence[float], repeats: int, rounds: int = 1
) -> xr.Dataset:
    """Gradient sums over per-worker links: one cluster of max(k) workers, each in its own network
    namespace behind a `tc` token bucket of each rate in turn; k workers of it per point.

    CaffeNet's conv gradient only. `rounds` repeats the whole sweep (every rate, every k) on the
    same cluster, each round a median of `repeats` per point, so the rounds give the spread; the
    1-minute load average is kept per round. Predictions from the link's rate BW: one-way ps
    (k − 1)·|∇W|/BW, tree ceil(log2 k)·|∇W|/BW, and FireCaffe's Eq. 3 / 4.
    """
    from experiments.netns_cluster import MAX_WORKERS, netns_client

    if not ks or min(ks) < 2 or max(ks) > MAX_WORKERS or repeats < 1 or rounds < 1:
        raise ValueError(
            f"need 2 <= k <= {MAX_WORKERS}, repeats >= 1 and rounds >= 1; got {list(ks)}, {repeats}, {rounds}"
        )
    if not rates_mbit or min(rates_mbit) <= 0:
        raise ValueError(f"link rates must be > 0 Mbit/s, got {list(rates_mbit)}")
    grad = conv_gradient("caffenet_conv")
    nr, nk, na = len(rates_mbit), len(ks), len(AGGREGATIONS)
    sums, transfer = np.full((rounds, nr, nk, na), np.nan), np.full((rounds, nr, nk), np.nan)
    load = np.full((rounds, 2), np.nan)
    with netns_client(max(ks), rates_mbit[0]) as (client, links):
        workers = _by_host(client.scheduler_info()["workers"])
        client.run(importlib.import_module, "dasknn.engine.dask.tasks")
        for n in range(rounds):
            load[n, 0] = os.getloadavg()[0]
            for ri, rate in enumerate(rates_mbit):
                links.set_rate(rate)
                for ki, k in enumerate(ks):
                    transfer[n, ri, ki] = time_transfer(client, workers[:k], grad, repeats)
                    for ai, aggregation in enumerate(AGGREGATIONS):
                        sums[n, ri, ki, ai] = time_sum(client, workers[:k], grad, aggregation, repeats)
                    print(
                        f"  round {n + 1}, {rate:g} Mbit/s, k = {k}: t1 {transfer[n, ri, ki]:.2f} s, "
                        + ", ".join(f"{a} {sums[n, ri, ki, ai]:.2f} s" for ai, a in enumerate(AGGREGATIONS)),
                        flush=True,
                    )
            load[n, 1] = os.getloadavg()[0]
            print(f"  round {n + 1}/{rounds} done, load {load[n, 0]:.1f} → {load[n, 1]:.1f}", flush=True)
    ds = links_dataset(sums, transfer, load, ks, rates_mbit, float(_nbytes(grad)))
    ds.attrs.update(repeats=repeats, rounds=rounds, links="network namespaces, veth pairs, tc tbf")
    return ds


def links_dataset(
    sums, transfer, load, ks: Sequence[int], rates_mbit: Sequence[float], nbytes: float
) -> xr.Dataset:
    """The link sweep's measurements (rounds × rates × k) with the one-way model and Eq. 3 / 4."""
    bw = np.asarray(rates_mbit, float) * 1e6 / 8
    hops = {"ps": [k - 1 for k in ks], "tree": [tree_depth(k, 2) for k in ks]}
    oneway = np.stack([np.outer(nbytes / bw, hops[a]) for a in AGGREGATIONS], axis=-1)
    model = {"ps": t_parameter_server, "tree": t_reduction_tree}
    eq = np.array([[[model[a](nbytes, k, b) for a in AGGREGATIONS] for k in ks] for b in bw])
    dims = ("rate_mbit", "k", "aggregation")
    ds = xr.Dataset(
        {
            "sum_time_s": (
                ("round", *dims),
                sums,
                {"units": "s", "description": "measured: k gradients to their sum, median of the round"},
            ),
            "predicted_oneway_s": (
                dims,
                oneway,
                {"units": "s", "description": "|∇W|/BW × serial transfers: ps k − 1, tree ceil(log2 k)"},
            ),
            "predicted_eq_s": (dims, eq, {"units": "s", "description": "FireCaffe Eq. 3 (ps) and 4 (tree)"}),
            "transfer_s": (
                ("round", "rate_mbit", "k"),
                transfer,
                {"units": "s", "description": "t1, task included"},
            ),
            "grad_bytes": ((), nbytes, {"units": "B", "description": "|∇W| of CaffeNet's conv phase"}),
            "load_1min": (
                ("round", "edge"),
                load,
                {"units": "1", "description": "1-minute load average at the round's start and end"},
            ),
        },
        coords={
            "round": np.arange(len(sums), dtype=np.int64),
            "rate_mbit": np.asarray(rates_mbit, float),
            "k": np.asarray(ks, np.int64),
            "aggregation": list(AGGREGATIONS),
            "edge": ["start", "end"],
        },
    )
    ds["rate_mbit"].attrs = {
        "units": "Mbit/s",
        "description": "tc token-bucket rate of every link, both ways",
    }
    return ds


def growth(ds: xr.Dataset) -> xr.DataArray:
    """Per round, rate and aggregation: the sum time at the largest k over that at the smallest
    (Eq. 3: k_max / k_min for ps; Eq. 4: log2 k_max / log2 k_min for the tree)."""
    k = ds["k"].values
    t = ds["sum_time_s"]
    return t.sel(k=k.max()) / t.sel(k=k.min())


def _spread(values) -> str:
    v = np.asarray(values, dtype=float).ravel()
    return f"{np.median(v):.3g} [{v.min():.3g}, {v.max():.3g}]"


def table_links(ds: xr.Dataset) -> str:
    """One row per (rate, k): measured ps and tree times and their ratio (median [range] over the
    rounds), beside the one-way model and Eq. 3 / 4."""
    rows = []
    for r in ds["rate_mbit"].values:
        for k in ds["k"].values:
            sel = ds.sel(rate_mbit=r, k=k)
            row = {"link Mbit/s": float(r), "k": int(k), "t1 s": _spread(sel["transfer_s"])}
            for a in ("ps", "tree"):
                row[f"{a} measured s"] = _spread(sel["sum_time_s"].sel(aggregation=a))
                row[f"{a} one-way s"] = float(sel["predicted_oneway_s"].sel(aggregation=a))
            row["ps / tree measured"] = _spread(
                sel["sum_time_s"].sel(aggregation="ps") / sel["sum_time_s"].sel(aggregation="tree")
            )
            row["one-way model"] = float(
                sel["predicted_oneway_s"].sel(aggregation="ps")
                / sel["predicted_oneway_s"].sel(aggregation="tree")
            )
            row["Eq. 3 / 4"] = float(
                sel["predicted_eq_s"].sel(aggregation="ps") / sel["predicted_eq_s"].sel(aggregation="tree")
            )
            rows.append(row)
    return markdown_table(pd.DataFrame(rows))


def plot_links(ds: xr.Dataset, fig) -> None:
    """Measured sum times against k (a line through the rounds' medians, a dot per round) and the
    one-way model (dashed), one panel per link rate."""
    rates = ds["rate_mbit"].values
    fig.set_size_inches(5.2 * len(rates), 4.2)
    for i, r in enumerate(rates):
        ax = fig.add_subplot(1, len(rates), i + 1)
        sel = ds.sel(rate_mbit=r)
        for a, color in (("ps", "C0"), ("tree", "C1")):
            t = sel["sum_time_s"].sel(aggregation=a)
            ax.plot(ds["k"], t.median("round"), "o-", color=color, label=f"{a} measured (median)")
            for n in ds["round"].values:
                ax.plot(ds["k"], t.sel(round=n), ".", color=color, ms=4, alpha=0.6)
            ax.plot(
                ds["k"], sel["predicted_oneway_s"].sel(aggregation=a), "--", color=color, label=f"{a} one-way"
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k workers, each on its own link")
        ax.set_ylabel("s to sum CaffeNet's conv gradients (dots: rounds)")
        ax.set_title(f"{r:g} Mbit/s links (cf. FireCaffe Fig. 4)", fontsize=9)
        ax.legend(fontsize=7)


def run_links(
    ks: Sequence[int], rates_mbit: Sequence[float], repeats: int, tiny: bool, rounds: int = 1
) -> Experiment:
    """The per-worker-link measurement as an Experiment."""
    ds = stamp(measure_links(ks, rates_mbit, repeats, rounds), NAME, MIRRORS, tiny, mode="links")
    ratio = ds["sum_time_s"].sel(aggregation="ps") / ds["sum_time_s"].sel(aggregation="tree")
    grows = growth(ds)
    kmin, kmax = int(ds["k"].min()), int(ds["k"].max())
    notes = [
        f"one dask worker (1 thread) per network namespace, each joined to a bridge by a veth pair shaped "
        f"both ways by tc tbf; {rounds} round(s) of medians of {repeats}, median [range] over the rounds; "
        f"load (1 min) {float(ds['load_1min'].min()):.1f}-{float(ds['load_1min'].max()):.1f}; "
        f"{ds.attrs['device']}",
        "ps / tree measured: "
        + "; ".join(
            f"{r:g} Mbit/s: "
            + ", ".join(f"k={int(k)} {_spread(ratio.sel(rate_mbit=r, k=k))}" for k in ds["k"].values)
            for r in ds["rate_mbit"].values
        ),
        f"growth k = {kmin} → {kmax} (Eq. 3: ps {kmax / kmin:g}×, one-way {(kmax - 1) / (kmin - 1):g}×; "
        f"Eq. 4 and one-way: tree {math.log2(kmax) / math.log2(kmin):g}×): "
        + "; ".join(
            f"{r:g} Mbit/s: ps {_spread(grows.sel(rate_mbit=r, aggregation='ps'))}×, "
            f"tree {_spread(grows.sel(rate_mbit=r, aggregation='tree'))}×"
            for r in ds["rate_mbit"].values
        ),
    ]
    return Experiment(ds, table_links(ds), plot_links, notes)


def run(
    tiny: bool = False,
    workers: Sequence[int] | None = None,
    repeats: int | None = None,
    iterations: int = 20,
    links: Sequence[float] | None = None,
    rounds: int = 1,
) -> Experiment:
    """Measure on LocalClusters of k workers (tiny: k = 2, LeNet's gradient, 2 repeats, no engine runs),
    or with `links` (Mbit/s) on per-worker links at k = 2, 4, 8 (tiny: k = 2, 4, 2 repeats)."""
    if links:
        ks = sorted({int(k) for k in (workers or ((2, 4) if tiny else (2, 4, 8)))})
        return run_links(ks, [float(r) for r in links], int(repeats or (2 if tiny else 5)), tiny, int(rounds))
    workers, repeats = workers or (2, 3, 4), int(repeats or 15)
    payloads: Sequence[str] = tuple(PAYLOADS)
    if tiny:
        workers, payloads, repeats, iterations = (2,), ("lenet_conv",), 2, 0
    ks = sorted({int(k) for k in workers})
    ds = stamp(measure(ks, payloads, repeats, iterations), NAME, MIRRORS, tiny)
    last = ds["sum_time_s"].sel(payload=ds["payload"].values[-1])
    ratio = last.sel(aggregation="ps") / last.sel(aggregation="tree")
    notes = [
        f"LocalCluster of k worker processes, 1 thread each, on {ds.attrs['device']}; k > 2 oversubscribes "
        "the 2 cores; transfers are localhost TCP. Medians of "
        f"{repeats} (sums) and time per iteration over {iterations} iterations (engine).",
        "Measured bandwidth |∇W|/t1: "
        + ", ".join(
            f"{p} {float(ds['bandwidth'].sel(payload=p)) / 1e6:.0f} MB/s" for p in ds["payload"].values
        ),
        "ps / tree measured for the largest gradient: "
        + ", ".join(f"k={int(k)} {float(ratio.sel(k=k)):.2f}" for k in ds["k"].values)
        + "; Eq. 3/4 predict "
        + ", ".join(f"k={int(k)} {k / (2 * math.log2(k)):.2f}" for k in ds["k"].values)
        + " (one-way model: "
        + ", ".join(f"k={int(k)} {(k - 1) / tree_depth(int(k)):.2f}" for k in ds["k"].values)
        + ").",
        "Timings on a shared 2-core machine are noisy (other processes run beside it).",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [
        (
            ("--workers",),
            {"type": int, "nargs": "+", "default": None, "help": "group sizes k (2 3 4; links 2 4 8)"},
        ),
        (
            ("--repeats",),
            {"type": int, "default": None, "help": "timed sums per point, median (15; links 5)"},
        ),
        (
            ("--links",),
            {
                "type": float,
                "nargs": "+",
                "default": None,
                "help": "Mbit/s: per-worker links (network namespaces + tc; needs root and iproute2)",
            },
        ),
        (("--iterations",), {"type": int, "default": 20, "help": "engine iterations per run (0: skip)"}),
        (
            ("--rounds",),
            {"type": int, "default": 1, "help": "with --links: sweeps of every rate and k, for a spread (1)"},
        ),
    ],
)

if __name__ == "__main__":
    sys.exit(main())
