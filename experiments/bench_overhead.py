"""Benchmark of the Dask engine's overhead: time per iteration of one group on one worker against
in-process training on the same batches.

Omnivore's claim that its compute groups add little over a single-device run (§III-B: a group of
one device runs the same maths) only holds on Dask if the engine's tasks, actors and driver cost
little per iteration. For LeNet (b = 64, digits upsampled to 28×28) and CIFAR-10 quick (b = 128,
synthetic 3×32×32 images), measured in the same run and interleaved repetition by repetition:

- in-process: `dasknn.nn.train.train_step` in this process on the engine's batches, in its order;
- worker train_step: the same loop submitted as ONE task to the dask worker, i.e. the worker
  process's environment (its malloc settings, a worker thread) without any engine machinery;
- engine: `DaskEngine` with 1 group on `local_client(n_workers=1)` (worker processes): the steady
  time per iteration (`time_per_iteration(trace, warmup=2)`, the spacing of `t_end`), its inner part
  (median t_end − t_start: pull, conv forward, FC step, conv backward, push on the worker), the loop
  gap between them (batch read, stop checks) and the fixed setup cost of a run (persist, actors,
  template scatter, final state: run wall time − the Trace's span).
- phases: pull / conv forward / FC step / conv backward / push with the engine's own server classes
  (`ConvModelServer`, `FCServer`) and shard functions (`tasks.conv_forward`, `tasks.conv_backward`),
  timed in this process and as one task on the worker.

BLAS threads: `--blas-threads` (default 1) everywhere, set with threadpoolctl in this process and by
`DaskEngine(blas_threads=...)` / threadpoolctl on the worker; the worker's setting is read back and
printed. One thread keeps the measurement stable on a small shared machine (idle BLAS threads spin).

Each measurement runs on two clusters in turn: dask's default worker environment ("dask default",
`local_client(tune_malloc=False)`) and "malloc tuned" (what `local_client` does by default),
with MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=64 MiB added to
`distributed.nanny.pre-spawn-environ`. Why: dask's nanny
starts every worker with MALLOC_TRIM_THRESHOLD_=65536, and setting any glibc malloc threshold turns
off glibc's dynamic mmap threshold, so every temporary over 128 KiB (lowered matrices, activations,
their gradients) is mmap'ed and unmapped again on every iteration and its pages fault in afresh.
The "worker train_step" column isolates that effect from the engine's own cost.

What it found (2 shared AMD EPYC cores, BLAS 1 thread, medians of 5, load 0-1.1): on the malloc-
tuned workers `local_client` starts, engine / in-process is 0.95× (LeNet) and 0.91× (CIFAR-10
quick): within the 1.05× goal. On dask's default workers it is 1.48× / 1.23×, but the same
train_step loop as one task on such a worker is already 1.40× / 1.24× slower, so the engine itself
adds ~0-6% (engine / worker train_step 0.91-1.06×); the loop gap between iterations is 0.2-6 ms
and a run's setup ~0.07 s. An earlier run at load 3-6 gave the same picture (1.59× / 1.26× default,
0.87× / 0.91× tuned).

    python -m experiments.bench_overhead [--quick] [--reps 5] [--blas-threads 1] [--gpu]

Every engine run also reads the worker's host↔device copies (`cluster_transfers`, the counter of
`backend.to_device`/`to_numpy`) and reports them per iteration: real copies on a `--gpu` worker,
on a numpy worker the copies a GPU worker would make.

Writes bench_overhead_<time>.csv (medians), _raw.csv (every repetition) and _phases.csv under
experiments/results/bench_overhead/ and prints the tables and the machine (`device_info()`).
The default run takes ~3-4 minutes on 2 cores; `--quick` ~1 minute.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import cupy_available, device_info  # noqa: E402
from dasknn.data import epoch_indices, load, n_batches  # noqa: E402
from dasknn.engine.dask import DaskEngine, local_client, tasks  # noqa: E402
from dasknn.engine.dask.runs import cluster_transfers  # noqa: E402
from dasknn.engine.servers import ConvModelServer, FCServer  # noqa: E402
from dasknn.engine.trace import Budget, RunConfig  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.nn.solver import SGD  # noqa: E402
from dasknn.nn.train import train_step  # noqa: E402
from dasknn.tradeoff import time_per_iteration  # noqa: E402
from experiments import common  # noqa: E402

RESULTS = common.RESULTS_ROOT / "bench_overhead"
MMAP_THRESHOLD = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): allocations below it reuse the heap."""
TRIM_THRESHOLD = 64 * 2**20
"""Free memory a worker keeps before giving it back to the system (dask's default keeps 64 KiB)."""
WARMUP_ITERATIONS = 1
"""Iterations skipped in the engine's numbers: the first builds the worker's copy of the net."""
PHASES = ("batch", "pull", "conv_forward", "fc_step", "conv_backward", "push")
TARGET, GOAL = 1.2, 1.05
CLUSTERS = {
    "dask default": {},
    "malloc tuned": {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD},
}


