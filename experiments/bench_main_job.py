"""Benchmark: the main job's time to target, "auto" against the best fixed configuration chosen apart.

The main job (`dasknn train`'s defaults: LeNet on mnist-sample, batch 64, weight decay 5e-4, a
stratified 20% held out that no contender trains on) on one LocalCluster of `--n-workers`, with two
targets on held-out accuracy, both read off the same fits:

- 95% with the rule "first" (DAWNBench: the first evaluation at or above);
- 96% with the rule "median5" (Crossbow: the first evaluation at which the median of the last five
  is at or above). Every fit runs until that rule is met (a callback stops it) or its budget ends.

So that the minimum of noisy medians does not flatter the grid, "the best fixed configuration" is
chosen in separate rounds from those that measure it:

1. **select**: every point of bench_tta's fixed grid (g ∈ {1, 2} × η ∈ {0.3, 0.1, 0.03, 0.01,
   0.003, 0.001} × µ ∈ {0.9, 0.6}, or the part `--groups/--lrs/--momenta` name) for
   `--select-rounds` rounds; per target, the point with the smallest median is chosen.
2. **measure**: `--rounds` interleaved rounds (each runs every contender once) of the default
   tuner "auto" (prior cache off: every round starts cold), the chosen point(s), the Caffe LeNet
   solver's settings (g = 1, η = 0.01, µ = 0.9) and a plain PyTorch loop with Caffe's solver
   (experiments/bench_tta_torch, same training part, same held-out part, same stopping rule).
   With `--warm`, also "auto" with a warm prior cache (its own file under `--out`, filled by one
   "auto" fit before the first round and updated by each of its fits, as a user's data home is):
   it starts from the configuration the last fit ended with, and skips the ramp.

Each contender's time to target is given on the engine clock (the wall time of its engine runs,
start-up included, evaluations excluded: bench_tta's `WallClockEngine`) and as the fit's wall time at
that evaluation (the history's `wall_time`: evaluations included). A miss counts as the budget.
The rules differ in how often a contender evaluates: median5 waits for two more evaluations after
a crossing, so a contender that evaluates more often waits fewer iterations. The table gives each
contender's median spacing of evaluations (iterations) so that this can be read off.

    python -m experiments.bench_main_job [--select-rounds 1] [--rounds 3] [--budget 25] [--warm]

Writes experiments/results/bench_main_job/{select.csv, runs.csv, table.md, decisions_auto_R.csv}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import device_info  # noqa: E402
from dasknn.callbacks import Callback  # noqa: E402
from dasknn.data import load  # noqa: E402
from dasknn.reports import time_to_accuracy  # noqa: E402
from experiments import bench_tta  # noqa: E402
from experiments.bench_tta_torch import caffe_lenet_loop, rule_met  # noqa: E402
from experiments.common import RESULTS_ROOT, markdown_table  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_main_job"
TARGETS = (("95% first", 0.95, "first"), ("96% median5", 0.96, "median5"))
"""(label, held-out accuracy, rule): the two targets every fit is measured on."""
STOP = TARGETS[-1]
"""Every fit runs until this target's rule is met (it is met after the other's)."""
SOLVER = (1, 0.01, 0.9)
"""Caffe's LeNet solver: lr 0.01, momentum 0.9, on one device (g = 1)."""
METRIC = bench_tta.METRIC


class RuleStop(Callback):
    """Stop the fit once `rule` holds at `target` on the held-out accuracy (`rule_met`)."""

    def __init__(self, target: float, rule: str) -> None:
        self.target, self.rule = target, rule
        self.stop_reason = f"{rule} at {target:.0%} held-out"
        self.values: list[float] = []

    def on_fit_begin(self, est) -> None:
        self.values = []

    def on_evaluation(self, est, record: dict) -> bool:
        value = record.get(METRIC)
        if value is None or not np.isfinite(value):
            return False
        self.values.append(float(value))
        return rule_met(self.values, self.target, self.rule)


def measured(name: str, kind: str, hist: pd.DataFrame, budget: float, fit_wall: float, rnd: int) -> dict:
    """One fit's row: per target, engine-clock seconds and fit wall seconds to it (a miss: the budget),
    and the median spacing of its evaluations in iterations."""
    row = {"run": name, "kind": kind, "round": rnd, "fit_wall_s": fit_wall}
    ev = hist.dropna(subset=[METRIC]) if len(hist) and METRIC in hist else hist
    for label, target, rule in TARGETS:
        rep = time_to_accuracy(ev, [target], rule=rule, metric=METRIC) if len(ev) else None
        hit = rep is not None and bool(rep["reached"].iloc[0])
        row[f"{label} reached"] = hit
        row[f"{label} s"] = float(rep["seconds"].iloc[0]) if hit else budget
        wall = np.nan
        if hit and "wall_time" in ev:
            wall = float(ev.loc[ev["time"] == rep["seconds"].iloc[0], "wall_time"].iloc[0])
        row[f"{label} wall s"] = wall if hit else np.nan
    spacing = np.diff(ev["iteration"].to_numpy()) if len(ev) > 1 and "iteration" in ev else []
    row["eval_every_it"] = float(np.median(spacing)) if len(spacing) else np.nan
    return row


