"""Benchmark: time to target accuracy, the online optimizer against a fixed grid it never sees.

Built so that it cannot flatter the optimizer:

- the fixed grid is wide and fixed here, not chosen by the optimizer: g ∈ {1, 2} × η ∈ {0.3, 0.1,
  0.03, 0.01, 0.003, 0.001} × µ ∈ {0.9, 0.6} (`FIXED_GRID`); the online optimizer runs on its own
  defaults (`DistributedCNN(tuner="online")`) and never sees that grid;
- a run that misses the target counts as taking the whole budget;
- every contender runs `--runs` times (default 5), the repetitions interleaved (each round runs every
  contender once, so the machine's load falls on all alike); the table shows medians, the ratio
  of medians, and the per-run ratios (round i of the optimizer against round i of the other);
- the contenders: the default "auto" tuner (`tuner="auto"`, its prior cache off, so every round
  starts cold; headline ratios against the best fixed configuration, the Caffe solver's settings
  g = 1, η = 0.01, µ = 0.9, and PyTorch); the online optimizer; Omnivore's Algorithm 1
  (`tuner="grid"`, its paper defaults); the best fixed configuration of the grid (its grid cost
  not counted), and the grid's median configuration; a plain PyTorch loop with Caffe's LeNet
  solver (experiments/bench_tta_torch).

Main job (`dasknn train`'s): mnist-sample / LeNet, batch 64, weight decay 5e-4, target 96%
held-out accuracy on a stratified 20% of mnist-sample that no contender trains on (the
estimator's own seeded split, `dasknn.data.split`; the PyTorch loop trains on the same training
part and scores the same held-out part), on one LocalCluster of `--n-workers` (default 2) shared
by every Dask run. The optimizers also set their selection part (512 samples) aside from the
training part, as `dasknn train` does; fixed configurations train on all of it. Clock: each run is charged the
wall time of its engine runs, start-up included (`WallClockEngine`), evaluations excluded.

Simulated part (`--no-sim` skips it): a 32-worker CPU cluster (c4.4xlarge-like nodes at 742 GFLOP/s
and 50% efficiency, 1 Gbit/s: LeNet's HE model of experiments/whatif_cpu_l.py) training a small CNN
on 8×8 digits (batch 32) to 99.5% training accuracy (the simulated part measures scheduling,
not generalisation, so it has no held-out split): the maths of a small net keeps 2,000+
iterations within seconds of real time, the clock is LeNet's on that cluster. Online vs grid vs
sync (g = 1) vs plain async (g = 32, η = 0.01, µ = 0.9), in simulated seconds (deterministic).

    python -m experiments.bench_tta [--quick] [--runs 5] [--n-workers 2] [--budget 60]

`--quick` (one round, a 30 s budget, only µ = 0.9 of the fixed grid, no simulated part) is what
fits a shared 2-core machine; `--groups`, `--lrs`, `--momenta` run a part of the fixed grid, and
the table says which part ran. Writes experiments/results/bench_tta/{runs.csv, summary.csv,
table.md, simulated.csv, simulated.md, decisions_*.csv}; the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import device_info  # noqa: E402
from dasknn.data import load  # noqa: E402
from dasknn.data.split import split_parts  # noqa: E402
from dasknn.engine.simulated import SimulatedEngine  # noqa: E402
from dasknn.estimator import DistributedCNN  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.nn.layers import Convolution, InnerProduct, Pooling, ReLU  # noqa: E402
from dasknn.nn.net import Net  # noqa: E402
from dasknn.reports import time_to_accuracy  # noqa: E402
from dasknn.tradeoff.hardware import HEModel  # noqa: E402
from experiments.bench_tta_torch import caffe_lenet_loop  # noqa: E402
from experiments.common import RESULTS_ROOT, save_figure  # noqa: E402
from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_tta"
THRESHOLDS = (0.9, 0.95, 0.96, 0.97)
TARGET = 0.96
"""The main job's target: held-out accuracy (`dasknn train`'s default)."""
VALIDATION_FRACTION = 0.2
METRIC = "val_accuracy"
BATCH = 64
WEIGHT_DECAY = 5e-4
MOMENTUM = 0.9
SEED = 0
FIXED_GROUPS = (1, 2)
FIXED_LRS = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)
FIXED_MOMENTA = (0.9, 0.6)
FIXED_GRID = [(g, lr, mu) for g in FIXED_GROUPS for lr in FIXED_LRS for mu in FIXED_MOMENTA]
"""The fixed configurations (g, η, µ) every optimizer is measured against; the optimizers never see it."""
SIM_TARGET = 0.995
SIM_BATCH = 32
SIM_PLAIN = (0.01, 0.9)
"""Plain async's and sync's (η, µ) on the simulated cluster: Caffe's defaults."""


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

    def _engine(self, stack, net, start=None):
        return self.bench_engine, getattr(self.bench_engine, "client", None)


