"""Benchmark: the tuner across a suite of workloads, "auto" against the best fixed choice and the solver's.

Judged as the AlgoPerf benchmark's self-tuning track judges a training algorithm: time to a held-out
target on every workload, with no per-workload knobs, against a tuned baseline. The workloads
(`workloads`), each built from the benchmark that measured it first:

1. `main_job`: LeNet on mnist-sample, b = 64, on Dask (2 workers), 96% by "median5"
   (experiments/bench_main_job);
2. `long`: CIFAR-10 quick on bench_long's synthetic CIFAR-shaped data on Dask (experiments/bench_long);
3. `sim32`: the small CNN on shifted digits on 32 simulated workers (experiments/bench_auto_sim32);
4. `sim_lenet128`: LeNet at b = 128, simulated (experiments/bench_auto_workloads);
5. `sim_cifar10_quick`: CIFAR-10 quick, simulated (experiments/bench_auto_workloads);
6. `resnet20`: ResNet-20 of the zoo (BatchNorm) on Dask on bench_long's synthetic data (10,000 images);
7. `lenet128`: LeNet on mnist-sample at b = 128 on Dask.

Fixed for each before any "auto" run (`Workload`): its target and rule ("first": the first
evaluation at or above; "median5": the median of the last five at or above, so that one noisy
evaluation does not decide it), its budget on the fit's clock (a miss counts as the budget), the
solver's settings (g = 1, the net's solver η and µ, as Caffe runs it) and the grid g × η × µ
(g ∈ {1, 2} on two workers, {1, 4, 8, 32} on 32 simulated ones; η over two decades around the
solver's; µ ∈ {0.6, 0.9}). Then, per workload:

1. **select**: every grid point once (random_state `SELECT_SEED`); the best is the smallest time
   to the target (the first in grid order on a tie);
2. **measure**, in separate rounds, one round per seed, the contenders interleaved (the order
   rotates by one each round): "auto" (the ramp), "auto range" (`lr_search="range"`: the in-run
   range test, `dasknn.optimizer.range_test`), the best fixed point and the solver's settings.

Times are on the fit's clock: simulated seconds on the simulated engine, the engine's wall time
on Dask (evaluations excluded; compare Dask numbers only within one run: the load average is
printed). The table gives, per workload and seed, auto ÷ best fixed and auto ÷ solver (and the
same for "auto range"), their medians over the seeds, and the geometric mean over the workloads
of the median auto ÷ best fixed.

Settings: the default (the full suite: 3 seeds, the whole grid), `--quick` (1 seed, the grid's
g and η at the two ends and η's middle, at µ = 0.9; shorter budgets and lower targets fixed here
for them; less data on Dask, 2,000 images on sim32, the simulated LeNet and CIFAR-10 quick at
their full size: smaller, an epoch is fewer batches than the ramp's window; without ResNet-20,
which no short budget measures on two cores) and `--tiny`
(seconds: the 32 simulated workers on 400 images, one epoch, for the tests). Dask workloads
share one LocalCluster of 2 workers started by the suite.

    python -m experiments.bench_suite [--quick | --tiny] [--workloads main_job sim32 ...] [--seeds 0 1 2]

Writes experiments/results/bench_suite/<setting>/{select.csv, runs.csv, table.csv, table.md}.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dasknn.data import load
from dasknn.nn import zoo
from dasknn.optimizer.prior import ZOO_SOLVERS
from dasknn.reports import time_to_accuracy
from dasknn.tradeoff.hardware import HEModel
from experiments import bench_auto_sim32 as sim32
from experiments import bench_auto_workloads as workloads_sim
from experiments import bench_long
from experiments.bench_long import ClockBudget
from experiments.bench_main_job import RuleStop
from experiments.common import RESULTS_ROOT, machine_line, markdown_table, parser
from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY

RESULTS = RESULTS_ROOT / "bench_suite"
SELECT_SEED = 1000
"""The grid's selection rounds use their own random_state, apart from the measured seeds."""
METRIC = "val_accuracy"
MOMENTA = (0.6, 0.9)
AUTO = {"auto": {}, "auto range": {"lr_search": "range"}}
"""The auto contenders: AutoPolicy's options (the prior cache is off by default)."""
"""The tuners measured: "auto" as shipped and with the in-run range test, each starting cold."""