def dasknn_fit(engine, X, y, budget, name, kind, rnd, eval_size, decisions_csv=None, **params) -> dict:
    t0 = time.perf_counter()
    _, hist = bench_tta.fit_run(
        name, kind, engine, X, y, budget, eval_size, target=None, decisions_csv=decisions_csv,
        callbacks=[RuleStop(STOP[1], STOP[2])], **params,
    )  # fmt: skip
    return measured(name, kind, hist, budget, time.perf_counter() - t0, rnd)


def fixed_name(g: int, lr: float, mu: float) -> str:
    return f"fixed g={g} η={lr:g} µ={mu:g}"


def choose(select: pd.DataFrame, grid: list[tuple]) -> dict[str, tuple]:
    """Per target, the grid point with the smallest median seconds in the selection rounds (the
    first in grid order on a tie)."""
    by_name = {fixed_name(*p): p for p in grid}
    chosen = {}
    for label, _, _ in TARGETS:
        med = select.groupby("run", sort=False)[f"{label} s"].median()
        chosen[label] = by_name[med.idxmin()]
    return chosen


def summary(runs: pd.DataFrame, chosen: dict[str, tuple]) -> tuple[pd.DataFrame, list[str]]:
    """Medians per contender and target, and the headline ratios of medians (with per-round ratios)."""
    rows, lines = [], []
    for label, _, _ in TARGETS:
        for name, grp in runs.groupby("run", sort=False):
            grp = grp.sort_values("round")
            rows.append(
                {
                    "target": label,
                    "run": name,
                    "median_s": float(grp[f"{label} s"].median()),
                    "median_wall_s": float(grp[f"{label} wall s"].median()),
                    "reached": f"{int(grp[f'{label} reached'].sum())}/{len(grp)}",
                    "per_round_s": ", ".join(f"{v:.2f}" for v in grp[f"{label} s"]),
                    "eval_every_it": float(grp["eval_every_it"].median()),
                }
            )
    table = pd.DataFrame(rows)
    for kind, who in (("auto", "auto"), ("auto_warm", "auto (warm cache)")):
        auto = runs[runs["kind"] == kind].set_index("round")
        for label, _, _ in TARGETS:
            col = f"{label} s"
            for other in (fixed_name(*chosen[label]), fixed_name(*SOLVER), "pytorch (Caffe solver)"):
                ref = runs[runs["run"] == other].set_index("round")
                if not len(auto) or not len(ref):
                    continue
                ratio = float(auto[col].median() / ref[col].median())
                per = [
                    round(float(auto.loc[i, col] / ref.loc[i, col]), 2)
                    for i in auto.index.intersection(ref.index)
                ]
                lines.append(f"- {label}: {who} ÷ {other} = {ratio:.2f} (per round {per})")
    return table, lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__)
    cli.add_argument(
        "--select-rounds", type=int, default=1, help="rounds of the grid that choose (default 1)"
    )
    cli.add_argument("--rounds", type=int, default=3, help="interleaved rounds that measure (default 3)")
    cli.add_argument(
        "--budget", type=float, default=25.0, help="engine seconds per fit; a miss counts as this"
    )
    cli.add_argument("--n-workers", type=int, default=2)
    cli.add_argument("--eval-size", type=int, default=1000, help="training samples scored (default 1000)")
    cli.add_argument("--groups", help="part of the grid's g, e.g. 2 (default 1,2)")
    cli.add_argument("--lrs", help="part of the grid's η (default all six)")
    cli.add_argument("--momenta", help="part of the grid's µ (default 0.9,0.6)")
    cli.add_argument("--chosen", nargs=2, metavar=("G,LR,MU_95", "G,LR,MU_96"),
                     help="skip the selection: the chosen points for 95%% and 96%%")  # fmt: skip
    cli.add_argument("--no-torch", action="store_true")
    cli.add_argument("--warm", action="store_true", help='also "auto" with a warm prior cache')
    cli.add_argument("--out", type=Path, default=RESULTS)
    args = cli.parse_args(argv)
    for key, full, kind in (("groups", bench_tta.FIXED_GROUPS, int), ("lrs", bench_tta.FIXED_LRS, float),
                            ("momenta", bench_tta.FIXED_MOMENTA, float)):  # fmt: skip
        text = getattr(args, key)
        values = full if text is None else tuple(kind(v) for v in text.split(","))
        if not set(values) <= set(full):
            cli.error(f"--{key} must be a part of the fixed grid's {full}")
        setattr(args, key, values)
    if args.chosen:
        try:
            args.chosen = [tuple(k(v) for k, v in zip((int, float, float), c.split(","), strict=True))
                           for c in args.chosen]  # fmt: skip
        except ValueError:
            cli.error("--chosen takes two points g,η,µ (for example 2,0.03,0.9 2,0.03,0.9)")
    if min(args.select_rounds, args.rounds, args.n_workers, args.eval_size) < 1 or args.budget <= 0:
        cli.error("--select-rounds, --rounds, --n-workers, --eval-size and --budget must be positive")
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse(argv)
    os.environ["DASKNN_PRIOR_CACHE"] = "off"
    args.out.mkdir(parents=True, exist_ok=True)
    from dasknn.engine.dask import DaskEngine, local_client

    load0, t_start = os.getloadavg()[0], time.perf_counter()
    print(f"machine: {device_info()}; load average {load0:.2f}", flush=True)
    X, y = load("mnist-sample", batch_size=bench_tta.BATCH)
    Xt, yt, held_out = bench_tta.torch_parts(*dask.compute(X, y))
    grid = [
        p for p in bench_tta.FIXED_GRID if p[0] in args.groups and p[1] in args.lrs and p[2] in args.momenta
    ]
    with local_client(n_workers=args.n_workers) as client:
        engine = bench_tta.WallClockEngine(DaskEngine(client))
        Xc, yc = client.persist([X, y])
        if args.chosen:
            chosen = dict(zip([t[0] for t in TARGETS], args.chosen, strict=True))
            select = pd.DataFrame()
        else:
            rows = []
            for rnd in range(args.select_rounds):
                print(f"select round {rnd + 1} of {args.select_rounds}: {len(grid)} grid points", flush=True)
                for g, lr, mu in grid:
                    row = dasknn_fit(engine, Xc, yc, args.budget, fixed_name(g, lr, mu), "fixed", rnd,
                                     args.eval_size, g=g, lr=lr, mu=mu)  # fmt: skip
                    rows.append(row)
            select = pd.DataFrame(rows)
            select.to_csv(args.out / "select.csv", index=False)
            chosen = choose(select, grid)
        print(f"chosen: {chosen}", flush=True)
        fixed = list(dict.fromkeys([*chosen.values(), SOLVER]))
        runs = []
        warm = {"prior_cache": str(args.out / "prior-cache.json")}
        if args.warm:
            Path(warm["prior_cache"]).unlink(missing_ok=True)
            print("filling the warm prior cache with one auto fit", flush=True)
            dasknn_fit(engine, Xc, yc, args.budget, "auto (fills the cache)", "auto", -1, args.eval_size,
                       tuner="auto", options=warm)  # fmt: skip
        for rnd in range(args.rounds):
            print(f"measure round {rnd + 1} of {args.rounds} (load {os.getloadavg()[0]:.1f})", flush=True)
            runs.append(dasknn_fit(
                engine, Xc, yc, args.budget, "tuner=auto", "auto", rnd, args.eval_size,
                decisions_csv=args.out / f"decisions_auto_{rnd}.csv", tuner="auto",
            ))  # fmt: skip
            if args.warm:
                runs.append(dasknn_fit(
                    engine, Xc, yc, args.budget, "tuner=auto, warm cache", "auto_warm", rnd, args.eval_size,
                    decisions_csv=args.out / f"decisions_auto_warm_{rnd}.csv", tuner="auto", options=warm,
                ))  # fmt: skip
            for g, lr, mu in fixed:
                runs.append(dasknn_fit(engine, Xc, yc, args.budget, fixed_name(g, lr, mu), "fixed", rnd,
                                       args.eval_size, g=g, lr=lr, mu=mu))  # fmt: skip
            if not args.no_torch:
                t0 = time.perf_counter()
                hist = caffe_lenet_loop(
                    Xt, yt, args.budget, STOP[1], args.eval_size, bench_tta.SEED,
                    threads=bench_tta._cores(), validation=held_out, rule=STOP[2],
                )  # fmt: skip
                runs.append(measured("pytorch (Caffe solver)", "pytorch", hist, args.budget,
                                     time.perf_counter() - t0, rnd))  # fmt: skip
                print(f"  pytorch (Caffe solver)  {runs[-1][f'{STOP[0]} s']:.2f} s to {STOP[0]}", flush=True)
    runs = pd.DataFrame(runs)
    runs.to_csv(args.out / "runs.csv", index=False)
    table, lines = summary(runs, chosen)
    how = "given" if args.chosen else f"{args.select_rounds} round(s) of {len(grid)} grid points"
    text = [
        f"# The main job: time to target on held-out accuracy, {args.n_workers}-worker LocalCluster",
        "",
        f"machine: {device_info()}; load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"selection: {how}; "
        f"{args.rounds} measuring round(s); budget {args.budget:g} s (a miss counts as the budget); "
        f"wall {time.perf_counter() - t_start:.0f} s",
        f"chosen: {', '.join(f'{k}: {fixed_name(*v)}' for k, v in chosen.items())}",
        "",
        markdown_table(table, ".2f"),
        "",
        *lines,
    ]
    if len(select):
        best = select.groupby("run")[[f"{t[0]} s" for t in TARGETS]].median().sort_values(f"{STOP[0]} s")
        text += [
            "",
            "selection rounds (median seconds per grid point):",
            "",
            markdown_table(best.reset_index(), ".2f"),
        ]
    print("\n".join(text), flush=True)
    (args.out / "table.md").write_text("\n".join(text) + "\n")
    return runs


if __name__ == "__main__":
    main()