@dataclass(frozen=True)
class Case:
    """One benchmarked net: its data, batch size, solver settings and iterations per repetition."""

    name: str
    net: str
    dataset: str
    batch_size: int
    lr: float
    iterations: int
    quick_iterations: int

    def data(self):
        if self.dataset == "digits":
            return load("digits", size=28, batch_size=self.batch_size)
        n = self.batch_size * (self.iterations + 2)
        return load("synthetic", n_samples=n, shape=(3, 32, 32), n_classes=10, batch_size=self.batch_size)

    def make_net(self):
        return getattr(zoo, self.net)(seed=0)

    def config(self) -> RunConfig:
        return RunConfig(n_groups=1, lr=self.lr, momentum=0.9, weight_decay=5e-4, batch_size=self.batch_size)


CASES = (
    Case("LeNet", "lenet", "digits", 64, 0.01, iterations=24, quick_iterations=12),
    Case("CIFAR-10 quick", "cifar10_quick", "synthetic", 128, 0.001, iterations=6, quick_iterations=4),
)


def batch_indices(chunks: tuple[int, ...], batch_size: int, n: int, seed: int = 0) -> list[np.ndarray]:
    """The sample indices of global batches 0..n-1 in the engine's order (`BatchReader`'s)."""
    per_epoch = n_batches(int(sum(chunks)), batch_size)
    orders: dict[int, np.ndarray] = {}
    out = []
    for b in range(n):
        epoch, pos = divmod(b, per_epoch)
        if epoch not in orders:
            orders[epoch] = epoch_indices(chunks, epoch=epoch, seed=seed)
        out.append(orders[epoch][pos * batch_size : (pos + 1) * batch_size])
    return out


def train_loop(case: Case, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], threads: int) -> float:
    """Seconds per iteration of `train_step` over `batches` (indexing included), from a fresh net."""
    from threadpoolctl import threadpool_limits

    config = case.config()
    net = case.make_net()
    solver = SGD.for_net(net, base_lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    with threadpool_limits(limits=threads):
        t0 = time.perf_counter()
        for idx in batches:
            train_step(net, solver, X[idx], y[idx], lr=config.lr, momentum=config.momentum)
        return (time.perf_counter() - t0) / len(batches)


def phase_times(
    case: Case, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], threads: int
) -> dict[str, float]:
    """Median seconds of each phase of a one-worker iteration, with the engine's servers and shard code."""
    from threadpoolctl import threadpool_limits

    config = case.config()
    conv, fc = case.make_net().split_phases()
    conv_server = ConvModelServer.of_phase(conv, config.weight_decay)
    fc_server = FCServer(fc.copy(), config.weight_decay, config.seed)
    run_id = f"bench-overhead-{os.getpid()}"
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        with threadpool_limits(limits=threads):
            for idx in batches:
                t = [time.perf_counter()]
                xb, yb = X[idx], y[idx]
                t.append(time.perf_counter())
                version, weights = conv_server.pull()
                t.append(time.perf_counter())
                acts = tasks.conv_forward(run_id, "bench", 0, conv, weights, xb, "cpu", (config.seed, 0))
                t.append(time.perf_counter())
                out = fc_server.step(acts, yb, config.lr, config.momentum)
                t.append(time.perf_counter())
                grads = tasks.conv_backward(run_id, "bench", 0, conv, weights, None, out["dacts"], "cpu")
                t.append(time.perf_counter())
                conv_server.push(grads, version, config.lr, config.momentum)
                t.append(time.perf_counter())
                for p, a, b in zip(PHASES, t[:-1], t[1:], strict=True):
                    times[p].append(b - a)
    finally:
        tasks.forget_run(run_id)
    return {p: float(np.median(v)) for p, v in times.items()}


def worker_blas_threads() -> list[int]:
    """BLAS/OpenMP thread counts of the calling process (run on the worker to read its setting)."""
    from threadpoolctl import threadpool_info

    return sorted({int(i["num_threads"]) for i in threadpool_info()})


