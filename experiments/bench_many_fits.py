"""Benchmark: many fits in one process on one Dask client: the driver's memory and the scheduler's
tasks after each fit, to show whether either grows without bound.

Starts a LocalCluster (2 worker processes, 1 thread each) and a Client, then fits a new
DistributedCNN (LeNet on digits at 28×28, the "auto" tuner, `--budget` seconds of training, the
fitted estimator dropped) `--fits` times. After each fit, once the scheduler has let the fit's
keys go (polled up to 30 s), it prints the driver's RSS, the scheduler's task count, the client's
futures and the fit's seconds; at the end, the RSS growth per fit over the first and the last
third of the fits, and the most tasks left after any fit. Bounded growth: the last third's slope
near 0 MB a fit, and the task count back to 0 after every fit.

    python -m experiments.bench_many_fits [--fits 50] [--budget 4]

Writes experiments/results/bench_many_fits/bench_many_fits.csv.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import RESULTS_ROOT, machine_line, parser, write_tables  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_many_fits"


def scheduler_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def settled_tasks(client, seconds: float = 30.0) -> int:
    """The scheduler's task count once it has fallen to 0, or the last count after `seconds`."""
    deadline = time.monotonic() + seconds
    count = client.run_on_scheduler(scheduler_tasks)
    while count and time.monotonic() < deadline:
        time.sleep(0.1)
        count = client.run_on_scheduler(scheduler_tasks)
    return count


def slope(rss: np.ndarray) -> float:
    """Least-squares MB per fit of an RSS series."""
    return float(np.polyfit(np.arange(len(rss)), rss, 1)[0]) if len(rss) > 1 else float("nan")


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--fits", type=int, default=50, help="fits in the one process")
    cli.add_argument("--budget", type=float, default=4.0, help="seconds of training per fit")
    args = cli.parse_args(argv)
    import psutil
    from distributed import Client, LocalCluster

    from dasknn.data import load
    from dasknn.estimator import DistributedCNN

    print(machine_line())
    X, y = load("digits", size=28)
    me, rows = psutil.Process(), []
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        for i in range(args.fits):
            t0 = time.perf_counter()
            est = DistributedCNN(net="lenet", time_budget=args.budget, eval_size=200, random_state=i)
            est.fit(X, y)
            seconds, iterations = time.perf_counter() - t0, int(est.n_iter_)
            del est
            gc.collect()
            row = {
                "fit": i,
                "seconds": round(seconds, 2),
                "iterations": iterations,
                "rss_mb": round(me.memory_info().rss / 2**20, 1),
                "tasks": settled_tasks(client),
                "futures": len(client.futures),
            }
            rows.append(row)
            print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    df = pd.DataFrame(rows)
    third = max(len(df) // 3, 2)
    rss = df["rss_mb"].to_numpy()
    print(
        f"RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB (max {rss.max():.0f}); growth per fit: first third "
        f"{slope(rss[:third]):.2f} MB, last third {slope(rss[-third:]):.2f} MB; most tasks left after "
        f"a fit: {int(df['tasks'].max())}, futures {int(df['futures'].max())}"
    )
    print(machine_line())
    write_tables(RESULTS, {"bench_many_fits": df})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
