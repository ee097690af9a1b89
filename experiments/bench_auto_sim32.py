"""Benchmark: the "auto" tuner against sync and plain async on a simulated 32-worker cluster.

Omnivore's Fig. 7 setting in miniature: 32 simulated CPU workers (c4.4xlarge-like nodes at 742
GFLOP/s × 50%, 1 Gbit/s; the clock is LeNet's HE model at the run's batch size, as in
experiments/whatif_cpu_l.py; at b = 8 HE(1) = 52.8 ms, HE(8) = 0.88 ms, HE(16) = HE(32) = 0.46
ms). The maths is real SGD on a small CNN (8 3×3 filters, max pooling, 32 hidden units) on
mnist-sample at batch 8 (`--batch`) with the training digits shifted by up to ±2 px
(`--augment`, default "shift", `dasknn.data.augment`; held-out digits are not shifted), so that
thousands of iterations cost a few ms each of real time; the clock is the model's, so the numbers
are the same at any load. Each group of k workers computes as one device timed t_conv(k) (the
shards' gradients sum to the batch gradient; `GroupDevices`, which applies the fit's
augmentation as the simulated engine does). The fits are
`DistributedCNN(engine="simulated", n_workers=32, max_wall_time=None)`, target **94% held-out
accuracy** (`--target`; the estimator's stratified 20% split, 1,000 samples, seeded by
random_state; first evaluation at or above); a miss counts as the fit's end time and is marked.

The workload. The design's 32-worker benchmark asks for one where plain async g = 32 needs at least 2,000
iterations. On unshifted digits (`--augment none`, the earlier workload) plain
async at its selected η = 0.01 needed a median of 1,719 iterations to 94% (1,375-3,562 over seeds
0-5), and 95% sat at its plateau on seed 3. The ±2 px shifts (the usual MNIST augmentation) lower
each iteration's progress without lowering the plateau: plain async at its selected η = 0.003, run
15 epochs with no reachable target, ends at 95.1-96.4% held-out (median of its last 5
evaluations; best 96.1-97.7%; seeds 0-5), so 94% stays 1.1 points (1.6 standard errors of the
1,000 held-out samples) below the lowest plateau, the same margin as before; it needs a median of
2,531 iterations (refined, 1,812-3,812). The workload was chosen from plain async's runs, before
"auto" ran on it. Each fit's time to target is also given as a
lower bound, the evaluation before the one at or above the target (`seconds_lower`): fixed knobs
are evaluated once an epoch and "auto" once a window, and the table's conservative ratio divides
the fixed contender's lower bound by "auto"'s time.

Contenders (µ = 0.9, Caffe's, for both fixed ones):
- sync: g = 1 over the 32 workers; plain async: g = 32 (one worker a group);
  each at the best η of `LRS`, chosen in a **separate selection pass** (random_state
  `SELECT_SEED`, never measured) so that the minimum of noisy results does not flatter them;
- "auto" (`tuner="auto"`, its prior cache off: `DASKNN_PRIOR_CACHE=off` and `prior_cache=False`,
  the default), which also sets its 512-sample selection part aside.

Measured over `--seeds` random_states (default 0, 1, 2; `--quick`: 0), interleaved: medians of
simulated seconds and iterations to the target, ratios of medians and per seed. The decisions log
of each "auto" fit is written next to the table.

    python -m experiments.bench_auto_sim32 [--quick] [--seeds 0 1 2] [--budget 60] [--batch 8]
        [--chosen SYNC_LR ASYNC_LR] [--augment shift|none] [--target 0.94] [--refine 8] [--only ...]

Writes experiments/results/bench_auto_sim32/{selection.csv, runs.csv, table.md,
decisions_auto_SEED.csv}.

Found (measured 2026-11-26; the clock does not depend on the machine's load), shifted digits,
seeds 0-5: selection chose η = 0.01 for sync (every η missed in 60 s) and η = 0.003 for plain
async (1.21 s; 0.001 1.70 s, 0.01 2.44 s, 0.03 at chance); plain async 1.23 s refined, 2,531
iterations (refined median), sync 42 s (seeds 0-2, 2 of 3); "auto" at main 62dfe1e 1.10 s median:
plain async ÷ "auto" **1.12** (per seed 0.42-2.83; 6 of 6 reached): the 1.2× is not met. On
unshifted digits (`--augment none`, main 8ccf8e1): "auto" 0.768 s median, plain async η = 0.01
0.84 s refined (1.09×), 1,719 iterations. Details: experiments/README.md, "bench_auto_sim32".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dasknn.data import load
from dasknn.data.augment import as_augment
from dasknn.engine.simulated import SimulatedEngine
from dasknn.estimator import DistributedCNN
from dasknn.nn import zoo
from dasknn.nn.layers import Convolution, InnerProduct, Pooling, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff.hardware import HEModel
from experiments.common import RESULTS_ROOT, machine_line, markdown_table, parser
from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY

RESULTS = RESULTS_ROOT / "bench_auto_sim32"
N_WORKERS = 32
BATCH = 8
TARGET = 0.94
"""Held-out target: below the plateau of plain async on every measured seed (module docstring)."""
MOMENTUM = 0.9
LRS = (0.001, 0.003, 0.01, 0.03)
"""The η grid of sync and plain async (µ = 0.9)."""
SELECT_SEED = 1000
"""The random_state of the selection pass (its runs choose η, they are never measured)."""
AUGMENT = "shift"
"""±2 px shifts of the training digits (`dasknn.data.augment`): the workload plain async needs
2,000+ iterations on (module docstring)."""
MAX_EPOCHS = 15
"""Each fit's epoch cap: bounds the real time of a fit that misses (async iterations are cheap
on the simulated clock)."""


class GroupDevices:
    """The simulated cluster with each group of k = N / g workers computing as one device.

    `SimulatedEngine` with n_workers = g (one device a group) and the mean conv time t_conv(N / g)
    of `model` (Omnivore §IV-B): the clock of N workers, the maths of one batch per group (k shards'
    gradients sum to it), k times cheaper in real time. Traces record the N conv workers. `augment`
    (a name or `Augment`, as `DistributedCNN(augment=...)`) shapes the training batches as the
    simulated engine does (`SimulatedEngine(augment=...)`); `averaging` likewise
    (`SimulatedEngine(averaging=...)`)."""

    def __init__(self, model: HEModel, cv: float = 0.06, augment=None, averaging: str | None = None) -> None:
        self.timing, self.cv, self.n_workers, self.augment = model, cv, model.n_workers, as_augment(augment)
        self.averaging = averaging
        self.engines: dict[tuple[int, str | None], SimulatedEngine] = {}
        self.wall_deadline = None

    def conv_worker_count(self) -> int:
        return self.n_workers

    def run(self, net, X, y, config, budget, start=None):
        g = int(config.n_groups)
        if (g, self.averaging) not in self.engines:
            t_conv = self.timing.t_conv(self.timing.group_size(g))
            self.engines[g, self.averaging] = SimulatedEngine(
                t_conv=t_conv,
                t_fc=self.timing.t_fc,
                n_workers=g,
                variability="gamma",
                cv=self.cv,
                verbose=0,
                augment=self.augment,
                averaging=self.averaging,
            )
        result = self.engines[g, self.averaging].run(net, X, y, config, budget, start=start)
        result.trace.attrs["n_workers"] = self.n_workers
        return result


class BenchCNN(DistributedCNN):
    """DistributedCNN on the engine the benchmark built (`bench_engine`), averaging as the
    estimator's `averaging` says."""

    def _engine(self, stack, net, averaging=None):
        self.bench_engine.averaging = averaging
        return self.bench_engine, None


