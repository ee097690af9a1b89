"""Benchmark: "auto" on the main job over seeds, where its η ramp may end at the edge of stability.

`dasknn train`'s main job (LeNet on mnist-sample, batch 64, 20% held out, target 96%) on the
simulated engine with 2 workers, once per `--random-state`: the clock is a model and each seed's fit
is deterministic, so the numbers are the same on any machine at any load (the wall-clock cap is an
hour, so that a busy machine cannot cut a fit short). Per seed: the kept iterations at the first
evaluation at or above the target (the history's), the iterations the engine ran until then (rolled-
back ones included), the fit's clock there, the rollbacks and the η the ramp ended at. A fit that
misses the target or raises counts as a miss.

    python -m experiments.bench_ramp_edge [--seeds 0-19] [--out DIR]

Writes runs.csv under `--out` (default experiments/results/bench_ramp_edge) and prints the medians
and the worst seed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.cli.app import main as dasknn_main  # noqa: E402
from experiments.common import RESULTS_ROOT  # noqa: E402

TARGET = 0.96


def seeds_of(text: str) -> list[int]:
    """'0-19' or '1,4,7' as a list of seeds."""
    if "-" in text:
        low, high = (int(v) for v in text.split("-"))
        return list(range(low, high + 1))
    return [int(v) for v in text.split(",")]


def one_seed(seed: int, out: Path) -> dict:
    """One `dasknn train` of the main job on the simulated engine; its row."""
    argv = ["train", "--engine", "simulated", "--n-workers", "2", "--max-wall-time", "3600"]
    argv += ["--random-state", str(seed), "--output", str(out), "-q"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = dasknn_main(argv)
    row = {"seed": seed, "rc": rc, "reached": False, "iterations": np.nan, "ran": np.nan, "seconds": np.nan}
    if not (out / "history.csv").exists():  # the fit raised: no run folder
        return {**row, "rollbacks": np.nan, "ramp_end": np.nan, "final_lr": np.nan}
    history, decisions = pd.read_csv(out / "history.csv"), pd.read_csv(out / "decisions.csv")
    trace = pd.read_csv(out / "trace.csv")
    end = decisions[decisions["action"] == "end"]["lr"]
    row.update(
        rollbacks=int((decisions["action"] == "rollback").sum()),
        ramp_end=float(end.iloc[0]) if len(end) else np.nan,
        final_lr=float(decisions["lr"].iloc[-1]),
    )
    hit = history[history["val_accuracy"] >= TARGET]
    if len(hit):
        t = float(hit["time"].iloc[0])
        row.update(reached=True, iterations=int(hit["iteration"].iloc[0]), seconds=t)
        row["ran"] = int((trace["t_end"] <= t + 1e-9).sum())
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19", help="'0-19' or '1,4,7'")
    parser.add_argument("--out", type=Path, default=RESULTS_ROOT / "bench_ramp_edge")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds_of(args.seeds):
        rows.append(one_seed(seed, args.out / f"seed{seed}"))
        print(rows[-1], flush=True)
    runs = pd.DataFrame(rows)
    runs.to_csv(args.out / "runs.csv", index=False)
    ok = runs[runs["reached"]]
    print(f"{len(ok)} of {len(runs)} seeds reached {TARGET:.0%}")
    for name in ("iterations", "ran", "seconds"):
        print(f"{name}: median {ok[name].median():.4g}, worst {ok[name].max():.4g}")
    print(f"rollbacks: {int(runs['rollbacks'].sum())} in all")


if __name__ == "__main__":
    main()
