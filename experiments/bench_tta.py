"""Benchmark: time to 95/98/99% training accuracy, Omnivore's optimizer against tuned fixed configurations.

The optimizer's time-to-accuracy check, on mnist-sample / LeNet (batch 64, weight decay 5e-4), in one run:

- on one LocalCluster shared by every Dask run: the optimizer (`DistributedCNN` with n_groups,
  learning_rate and momentum "auto", its search time counted); sync (g = 1, µ = 0.9) and fully
  async (g = #workers, µ = 0.9) at every η of a grid, as MXNet users tune, each trained with the same
  time budget and target 0.99 (stopping when reached); the best η of each is reported alone and with
  the grid's cost (the other grid runs' training time) added;
- a plain PyTorch loop on the same data, net and initial weights, with Caffe's LeNet solver (lr 0.01,
  momentum 0.9, weight decay 5e-4, policy inv with gamma 1e-4 and power 0.75, bias lr_mult 2),
  scored on the same evaluation subset every same number of training seconds;
- the simulated part: a 32-worker CPU cluster (c4.4xlarge-like nodes at 742 GFLOP/s and 50% efficiency,
  1 Gbit/s: the HE model of experiments/whatif_cpu_l.py for LeNet), optimizer vs sync (g = 1) vs
  async (g = 32), in simulated seconds.

Clock: every Dask run is charged the wall time of its engine runs, start-up (actors, scatter) included,
evaluations excluded; the optimizer's clock already counts its probes that way, so `WallClockEngine`
charges the fixed runs likewise (the estimator's fixed path would otherwise drop ~0.1-0.5 s of start-up
per evaluation chunk). The simulated part runs each group's batch unsharded with the clock of k = N / g
workers (`GroupClockSimulator`): the simulator's docstring states the k-shard sum equals the full-batch
gradient up to float rounding, and the k = 32 shard-by-shard maths costs ~1 s of real time per iteration.

What it found (2-core AMD EPYC, 24 GB, otherwise quiet: load average 1.8-2.6, i.e. the benchmark's own
two workers; medians of 3 runs of the default settings, 2026-11-23, after the Dask engine's remote
shards moved to ShardServer actors, which made the one-group iteration over both workers ~3× faster,
~45-50 → ~15-18 ms): the optimizer reached 95 / 98 / 99% at 6.4 / 6.5 / 9.0 s (99%: 9.3, 9.0,
8.6 s), its search included. Against the best fixed configuration (async g = 2, η = 0.03:
1.4 / 2.7 / 5.0 s; sync g = 1, η = 0.03 follows at 1.3 / 5.4 / 6.9 s) that is 4.5 / 2.4 / 1.8×
slower (per-run ratios at 99%: 1.72, 1.78, 2.25; target ≤ 1.10: missed); against the worst
(η = 0.003: sync 6.9 / 13.9 / 20.9 s) 1.1 / 2.2 / 2.3× faster (target ≥ 1.5: met at 98 and 99%,
missed at 95%, which even the slowest rate now reaches in ~7 s); PyTorch's Caffe-solver loop,
scored on the same schedule, took 1.5 / 3.6 / 4.3 s (goal missed: 2.1× at 99%). Counting the η
grid a user runs to find the best fixed configuration, the optimizer is 4.4× faster than tuned
async (39.6 s) and 4.7× than tuned sync (42.6 s). Three earlier runs of the same code but for
the PyTorch scoring gave 6.8 / 7.5 / 11.1 s against 1.9 / 3.5 / 6.7 s: run-to-run spread is
±20%. Where its time goes: the g = 1 rate probes (1.5-1.7 s, 20 iterations each at ~22-25 ms,
start-up and probe scoring included; ~3.1 s before the engine change) and the g = 2 (µ, η)
grid with its equal-time continuation (~2 s; 3.5 s in the run where g = 1 and 2 tied and got a
second round) end the search at 3.5-5.0 s (median 3.75) before any training epoch, while the
best fixed run reaches 99% in ~5 s: the probes the search discards cost ~3 s, and ≤ 1.10× leaves
room for ~0.5 s, less than two 20-iteration probes. The paper's premise, a search ~10%
of a long run (1-minute probes, 1-hour epochs), does not hold for a 5-10 s problem. The
simulated 32-worker cluster (deterministic, unchanged): the optimizer picks g = 8 (the HE model
saturates the FC server at g = 5; 8 is the next candidate) and reaches 99% at 10.7 simulated s,
2.2× faster than sync (24.0 s) but 7.4× slower than fully async g = 32 (1.4 s); its search
(g = 1 probes at 56 ms an iteration, then the ladder g = 2, 4, 8) is 9.8 s of the 10.7.

    python -m experiments.bench_tta [--quick] [--n-workers 2] [--lr-grid 0.1,0.03,0.01,0.003]

Writes experiments/results/bench_tta/{tta.csv, histories.csv, simulated.csv, accuracy.png,
accuracy_simulated.png, table.md, simulated.md, decisions.csv, decisions_simulated.csv}. The machine is
shared: the load average is printed and recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import device_info  # noqa: E402
from dasknn.data import load  # noqa: E402
from dasknn.engine.simulated import SimulatedEngine  # noqa: E402
from dasknn.estimator import DistributedCNN  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.reports import plot_accuracy, search_spans, time_to_accuracy  # noqa: E402
from dasknn.tradeoff.hardware import HEModel  # noqa: E402
from experiments.bench_tta_torch import caffe_lenet_loop  # noqa: E402
from experiments.common import RESULTS_ROOT, machine_line, markdown_table  # noqa: E402
from experiments.common import parser as common_parser  # noqa: E402
from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_tta"
THRESHOLDS = (0.95, 0.98, 0.99)
TARGET = 0.99
BATCH = 64
WEIGHT_DECAY = 5e-4
MOMENTUM = 0.9
SEED = 0
SETTINGS = {  # defaults and --quick
    False: {
        "budget": 60.0,
        "lr_grid": "0.1,0.03,0.01,0.003",
        "sim_budget": 60.0,
        "sim_max_epochs": 30,
        "sim_lr_grid": "0.01,0.001",
        "eval_size": 2000,
    },
    True: {
        "budget": 20.0,
        "lr_grid": "0.03,0.01",
        "sim_budget": 30.0,
        "sim_max_epochs": 3,
        "sim_lr_grid": "0.01",
        "eval_size": 1000,
    },
}


class WallClockEngine:
    """An engine whose traces end at each run's wall time, start-up included (the optimizer's clock)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.startup: list[float] = []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def run(self, net, X, y, config, budget, start=None):
        t0 = time.perf_counter()
        result = self.engine.run(net, X, y, config, budget, start=start)
        wall = time.perf_counter() - t0
        trace = result.trace
        if len(trace):
            shift = max(0.0, wall - float(trace["t_end"].max()))
            trace[["t_start", "t_end"]] += shift
            self.startup.append(shift)
        return result