def small_cnn(seed: int = 0) -> Net:
    """The maths: 8 3×3 filters, 2×2 max pooling, 32 hidden units, 10 classes (28×28 inputs)."""
    layers = [
        Convolution("conv1", 8, 3),
        ReLU("relu1"),
        Pooling("pool1", "max", 2, stride=2),
        InnerProduct("ip1", 32),
        ReLU("relu2"),
        InnerProduct("ip2", 10),
    ]
    return Net(layers, (1, 28, 28), name="small", seed=seed)


def time_to_target(history: list[dict], target: float) -> tuple[float, int, bool]:
    """(seconds, iterations, reached): the first evaluation at or above `target`, else the last."""
    hist = pd.DataFrame(history)
    hit = hist[hist["val_accuracy"] >= target]
    row = hit.iloc[0] if len(hit) else hist.iloc[-1]
    return float(row["time"]), int(row["iteration"]), bool(len(hit))


def evaluation_before(history: list[dict], seconds: float) -> float:
    """The time of the evaluation before the one at `seconds`: the target was crossed after it,
    so it bounds the time to target from below (a fixed run is evaluated once an epoch, "auto"
    once a window)."""
    times = pd.DataFrame(history)["time"]
    before = times[times < seconds]
    return float(before.max()) if len(before) else 0.0


