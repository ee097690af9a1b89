"""Benchmark the other papers' strategies (FireCaffe, Omnivore app. C, Crossbow, SparkNet) against Omnivore's.

On a simulated 32-worker cluster (LeNet, 1 Gbit/s, device speed from the FLOP counts; simulated
seconds): time per iteration, iterations to the target accuracy, and time to it, for Omnivore's
merged FC with g groups (reduction tree and parameter-server aggregation inside each group), the
unmerged physical map, Crossbow's SMA and SparkNet's model averaging. On a LocalCluster of 2
workers (wall seconds): the same strategies on the Dask engine (merged g = 2, one group of k = 2 with
tree aggregation on ShardServer actors or on shard tasks, or PS aggregation (shard tasks), unmerged
(g = 2: one worker a group, no shards), SMA, model averaging) with the same measures.
Also prints RALP's split for LeNet, CIFAR-10 quick and CaffeNet.

"Accuracy" is the mean batch accuracy over the last 50 batches of the trace (the training batches
each update saw), so reaching it needs no extra passes over the data.

    python -m experiments.bench_strategies [--quick]

Writes experiments/results/bench_strategies/{simulated,dask,placement}.csv.
"""

from __future__ import annotations

import math
import time

import pandas as pd

from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from dasknn.tradeoff.hardware import HEModel, phase_costs, time_per_iteration
from dasknn.tradeoff.layer_placement import placement_report, t_aggregation
from experiments.common import RESULTS_ROOT, parser, write_tables

RESULTS = RESULTS_ROOT / "bench_strategies"
BANDWIDTH = 125e6  # 1 Gbit/s, bytes per second
DEVICE_GFLOPS = 100.0  # one CPU socket's peak, the scale of Omnivore's c4.4xlarge workers
N_WORKERS = 32
WINDOW = 50


def iterations_to(trace: pd.DataFrame, target: float) -> tuple[float, float]:
    """(iterations, time) when the rolling mean batch accuracy first reaches `target`, else NaN."""
    acc = trace["accuracy"].rolling(WINDOW).mean()
    hit = acc[acc >= target]
    if hit.empty:
        return math.nan, math.nan
    i = int(hit.index[0])
    return float(i + 1), float(trace["t_end"].iloc[i])


def run_row(
    engine, label: str, cfg: RunConfig, X, y, iterations: int, target: float, simulated: bool
) -> dict:
    """One strategy's run on LeNet: time per iteration, iterations and time to `target`, final accuracy.

    Simulated runs report simulated seconds (`_sim_s`) and the bench's own wall time beside them;
    Dask runs report wall seconds, their first two completions per group skipped as warm-up.
    """
    t0 = time.perf_counter()
    trace = engine.run(zoo.lenet(seed=0), X, y, cfg, Budget(iterations=iterations)).trace
    its, tta = iterations_to(trace, target)
    unit = "sim_s" if simulated else "s"
    per_iter = time_per_iteration(trace) if simulated else time_per_iteration(trace, warmup=2)
    return {
        "strategy": label,
        "n_groups": cfg.n_groups,
        "lr": cfg.lr,
        "momentum": cfg.momentum,
        f"time_per_iter_{unit}": per_iter,
        f"iters_to_{target:.0%}": its,
        f"time_to_{target:.0%}_{unit}": tta,
        "final_acc": float(trace["accuracy"].tail(WINDOW).mean()),
        "bench_wall_s" if simulated else "run_wall_s": time.perf_counter() - t0,
    }


def simulated_setups(batch_size: int) -> list[tuple[str, Strategy, int, dict]]:
    """(label, strategy, n_groups, engine options) on the 32-worker cluster, timings from the net."""
    net = zoo.lenet()
    he = HEModel.estimate(net, batch_size, N_WORKERS, DEVICE_GFLOPS, BANDWIDTH)
    costs = phase_costs(net, batch_size)
    conv_bytes, fc_bytes = costs["conv_model_bytes"], costs["fc_model_bytes"]
    fc_compute = costs["fc_flops"] / (DEVICE_GFLOPS * 1e9 * 0.5)

    def tree_t_conv(k: int) -> float:
        """FireCaffe's tree inside a group: the k gradients in 2·ceil(log2 k) hops, not k."""
        return max(he.T_cc / k, conv_bytes / BANDWIDTH + t_aggregation(conv_bytes, k, BANDWIDTH, "tree"))

    unmerged_fc = fc_compute + 2 * fc_bytes / BANDWIDTH  # pull the FC model, push its gradient
    sync = 2 * (conv_bytes + fc_bytes) / BANDWIDTH  # ring all-reduce of the replicas' differences
    base = {"timing": he}
    return [
        ("omnivore g=4 (ps)", Strategy(aggregation="ps"), 4, base),
        ("omnivore g=4 (tree)", Strategy(aggregation="tree"), 4, {"t_conv": tree_t_conv, "t_fc": he.t_fc}),
        ("omnivore g=32", Strategy(), 32, base),
        ("unmerged g=4", Strategy(physical_map="unmerged"), 4, {**base, "t_fc_worker": unmerged_fc}),
        ("sma k=4", Strategy("sma"), 4, {**base, "t_fc_worker": fc_compute, "t_sync": sync}),
        (
            "model_averaging k=4 tau=4",
            Strategy("model_averaging", tau=4),
            4,
            {**base, "t_fc_worker": fc_compute, "t_sync": sync},
        ),
    ]