class GroupClockSimulator:
    """A SimulatedEngine per g: one unsharded device per group, timed as k = N / g workers of `model`."""

    def __init__(self, model: HEModel, cv: float = 0.06) -> None:
        self.model, self.cv, self.n_workers = model, cv, model.n_workers
        self.timing = model  # the optimizer's HE model for the initial g (as SimulatedEngine.timing)
        self.engines: dict[int, SimulatedEngine] = {}

    def run(self, net, X, y, config, budget, start=None):
        g = int(config.n_groups)
        if g not in self.engines:
            t_conv = self.model.t_conv(self.model.group_size(g))
            self.engines[g] = SimulatedEngine(
                t_conv=t_conv, t_fc=self.model.t_fc, n_workers=g, variability="gamma", cv=self.cv, verbose=0
            )
        return self.engines[g].run(net, X, y, config, budget, start=start)


class BenchCNN(DistributedCNN):
    """DistributedCNN on the engine the benchmark built (`bench_engine`), so every run shares it."""

    def _engine(self, stack, net):
        return self.bench_engine, getattr(self.bench_engine, "client", None)


def fit_run(
    name, kind, engine, X, y, budget, eval_size, max_epochs=None, g="auto", lr="auto", mu="auto",
    decisions_csv=None, options=None,
):  # fmt: skip
    """One DistributedCNN fit to TARGET: its record (status, charged seconds) and history; the
    optimizer's decisions are written to `decisions_csv` when given."""
    est = BenchCNN(
        net="lenet",
        batch_size=BATCH,
        n_groups=g,
        learning_rate=lr,
        momentum=mu,
        weight_decay=WEIGHT_DECAY,
        time_budget=budget,
        max_epochs=max_epochs,
        target_accuracy=TARGET,
        eval_size=eval_size,
        random_state=SEED,
        optimizer_options=options,
    )
    est.bench_engine = engine
    t0 = time.perf_counter()
    try:
        est.fit(X, y)
    except FloatingPointError:
        hist, status, decisions = pd.DataFrame(columns=["time", "accuracy"]), "diverged", None
    except ValueError as err:  # the estimator's report of an empty history: no train epoch was reached
        if "history needs columns" not in str(err):
            raise
        hist, status, decisions = pd.DataFrame(columns=["time", "accuracy"]), "no_train", None
    else:
        hist, decisions = pd.DataFrame(est.history_), est.decisions_
        hist.attrs["search"] = search_spans(est.trace_, decisions)  # shaded in the plots
        status = "reached" if hist["accuracy"].max() >= TARGET else "budget"
    seconds = float(hist["time"].max()) if len(hist) else float("nan")
    record = {
        "run": name,
        "kind": kind,
        "n_groups": g,
        "lr": lr,
        "momentum": mu,
        "status": status,
        "train_seconds": seconds,
        "wall_seconds": time.perf_counter() - t0,
    }
    if decisions is not None and len(decisions):
        # a fixed run's decisions are its rollbacks (divergence: back to the last good state, lr / 10)
        record["rollbacks"] = int((decisions["action"] == "rollback").sum())
    if decisions is not None and (decisions.get("action", pd.Series(dtype=object)) == "train").any():
        if decisions_csv is not None:
            decisions.to_csv(decisions_csv, index=False)
        trained = decisions[decisions["action"] == "train"]
        record["n_groups"] = "→".join(str(int(v)) for v in trained["n_groups"].drop_duplicates())
        record["lr"], record["momentum"] = trained["lr"].iloc[-1], trained["momentum"].iloc[-1]
        record["search_seconds"] = float(
            decisions[decisions["action"].isin(["probe", "extend"])]["seconds"].sum()
        )
    print(
        f"  {name:<22} {status:<8} {seconds:7.1f} s trained, {record['wall_seconds']:6.1f} s wall", flush=True
    )
    return record, hist