def fit_one(est: DistributedCNN, X, y, target: float, **about) -> tuple[dict, pd.DataFrame | None]:
    """Fit `est` on (X, y): its time to `target` (simulated s), wall time and end configuration."""
    t0 = time.perf_counter()
    est.fit(X, y)
    wall = time.perf_counter() - t0
    seconds, iterations, reached = time_to_target(est.history_, target)
    config = est.config_
    row = {
        **about,
        "seconds": seconds,
        "seconds_lower": evaluation_before(est.history_, seconds),
        "iterations": iterations,
        "reached": reached,
        "best_val_accuracy": float(pd.DataFrame(est.history_)["val_accuracy"].max()),
        "final_val_accuracy": float(pd.DataFrame(est.history_)["val_accuracy"].iloc[-1]),
        "last5_median_val_accuracy": float(pd.DataFrame(est.history_)["val_accuracy"].iloc[-5:].median()),
        "end_g": config.n_groups,
        "end_lr": config.lr,
        "end_momentum": config.momentum,
        "stopped_by": getattr(est, "stopped_by_", ""),
        "wall_seconds": wall,
    }
    print(
        f"  {about.get('run', ''):<16} seed {about.get('seed', '')}: "
        f"{'reached' if reached else 'MISSED '} {seconds:7.2f} s, {iterations:5d} it "
        f"(best {row['best_val_accuracy']:.3f}), end g={config.n_groups} η={config.lr:.3g} "
        f"µ={config.momentum:.3g}; {wall:.0f} s wall",
        flush=True,
    )
    decisions = getattr(est, "decisions_", None)
    return row, decisions


def contender(
    name: str,
    seed: int,
    model: HEModel,
    budget: float,
    lr: float | None = None,
    batch: int = BATCH,
    max_epochs: float = MAX_EPOCHS,
    target: float = TARGET,
    augment: str | None = AUGMENT,
    averaging: str | None = "auto",
) -> BenchCNN:
    """The estimator of one contender: "auto", "sync" (g = 1) or "async" (g = N) at `lr`;
    `averaging` as DistributedCNN's."""
    knobs = {"tuner": "auto"}  # its prior cache off: the default
    if name != "auto":
        knobs = {"n_groups": 1 if name == "sync" else N_WORKERS, "learning_rate": lr, "momentum": MOMENTUM}
    est = BenchCNN(
        net=small_cnn(), batch_size=batch, engine="simulated", n_workers=N_WORKERS, backend="lowering",
        time_budget=budget, max_epochs=max_epochs, max_wall_time=None, target_accuracy=target,
        validation_fraction=0.2, eval_size=500, random_state=seed, augment=augment, averaging=averaging,
        **knobs,
    )  # fmt: skip
    est.bench_engine = GroupDevices(model, augment=augment)
    return est


