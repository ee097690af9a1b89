"""A/B of the main job on Dask: `dasknn train` with the "auto" tuner against fixed knobs, interleaved.

Each round runs every contender once, in turn, as its own `python -m dasknn train` process (LeNet
on mnist-sample, 20% held out, a LocalCluster of 2 workers, the prior cache off:
DASKNN_PRIOR_CACHE=off), and reads from its run folder the time on the fit's clock and the
iterations to each target held-out accuracy (report.csv, first evaluation at or above; 95% and 96%
by default; the fit itself stops at 96%), and the process's wall time, measured here around the
subprocess (each run's folder is kept under experiments/results/ab_main_job/). Prints every run,
the medians, the ratios of medians to the first fixed contender, and the machine's load before and
after (a busy machine moves wall-clock numbers: compare only contenders of the same round).

Each `dasknn train` run's overheads, read from its files (`overheads`), at the evaluation that
reached the last target (else the last one): the fit's clock there, the fit loop's wall there
(history's `wall_time`, from the loop's start), the process wall ÷ the time to target; the
evaluations' cost (the loop's wall beyond the fit's clock: the evaluations, which the clock does
not charge, and the loop's own work between runs), the run boundaries' cost (each run's time on the
fit's clock less its iterations at its own steady time per iteration, `measure.seconds_per_iteration`:
start-up, the first iterations' warm-up, tear-down; a run evaluated while it trained counts to the
target only), each as a share of the loop's wall, and the
process's wall outside the loop (imports, data, cluster start, the fit's set-up, report, exit).

`--torch` adds a contender "pytorch": a plain PyTorch loop with Caffe's LeNet solver (batch 64,
η 0.01 with the inv policy, µ 0.9) on the same split and initial weights, as its own process
(`torch_once`; its clock is its training time, scoring excluded, as the fit's clock).

`--base DIR` adds, for "auto" and each fixed contender, a contender "base:auto" or "base:g,η,µ"
running the same knobs with the code of another checkout (DIR first on PYTHONPATH, e.g. the main
branch's worktree), in the same rounds: before and after a change. `--no-auto` leaves "auto" (and
"base:auto") out.

A contender carries extra `dasknn train` flags after its knobs, each after a "+": a shorthand
of `EXTRAS` ("+ema": `--averaging ema`, the servers' weight average) or a flag written
"+name=value" (`--name value`, e.g. "+shuffle-window=4"). `--fixed 2,0.03,0.9 2,0.03,0.9+ema`
runs the fixed knobs with and without averaging, and `--auto auto auto+ema` the tuner with and
without it, in the same rounds (`--auto` with no value: no tuner; `--no-auto` says the same).

    python -m experiments.ab_main_job [--rounds 3] [--targets 0.95 0.96] [--fixed 2,0.03,0.9 ...]
        [--auto auto auto+ema ...] [--torch] [--base DIR] [--no-auto]

`--fixed` with no value runs "auto" alone.
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

OVERHEADS = ("loop_wall", "wall_per_tta", "evaluations", "evaluation_s", "boundary_s", "runs",
             "evaluation_share", "boundary_share", "both_share", "outside_loop_s")  # fmt: skip
"""The columns `overheads` adds to a `dasknn train` run's row (shares of the loop's wall)."""


def overheads(folder: Path, target: float, process_wall: float) -> dict:
    """A `dasknn train` run's fixed costs from its files (the module docstring), up to the first
    evaluation at or above `target` held-out (else the last evaluation)."""
    from dasknn.optimizer.measure import seconds_per_iteration

    history, trace = folder / "history.csv", folder / "trace.csv"
    if not history.is_file() or not trace.is_file():
        return {}
    h, t = pd.read_csv(history), pd.read_csv(trace)
    hit = h[h["val_accuracy"] >= target] if "val_accuracy" in h else h.iloc[0:0]
    row = hit.iloc[0] if len(hit) else h.iloc[-1]
    clock, wall = float(row["time"]), float(row["wall_time"])
    ends = t.groupby("run")["t_end"].max().sort_index()
    boundary, runs, before = 0.0, 0, 0.0
    for run, end in ends.items():
        rows = t[t["run"] == run]
        spans = end > clock + 1e-9  # a run evaluated while it trained goes on past the target
        if spans:
            rows = rows[rows["t_end"] <= clock + 1e-9]
        # the run's time on the fit's clock (its iterations end there), to the target for the last
        charged = (clock if spans else float(end)) - before
        boundary += max(0.0, charged - len(rows) * seconds_per_iteration(t[t["run"] == run]))
        before, runs = float(end), runs + 1
        if spans:
            break
    evaluations = int((h["wall_time"] <= wall + 1e-9).sum())
    evaluation = wall - clock
    return {
        "loop_wall": wall,
        "wall_per_tta": process_wall / clock if len(hit) else float("nan"),
        "evaluations": evaluations,
        "evaluation_s": evaluation,
        "boundary_s": boundary,
        "runs": runs,
        "evaluation_share": evaluation / wall,
        "boundary_share": boundary / wall,
        "both_share": (evaluation + boundary) / wall,
        "outside_loop_s": process_wall - wall,
    }


def torch_once(folder: str, budget: float = 60.0) -> None:
    """The PyTorch contender, run as its own process: a plain loop with Caffe's LeNet solver
    (experiments/bench_tta_torch, 2 threads) on the main job's split, from dasknn's initial
    weights, to 96% held-out; its history (training seconds, scoring off the clock) and a report
    in the shape of dasknn train's go to `folder`."""
    import dask

    from dasknn.data import load
    from dasknn.reports import time_to_accuracy
    from experiments.bench_tta import TARGET, _cores, torch_parts
    from experiments.bench_tta_torch import caffe_lenet_loop

    X, y = dask.compute(*load("mnist-sample"))
    Xt, yt, held_out = torch_parts(X, y)
    history = caffe_lenet_loop(Xt, yt, budget, TARGET, 2000, 0, threads=_cores(), validation=held_out)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    history.to_csv(out / "history.csv", index=False)
    report = time_to_accuracy(history, (0.9, 0.95, 0.96), metric="val_accuracy")
    report.rename(columns={"time": "seconds"}).to_csv(out / "report.csv", index=False)