def tta_row(record: dict, hist: pd.DataFrame) -> dict:
    """The record with tta_95 / tta_98 / tta_99 (NaN where not reached)."""
    rep = time_to_accuracy(hist, THRESHOLDS) if len(hist) else None
    out = dict(record)
    for x in THRESHOLDS:
        out[f"tta_{round(100 * x)}"] = np.nan if rep is None else rep.set_index("threshold").loc[x, "seconds"]
    return out


def best_of(rows: list[dict], label: str) -> list[dict]:
    """'best η' rows of a grid: the best config's TTA alone, and with the other grid runs' time added."""
    reached = [r for r in rows if np.isfinite(r["tta_99"])]
    if not reached:
        return []
    best = min(reached, key=lambda r: r["tta_99"])
    grid_cost = sum(r["train_seconds"] for r in rows if r is not best and np.isfinite(r["train_seconds"]))
    alone = {**best, "run": f"{label}, best η={best['lr']:g}", "kind": "best"}
    tuned = {**alone, "run": f"{label}, best η + grid cost", "kind": "best+grid", "grid_seconds": grid_cost}
    for x in THRESHOLDS:
        tuned[f"tta_{round(100 * x)}"] = alone[f"tta_{round(100 * x)}"] + grid_cost
    return [alone, tuned]


def verdicts(table: pd.DataFrame) -> list[str]:
    """The issue's targets at each threshold: optimizer ≤ 1.10 × best fixed, ≥ 1.5 × faster than worst,
    and ≤ PyTorch at 99%. A fixed run that never reached a threshold counts as its training time (≥)."""
    lines = []
    for kind in ("optimizer", "optimizer_paper"):
        if (table["kind"] == kind).any():
            lines += _verdicts(table, table[table["kind"] == kind].iloc[0])
    return lines