def main(argv: list[str] | None = None) -> dict:
    cli = parser(__doc__, quick="one measured seed (0) instead of three")
    cli.add_argument("--seeds", type=int, nargs="+", default=None, help="measured random_states")
    cli.add_argument("--budget", type=float, default=60.0, help="simulated seconds per fit (default 60)")
    cli.add_argument("--batch", type=int, default=BATCH, help=f"batch size (default {BATCH})")
    cli.add_argument("--lrs", type=float, nargs="+", default=list(LRS), help=f"η grid (default {LRS})")
    cli.add_argument("--max-epochs", type=float, default=MAX_EPOCHS, help=f"epoch cap (default {MAX_EPOCHS})")
    cli.add_argument(
        "--chosen",
        type=float,
        nargs=2,
        metavar=("SYNC_LR", "ASYNC_LR"),
        help="skip the selection pass: the η a previous one chose (it is deterministic)",
    )
    cli.add_argument("--target", type=float, default=TARGET, help=f"held-out target (default {TARGET})")
    cli.add_argument(
        "--refine",
        type=int,
        default=8,
        help="evaluations an epoch a fixed run's crossing is searched at (default 8; 1: none)",
    )
    cli.add_argument(
        "--augment",
        default=AUGMENT,
        type=lambda v: None if v == "none" else v,
        help=f"training augmentation (default {AUGMENT!r}: ±2 px shifts; 'none': the first workload)",
    )
    cli.add_argument("--only", nargs="+", default=["auto", "sync", "async"], help="contenders to measure")
    cli.add_argument("--out", type=Path, default=RESULTS)
    args = cli.parse_args(argv)
    os.environ["DASKNN_PRIOR_CACHE"] = "off"  # as prior_cache=False, the default: "auto" starts cold
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    batch = args.batch
    args.out.mkdir(parents=True, exist_ok=True)
    X, y = load("mnist-sample", batch_size=batch)
    X, y = np.asarray(X), np.asarray(y)
    model = HEModel.estimate(zoo.lenet(seed=0), batch, N_WORKERS, C4_GFLOPS, 1e9 / 8, efficiency=EFFICIENCY)
    he = ", ".join(f"HE({g}) = {1e3 * model.he(g):.2f} ms" for g in (1, 2, 4, 8, 32))
    print(machine_line(), flush=True)
    print(f"simulated cluster: {N_WORKERS} workers, LeNet's HE model at b = {batch}: {he}", flush=True)

    if args.chosen is None:
        best = select(args, model, X, y, batch)
    else:
        best = {"sync": args.chosen[0], "async": args.chosen[1]}
    print(f"chosen η: sync {best['sync']:g}, plain async {best['async']:g}", flush=True)

    rows = []
    for seed in seeds:
        print(f"round random_state {seed}", flush=True)
        for name in args.only:
            lr = best.get(name)
            est = contender(
                name, seed, model, args.budget, lr, batch, args.max_epochs, args.target, args.augment
            )
            row, decisions = fit_one(est, X, y, args.target, run=name, lr=best.get(name), seed=seed)
            row["seconds_refined"], row["iterations_refined"] = row["seconds"], row["iterations"]
            if name != "auto" and row["reached"] and args.refine > 1:
                refined = refine(name, seed, model, args, lr, batch, X, y, est)
                row["seconds_refined"], row["iterations_refined"] = refined
            rows.append(row)
            if name == "auto" and decisions is not None:
                decisions.to_csv(args.out / f"decisions_auto_{seed}.csv", index=False)
    runs = pd.DataFrame(rows)
    runs.to_csv(args.out / "runs.csv", index=False)
    table = summarise(runs, best)
    text = "\n".join(
        [
            f"# bench_auto_sim32: {N_WORKERS} simulated workers, small CNN on mnist-sample, b = {batch}, "
            f"augment {args.augment}, target {args.target:.0%} held-out (simulated seconds)",
            "",
            machine_line(),
            "",
            markdown_table(table),
        ]
    )
    (args.out / "table.md").write_text(text + "\n")
    print(text, flush=True)
    return {"runs": runs, "table": table, "best": best}