EXTRAS = {"ema": ["--averaging", "ema"]}
"""The shorthands of a contender's extra flags (the module docstring)."""


FOLDER_CHARACTERS = str.maketrans({",": "_", ":": "_", "+": "-", "=": "-"})
"""A contender's name in its run folder's name."""


def is_auto(name: str) -> bool:
    """Whether contender `name` runs the "auto" tuner ("[base:]auto[+extra...]")."""
    return name.removeprefix("base:").split("+")[0] == "auto"


def flags_of(name: str) -> list[str]:
    """The `dasknn train` flags of a contender: "[base:]auto" (the default) or "[base:]g,η,µ",
    then its extras, each after a "+" (a shorthand of `EXTRAS`, or "name=value")."""
    if name == "pytorch":
        return []
    knobs, *extras = name.removeprefix("base:").split("+")
    flags = []
    if knobs != "auto":
        g, lr, mu = knobs.split(",")
        flags = ["--n-groups", g, "--lr", lr, "--momentum", mu]
    for extra in extras:
        if extra in EXTRAS:
            flags += EXTRAS[extra]
        elif "=" in extra:
            flag, value = extra.split("=", 1)
            flags += [f"--{flag}", value]
        else:
            raise ValueError(
                f"contender {name!r}: extra {extra!r} is neither one of {sorted(EXTRAS)} nor name=value"
            )
    return flags