def fit_run(
    name, kind, engine, X, y, budget, eval_size, max_epochs=None, g="auto", lr="auto", mu="auto",
    decisions_csv=None, options=None, tuner="grid", target=TARGET, net="lenet", batch_size=BATCH,
    validation_fraction=VALIDATION_FRACTION, metric=METRIC, callbacks=None,
):  # fmt: skip
    """One DistributedCNN fit to `target` (None: until a callback or the budget stops it): its record
    (status, charged seconds) and history; the optimizer's decisions are written to `decisions_csv`
    when given. `options`: the tuner's options (its object is built from them), and `prior_cache`:
    False (the default), or a file for "auto"'s prior cache (`$DASKNN_PRIOR_CACHE` during the fit)."""
    from dasknn.estimator_params import optimizer_class

    options = dict(options or {})
    cache = options.pop("prior_cache", False)
    if cache:
        os.environ["DASKNN_PRIOR_CACHE"] = str(cache)
    est = BenchCNN(
        net=net,
        batch_size=batch_size,
        n_groups=g,
        learning_rate=lr,
        momentum=mu,
        weight_decay=WEIGHT_DECAY,
        time_budget=budget,
        max_epochs=max_epochs,
        target_accuracy=target,
        eval_size=eval_size,
        random_state=SEED,
        tuner=optimizer_class(tuner)(**options) if options else tuner,
        prior_cache=bool(cache),
        validation_fraction=validation_fraction,
        callbacks=callbacks,
    )
    est.bench_engine = engine
    t0 = time.perf_counter()
    try:
        est.fit(X, y)
    except FloatingPointError:
        hist, status, decisions = pd.DataFrame(columns=["time", metric]), "diverged", None
    except ValueError as err:  # the estimator's report of an empty history: no train epoch was reached
        if "history needs columns" not in str(err):
            raise
        hist, status, decisions = pd.DataFrame(columns=["time", metric]), "no_train", None
    else:
        hist, decisions = pd.DataFrame(est.history_), est.decisions_
        status = "ended" if target is None else "reached" if hist[metric].max() >= target else "budget"
    finally:
        if cache:
            os.environ.pop("DASKNN_PRIOR_CACHE", None)
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
    # grid's train epochs, online's runs ("segment" before the renames), auto's windows
    trains = ("train", "run", "segment", "window", "end")
    if decisions is not None and decisions.get("action", pd.Series(dtype=object)).isin(trains).any():
        if decisions_csv is not None:
            decisions.to_csv(decisions_csv, index=False)
        trained = decisions[decisions["action"].isin(trains)]
        record["n_groups"] = "→".join(str(int(v)) for v in trained["n_groups"].drop_duplicates())
        record["lr"], record["momentum"] = trained["lr"].iloc[-1], trained["momentum"].iloc[-1]
        record["search_seconds"] = float(
            decisions[decisions["action"].isin(["probe", "extend", "trial", "abandon"])]["seconds"].sum()
        )
    print(
        f"  {name:<22} {status:<8} {seconds:7.1f} s trained, {record['wall_seconds']:6.1f} s wall", flush=True
    )
    return record, hist


