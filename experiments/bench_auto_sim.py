"""Benchmark: the "auto" tuner against fixed configurations on the simulated engine (main job).

LeNet on mnist-sample (batch 64, weight decay 5e-4), 1,000 samples held out (seeded permutation),
on a simulated cluster of 2 workers at `SIMULATED_GFLOPS` with a 1.25 GB/s network (its HE model
from the net's FLOPs and bytes): the clock is a model, so each contender runs once and the numbers
are the same on any machine at any load. Time to the target held-out accuracy (rule: the first
evaluation at or above), in simulated seconds, for "auto" (prior cache off) and the fixed
configurations given (default: the Caffe LeNet solver's g = 1, η = 0.01, µ = 0.9 and g ∈ {1, 2} ×
η ∈ {0.01, 0.03, 0.1} at µ = 0.9); a miss counts as the budget.

    python -m experiments.bench_auto_sim [--target 0.96] [--budget 30] [--window 32]
        [--run-iterations 63] [--only auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.data import load  # noqa: E402
from dasknn.engine.simulated import SimulatedEngine  # noqa: E402
from dasknn.engine.trace import RunConfig, TrainState  # noqa: E402
from dasknn.estimator_params import SIMULATED_GFLOPS  # noqa: E402
from dasknn.fitting import Evaluator, Loop  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.optimizer.auto import AutoPolicy  # noqa: E402
from dasknn.optimizer.fixed import FixedKnobs  # noqa: E402
from dasknn.tradeoff.hardware import HEModel  # noqa: E402

FIXED = [(1, 0.01), (1, 0.03), (1, 0.1), (2, 0.01), (2, 0.03), (2, 0.1)]
"""(g, η) at µ = 0.9; (1, 0.01) is the Caffe LeNet solver's setting."""


def run(name: str, policy, parts, model: HEModel, target: float, budget: float) -> dict:
    """One fit on a fresh LeNet: its time to `target` held-out accuracy and its decisions."""
    Xt, yt, Xv, yv = parts
    net = zoo.lenet(seed=0)
    tuner = (Xt[:1000], yt[:1000]) if isinstance(policy, AutoPolicy) else None  # its measure's samples
    loop = Loop(SimulatedEngine(model, verbose=0), net, Xt, yt, batch_size=64, weight_decay=5e-4, seed=0,
                time_budget=budget, evaluate=Evaluator(net, Xv, yv, tuner=tuner),
                target_accuracy=target, n_classes=10)  # fmt: skip
    t0 = time.perf_counter()
    result = loop.run(policy, TrainState.from_net(net))
    hist = pd.DataFrame(loop.history)
    hit = hist[hist["val_accuracy"] >= target]
    return {
        "run": name,
        "seconds_to_target": float(hit["time"].iloc[0]) if len(hit) else budget,
        "reached": bool(len(hit)),
        "best_val_accuracy": float(hist["val_accuracy"].max()),
        "evaluations": len(hist),
        "real_seconds": time.perf_counter() - t0,
        "decisions": result.decisions,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.96)
    parser.add_argument("--budget", type=float, default=30.0, help="simulated seconds per fit")
    parser.add_argument("--window", type=int, default=None, help="auto's ramp window (default its own)")
    parser.add_argument(
        "--run-iterations",
        type=int,
        default=None,
        help="auto's training runs after the ramp (default its own)",
    )
    parser.add_argument("--only", default=None, help="comma-separated: auto, g1_0.01, ...")
    args = parser.parse_args(argv)
    X, y = load("mnist-sample")
    X, y = np.asarray(X), np.asarray(y)
    order = np.random.default_rng(0).permutation(len(X))
    parts = (X[order[1000:]], y[order[1000:]], X[order[:1000]], y[order[:1000]])
    model = HEModel.estimate(zoo.lenet(), 64, 2, device_gflops=SIMULATED_GFLOPS, bandwidth_bytes_per_s=1.25e9)
    contenders = {
        "auto": lambda: AutoPolicy(window=args.window, run_iterations=args.run_iterations).for_fit(
            net_name="lenet"
        )
    }
    for g, lr in FIXED:
        config = RunConfig(g, lr, 0.9, 5e-4, 64, 0)
        contenders[f"g{g}_{lr:g}"] = lambda config=config: FixedKnobs(config, args.budget, None)
    wanted = args.only.split(",") if args.only else list(contenders)
    rows = []
    for name in wanted:
        row = run(name, contenders[name](), parts, model, args.target, args.budget)
        if name == "auto":
            cols = ["phase", "action", "n_groups", "lr", "momentum", "time", "reason"]
            print(row["decisions"][cols].to_string(), flush=True)
        rows.append({k: v for k, v in row.items() if k != "decisions"})
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    if "auto" in set(table["run"]) and len(table) > 1:
        auto = float(table.loc[table["run"] == "auto", "seconds_to_target"].iloc[0])
        table["auto_ratio"] = auto / table["seconds_to_target"]
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