@dataclass(frozen=True)
class Workload:
    """One workload of the suite: how to build a contender's fit, its data, and what is fixed
    before any "auto" run (target, rule, budget, the solver's point, the grid)."""

    name: str
    engine: str
    target: float
    rule: str
    budget: float
    """Seconds on the fit's clock a fit may run (simulated seconds on the simulated engine)."""
    groups: tuple[int, ...]
    lrs: tuple[float, ...]
    solver: tuple[int, float, float]
    build: Callable[[int, dict], object]
    """(random_state, knobs) -> an unfitted DistributedCNN."""
    data: Callable[[], tuple]
    momenta: tuple[float, ...] = MOMENTA

    def grid(self) -> list[tuple[int, float, float]]:
        return [(g, lr, mu) for g in self.groups for lr in self.lrs for mu in self.momenta]


def fixed_name(point: tuple[int, float, float]) -> str:
    g, lr, mu = point
    return f"g={g} η={lr:g} µ={mu:g}"


def knobs_of(point: tuple[int, float, float]) -> dict:
    g, lr, mu = point
    return {"n_groups": g, "learning_rate": lr, "momentum": mu}


def tuner_knobs(name: str) -> dict:
    from dasknn.optimizer import AutoPolicy

    return {"tuner": AutoPolicy(**AUTO[name])}


# -- the workloads ---------------------------------------------------------------------------------
def _dask_cnn(net, batch, weight_decay, seed, knobs, max_epochs, **more):
    from dasknn.estimator import DistributedCNN

    return DistributedCNN(
        net=net, batch_size=batch, weight_decay=weight_decay, engine="dask", n_workers=2,
        time_budget=None, max_epochs=max_epochs, max_wall_time=None, validation_fraction=0.2,
        eval_size=500, random_state=seed, **more, **knobs,
    )  # fmt: skip


def _mnist(batch: int, n: int | None):
    X, y = load("mnist-sample", batch_size=batch)
    X, y = np.asarray(X), np.asarray(y)
    return (X, y) if n is None else (X[:n], y[:n])


def _cifar_like(n: int):
    X, y = bench_long.workload(n_samples=n)
    return np.asarray(X.compute()), np.asarray(y.compute())


def _sim(w: workloads_sim.Workload, n: int | None):
    def data():
        X, y = w.data()
        return (X, y) if n is None else (X[:n], y[:n])

    def build(seed, knobs):
        est = workloads_sim.estimator(w, seed, knobs)
        return est.set_params(time_budget=None, target_accuracy=None)

    return data, build


def _sim32(batch: int, max_epochs: float, n: int | None):
    model = HEModel.estimate(
        zoo.lenet(seed=0), batch, sim32.N_WORKERS, C4_GFLOPS, 1e9 / 8, efficiency=EFFICIENCY
    )

    def build(seed, knobs):
        est = sim32.BenchCNN(
            net=sim32.small_cnn(), batch_size=batch, engine="simulated", n_workers=sim32.N_WORKERS,
            backend="lowering", time_budget=None, max_epochs=max_epochs, max_wall_time=None,
            validation_fraction=0.2, eval_size=500, random_state=seed, augment=sim32.AUGMENT, **knobs,
        )  # fmt: skip
        est.bench_engine = sim32.GroupDevices(model, augment=sim32.AUGMENT)
        return est

    return (lambda: _mnist(batch, n)), build


def _solver(net: str) -> tuple[int, float, float]:
    s = ZOO_SOLVERS.get(net, {"base_lr": 0.01, "momentum": 0.9})
    return 1, float(s["base_lr"]), float(s["momentum"])