def tta_row(record: dict, hist: pd.DataFrame, thresholds=THRESHOLDS, metric: str = METRIC) -> dict:
    """The record with tta_90 / tta_95 / ... of `metric` (NaN where not reached)."""
    rep = time_to_accuracy(hist, thresholds, metric=metric) if len(hist) else None
    out = dict(record)
    for x in thresholds:
        key = f"tta_{round(1000 * x) / 10:g}".replace(".", "_")
        out[key] = np.nan if rep is None else rep.set_index("threshold").loc[x, "seconds"]
    return out


def charged(row: dict, target: float, budget: float) -> float:
    """Seconds to `target` of one run; the whole budget when it missed it."""
    value = row.get(f"tta_{round(1000 * target) / 10:g}".replace(".", "_"), np.nan)
    return float(value) if np.isfinite(value) else float(budget)


def summarise(runs: pd.DataFrame, budget: float) -> tuple[pd.DataFrame, dict]:
    """Per contender: median seconds to target (a miss = the budget), runs reached, the per-run
    values; and the headline ratios of medians and per-run ratios against the online optimizer."""
    rows = []
    for name, grp in runs.groupby("run", sort=False):
        grp = grp.sort_values("round")
        rows.append(
            {
                "run": name,
                "kind": grp["kind"].iloc[0],
                "median_s": float(grp["seconds"].median()),
                "reached": f"{int(grp['reached'].sum())}/{len(grp)}",
                "per_run_s": ", ".join(f"{v:.1f}" for v in grp["seconds"]),
            }
        )
    table = pd.DataFrame(rows)
    fixed = table[table["kind"] == "fixed"]
    out: dict = {"budget": budget}
    if len(fixed):
        best = fixed.loc[fixed["median_s"].idxmin()]
        out["best_fixed"], out["best_fixed_s"] = best["run"], best["median_s"]
        out["median_config_s"] = float(fixed["median_s"].median())
    online = runs[runs["kind"] == "online"].set_index("round")["seconds"]
    for label, name in (
        ("best fixed", out.get("best_fixed")),
        ("grid optimizer", "optimizer=grid"),
        ("pytorch", "pytorch (Caffe solver)"),
    ):
        other = runs[runs["run"] == name].set_index("round")["seconds"] if name else pd.Series(dtype=float)
        if len(online) and len(other):
            common = online.index.intersection(other.index)
            out[f"vs {label}: ratio of medians"] = float(online.median() / other.median())
            out[f"vs {label}: per-run ratios"] = [round(float(online[i] / other[i]), 2) for i in common]
    if len(online) and "median_config_s" in out:
        out["vs median fixed config: ratio of medians"] = float(online.median() / out["median_config_s"])
    auto = runs[runs["kind"] == "auto"].set_index("round")["seconds"]
    for label, name in (
        ("best fixed", out.get("best_fixed")),
        ("Caffe solver's settings", "fixed g=1 η=0.01 µ=0.9"),
        ("pytorch", "pytorch (Caffe solver)"),
    ):
        other = runs[runs["run"] == name].set_index("round")["seconds"] if name else pd.Series(dtype=float)
        if len(auto) and len(other):
            common = auto.index.intersection(other.index)
            out[f"auto vs {label}: ratio of medians"] = float(auto.median() / other.median())
            out[f"auto vs {label}: per-run ratios"] = [round(float(auto[i] / other[i]), 2) for i in common]
    table["ratio_to_online"] = table["median_s"] / (float(online.median()) if len(online) else np.nan)
    return table, out