def run_once(name: str, targets: list[float], folder: Path, base: Path | None = None) -> dict:
    """One `dasknn train` process: its time (fit's clock) and iterations to each of `targets`
    held-out, and its wall time; a "base:" contender runs the code of `base`."""
    env = {**os.environ, "DASKNN_PRIOR_CACHE": "off"}
    # `python -m` imports from its working folder first: each contender runs in its own checkout
    checkout = base if name.startswith("base:") else Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
    folder = folder.resolve()
    command = [sys.executable, "-m", "dasknn", "train", "--output", str(folder), *flags_of(name)]
    if name == "pytorch":
        command = [
            sys.executable,
            "-c",
            f"from experiments.ab_main_job import torch_once; torch_once({str(folder)!r})",
        ]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    wall = time.perf_counter() - t0
    row = {"contender": name, "exit": done.returncode, "process_wall": wall, "load_before": load}
    if done.returncode != 0:  # keep what the failing process said, beside its run folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stderr.txt").write_text(done.stderr)
        print(f"{name} exited {done.returncode}: {folder / 'stderr.txt'}", file=sys.stderr)
    report = folder / "report.csv"
    rows = pd.read_csv(report) if report.is_file() else None
    for target in targets:
        seconds = iterations = float("nan")
        if rows is not None:
            hit = rows[(rows["metric"] == "val_accuracy") & (rows["threshold"].round(4) == round(target, 4))]
            if len(hit) and bool(hit["reached"].iloc[0]):
                seconds, iterations = float(hit["seconds"].iloc[0]), float(hit["iterations"].iloc[0])
        row[f"time_to_{target:g}"], row[f"iterations_to_{target:g}"] = seconds, iterations
    if name != "pytorch":
        row.update(overheads(folder, targets[-1], wall))
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=[0.95, 0.96],
        help="thresholds of dasknn train's report (the fit stops at its own 96%%)",
    )
    parser.add_argument("--fixed", nargs="*", default=["2,0.03,0.9"], help="fixed knobs g,η,µ")
    parser.add_argument("--torch", action="store_true", help="also a PyTorch loop with Caffe's solver")
    parser.add_argument("--base", type=Path, help="a checkout whose code runs the fixed knobs as base:g,η,µ")
    parser.add_argument("--no-auto", action="store_true", help='leave the "auto" tuner out')
    parser.add_argument(
        "--auto", nargs="*", default=["auto"], help='the "auto" contenders, with extras: auto auto+ema'
    )
    args = parser.parse_args(argv)
    if args.base is not None and not (args.base / "dasknn" / "__init__.py").is_file():
        parser.error(f"--base {args.base}: no dasknn package there")
    autos = [] if args.no_auto else args.auto
    for name in [*autos, *args.fixed]:
        if is_auto(name) != (name in autos):
            parser.error(f"{name!r}: a tuner's contender goes to --auto, fixed knobs g,η,µ to --fixed")
        try:
            flags_of(name)
        except ValueError as err:
            parser.error(str(err))
    bases = [f"base:{name}" for name in [*autos, *args.fixed]]
    bases = bases if args.base is not None else []
    contenders = [*autos, *args.fixed, *bases]
    contenders += ["pytorch"] if args.torch else []
    print(machine_line(), flush=True)
    rows = []
    stem = f"ab_main_job_{timestamp()}"
    runs = results_dir("ab_main_job") / stem  # each run's folder (decisions.csv, history.csv, ...)
    for r in range(args.rounds):
        for name in contenders:
            folder = runs / f"{r}_{name.translate(FOLDER_CHARACTERS)}"
            row = {"round": r, **run_once(name, args.targets, folder, args.base)}
            rows.append(row)
            print(row, flush=True)
    table = pd.DataFrame(rows)
    columns = [c for c in table.columns if c.startswith(("time_to_", "iterations_to_"))] + ["process_wall"]
    columns += [c for c in OVERHEADS if c in table]
    med = table.groupby("contender", sort=False)[columns].median()
    fixed = [c for c in contenders if not is_auto(c) and c != "pytorch"]
    base = med.loc[fixed[0]] if fixed else med.loc[contenders[0]]
    for target in args.targets:
        med[f"time to {target:g} ÷ first fixed"] = med[f"time_to_{target:g}"] / base[f"time_to_{target:g}"]
    last = f"time_to_{args.targets[-1]:g}"
    med[f"wall ÷ {last}"] = med["process_wall"] / med[last]
    print(machine_line())
    print(med.T.to_string())
    write_tables(results_dir("ab_main_job"), {"": table}, stem)


if __name__ == "__main__":
    main()