def _verdicts(table: pd.DataFrame, opt: pd.Series) -> list[str]:
    fixed = table[table["kind"].isin(["sync", "async"])]
    lines = []
    for x in THRESHOLDS:
        col = f"tta_{round(100 * x)}"
        t_opt = opt[col]
        best = fixed[col].min()
        worst_vals = fixed[col].where(np.isfinite(fixed[col]), fixed["train_seconds"])
        worst, censored = worst_vals.max(), bool((~np.isfinite(fixed[col])).any())
        if not np.isfinite(t_opt):
            lines.append(f"{opt['run']}: {round(100 * x)}% not reached: FAIL (best fixed {best:.1f} s)")
            continue
        r_best, r_worst = t_opt / best, worst / t_opt
        lines.append(
            f"{opt['run']}: {round(100 * x)}% at {t_opt:.1f} s; best fixed {best:.1f} s → ratio {r_best:.2f} "
            f"(target ≤ 1.10: {'PASS' if r_best <= 1.10 else 'FAIL'}); worst fixed "
            f"{'≥ ' if censored else ''}{worst:.1f} s → {'≥ ' if censored else ''}{r_worst:.2f}× "
            f"(target ≥ 1.5: {'PASS' if r_worst >= 1.5 else 'FAIL'})"
        )
    torch_rows = table[table["kind"] == "pytorch"]
    if len(torch_rows):
        t_torch, t_opt = torch_rows.iloc[0]["tta_99"], opt["tta_99"]
        ok = np.isfinite(t_opt) and (not np.isfinite(t_torch) or t_opt <= t_torch)
        lines.append(
            f"{opt['run']}: 99% vs PyTorch: {t_opt:.1f} s, PyTorch {t_torch:.1f} s "
            f"(goal: match or beat: {'PASS' if ok else 'FAIL'})"
        )
    return lines


def dask_part(args, X, y) -> tuple[pd.DataFrame, dict, dict]:
    """Every Dask run on one LocalCluster, then the PyTorch loop: (table, histories, notes)."""
    from dasknn.engine.dask import DaskEngine, local_client

    grid = [float(v) for v in args.lr_grid.split(",")]
    histories, rows, notes = {}, [], {}
    with local_client(n_workers=args.n_workers) as client:
        engine = WallClockEngine(DaskEngine(client))
        # persisted once for every run: each fit would otherwise persist the same graph again
        Xc, yc = client.persist([X, y])
        # the optimizer picks its cold-start rate from the fixed runs' grid (the same candidates),
        # and again from the paper's decade grid (its default)
        for name, kind, options, csv in (
            ("optimizer", "optimizer", {"lr_grid": tuple(grid)}, "decisions.csv"),
            ("optimizer, paper η grid", "optimizer_paper", None, "decisions_paper_grid.csv"),
        ):
            record, hist = fit_run(
                name, kind, engine, Xc, yc, args.budget, args.eval_size, decisions_csv=args.out / csv,
                options=options,
            )  # fmt: skip
            rows.append(tta_row(record, hist))
            histories[name] = hist
        for kind, g in (("sync", 1), ("async", args.n_workers)):
            for lr in grid:
                name = f"{kind} g={g} η={lr:g}"
                record, hist = fit_run(
                    name, kind, engine, Xc, yc, args.budget, args.eval_size, g=g, lr=lr, mu=MOMENTUM
                )
                rows.append(tta_row(record, hist))
                histories[name] = hist
        notes["startup_median_s"] = float(np.median(engine.startup)) if engine.startup else float("nan")
        notes["engine_runs"] = len(engine.startup)
    for kind in ("sync", "async"):
        rows += best_of([r for r in rows if r["kind"] == kind], kind)
    if not args.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("  torch is not installed: no PyTorch row")
        else:
            t0 = time.perf_counter()
            hist = caffe_lenet_loop(X, y, args.budget, TARGET, args.eval_size, SEED, threads=_cores())
            status = "reached" if hist["accuracy"].max() >= TARGET else "budget"
            record = {
                "run": "pytorch (Caffe solver)",
                "kind": "pytorch",
                "n_groups": 1,
                "lr": 0.01,
                "momentum": MOMENTUM,
                "status": status,
                "train_seconds": float(hist["time"].max()),
                "wall_seconds": time.perf_counter() - t0,
            }
            print(f"  {record['run']:<22} {status:<8} {record['train_seconds']:7.1f} s trained", flush=True)
            rows.append(tta_row(record, hist))
            histories[record["run"]] = hist
    return _with_ratios(pd.DataFrame(rows)), histories, notes