def markdown(table: pd.DataFrame, cols: list[str] | None = None) -> str:
    cols = cols or ["run", "median_s", "reached", "per_run_s", "ratio_to_online"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table[cols].itertuples(index=False):
        cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_parts(X, y):
    """(training X, y; held-out X, y) for the PyTorch loop: the estimator's split of the main job."""
    Xn, yn = np.asarray(X), np.asarray(y)
    parts = split_parts(yn, VALIDATION_FRACTION, 0, SEED)
    return (
        da.from_array(Xn[parts.train]),
        da.from_array(yn[parts.train]),
        (Xn[parts.validation], yn[parts.validation]),
    )


def dask_part(args, X, y) -> tuple[pd.DataFrame, dict]:
    """Every round: online, grid, each fixed configuration, PyTorch; one LocalCluster for all.
    Returns the runs' rows and every run's history by (run, round)."""
    from dasknn.engine.dask import DaskEngine, local_client

    grid = [
        (g, lr, mu) for g, lr, mu in FIXED_GRID if g in args.groups and lr in args.lrs and mu in args.momenta
    ]
    records, histories = [], {}
    Xt, yt, held_out = torch_parts(*dask.compute(X, y))
    with local_client(n_workers=args.n_workers) as client:
        engine = WallClockEngine(DaskEngine(client))
        Xc, yc = client.persist([X, y])
        for rnd in range(args.runs):
            print(f"round {rnd + 1} of {args.runs} (load average {os.getloadavg()[0]:.1f})", flush=True)
            contenders = [("tuner=auto", "auto", {"tuner": "auto"})]
            contenders += [("optimizer=online", "online", {"tuner": "online"})]
            contenders += [("optimizer=grid", "grid", {"tuner": "grid"})]
            contenders += [
                (f"fixed g={g} η={lr:g} µ={mu:g}", "fixed", {"g": g, "lr": lr, "mu": mu})
                for g, lr, mu in grid
            ]
            for name, kind, params in contenders:
                csv = args.out / f"decisions_{kind}_{rnd}.csv" if kind != "fixed" else None
                record, hist = fit_run(
                    name, kind, engine, Xc, yc, args.budget, args.eval_size, decisions_csv=csv, **params
                )
                records.append(_run_row(record, hist, rnd, args.budget))
                histories[name, rnd] = hist
            if not args.no_torch:
                hist = caffe_lenet_loop(
                    Xt, yt, args.budget, TARGET, args.eval_size, SEED, threads=_cores(), validation=held_out
                )
                histories["pytorch (Caffe solver)", rnd] = hist
                record = {"run": "pytorch (Caffe solver)", "kind": "pytorch", "n_groups": 1, "lr": 0.01,
                          "momentum": MOMENTUM, "train_seconds": float(hist["time"].max())}  # fmt: skip
                records.append(_run_row(record, hist, rnd, args.budget))
                print(f"  pytorch (Caffe solver)  {records[-1]['seconds']:7.1f} s to target", flush=True)
    return pd.DataFrame(records), histories


def plot(runs: pd.DataFrame, table: pd.DataFrame, headline: dict, histories: dict, path: Path) -> Path:
    """Left: every run's seconds to target per contender (dots; the median a bar; a miss sits at the
    budget). Right: held-out accuracy against training time in round 1 for the online and grid
    optimizers, the best fixed configuration and PyTorch, the target dashed."""
    order = table.sort_values("median_s")["run"].tolist()
    budget = headline["budget"]

    def draw(fig) -> None:
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
        for i, name in enumerate(order):
            secs = runs.loc[runs["run"] == name, "seconds"].to_numpy()
            kind = runs.loc[runs["run"] == name, "kind"].iloc[0]
            color = {"online": "C0", "grid": "C1", "pytorch": "C2"}.get(kind, "0.5")
            left.scatter(secs, np.full(len(secs), i), s=14, color=color, zorder=3)
            left.plot([np.median(secs)] * 2, [i - 0.35, i + 0.35], color=color, lw=2)
        left.axvline(budget, color="k", ls=":", lw=1)
        left.text(budget, len(order) - 0.5, " budget\n (miss)", fontsize=7, va="top")
        left.set_yticks(range(len(order)), order, fontsize=7)
        left.invert_yaxis()
        left.set_xlabel(f"seconds to {TARGET:.0%} held-out accuracy (training time, search included)")
        left.set_title("time to target, every run; bar = median", fontsize=9)
        shown = ["optimizer=online", "optimizer=grid", headline.get("best_fixed"), "pytorch (Caffe solver)"]
        for name in [n for n in shown if n is not None]:
            hist = histories.get((name, 0))
            if hist is None or not len(hist) or METRIC not in hist:
                continue
            right.plot(hist["time"], hist[METRIC], marker=".", ms=4, lw=1, label=name)
        right.axhline(TARGET, color="k", ls="--", lw=1)
        right.set_ylim(0.8, 1.0)
        right.set_xlabel("training seconds")
        right.set_ylabel("held-out accuracy (fraction)")
        right.set_title("round 1", fontsize=9)
        right.legend(fontsize=7, loc="lower right")

    return save_figure(draw, path, figsize=(11, 0.28 * len(order) + 2.5))


def _run_row(
    record: dict, hist: pd.DataFrame, rnd: int, budget: float, target: float = TARGET, metric: str = METRIC
) -> dict:
    row = tta_row(record, hist, (*THRESHOLDS, target) if target not in THRESHOLDS else THRESHOLDS, metric)
    seconds = charged(row, target, budget)
    return {**row, "round": rnd, "seconds": seconds, "reached": seconds < budget}


def sim_net() -> Net:
    """The simulated part's small CNN on 8×8 digits: a conv phase and a two-layer FC phase."""
    layers = [
        Convolution("conv1", 8, 3),
        ReLU("relu1"),
        Pooling("pool1", "max", 2, stride=2),
        InnerProduct("ip1", 32),
        ReLU("relu2"),
        InnerProduct("ip2", 10),
    ]
    return Net(layers, (1, 8, 8), name="small", seed=SEED)


def simulated_part(args) -> tuple[pd.DataFrame, str]:
    """Online vs grid vs sync vs plain async on the simulated 32-worker cluster (simulated s)."""
    n = args.sim_workers
    model = HEModel.estimate(zoo.lenet(seed=SEED), BATCH, n, C4_GFLOPS, 1e9 / 8, efficiency=EFFICIENCY)
    engine = GroupClockSimulator(model)
    X, y = load("digits", size=8, batch_size=SIM_BATCH)
    X, y = np.asarray(X), np.asarray(y)
    describe = (
        f"{n} workers, LeNet's HE model at {C4_GFLOPS:g} GFLOP/s × {EFFICIENCY:g}, 1 Gbit/s: "
        f"HE(1)={1e3 * model.he(1):.2f} ms, HE({n})={1e3 * model.he(n):.2f} ms, smallest saturating "
        f"g = {model.smallest_saturating_g()}; maths: small CNN on 8×8 digits, batch {SIM_BATCH}, "
        f"target {SIM_TARGET:.1%}"
    )
    print(f"simulated cluster: {describe}", flush=True)
    lr, mu = SIM_PLAIN
    records = []
    for name, kind, params in (
        ("optimizer=online", "online", {"tuner": "online"}),
        ("optimizer=grid", "grid", {"tuner": "grid"}),
        (f"sync g=1 η={lr:g} µ={mu:g}", "fixed", {"g": 1, "lr": lr, "mu": mu}),
        (f"plain async g={n} η={lr:g} µ={mu:g}", "fixed", {"g": n, "lr": lr, "mu": mu}),
    ):
        record, hist = fit_run(
            name, kind, engine, X, y, args.sim_budget, args.eval_size, target=SIM_TARGET, net=sim_net(),
            batch_size=SIM_BATCH, decisions_csv=args.out / f"decisions_simulated_{kind}.csv",
            validation_fraction=None, metric="accuracy", **params,
        )  # fmt: skip
        row = _run_row(record, hist, 0, args.sim_budget, SIM_TARGET, metric="accuracy")
        reached = hist[hist["accuracy"] >= SIM_TARGET]
        row["iterations_to_target"] = int(reached["iteration"].iloc[0]) if len(reached) else np.nan
        records.append(row)
    return pd.DataFrame(records), describe


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one round, 30 s budget, µ = 0.9 only, no simulation"
    )
    parser.add_argument("--runs", type=int, help="rounds (default 5, quick 1)")
    parser.add_argument("--n-workers", type=int, default=2, help="LocalCluster workers (default 2)")
    parser.add_argument("--budget", type=float, help="seconds per run (default 60, quick 30)")
    parser.add_argument("--groups", help="part of the fixed grid's g to run, e.g. 2 (default 1,2)")
    parser.add_argument("--lrs", help="part of the fixed grid's η to run (default all six)")
    parser.add_argument("--momenta", help="part of the fixed grid's µ to run (default 0.9,0.6; quick 0.9)")
    parser.add_argument("--eval-size", type=int, default=1000, help="training samples scored (default 1000)")
    parser.add_argument("--sim-workers", type=int, default=32)
    parser.add_argument(
        "--sim-budget", type=float, default=60.0, help="simulated seconds per run (default 60)"
    )
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-dask", action="store_true", help="skip the LocalCluster and PyTorch runs")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated cluster")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.budget = args.budget or (30.0 if args.quick else 60.0)
    args.no_sim = args.no_sim or (args.quick and "--no-sim" not in (argv or sys.argv))
    chosen = {"groups": (args.groups, FIXED_GROUPS, int), "lrs": (args.lrs, FIXED_LRS, float)}
    chosen["momenta"] = (args.momenta or ("0.9" if args.quick else None), FIXED_MOMENTA, float)
    for key, (text, full, kind) in chosen.items():
        values = full if text is None else tuple(kind(v) for v in text.split(","))
        if not set(values) <= set(full):
            parser.error(f"--{key} must be a part of the fixed grid's {full}")
        setattr(args, key, values)
    if args.runs < 1 or args.n_workers < 1 or args.budget <= 0 or args.eval_size < 1:
        parser.error("--runs, --n-workers, --budget and --eval-size must be positive")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    print(f"machine: {device_info()}; load average: {os.getloadavg()[0]:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    if not args.no_dask:
        X, y = load("mnist-sample", batch_size=BATCH)
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        runs, histories = dask_part(args, X, y)
        table, headline = summarise(runs, args.budget)
        plot(runs, table, headline, histories, args.out / "tta.png")
        missing = [f"g={g} η={lr:g} µ={mu:g}" for g, lr, mu in FIXED_GRID
                   if not (g in args.groups and lr in args.lrs and mu in args.momenta)]  # fmt: skip
        text = [
            f"# Time to {TARGET:.0%} held-out accuracy, mnist-sample / LeNet, "
            f"{args.n_workers}-worker LocalCluster",
            "",
            f"machine: {device_info()}; load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
            f"{args.runs} round(s), budget {args.budget:g} s (a miss counts as the budget); "
            f"wall {time.perf_counter() - t0:.0f} s",
            f"fixed configurations not run: {', '.join(missing) if missing else 'none'}",
            "",
            markdown(table),
            "",
            *[f"- {k}: {v:.2f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in headline.items()],
        ]
        print("\n".join(text), flush=True)
        (args.out / "table.md").write_text("\n".join(text) + "\n")
        runs.to_csv(args.out / "runs.csv", index=False)
        table.to_csv(args.out / "summary.csv", index=False)
        out["dask"], out["summary"], out["headline"] = runs, table, headline
    if not args.no_sim:
        sim, describe = simulated_part(args)
        cols = ["run", "seconds", "reached", "iterations_to_target", "n_groups", "lr", "momentum"]
        text = [
            f"# Simulated {args.sim_workers}-worker cluster (simulated s)",
            "",
            describe,
            "",
            markdown(sim, cols),
        ]
        online = float(sim.loc[sim["kind"] == "online", "seconds"].iloc[0])
        for _, row in sim[sim["kind"] != "online"].iterrows():
            ratio = row["seconds"] / online
            how = f"{ratio:.2f}× faster than" if ratio >= 1 else f"{1 / ratio:.2f}× slower than"
            text.append(f"- online is {how} {row['run']}")
        print("\n".join(text), flush=True)
        (args.out / "simulated.md").write_text("\n".join(text) + "\n")
        sim.to_csv(args.out / "simulated.csv", index=False)
        out["simulated"] = sim
    print(f"wrote {sorted(p.name for p in args.out.iterdir())} to {args.out}")
    return out


if __name__ == "__main__":
    main()