def workloads(setting: str = "full") -> dict[str, Workload]:
    """The suite at `setting` ("full", "quick" or "tiny"): each workload's sizes, target and grid.
    The quick targets are lower than the full ones: its runs are shorter and on less data; ResNet-20
    is in the full suite only."""
    full, tiny = setting == "full", setting == "tiny"
    n_mnist = None if full else 2000
    lenet_lrs, cifar_lrs = (0.003, 0.01, 0.03, 0.1, 0.3), (0.0003, 0.001, 0.003, 0.01, 0.03)
    resnet_lrs = (0.01, 0.03, 0.1, 0.3, 1.0)
    lenet = _solver("lenet")
    out: dict[str, Workload] = {}
    data, build = _sim32(
        sim32.BATCH, sim32.MAX_EPOCHS if full else 1 if tiny else 4, 400 if tiny else n_mnist
    )
    out["sim32"] = Workload(
        "sim32", "simulated", sim32.TARGET if full else 0.4 if tiny else 0.85, "first",
        60.0 if full else 2.0 if tiny else 20.0, (1, 4, 8, 32), lenet_lrs, lenet, build, data,
    )  # fmt: skip
    if tiny:
        return out
    data, build = _sim(workloads_sim.WORKLOADS["lenet128"], None)
    out["sim_lenet128"] = Workload(
        "sim_lenet128", "simulated", 0.96 if full else 0.9, "first", 60.0 if full else 20.0, (1, 2),
        lenet_lrs, lenet, build, data,
    )  # fmt: skip
    data, build = _sim(workloads_sim.WORKLOADS["cifar10_quick"], None)
    out["sim_cifar10_quick"] = Workload(
        "sim_cifar10_quick", "simulated", 0.7 if full else 0.4, "first", 120.0 if full else 40.0,
        (1, 2), cifar_lrs, _solver("cifar10_quick"), build, data,
    )  # fmt: skip
    out["main_job"] = Workload(
        "main_job", "dask", 0.96 if full else 0.9, "median5", 25.0 if full else 10.0, (1, 2), lenet_lrs,
        lenet, lambda seed, knobs: _dask_cnn("lenet", 64, 5e-4, seed, knobs, 30),
        lambda: _mnist(64, n_mnist),
    )  # fmt: skip
    out["lenet128"] = Workload(
        "lenet128", "dask", 0.96 if full else 0.9, "first", 30.0 if full else 10.0, (1, 2), lenet_lrs,
        lenet, lambda seed, knobs: _dask_cnn("lenet", 128, 5e-4, seed, knobs, 30),
        lambda: _mnist(128, n_mnist),
    )  # fmt: skip
    n_long = bench_long.N_SAMPLES if full else 4000
    out["long"] = Workload(
        "long", "dask", bench_long.TARGET if full else 0.5, "first", 150.0 if full else 30.0, (1, 2),
        cifar_lrs, _solver("cifar10_quick"),
        lambda seed, knobs: _dask_cnn(
            "cifar10_quick", bench_long.BATCH, bench_long.WEIGHT_DECAY, seed, knobs, 100,
            augment=bench_long.AUGMENT,
        ),
        lambda: _cifar_like(n_long),
    )  # fmt: skip
    if not full:  # at about 1 s an iteration on two cores, 40 s left every point at chance and 150 s
        return out  # fixed η = 0.1 short of 30%: a row that measures nothing, at ten minutes a run
    out["resnet20"] = Workload(
        "resnet20", "dask", 0.6, "first", 300.0, (1, 2), resnet_lrs, _solver("resnet20"),
        lambda seed, knobs: _dask_cnn("resnet20", 100, 1e-4, seed, knobs, 100), lambda: _cifar_like(10_000),
    )  # fmt: skip
    return out