def simulated_part(args, X, y) -> tuple[pd.DataFrame, dict, str]:
    """Optimizer vs sync (g = 1) vs async (g = N) on the simulated CPU cluster (simulated seconds)."""
    n = args.sim_workers
    model = HEModel.estimate(
        zoo.lenet(seed=SEED), BATCH, n, C4_GFLOPS, args.sim_gbit * 1e9 / 8, efficiency=EFFICIENCY
    )
    engine = GroupClockSimulator(model)
    he = ", ".join(f"HE({g})={1e3 * model.he(g):.2f} ms" for g in (1, 2, 4, 8, 16, 32) if g <= n)
    describe = (
        f"{n} workers at {C4_GFLOPS:g} GFLOP/s × {EFFICIENCY:g}, {args.sim_gbit:g} Gbit/s: "
        f"T_cc={1e3 * model.T_cc:.2f} ms, T_nc={1e3 * model.T_nc:.2f} ms, "
        f"t_fc={1e3 * model.t_fc:.2f} ms; "
        f"{he}; HE model's smallest saturating g = {model.smallest_saturating_g()}"
    )
    print(f"simulated cluster: {describe}", flush=True)
    rows, histories = [], {}
    record, hist = fit_run(
        "optimizer", "optimizer", engine, X, y, args.sim_budget, args.eval_size,
        max_epochs=args.sim_max_epochs, decisions_csv=args.out / "decisions_simulated.csv",
    )  # fmt: skip
    rows.append(tta_row(record, hist))
    histories["optimizer"] = hist
    for kind, g in (("sync", 1), ("async", n)):
        for lr in [float(v) for v in args.sim_lr_grid.split(",")]:
            name = f"{kind} g={g} η={lr:g}"
            record, hist = fit_run(
                name,
                kind,
                engine,
                X,
                y,
                args.sim_budget,
                args.eval_size,
                max_epochs=args.sim_max_epochs,
                g=g,
                lr=lr,
                mu=MOMENTUM,
            )
            rows.append(tta_row(record, hist))
            histories[name] = hist
    for kind in ("sync", "async"):
        rows += [r for r in best_of([r for r in rows if r["kind"] == kind], kind) if r["kind"] == "best"]
    return _with_ratios(pd.DataFrame(rows)), histories, describe


def _with_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """ratio_X = run's TTA / optimizer's TTA at X (> 1: the optimizer is faster)."""
    opt = table[table["kind"] == "optimizer"].iloc[0]
    for x in THRESHOLDS:
        col = f"tta_{round(100 * x)}"
        table[f"ratio_{round(100 * x)}"] = table[col] / opt[col]
    return table


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def markdown(table: pd.DataFrame) -> str:
    cols = ["run", "n_groups", "lr", "momentum", "status", "train_seconds"]
    cols += [f"tta_{round(100 * x)}" for x in THRESHOLDS] + [f"ratio_{round(100 * x)}" for x in THRESHOLDS]
    view = table[cols].copy()
    for c in view.columns[5:]:
        digits = 2 if c.startswith("ratio") else 1
        view[c] = [f"{v:.{digits}f}" if np.isfinite(v) else "—" for v in view[c]]
    return markdown_table(view)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = common_parser(__doc__, quick="the ~3-minute version")
    parser.add_argument("--n-workers", type=int, default=2, help="LocalCluster workers (default 2)")
    parser.add_argument("--budget", type=float, help="seconds per Dask/PyTorch run (default 60, quick 20)")
    parser.add_argument("--lr-grid", help="η grid of the fixed runs (default 0.1,0.03,0.01,0.003)")
    parser.add_argument("--eval-size", type=int, help="training samples scored (default 2000, quick 1000)")
    parser.add_argument("--sim-workers", type=int, default=32)
    parser.add_argument("--sim-gbit", type=float, default=1.0, help="simulated network, Gbit/s")
    parser.add_argument("--sim-budget", type=float, help="simulated seconds per run (default 60)")
    parser.add_argument(
        "--sim-max-epochs", type=float, help="epochs per simulated run, probes included (default 30)"
    )
    parser.add_argument("--sim-lr-grid", help="η grid of the simulated fixed runs (default 0.01,0.001)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-dask", action="store_true", help="skip the LocalCluster and PyTorch runs")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated cluster")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for key, value in SETTINGS[args.quick].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.n_workers < 1 or args.sim_workers < 1 or args.budget <= 0 or args.eval_size < 1:
        parser.error("--n-workers, --sim-workers, --budget and --eval-size must be positive")
    return args


