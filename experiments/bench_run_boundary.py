"""Benchmark: the fixed cost of a run boundary and of an evaluation on the Dask engine (main job).

A fit is a sequence of engine runs (a window, a trial, a training run) with an evaluation after each
kept one (`dasknn.fitting.Loop`). What a boundary costs beyond its iterations decides how short the
tuner's windows may be (docs/architecture.md, "The loop and its policies": a boundary and an
evaluation together under 5% of a fit's wall time). Measured here on the main job's set-up: LeNet,
batch 64, mnist-sample's 4,000 training samples, a LocalCluster of 2 workers (`local_client`),
`DaskEngine` runs from the previous run's end state, as the loop makes them:

- two engines on one cluster, interleaved repetition by repetition: `DaskEngine(keep_servers=False)`
  (every run starts new servers, as before) and the default (a run starts on the servers the last
  one left running);
- each repetition: a run of `--short` iterations and one of `--long` at g = 2, then g = 1 and back
  to g = 2 (`--short` each), all at the repetition's η and µ (the tuner's ramp changes η every
  window); a run's boundary is its wall time less its iterations at its own steady time per
  iteration (`measure.seconds_per_iteration`, the spacing of updates after the first): start-up,
  the first iterations' warm-up and tear-down; the part outside its iterations is wall − the
  Trace's span;
- an evaluation: the estimator's defaults (2,000 training samples and the 1,000 held out), in this
  process, `nn.train.scoring_batch_size` images a forward: in the "restart" rows one batch after
  another on the process's BLAS/OpenMP threads (`nn.train.evaluate`, the evaluation before), in the
  "keep" rows the batches side by side (`Evaluator`, as the loop runs it now: `nn.scoring.Scorer`).

    python -m experiments.bench_run_boundary [--reps 7] [--short 32] [--long 160]

Prints the medians and the machine line; writes bench_run_boundary_<time>.csv (every run) under
experiments/results/bench_run_boundary/.
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
from dasknn.engine.dask import DaskEngine  # noqa: E402
from dasknn.engine.dask.driver import local_client  # noqa: E402
from dasknn.engine.trace import Budget, RunConfig, TrainState  # noqa: E402
from dasknn.fitting import Evaluator  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.nn.train import evaluate, scoring_batch_size  # noqa: E402
from dasknn.optimizer.measure import seconds_per_iteration  # noqa: E402
from experiments.common import machine_line, results_dir, timestamp, write_tables  # noqa: E402


def timed_run(engine, net, X, y, config: RunConfig, iterations: int, state: TrainState):
    """(wall seconds of engine.run, its boundary: the wall less its iterations at the run's own
    steady time per iteration (`measure.seconds_per_iteration`: start-up, the first iterations'
    warm-up and tear-down), the seconds outside its iterations (wall − the Trace's span), end
    state, iterations done)."""
    t0 = time.perf_counter()
    result = engine.run(net, X, y, config, Budget(iterations=iterations), start=state.copy())
    wall = time.perf_counter() - t0
    trace = result.trace
    boundary = wall - len(trace) * seconds_per_iteration(trace)
    outside = wall - float(trace["t_end"].max() - trace["t_start"].min())
    return wall, boundary, outside, result.state, len(trace)


RUNS = (("short", 2, "short"), ("long", 2, "long"), ("g 2 → 1", 1, "short"), ("g 1 → 2", 2, "short"))
"""(kind, g, length) of each repetition's runs, in order."""


def summarize(table: pd.DataFrame, short: int, long: int) -> pd.DataFrame:
    """Per engine mode, medians: the boundary of a run at a new η and µ, of a g change, the part
    of it outside the iterations, the time per iteration and a short run's wall; the evaluation."""
    out = []
    for mode, rows in table.groupby("mode", sort=False):
        med = rows.groupby("kind")[["wall", "boundary", "outside"]].median()
        b = (med.loc["long", "wall"] - med.loc["short", "wall"]) / (long - short)
        measured = [
            (f"run boundary, new η and µ ({short} iterations, g = 2)", med.loc["short", "boundary"]),
            ("  of which outside the iterations (wall − span)", med.loc["short", "outside"]),
            ("run boundary, g 2 → 1", med.loc["g 2 → 1", "boundary"]),
            ("run boundary, g 1 → 2", med.loc["g 1 → 2", "boundary"]),
            (f"run boundary, new η and µ ({long} iterations, g = 2)", med.loc["long", "boundary"]),
            (f"wall of a {short}-iteration run, g = 2", med.loc["short", "wall"]),
            (f"time per iteration, g = 2 (wall({long}) − wall({short}) over {long - short})", b),
            ("evaluation (2,000 training + 1,000 held-out samples)", med.loc["evaluation", "wall"]),
        ]
        out += [{"mode": mode, "what": what, "seconds": value} for what, value in measured]
    return pd.DataFrame(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--short", type=int, default=32, help="iterations of a window-sized run")
    parser.add_argument("--long", type=int, default=160, help="iterations of the long run")
    args = parser.parse_args(argv)
    X_all, y_all = (np.asarray(a) for a in load("mnist-sample"))
    X, y, Xv, yv = X_all[:4000], y_all[:4000], X_all[4000:], y_all[4000:]
    print(machine_line(), flush=True)
    length = {"short": args.short, "long": args.long}
    rows = []
    with local_client(n_workers=2) as client:
        import dask.array as da

        Xd, yd = client.persist(
            [da.from_array(X, chunks=(1024, 1, 28, 28)), da.from_array(y, chunks=(1024,))]
        )
        net = zoo.lenet(seed=0)
        evaluator = Evaluator(net, Xv, yv, tuner=(X[:2000], y[:2000]))  # an "auto" fit's evaluation
        scorer, batch = net.copy(), scoring_batch_size(net)

        def one_after_another(state: TrainState) -> None:
            scorer.set_params(state.params)
            evaluate(scorer, X[:2000], y[:2000], batch)
            evaluate(scorer, Xv, yv, batch)

        modes = {"restart": DaskEngine(client, keep_servers=False), "keep": DaskEngine(client)}
        states = {mode: TrainState.from_net(net) for mode in modes}
        for rep in range(args.reps):
            lr, mu = (0.01, 0.02, 0.04, 0.03)[rep % 4], 0.9 - 0.05 * (rep % 2)
            for mode, engine in modes.items():  # interleaved: each repetition runs both modes
                for kind, g, n in RUNS:
                    config = RunConfig(g, lr, mu, 5e-4, 64, 0)
                    wall, boundary, outside, states[mode], done = timed_run(
                        engine, net, Xd, yd, config, length[n], states[mode]
                    )
                    rows.append({"mode": mode, "rep": rep, "kind": kind, "n_groups": g, "iterations": done,
                                 "wall": wall, "boundary": boundary, "outside": outside})  # fmt: skip
            for mode, score in (("restart", one_after_another), ("keep", evaluator)):  # before, now
                t0 = time.perf_counter()
                score(states["keep"])
                rows.append(
                    {"mode": mode, "rep": rep, "kind": "evaluation", "wall": time.perf_counter() - t0}
                )
            print(f"repetition {rep + 1} of {args.reps} done", flush=True)
        for engine in modes.values():
            engine.close()
    table = pd.DataFrame(rows)
    stem = f"bench_run_boundary_{timestamp()}"
    write_tables(results_dir("bench_run_boundary"), {"": table}, stem)
    summary = summarize(table, args.short, args.long)
    print(machine_line())
    print(summary.to_string(index=False))
    write_tables(results_dir("bench_run_boundary"), {"_summary": summary}, stem)


if __name__ == "__main__":
    main()
