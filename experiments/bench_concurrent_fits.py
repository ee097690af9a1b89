"""Benchmark: two fits at once on one Dask cluster, against one fit alone on it.

Starts a LocalCluster (3 worker processes, 1 thread each), then runs LeNet on digits (28×28,
fixed n_groups, learning rate and momentum, no target) for `--budget` seconds: one fit alone,
then two fits at once (two client processes on the same scheduler, as two users would), after one
unrecorded warm-up fit (the first fit on a fresh cluster pays its workers' imports and first
scatters inside its budget) and in alternating order over the repetitions. Prints
each fit's iterations and its iterations per second of training, the pair's sum against the lone
fit (1.0: the cluster's throughput is shared without loss), and the machine's load.

    python -m experiments.bench_concurrent_fits [--budget 20] [--n-groups 1] [--reps 2]

Writes experiments/results/bench_concurrent_fits/bench_concurrent_fits.csv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import RESULTS_ROOT, machine_line, parser, repetitions  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_concurrent_fits"
REPO = Path(__file__).resolve().parents[1]

FIT = """
import json, sys, time
from dasknn.data import load
from dasknn.estimator import DistributedCNN
address, budget, groups, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
X, y = load("digits", size=28)
est = DistributedCNN(net="lenet", scheduler=address, n_groups=groups, learning_rate=0.01, momentum=0.9,
                     time_budget=budget, eval_size=200, validation_fraction=None, random_state=seed)
t0 = time.perf_counter()
est.fit(X, y)
train = est.trace_[est.trace_["phase"] == "train"] if "phase" in est.trace_ else est.trace_
busy = float((train["t_end"] - train["t_start"]).sum()) if len(train) else float("nan")
print(json.dumps({"iterations": int(est.n_iter_), "wall": time.perf_counter() - t0, "trained_s": busy}))
"""


def start_fits(address: str, budget: float, groups: int, seeds: list[int]) -> list[dict]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIT, address, str(budget), str(groups), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in seeds
    ]
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=budget * 20 + 300)
        if p.returncode != 0:
            raise RuntimeError(f"a fit failed with exit code {p.returncode}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, reps=(2, 1))
    cli.add_argument("--budget", type=float, default=20.0, help="seconds of training per fit")
    cli.add_argument("--n-groups", type=int, default=1, help="compute groups of each fit")
    args = cli.parse_args(argv)
    from distributed import LocalCluster

    print(machine_line())
    rows = []
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0") as cluster:
        start_fits(cluster.scheduler_address, 5.0, args.n_groups, [999])  # warm-up, not recorded
        for rep in range(repetitions(args)):
            modes = [("alone", [rep]), ("pair", [rep, rep + 100])]
            for mode, seeds in modes if rep % 2 == 0 else modes[::-1]:  # either order, alternately
                load0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                for i, r in enumerate(
                    start_fits(cluster.scheduler_address, args.budget, args.n_groups, seeds)
                ):
                    rows.append(
                        {
                            "rep": rep,
                            "mode": mode,
                            "fit": i,
                            **r,
                            "load": load0,
                            "span": time.perf_counter() - t0,
                        }
                    )
                print(pd.DataFrame(rows[-len(seeds) :]).to_string(index=False), flush=True)
    df = pd.DataFrame(rows)
    df["it_per_s"] = df["iterations"] / args.budget
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / "bench_concurrent_fits.csv", index=False)
    alone = df[df["mode"] == "alone"].groupby("rep")["iterations"].sum()
    pair = df[df["mode"] == "pair"].groupby("rep")["iterations"].sum()
    print(df.to_string(index=False))
    print(
        f"pair's iterations ÷ lone fit's (per rep): {(pair / alone).round(2).tolist()}; "
        f"median {float((pair / alone).median()):.2f} (1.0: shared without loss, 0.5 each: fair)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