def refine(name: str, seed: int, model: HEModel, args, lr: float, batch: int, X, y, est) -> tuple[float, int]:
    """(seconds, iterations) to the target at `args.refine` evaluations an epoch: a fixed run is
    evaluated once an epoch, so the crossing is searched between its previous evaluation and the
    one at or above the target by the same fit stopped early (`max_epochs` at each 1/refine of an
    epoch in between, in order). The simulated engine is deterministic and a fit stopped early is
    the longer fit's prefix (the same losses and clock, iteration by iteration), so each such fit's
    last evaluation is the held-out accuracy of the one trajectory at that iteration."""
    hist = pd.DataFrame(est.history_)
    nb = est.n_train_samples_ // batch
    hit = hist[hist["val_accuracy"] >= args.target].iloc[0]
    before = int(hist[hist["iteration"] < hit["iteration"]]["iteration"].max())
    for k in range(1, args.refine):
        iterations = before + round(k * nb / args.refine)
        if iterations >= hit["iteration"]:
            break
        short = contender(
            name, seed, model, args.budget, lr, batch, iterations / nb, args.target, args.augment
        )
        short.fit(X, y)
        last = pd.DataFrame(short.history_).iloc[-1]
        if last["val_accuracy"] >= args.target:
            return float(last["time"]), int(last["iteration"])
    return float(hit["time"]), int(hit["iteration"])


def select(args, model: HEModel, X, y, batch: int) -> dict[str, float]:
    """The selection pass: every η of the grid for sync and plain async at random_state
    `SELECT_SEED`; the fastest to the target (when all missed, the most accurate) per contender."""
    print(f"selection pass (random_state {SELECT_SEED}): η ∈ {args.lrs} for sync and plain async", flush=True)
    selection = []
    for name in ("sync", "async"):
        for lr in args.lrs:
            est = contender(
                name, SELECT_SEED, model, args.budget, lr, batch, args.max_epochs, args.target, args.augment
            )
            row, _ = fit_one(est, X, y, args.target, run=name, lr=lr, seed=SELECT_SEED)
            selection.append(row)
    sel = pd.DataFrame(selection)
    sel.to_csv(args.out / "selection.csv", index=False)
    best = {}
    for name, part in sel.groupby("run"):
        # the fastest to the target; when every η missed, the best accuracy reached
        ranked = part.assign(missed=~part["reached"], worse=-part["best_val_accuracy"])
        ranked = ranked.sort_values(["missed", "seconds", "worse"])
        best[name] = float(ranked["lr"].iloc[0])
    return best


def summarise(runs: pd.DataFrame, best: dict) -> pd.DataFrame:
    """Medians per contender, "auto"'s speed-up over each (ratio of medians, and per seed)."""
    auto = runs[runs["run"] == "auto"].set_index("seed")
    out = []
    for name in [n for n in ("auto", "sync", "async") if (runs["run"] == n).any()]:
        part = runs[runs["run"] == name].set_index("seed")
        per_seed = (part["seconds"] / auto["seconds"]).dropna()
        refined = (part["seconds_refined"] / auto["seconds"]).dropna()
        out.append(
            {
                "contender": name if name == "auto" else f"{name} η={best[name]:g}",
                "median s": float(part["seconds"].median()),
                "median iterations": float(part["iterations"].median()),
                "reached": f"{int(part['reached'].sum())}/{len(part)}",
                "speed-up of auto (its s ÷ auto's)": float(
                    part["seconds"].median() / auto["seconds"].median()
                ),
                # the crossing lies between two evaluations: its lower bound ÷ auto's upper one
                "conservative speed-up (its previous evaluation's s ÷ auto's s)": float(
                    part["seconds_lower"].median() / auto["seconds"].median()
                ),
                "median s, refined": float(part["seconds_refined"].median()),
                "speed-up, refined": float(part["seconds_refined"].median() / auto["seconds"].median()),
                "per seed": ", ".join(f"{v:.2f}" for v in per_seed),
                "per seed, refined": ", ".join(f"{v:.2f}" for v in refined),
                "wall s (median)": float(part["wall_seconds"].median()),
            }
        )
    return pd.DataFrame(out)


if __name__ == "__main__":
    main()