def bench_simulated(X, y, batch_size: int, iterations: int, target: float) -> pd.DataFrame:
    rows = []
    runs = []
    for label, strategy, g, options in simulated_setups(batch_size):
        compensated = 0.9 if strategy.synchronous or g == 1 else max(0.0, 0.9 - (1 - 1 / g))
        # asynchronous groups: the momentum that offsets the implicit 1 - 1/g, and the untuned 0.9
        runs += [(label, strategy, g, options, m) for m in sorted({compensated, 0.9})]
    for label, strategy, g, options, momentum in runs:
        opts = dict(options)
        timing = opts.pop("timing", None)
        engine = SimulatedEngine(timing, n_workers=N_WORKERS, verbose=0, strategy=strategy, **opts)
        lr = 0.02 if strategy.synchronous else 0.01
        cfg = RunConfig(n_groups=g, lr=lr, momentum=momentum, batch_size=batch_size)
        rows.append(run_row(engine, label, cfg, X, y, iterations, target, simulated=True))
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    return pd.DataFrame(rows)


DASK_SETUPS = (
    # label, strategy, n_groups, lr, momentum (async groups: 0.9 minus the implicit 1 - 1/g, and 0.9),
    # how a group of k > 1 reaches its remote shards (DaskEngine's shard_calls)
    ("omnivore merged g=2", Strategy(), 2, 0.01, 0.4, "actors"),
    ("omnivore merged g=2", Strategy(), 2, 0.01, 0.9, "actors"),
    ("omnivore merged g=1 k=2 (tree, shard servers)", Strategy(aggregation="tree"), 1, 0.01, 0.9, "actors"),
    ("omnivore merged g=1 k=2 (tree, shard tasks)", Strategy(aggregation="tree"), 1, 0.01, 0.9, "tasks"),
    ("omnivore merged g=1 k=2 (ps, shard tasks)", Strategy(aggregation="ps"), 1, 0.01, 0.9, "tasks"),
    ("unmerged g=2", Strategy(physical_map="unmerged"), 2, 0.01, 0.4, "actors"),
    ("unmerged g=2", Strategy(physical_map="unmerged"), 2, 0.01, 0.9, "actors"),
    ("sma k=2", Strategy(name="sma"), 2, 0.02, 0.9, "actors"),
    ("model averaging k=2 tau=4", Strategy(name="model_averaging", tau=4), 2, 0.02, 0.9, "actors"),
)


def bench_dask(X, y, batch_size: int, iterations: int, target: float) -> pd.DataFrame:
    """Every strategy on one LocalCluster of 2 single-thread workers: wall seconds, same budget."""
    from dasknn.engine.dask import DaskEngine, local_client

    rows = []
    with local_client(n_workers=2, threads_per_worker=1) as client:
        for label, strategy, g, lr, momentum, shard_calls in DASK_SETUPS:
            engine = DaskEngine(client, strategy=strategy, shard_calls=shard_calls)
            cfg = RunConfig(n_groups=g, lr=lr, momentum=momentum, batch_size=batch_size)
            rows.append(run_row(engine, label, cfg, X, y, iterations, target, simulated=False))
            print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    return pd.DataFrame(rows)


def bench_placement() -> pd.DataFrame:
    frames = []
    for make, b in (
        (zoo.lenet, 64),
        (zoo.cifar10_quick, 64),
        (zoo.cifar10_quick, 100),
        (zoo.caffenet, 32),
        (zoo.caffenet, 256),
    ):
        net = make()
        report = placement_report(net, b).reset_index()
        report.insert(0, "batch_size", b)
        report.insert(0, "net", net.name)
        frames.append(report)
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, quick="digits, 95%% target, short runs (~2 min)").parse_args(argv)
    placement = bench_placement()
    print(placement[["net", "batch_size", "placement", "first_server_layer", "bytes_per_worker"]].to_string())
    write_tables(RESULTS, {"placement": placement})
    if args.quick:
        X, y = load("digits", size=28, batch_size=32)
        batch_size, iterations, target, dask_iters = 32, 240, 0.95, 120
    else:
        X, y = load("mnist-sample")
        batch_size, iterations, target, dask_iters = 64, 600, 0.98, 600
    print(f"\nsimulated {N_WORKERS}-worker cluster (simulated seconds), target {target:.0%}:")
    sim = bench_simulated(X, y, batch_size, iterations, target)
    write_tables(RESULTS, {"simulated": sim})
    print("\nDask engine, LocalCluster of 2 workers (wall seconds):")
    dask_rows = bench_dask(X, y, batch_size, dask_iters, target)
    write_tables(RESULTS, {"dask": dask_rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
