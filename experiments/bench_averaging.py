"""Benchmark: annealing without a horizon: weight averaging against a decay on measured stall.

On the suite's simulated workloads (`experiments.bench_suite`: sim_lenet128, sim_cifar10_quick,
sim32, with the suite's targets, rules and budgets at its full setting, or its `--quick` ones), the
time to each workload's target for six contenders:

- "solver": the solver's η, µ fixed for the whole fit at g = 1 (Caffe's way: the baseline that
  annealing must beat);
- "best fixed": the workload's best fixed point of the suite's grid (`BEST`, chosen in the earlier
  selection rounds named there; `--select` chooses it again with `bench_suite.select`);
- "auto": the "auto" tuner as shipped (η ÷ 3 on measured stall, `optimizer.plateau`), prior cache off;
- each of the three again with `averaging="ema"`: the servers keep an exponential moving average of
  the weights (`engine.averaging`), and the evaluations score it.

Simulated clock (the HE model), so the machine's load does not enter the times. One round per seed,
the six contenders in each, their order rotated by one each round; rounds run in `--jobs`
processes. The table: seconds per contender and seed (a miss counts as the budget and is named),
each "+ ema" ÷ its plain contender, "auto" and "auto + ema" ÷ "solver", their medians over the seeds
and their spread (min–max).

    python -m experiments.bench_averaging [--quick] [--seeds 0 1 2] [--workloads sim32 ...] [--jobs 2]

Writes experiments/results/bench_averaging/<setting>/{runs.csv, table.csv, table.md}.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from experiments import bench_suite
from experiments.common import RESULTS_ROOT, machine_line, markdown_table, parser

RESULTS = RESULTS_ROOT / "bench_averaging"
WORKLOADS = ("sim_lenet128", "sim_cifar10_quick", "sim32")
BEST = {
    "sim_lenet128": (2, 0.03, 0.9),
    "sim_cifar10_quick": (1, 0.003, 0.9),
    "sim32": (32, 0.003, 0.9),
}
"""The best fixed point of each workload, chosen before this benchmark in separate rounds: LeNet
b128 and CIFAR-10 quick by bench_auto_workloads' grid (g ∈ {1, 2} × η, µ = 0.9, seeds 0-2), sim32 by
bench_auto_sim32's selection pass (random_state 1000; plain async at η = 0.003, refined); the quick
suite's selection (random_state 1000) chose the same on LeNet and sim32."""
BASES = ("solver", "best fixed", "auto")
EMA = " + ema"


def contenders(w: bench_suite.Workload, best: tuple[int, float, float]) -> list[tuple[str, dict]]:
    """(name, estimator parameters) of the six contenders on `w`."""
    plain = {
        "solver": bench_suite.knobs_of(w.solver),
        "best fixed": bench_suite.knobs_of(best),
        "auto": bench_suite.tuner_knobs("auto"),
    }
    out = []
    for name, knobs in plain.items():
        out += [(name, {**knobs, "averaging": None}), (name + EMA, {**knobs, "averaging": "ema"})]
    return out


Point = tuple[int, float, float]


def one_round(setting: str, name: str, best: Point, seed: int, rotation: int, out: Path) -> Path:
    """Every contender once on workload `name` at `seed`, the order rotated by `rotation`; its rows
    go to out/rounds/NAME-SEED.csv (written when the round ends: a round found there is not run
    again, so a benchmark cut short goes on where it stopped)."""
    os.environ["DASKNN_PRIOR_CACHE"] = "off"
    path = out / "rounds" / f"{name}-{seed}.csv"
    if path.exists():
        return path
    w = bench_suite.workloads(setting)[name]
    X, y = w.data()
    order = contenders(w, best)
    order = order[rotation % len(order) :] + order[: rotation % len(order)]
    rows = []
    for contender, knobs in order:
        row = bench_suite.fit_contender(w, X, y, contender, knobs, seed)
        point = best if contender.startswith("best") else w.solver
        rows.append({**row, "point": "" if contender.startswith("auto") else bench_suite.fixed_name(point)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path.with_suffix(".part"), index=False)
    path.with_suffix(".part").replace(path)
    return path


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Per workload and seed: each contender's seconds, each "+ ema" ÷ its plain contender, "auto"
    and "auto + ema" ÷ "solver"; then per workload the medians and the spread (min–max) over the
    seeds."""
    rows = []
    for (workload, seed), part in runs.groupby(["workload", "seed"], sort=False):
        t = dict(zip(part["contender"], part["seconds"].astype(float), strict=True))
        row = {"workload": workload, "seed": str(seed)}
        row.update({f"{c} s": t[c] for c in (b + e for b in BASES for e in ("", EMA))})
        row.update({f"{b}: ema ÷ plain": t[b + EMA] / t[b] for b in BASES})
        row["auto ÷ solver"] = t["auto"] / t["solver"]
        row["auto + ema ÷ solver"] = t["auto" + EMA] / t["solver"]
        missed = part.loc[~part["reached"].astype(bool), "contender"]
        row["missed"] = ", ".join(missed) or "none"
        rows.append(row)
    table = pd.DataFrame(rows)
    numbers = table.drop(columns=["seed", "missed"])
    by = numbers.groupby("workload", sort=False)
    medians = by.median().reset_index().assign(seed="median")
    spread = (by.max() - by.min()).reset_index().assign(seed="spread (max − min)")
    return pd.concat([table, medians, spread], ignore_index=True)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = parser(__doc__, quick="the suite's quick targets and budgets, 1 seed")
    cli.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    cli.add_argument("--seeds", type=int, nargs="+", default=None, help="random_states (default 0 1 2)")
    cli.add_argument("--select", action="store_true", help="choose the best fixed points again (bench_suite)")
    cli.add_argument("--jobs", type=int, default=1, help="rounds run side by side in this many processes")
    cli.add_argument("--out", type=Path, default=None, help="results folder")
    args = cli.parse_args(argv)
    setting = "quick" if args.quick else "full"
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    out = args.out or RESULTS / setting
    out.mkdir(parents=True, exist_ok=True)
    os.environ["DASKNN_PRIOR_CACHE"] = "off"
    print(machine_line(), flush=True)
    t0 = time.perf_counter()
    suite = bench_suite.workloads(setting)
    best = dict(BEST)
    if args.select:
        for name in args.workloads:
            best[name], _ = bench_suite.select(suite[name], *suite[name].data(), setting)
    jobs = [
        (setting, name, best[name], seed, r, out) for name in args.workloads for r, seed in enumerate(seeds)
    ]
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        rounds = list(pool.map(one_round, *zip(*jobs, strict=True)))
    runs = pd.concat([pd.read_csv(path) for path in rounds], ignore_index=True)
    table = summarise(runs)
    runs.to_csv(out / "runs.csv", index=False)
    table.to_csv(out / "table.csv", index=False)
    targets = "; ".join(
        f"{n}: {suite[n].target:.0%} ({suite[n].rule}), budget {suite[n].budget:g} s, "
        f"best fixed {bench_suite.fixed_name(best[n])}, solver {bench_suite.fixed_name(suite[n].solver)}"
        for n in args.workloads
    )
    lines = [
        f"# bench_averaging ({setting}): simulated seconds to target, with and without weight averaging",
        "",
        machine_line(),
        f"seeds {seeds}; {targets}",
        "",
        markdown_table(table),
        "",
        f"wall time {time.perf_counter() - t0:.0f} s",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print((out / "table.md").read_text(), flush=True)
    return table


if __name__ == "__main__":
    main()
