"""A/B of the main job on Dask: `dasknn train` with the "auto" tuner against fixed knobs, interleaved.

Each round runs every contender once, in turn, as its own `python -m dasknn train` process (LeNet
on mnist-sample, 20% held out, a LocalCluster of 2 workers, the prior cache off:
DASKNN_PRIOR_CACHE=off), and reads from its run folder the time to the target held-out accuracy on
the fit's clock (report.csv, first evaluation at or above) and the process's wall time, measured
here around the subprocess (each run's folder is kept under experiments/results/ab_main_job/).
Prints every run, the medians, the ratios of medians to the first
fixed contender, and the machine's load before and after (a busy machine moves wall-clock numbers:
compare only contenders of the same round).

    python -m experiments.ab_main_job [--rounds 3] [--target 0.96] [--fixed 2,0.03,0.9 ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import machine_line, results_dir, timestamp, write_tables  # noqa: E402


def flags_of(name: str) -> list[str]:
    """The `dasknn train` flags of a contender: "auto" (the default) or "g,η,µ"."""
    if name == "auto":
        return []
    g, lr, mu = name.split(",")
    return ["--n-groups", g, "--lr", lr, "--momentum", mu]


def run_once(name: str, target: float, folder: Path) -> dict:
    """One `dasknn train` process: its time to `target` on the fit's clock and its wall time."""
    env = {**os.environ, "DASKNN_PRIOR_CACHE": "off"}
    command = [sys.executable, "-m", "dasknn", "train", "--output", str(folder), *flags_of(name)]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    seconds = float("nan")
    report = folder / "report.csv"
    if report.is_file():
        rows = pd.read_csv(report)
        hit = rows[(rows["metric"] == "val_accuracy") & (rows["threshold"].round(4) == round(target, 4))]
        if len(hit) and bool(hit["reached"].iloc[0]):
            seconds = float(hit["seconds"].iloc[0])
    return {"contender": name, "exit": done.returncode, "time_to_target": seconds, "process_wall": wall,
            "load_before": load}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.96, help="a threshold of dasknn train's report")
    parser.add_argument("--fixed", nargs="*", default=["2,0.03,0.9"], help="fixed knobs g,η,µ")
    args = parser.parse_args(argv)
    contenders = ["auto", *args.fixed]
    print(machine_line(), flush=True)
    rows = []
    stem = f"ab_main_job_{timestamp()}"
    runs = results_dir("ab_main_job") / stem  # each run's folder (decisions.csv, history.csv, ...)
    for r in range(args.rounds):
        for name in contenders:
            row = {"round": r, **run_once(name, args.target, runs / f"{r}_{name.replace(',', '_')}")}
            rows.append(row)
            print(row, flush=True)
    table = pd.DataFrame(rows)
    med = table.groupby("contender", sort=False)[["time_to_target", "process_wall"]].median()
    base = med.loc[contenders[1]] if len(contenders) > 1 else med.loc["auto"]
    med["time ÷ first fixed"] = med["time_to_target"] / base["time_to_target"]
    med["wall ÷ time to target"] = med["process_wall"] / med["time_to_target"]
    print(machine_line())
    print(med.to_string())
    write_tables(results_dir("ab_main_job"), {"": table}, stem)


if __name__ == "__main__":
    main()