@contextmanager
def cluster(environ: dict[str, Any], gpu: bool = False) -> Iterator[Any]:
    """`local_client(n_workers=1)` with extra variables in the worker's pre-spawn environment
    (`gpu`: the worker gets resource GPU=1 and the engine computes there with CuPy).

    The nanny lets the driver's os.environ override its config and then writes its values into the
    driver's os.environ, so a variable set here is taken out of os.environ again afterwards.
    """
    import dask

    saved = {k: os.environ.pop(k, None) for k in environ}
    try:
        with dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in environ.items()}):
            resources = {"GPU": 1} if gpu else {}
            with local_client(n_workers=1, tune_malloc=False, resources=resources) as client:
                yield client
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def engine_run(client, engine: DaskEngine, case: Case, X, y, iterations: int) -> dict[str, float]:
    """One engine run from a fresh net: steady period, inner time, loop gap, setup per run, and the
    worker's host↔device copies and bytes per iteration (`cluster_transfers`; a numpy worker
    counts the copies a GPU worker would make)."""
    before = cluster_transfers(client)
    t0 = time.perf_counter()
    trace = engine.run(case.make_net(), X, y, case.config(), Budget(iterations=iterations)).trace
    wall = time.perf_counter() - t0
    after = cluster_transfers(client)
    moved = {f"{k}_per_iter": (after[k] - before[k]) / len(trace) for k in after}
    steady = trace.sort_values("t_start").iloc[WARMUP_ITERATIONS:]
    gaps = steady["t_start"].to_numpy()[1:] - steady["t_end"].to_numpy()[:-1]
    return {
        "engine_s_per_iter": time_per_iteration(trace, warmup=WARMUP_ITERATIONS),
        "engine_inner_s": float((steady["t_end"] - steady["t_start"]).median()),
        "engine_gap_s": float(np.median(gaps)),
        "engine_setup_s": wall - float(trace["t_end"].max() - trace["t_start"].min()),
        "engine_run_s_per_iter": wall / len(trace),
        **moved,
    }


def transfers(row: dict[str, Any]) -> str:
    """The per-iteration host↔device copies of an engine row, as text."""
    kib = {k: row[f"{k}_bytes_per_iter"] / 1024 for k in ("to_device", "to_host")}
    return (
        f"{row['to_device_per_iter']:.1f} copies ({kib['to_device']:.0f} KiB) to device, "
        f"{row['to_host_per_iter']:.1f} ({kib['to_host']:.0f} KiB) to host"
    )