def write_dask(args, table: pd.DataFrame, histories: dict, notes: dict, loads: tuple) -> None:
    """table.md (with the verdicts), tta.csv, histories.csv and accuracy.png of the Dask/PyTorch part."""
    text = [
        f"# Time to accuracy, mnist-sample / LeNet, {args.n_workers}-worker LocalCluster",
        "",
        f"machine: {device_info()}",
        f"load average (1 min): {loads[0]:.2f} before, {loads[1]:.2f} after; budget {args.budget:g} s "
        f"per run; median engine start-up charged per run {notes['startup_median_s']:.2f} s over "
        f"{notes['engine_runs']} engine runs; wall time of the part {notes['wall_seconds']:.0f} s",
        "",
        markdown(table),
        "",
        *[f"- {v}" for v in verdicts(table)],
    ]
    print("\n".join(text[3:]), flush=True)
    (args.out / "table.md").write_text("\n".join(text) + "\n")
    plot_accuracy(
        histories,
        args.out / "accuracy.png",
        title="mnist-sample / LeNet: training accuracy",
        target=TARGET,
        search={k: h.attrs.get("search", []) for k, h in histories.items()},
    )
    table.to_csv(args.out / "tta.csv", index=False)
    frames = [h.assign(run=k) for k, h in histories.items() if len(h)]
    pd.concat(frames).to_csv(args.out / "histories.csv", index=False)


def write_simulated(args, sim: pd.DataFrame, histories: dict, describe: str, loads: tuple) -> None:
    """simulated.md, simulated.csv and accuracy_simulated.png: chosen g and speedups (simulated s)."""
    opt = sim[sim["kind"] == "optimizer"].iloc[0]
    summary = [f"optimizer's g (train epochs in order): {opt['n_groups']}"]
    for kind in ("sync", "async"):
        best = sim[(sim["kind"] == "best") & sim["run"].str.startswith(kind)]
        for x in THRESHOLDS:
            col = f"tta_{round(100 * x)}"
            if len(best) and np.isfinite(best.iloc[0][col]) and np.isfinite(opt[col]):
                ratio = best.iloc[0][col] / opt[col]
                summary.append(f"speedup over {best.iloc[0]['run']} at {round(100 * x)}%: {ratio:.2f}×")
    text = [
        f"# Simulated {args.sim_workers}-worker CPU cluster, mnist-sample / LeNet (times in simulated s)",
        "",
        describe,
        f"load average (1 min): {loads[0]:.2f} before, {loads[1]:.2f} after (real time only)",
        "",
        markdown(sim),
        "",
        *[f"- {s}" for s in summary],
    ]
    print("\n".join(text), flush=True)
    (args.out / "simulated.md").write_text("\n".join(text) + "\n")
    sim.to_csv(args.out / "simulated.csv", index=False)
    title = f"simulated {args.sim_workers}-worker CPU cluster"
    search = {k: h.attrs.get("search", []) for k, h in histories.items()}
    path = args.out / "accuracy_simulated.png"
    plot_accuracy(histories, path, simulated=True, title=title, target=TARGET, search=search)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    X, y = load("mnist-sample", batch_size=BATCH)
    print(machine_line(), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    if not args.no_dask:
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        out["dask"], histories, notes = dask_part(args, X, y)
        notes["wall_seconds"] = time.perf_counter() - t0
        write_dask(args, out["dask"], histories, notes, (load0, os.getloadavg()[0]))
    if not args.no_sim:
        load0 = os.getloadavg()[0]
        out["simulated"], histories, describe = simulated_part(args, X.compute(), y.compute())
        write_simulated(args, out["simulated"], histories, describe, (load0, os.getloadavg()[0]))
    print(f"wrote {sorted(p.name for p in args.out.iterdir())} to {args.out}")
    return out


if __name__ == "__main__":
    main()