def grid_at(w: Workload, setting: str) -> list[tuple[int, float, float]]:
    """The grid a setting runs: all of it (full); g at its ends × η at its ends and middle at
    µ = 0.9 (quick); g at its ends at the middle η and µ = 0.9 (tiny)."""
    if setting == "full":
        return w.grid()
    groups = (w.groups[0], w.groups[-1])
    lrs = (w.lrs[len(w.lrs) // 2],) if setting == "tiny" else (w.lrs[0], w.lrs[len(w.lrs) // 2], w.lrs[-1])
    return [(g, lr, 0.9) for g in groups for lr in lrs]


# -- one fit ---------------------------------------------------------------------------------------
def time_to_target(history: pd.DataFrame, w: Workload) -> tuple[float, bool]:
    """(seconds, reached): the fit's clock at the first evaluation where `w.rule` holds at
    `w.target` (`reports.time_to_accuracy`); the budget on a miss."""
    ev = history.dropna(subset=[METRIC]) if METRIC in history else history.iloc[:0]
    if not len(ev):
        return w.budget, False
    rep = time_to_accuracy(ev, [w.target], rule=w.rule, metric=METRIC)
    reached = bool(rep["reached"].iloc[0])
    seconds = float(rep["seconds"].iloc[0]) if reached else w.budget
    return (seconds, True) if reached and seconds <= w.budget else (w.budget, False)


def fit_contender(w: Workload, X, y, name: str, knobs: dict, seed: int) -> dict:
    """One fit of a contender, stopped at its target's rule or at the first evaluation past the
    budget: its row (a fit that diverged for good counts as a miss)."""
    est = w.build(seed, knobs)
    est.set_params(callbacks=[RuleStop(w.target, w.rule), ClockBudget(w.budget)])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="X looks unscaled")  # Caffe's CIFAR-10 input scale
        try:
            est.fit(X, y)
            history, status = pd.DataFrame(est.history_), ""
        except FloatingPointError as err:
            history, status = pd.DataFrame(), f"diverged: {err}"
    seconds, reached = time_to_target(history, w)
    config = getattr(est, "config_", None)
    row = {
        "workload": w.name, "contender": name, "seed": seed, "seconds": seconds, "reached": reached,
        "best_val_accuracy": float(history[METRIC].max()) if METRIC in history else math.nan,
        "end_g": getattr(config, "n_groups", None), "end_lr": getattr(config, "lr", None),
        "wall_s": time.perf_counter() - t0, "load": os.getloadavg()[0], "status": status,
    }  # fmt: skip
    print(
        f"  {w.name:<18} {name:<22} seed {seed}: {'reached' if reached else 'MISSED '} {seconds:7.2f} s "
        f"(best {row['best_val_accuracy']:.3f}); {row['wall_s']:.0f} s wall, load {row['load']:.1f}",
        flush=True,
    )
    return row


# -- the phases ------------------------------------------------------------------------------------
def select(w: Workload, X, y, setting: str) -> tuple[tuple[int, float, float], list[dict]]:
    """Every grid point once at `SELECT_SEED`; the best: the smallest time (on a tie, the highest
    held-out accuracy, then the first in grid order)."""
    rows = [fit_contender(w, X, y, fixed_name(p), knobs_of(p), SELECT_SEED) for p in grid_at(w, setting)]
    points = grid_at(w, setting)
    # the smallest time; on a tie (all missed: the budget) the highest held-out accuracy reached
    best = points[min(range(len(rows)), key=lambda i: (rows[i]["seconds"], -rows[i]["best_val_accuracy"]))]
    if not any(r["reached"] for r in rows):
        print(f"  {w.name}: no grid point reached {w.target:.0%}: the target is above the grid's reach")
    return best, rows


def measure(w: Workload, X, y, best, seeds: list[int]) -> list[dict]:
    """One round per seed, every contender once, the order rotated by one each round."""
    contenders = [(name, tuner_knobs(name)) for name in AUTO]
    contenders += [(f"best fixed ({fixed_name(best)})", knobs_of(best))]
    contenders += [(f"solver ({fixed_name(w.solver)})", knobs_of(w.solver))]
    rows = []
    for r, seed in enumerate(seeds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        rows += [fit_contender(w, X, y, name, knobs, seed) for name, knobs in order]
    return rows


def summarise(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per workload and seed, each tuner ÷ the best fixed point and ÷ the solver's settings, then
    the medians over the seeds; and per tuner the geometric mean over the workloads of its median
    ratio to the best fixed point."""
    rows = []
    for (workload, seed), part in runs.groupby(["workload", "seed"], sort=False):
        t = {c: float(s) for c, s in zip(part["contender"], part["seconds"], strict=True)}
        best = next(v for c, v in t.items() if c.startswith("best fixed"))
        solver = next(v for c, v in t.items() if c.startswith("solver"))
        row = {"workload": workload, "seed": str(seed), "best fixed s": best, "solver s": solver}
        if "reached" in part:  # a miss counts as the budget: the table names it
            missed = part.loc[~part["reached"].astype(bool), "contender"]
            row["missed"] = ", ".join(c.split(" (")[0] for c in missed) or "none"
        for tuner in AUTO:
            row[f"{tuner} s"] = t[tuner]
            row[f"{tuner} ÷ best"], row[f"{tuner} ÷ solver"] = t[tuner] / best, t[tuner] / solver
        rows.append(row)
    table = pd.DataFrame(rows)
    numbers = table.drop(columns=["seed", "missed"], errors="ignore")
    medians = numbers.groupby("workload", sort=False).median().reset_index()
    medians.insert(1, "seed", "median")
    geo = {tuner: float(np.exp(np.log(medians[f"{tuner} ÷ best"]).mean())) for tuner in AUTO if len(medians)}
    return pd.concat([table, medians], ignore_index=True), geo


def main(argv: list[str] | None = None) -> dict:
    cli = parser(__doc__, quick="1 seed, a third of the grid, smaller data and budgets")
    cli.add_argument("--tiny", action="store_true", help="one simulated workload in seconds (tests)")
    cli.add_argument("--workloads", nargs="+", default=None, help="workloads to run (default: all)")
    cli.add_argument("--seeds", type=int, nargs="+", default=None, help="measured random_states")
    cli.add_argument("--out", type=Path, default=None, help="results folder")
    args = cli.parse_args(argv)
    setting = "tiny" if args.tiny else "quick" if args.quick else "full"
    suite = workloads(setting)
    names = args.workloads or list(suite)
    unknown = sorted(set(names) - set(suite))
    if unknown:
        cli.error(f"unknown workload(s) {unknown} at the {setting} setting; choose from {list(suite)}")
    seeds = args.seeds or ([0] if setting != "full" else [0, 1, 2])
    out = args.out or RESULTS / setting
    out.mkdir(parents=True, exist_ok=True)
    os.environ["DASKNN_PRIOR_CACHE"] = "off"  # and prior_cache=False: every "auto" fit starts cold
    print(machine_line(), flush=True)
    t0 = time.perf_counter()
    client = _dask_client() if any(suite[n].engine == "dask" for n in names) else None
    selected, measured, chosen = [], [], {}
    try:
        for name in names:
            w = suite[name]
            X, y = w.data()
            what = f"target {w.target:.0%} ({w.rule}), budget {w.budget:g} s"
            print(f"{name}: {w.engine}, {len(X)} images, {what}", flush=True)
            best, rows = select(w, X, y, setting)
            chosen[name] = fixed_name(best)
            selected += rows
            measured += measure(w, X, y, best, seeds)
            result = write(out, setting, seeds, chosen, selected, measured, time.perf_counter() - t0)
    finally:
        if client is not None:
            client.close()
            client.cluster.close()
    print((out / "table.md").read_text(), flush=True)
    return result


def write(out: Path, setting: str, seeds, chosen: dict, selected: list, measured: list, wall: float) -> dict:
    """The suite's files for the workloads done so far (written again after each workload, so a
    suite cut short keeps its finished workloads)."""
    select_df, runs = pd.DataFrame(selected), pd.DataFrame(measured)
    table, geo = summarise(runs)
    select_df.to_csv(out / "select.csv", index=False)
    runs.to_csv(out / "runs.csv", index=False)
    table.to_csv(out / "table.csv", index=False)
    lines = [
        f"# bench_suite ({setting}): time to target, auto ÷ best fixed and ÷ the solver's settings",
        "",
        machine_line(),
        f"seeds {seeds}; grid selected at random_state {SELECT_SEED}: "
        + "; ".join(f"{k}: {v}" for k, v in chosen.items()),
        "",
        markdown_table(table),
        "",
        *(
            f"geometric mean of {t} ÷ best fixed over {len(chosen)} workloads: {g:.3g}"
            for t, g in geo.items()
        ),
        f"suite wall time {wall:.0f} s",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return {"select": select_df, "runs": runs, "table": table, "geomean": geo, "chosen": dict(chosen)}


def _dask_client():
    """One LocalCluster of 2 single-threaded worker processes that every Dask fit of the suite
    uses (the default client), so no fit pays for starting one."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    return Client(cluster)


if __name__ == "__main__":
    main()
