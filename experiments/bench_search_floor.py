"""Benchmark: how close can Omnivore's search get to the best fixed configuration on mnist-sample?

Issue #6 asks the optimizer to be within 1.10× of the best fixed configuration's time to 99%
training accuracy, its own search counted. On mnist-sample / LeNet on a 2-worker LocalCluster that
configuration (async g = 2, η = 0.03, µ = 0.9) needs ~5 s, so the probes the search discards may
cost ~0.5 s at most. This benchmark measures what the smallest search Algorithm 1 allows achieves,
against the default, on one cluster, interleaved repetition by repetition (medians):

- "default": `DistributedCNN` with n_groups / learning_rate / momentum "auto" and the bench_tta
  rate grid (0.1, 0.03, 0.01, 0.003), 20-iteration probes;
- "smallest search": 10-iteration probes, cold-start rates {0.03, 0.01} and µ ∈ {0.6, 0.9} only.
  Both sets contain the answer, so this is an oracle-sized grid: no real search is smaller;
- "fixed": async g = 2, η = 0.03, µ = 0.9 (bench_tta's best fixed configuration).

What it found (2-core AMD EPYC, load ~2 from its own workers, 3 repetitions, 2026-11-23): time to
95 / 98 / 99%: default 5.3 / 6.6 / 9.2 s, smallest search 5.1 / 5.8 / 7.2 s, fixed 3.0 / 3.1 / 5.4 s:
even the oracle-sized search is 1.35× the fixed run at 99% (default 1.7×). The cold start's two
rates at g = 1, the g = 2 grid and the equal-time comparison of g = 1 and 2 cost more than the
0.5 s the 1.10× target leaves on a problem this short.

    python -m experiments.bench_search_floor [--reps 3]

Writes experiments/results/bench_search_floor/search_floor.csv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_tta import WallClockEngine, fit_run, tta_row  # noqa: E402
from experiments.common import RESULTS_ROOT, parser, write_tables  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_search_floor"
THRESHOLDS = (0.95, 0.98, 0.99)
"""Training-accuracy thresholds (the question this answers was asked of training accuracy)."""
CONFIGS = (
    # name, optimizer options, n_groups, learning_rate, momentum
    ("default", {"lr_grid": (0.1, 0.03, 0.01, 0.003)}, "auto", "auto", "auto"),
    (
        "smallest search",
        {"lr_grid": (0.03, 0.01), "probe_iterations": 10, "momentum_grid": (0.6, 0.9)},
        "auto",
        "auto",
        "auto",
    ),
    ("fixed async g=2 η=0.03", None, 2, 0.03, 0.9),
)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    from dasknn.data import load
    from dasknn.engine.dask import DaskEngine, local_client

    cli = parser(__doc__)
    cli.add_argument("--reps", type=int, default=3, help="repetitions of each run (default 3)")
    cli.add_argument("--budget", type=float, default=60.0, help="seconds per run (default 60)")
    args = cli.parse_args(argv)
    X, y = load("mnist-sample", batch_size=64)
    rows = []
    with local_client(n_workers=2) as client:
        engine = WallClockEngine(DaskEngine(client))
        Xc, yc = client.persist([X, y])
        for rep in range(args.reps):
            for name, options, g, lr, mu in CONFIGS:
                record, hist = fit_run(
                    name, "floor", engine, Xc, yc, args.budget, 2000, g=g, lr=lr, mu=mu, options=options,
                    target=THRESHOLDS[-1], validation_fraction=None, metric="accuracy",
                )  # fmt: skip
                row = {"rep": rep, **tta_row(record, hist, THRESHOLDS, metric="accuracy")}
                rows.append(row)
                print(f"  rep {rep} {name:24s} 95/98/99%: {row['tta_95']:.2f} / {row['tta_98']:.2f} / "
                      f"{row['tta_99']:.2f} s", flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    medians = table.groupby("run", sort=False)[["tta_95", "tta_98", "tta_99"]].median()
    fixed = medians.loc[CONFIGS[-1][0]]
    medians["ratio_99_vs_fixed"] = medians["tta_99"] / fixed["tta_99"]
    print(medians.round(2).to_string())
    write_tables(RESULTS, {"search_floor": table})
    return medians


if __name__ == "__main__":
    main()