def bench_case(client, engine: DaskEngine, case: Case, label: str, reps: int, quick: bool, threads: int):
    """One net on one cluster: warm-up, then `reps` interleaved repetitions; raw rows and phase rows."""
    iterations = case.quick_iterations if quick else case.iterations
    X, y = client.persist(list(case.data()))
    Xn, yn = X.compute(), y.compute()
    batches = batch_indices(tuple(int(c) for c in X.chunks[0]), case.batch_size, iterations)
    Xf, yf = client.scatter([Xn, yn])

    def on_worker(fn, *args):
        return client.submit(fn, case, Xf, yf, *args, pure=False).result(timeout=600)

    # warm-up: imports, lowering workspaces, the worker's net cache, the actor classes
    train_loop(case, Xn, yn, batches[:2], threads)
    on_worker(train_loop, batches[:2], threads)
    engine_run(client, engine, case, X, y, WARMUP_ITERATIONS + 2)
    raw = []
    for rep in range(reps):
        row = {"cluster": label, "net": case.name, "batch_size": case.batch_size, "rep": rep}
        row["in_process_s_per_iter"] = train_loop(case, Xn, yn, batches, threads)
        row["worker_train_step_s_per_iter"] = on_worker(train_loop, batches, threads)
        row.update(engine_run(client, engine, case, X, y, iterations))
        raw.append(row)
        print(
            f"  [{label}] {case.name} rep {rep}: in-process {row['in_process_s_per_iter'] * 1e3:.1f} ms, "
            f"worker train_step {row['worker_train_step_s_per_iter'] * 1e3:.1f} ms, "
            f"engine {row['engine_s_per_iter'] * 1e3:.1f} ms; per iteration {transfers(row)}",
            flush=True,
        )
    n_phase = max(2, iterations // 2)
    phases = [
        {"cluster": label, "net": case.name, "where": where, **times}
        for where, times in (
            ("in-process", phase_times(case, Xn, yn, batches[:n_phase], threads)),
            ("worker", on_worker(phase_times, batches[:n_phase], threads)),
        )
    ]
    client.cancel([Xf, yf, X, y])
    return raw, phases


def bench_cluster(label: str, environ: dict[str, Any], reps: int, quick: bool, threads: int, gpu: bool):
    """Every case on one cluster; returns raw rows, phase rows and the worker's BLAS threads."""
    raw, phases = [], []
    with cluster(environ, gpu) as client:
        engine = DaskEngine(client, blas_threads=threads)
        for case in CASES:
            r, p = bench_case(client, engine, case, label, reps, quick, threads)
            raw += r
            phases += p
        blas = client.run(worker_blas_threads)
    return raw, phases, blas


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    """Medians over repetitions per (cluster, net) and the ratios to in-process training."""
    med = raw.drop(columns="rep").groupby(["cluster", "net", "batch_size"], sort=False).median().reset_index()
    med["reps"] = raw.groupby(["cluster", "net", "batch_size"], sort=False).size().to_numpy()
    med["ratio_engine"] = med["engine_s_per_iter"] / med["in_process_s_per_iter"]
    med["ratio_worker_env"] = med["worker_train_step_s_per_iter"] / med["in_process_s_per_iter"]
    med["ratio_engine_over_worker"] = med["engine_s_per_iter"] / med["worker_train_step_s_per_iter"]
    med["ratio_engine_run"] = med["engine_run_s_per_iter"] / med["in_process_s_per_iter"]
    return med


def show(summary: pd.DataFrame, phases: pd.DataFrame) -> None:
    ms = 1e3
    print(
        "\n| cluster | net | b | in-process ms/it | worker train_step | engine ms/it | inner | gap | "
        "setup s/run | engine / in-process | worker env / in-process | engine / worker train_step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in summary.itertuples():
        print(
            f"| {r.cluster} | {r.net} | {r.batch_size} | {r.in_process_s_per_iter * ms:.1f} | "
            f"{r.worker_train_step_s_per_iter * ms:.1f} | {r.engine_s_per_iter * ms:.1f} | "
            f"{r.engine_inner_s * ms:.1f} | {r.engine_gap_s * ms:.2f} | {r.engine_setup_s:.2f} | "
            f"**{r.ratio_engine:.2f}×** | {r.ratio_worker_env:.2f}× | {r.ratio_engine_over_worker:.2f}× |"
        )
    print("\nper-phase medians (ms), engine's server classes and shard functions:")
    print("| cluster | net | where | " + " | ".join(PHASES) + " | sum |")
    print("|---|---|---|" + "---|" * (len(PHASES) + 1))
    for r in phases.itertuples():
        cells = [f"{getattr(r, p) * ms:.2f}" for p in PHASES]
        total = sum(getattr(r, p) for p in PHASES) * ms
        print(f"| {r.cluster} | {r.net} | {r.where} | " + " | ".join(cells) + f" | {total:.1f} |")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = common.parser(__doc__, quick="fewer iterations and 2 repetitions (~1 min)", reps=(5, 2))
    cli.add_argument("--blas-threads", type=int, default=1, help="BLAS threads on both sides (default 1)")
    cli.add_argument("--gpu", action="store_true", help="the engine's worker has GPU=1 (CuPy)")
    args = cli.parse_args(argv)
    if args.gpu and not cupy_available():
        cli.error("--gpu needs CuPy and a CUDA GPU on this machine")
    reps = common.repetitions(args)
    info = device_info()
    load_avg = os.getloadavg()
    print(common.machine_line() + " (shared)")
    print(f"BLAS threads: {args.blas_threads} in this process and on the worker (threadpoolctl)")

    t0 = time.perf_counter()
    raw_rows, phase_rows = [], []
    for label, environ in CLUSTERS.items():
        print(f"cluster: {label}", flush=True)
        raw, phases, blas = bench_cluster(label, environ, reps, args.quick, args.blas_threads, args.gpu)
        print(f"  worker BLAS threads after the runs: {blas}")
        raw_rows += raw
        phase_rows += phases
    raw_df, phase_df = pd.DataFrame(raw_rows), pd.DataFrame(phase_rows)
    summary = summarize(raw_df)
    for df in (summary, raw_df, phase_df):
        df["cpu"], df["cores"], df["blas_threads"] = info["model"], info["cores"], args.blas_threads
        df["load_avg_start"] = load_avg[0]
    show(summary, phase_df)
    print(f"\nengine / in-process, median of {reps} (target ≤ {TARGET}×, goal {GOAL}×):")
    for label in CLUSTERS:
        rows = summary[summary["cluster"] == label]
        print(f"  {label}: " + ", ".join(f"{r.net} {r.ratio_engine:.2f}×" for r in rows.itertuples()))
    load_end = os.getloadavg()[0]
    print(f"local_client's workers are 'malloc tuned'. Shared machine: load {load_end:.2f} at the end.")
    print(f"total time {time.perf_counter() - t0:.0f} s")

    tables = {"": summary, "_raw": raw_df, "_phases": phase_df}
    common.write_tables(RESULTS, tables, stem=f"bench_overhead_{common.timestamp()}")
    return summary


if __name__ == "__main__":
    main()
