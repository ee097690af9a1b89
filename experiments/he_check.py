"""HE check: Omnivore's hardware efficiency model against measured Dask-engine runs on this machine.

Mirrors Omnivore §IV-B, "Hardware Efficiency Model" (and appendix D-D), and its
validation: Fig. 5(b), predicted and measured time per iteration as the devices per group change,
which is also the HE panel of Fig. 7(a). The model predicts the time per iteration of g compute
groups of k = N/g devices sharing one merged FC server:

    HE(g) = max{t_fc, (t_conv(k) + t_fc) / g},   t_conv(k) = max(T_cc / k, T_nc · k),

calibrated from t_conv(1) (= T_cc), t_fc and the network time T_nc of one conv model out and its
gradient back. What the paper found (appendix D-D): the parameters are measured once with a standard
deviation under 6% (t_conv(1), t_fc; 8% for the whole iteration on AlexNet, 1.5% on CIFAR-10), and
"the analytic model of hardware efficiency is accurate. When the FC server is saturated (right side
of the graph), the model is almost exact"; conv compute scaled a little below linear in k (8
machines: forward 7.2×, backward 6.6×) and network time linearly or worse ("thrashing").

Here, N = 2: `local_client(n_workers=2)` (two single-threaded worker processes, BLAS 1 thread
each; the FC server shares a worker with conv work, as `plan` places it without an FC resource).
g = 1 is one group of k = 2 (its lead's shard inline, the other on that worker's ShardServer actor,
one push); g = 2 is two groups of one worker.
For each of LeNet (b = 64, digits 28×28) and CIFAR-10 quick (b = 128, synthetic 3×32×32):

- calibration before each repetition, on the cluster's workers, every worker computing at once as
  the groups do (the runs' own process environment), and, for comparison, in this process alone:
  t_conv(1) = pull + conv forward + conv backward + push and t_fc = the FC step, timed with the
  engine's server classes and shard functions, medians over batches and workers; t_conv at the
  shard b/2 gives t_conv_fixed, the per-batch part of T_cc that a device pays whatever its shard
  (t(b/k) = (T_cc − c)/k + c); T_nc = median round trip of the conv weights to the other worker
  and back over dask's TCP comms; `HEModel.from_measurements(t_conv(1), t_fc, 2, conv model
  bytes, 2 · bytes / T_nc)`;
- t_call = the median round trip of an actor call from a task on one worker to an actor on the
  other (`call_seconds`, a small payload): what each round trip of a group's iteration adds to it
  beyond its bytes (`HEModel.round_trips`: the FC step and the push for the group whose lead is
  not the servers' worker, `local_groups=1`); t_shard_call = the same with a remote shard's bytes
  (weights and images out, activations back; activations' gradient out, weights' gradient back)
  while both cores compute (`shard_call_seconds`): the shard's forward and backward at k = 2;
- the CPU bound (`HEModel.t_cpu`), for processes that outnumber the cores: cpu_work = the thread
  CPU time of the calibration's conv and FC compute; cpu_background = the CPU-s per s of the
  driver and the workers with a sleeping task on each worker; cpu_call = the CPU of all processes
  per t_call round trip beyond that; cores = the CPU-s per s two spinning worker tasks get (the
  machine's cores, or fewer while other jobs share it);
- the servers' process (`HEModel.t_servers`): the servers sit on group 0's lead, so that process
  runs that group's conv, every group's FC step and its half of group 1's round trips' CPU
  (cpu_call / 2 each) one after another: t_fc + (t_conv(k) + trips · cpu_call / 2) / g;
- measured: `time_per_iteration(trace, warmup=2)` of DaskEngine runs, g = 1 and g = 2 interleaved,
  median over repetitions; measured ÷ predicted is the median of each repetition's ratio to the
  HE(g) of its own calibration (the machine's speed drifts between repetitions).

What it found (2 shared AMD EPYC cores, load 0-1.2, medians of 3, malloc-tuned workers): with one
worker per group (g = 2) the model holds where compute dominates, measured / predicted 1.04 on
CIFAR-10 quick, and misses by 2.05× on LeNet, whose 25 ms iteration is as long as the TCP round trips
of a group that is not on the servers' worker (pull, FC step with activations, push: ~7-10 ms each
way here), which the engine does not overlap with compute as the model's max() assumes; the two
workers also share the 2 cores with the FC server and the driver. With one group of two workers
(g = 1) the model was too optimistic, 1.51× (CIFAR-10 quick) and 5.3× (LeNet), while the remote
shard ran as dask tasks: the engine's k > 1 iteration cost ~75-85 ms more than t_conv(2) + t_fc in
scheduler round trips (scatters, submits, gathers, ~13 ms a hop) that a bandwidth-only T_nc · k does
not count. Since the remote shard runs on a ShardServer actor (direct worker-to-worker calls,
~1 ms), `--quick` on the same machine (load 1.4-1.6, median of 2, 2026-11-23) measures g = 1 at
17.6 ms on LeNet (was 53 ms; 1.74× the model) and 137 ms on CIFAR-10 quick (was 184 ms; 1.30×).
The worker and in-process calibrations agree within ~10% now that `local_client` tunes the
workers' malloc (see bench_overhead).

    python -m experiments.he_check [--quick] [--gpu]

Each run also records the workers' host↔device copies and bytes per iteration (`cluster_transfers`,
the counter of `backend.to_device`/`to_numpy`): real copies with `--gpu` (GPU=1 workers computing
with CuPy), with numpy the copies GPU workers would make.

Writes experiments/results/he_check/{he_check.nc, he_check.png, table.md}; prints the table. The
machine has 2 cores shared with other users: the load average is recorded, and every number is a
median. Default run ~2-3 minutes, `--quick` ~1 minute.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn import __version__  # noqa: E402
from dasknn.backend import cpu_cores, cupy_available, device_info  # noqa: E402
from dasknn.data import load  # noqa: E402
from dasknn.engine.dask import DaskEngine, cluster_workers, local_client, tasks  # noqa: E402
from dasknn.engine.dask.runs import cluster_transfers  # noqa: E402
from dasknn.engine.servers import ConvModelServer, FCServer  # noqa: E402
from dasknn.engine.trace import Budget, RunConfig  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.tradeoff import HEModel, phase_costs, time_per_iteration  # noqa: E402
from experiments.common import Experiment, parser, repetitions, write  # noqa: E402

NAME = "he_check"
N_WORKERS = 2
GROUPS = (1, 2)
BLAS_THREADS = 1
WARMUP = 2
"""Completions per group skipped by `time_per_iteration` (the first builds the workers' net copies)."""


@dataclass(frozen=True)
class Case:
    """One net: its data, batch, learning rate, iterations per run and calibration batches."""

    name: str
    net: str
    batch_size: int
    lr: float
    iterations: int
    calibration_batches: int

    def data(self):
        if self.net == "lenet":
            return load("digits", size=28, batch_size=self.batch_size)
        n = self.batch_size * 12
        return load("synthetic", n_samples=n, shape=(3, 32, 32), n_classes=10, batch_size=self.batch_size)

    def make_net(self):
        return getattr(zoo, self.net)(seed=0)

    def config(self, g: int) -> RunConfig:
        return RunConfig(n_groups=g, lr=self.lr, momentum=0.9, weight_decay=5e-4, batch_size=self.batch_size)


CASES = {
    False: (
        Case("LeNet", "lenet", 64, 0.01, 40, 12),
        Case("CIFAR-10 quick", "cifar10_quick", 128, 0.001, 14, 5),
    ),
    True: (
        Case("LeNet", "lenet", 64, 0.01, 20, 6),
        Case("CIFAR-10 quick", "cifar10_quick", 128, 0.001, 8, 3),
    ),
}


def phase_seconds(case: Case, X: np.ndarray, y: np.ndarray, threads: int) -> dict[str, float]:
    """t_conv(1) and t_fc on one device: medians over batches, the engine's servers and shard code.

    t_conv(1) = pull + conv forward + conv backward + push (what a one-worker group does besides
    the FC call); t_fc = one `FCServer.step` (FC forward, loss, FC backward, FC update); cpu_work:
    the CPU time of both (their wall time on an idle core). The first batch warms up and is not
    counted.
    """
    from threadpoolctl import threadpool_limits

    config = case.config(1)
    conv, fc = case.make_net().split_phases()
    conv_server = ConvModelServer.of_phase(conv, config.weight_decay)
    fc_server = FCServer(fc.copy(), config.weight_decay, config.seed)
    run_id = f"he-check-{os.getpid()}"
    b = case.batch_size
    t_conv, t_fc, cpu = [], [], []
    try:
        with threadpool_limits(limits=threads):
            for i in range(X.shape[0] // b):
                xb, yb = X[i * b : (i + 1) * b], y[i * b : (i + 1) * b]
                c0, t0 = time.thread_time(), time.perf_counter()
                version, weights = conv_server.pull()
                acts = tasks.conv_forward(run_id, "bench", 0, conv, weights, xb, "cpu", (config.seed, 0))
                t1 = time.perf_counter()
                out = fc_server.step(acts, yb, config.lr, config.momentum)
                t2 = time.perf_counter()
                grads = tasks.conv_backward(run_id, "bench", 0, conv, weights, None, out["dacts"], "cpu")
                conv_server.push(grads, version, config.lr, config.momentum)
                t3 = time.perf_counter()
                cpu.append(time.thread_time() - c0)
                t_conv.append((t1 - t0) + (t3 - t2))
                t_fc.append(t2 - t1)
    finally:
        tasks.forget_run(run_id)
    return {
        "t_conv_1": float(np.median(t_conv[1:])),
        "t_fc": float(np.median(t_fc[1:])),
        "cpu_work": float(np.median(cpu[1:])),
    }


def median_seconds(call, reps: int) -> float:
    """The median wall time of `reps` calls of `call()`, after one more that is not counted."""
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def network_seconds(client, worker: str, weights: dict[str, np.ndarray], reps: int = 7) -> float:
    """T_nc: median time to send the conv weights to `worker` and receive as many bytes back."""

    def there_and_back():
        [future] = client.scatter([weights], workers=[worker], direct=True, hash=False)
        client.gather(future, direct=True)
        client.cancel(future)

    return median_seconds(there_and_back, reps)


SMALL_CALL = 64
"""The bytes each way of an actor call that carries (almost) nothing: `t_call`."""


def call_seconds(client, background: float, reps: int = 60) -> tuple[float, float]:
    """t_call: the median round trip of an actor call from a task on one worker to an actor on the
    other, as a group's lead calls a server or a shard server (its bytes aside: a small payload);
    and cpu_call: the CPU all the cluster's processes spent per call, beyond `background` (CPU-s
    per s), the task's own submission included."""
    lead, other = sorted(cluster_workers(client))[:2]
    actor = client.submit(Carrier, workers=[other], actor=True, pure=False).result(timeout=60)
    cpu0, t0 = cluster_cpu_seconds(client), time.perf_counter()
    task = client.submit(
        carried_round_trip, actor, SMALL_CALL, SMALL_CALL, reps, False, workers=[lead], pure=False
    )
    seconds = task.result(timeout=600)
    cpu = cluster_cpu_seconds(client) - cpu0 - background * (time.perf_counter() - t0)
    client.cancel([task])
    del actor
    return seconds, max(0.0, cpu / (reps + 1))


def process_cpu_seconds() -> float:
    """This process's CPU seconds so far, user + system, all its threads."""
    t = os.times()
    return t.user + t.system


def cluster_cpu_seconds(client) -> float:
    """The CPU seconds so far of this process (with a LocalCluster's scheduler and nannies) and of
    every worker."""
    return process_cpu_seconds() + sum(client.run(process_cpu_seconds).values())


def _spin(seconds: float) -> float:
    """Compute for `seconds` of wall time; the CPU seconds this thread got meanwhile."""
    t0, cpu0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        pass
    return time.thread_time() - cpu0


def available_cores(client, seconds: float = 1.0) -> float:
    """cores: the CPU-s per s the workers get when each computes on one thread at once, at most the
    machine's cores (fewer when other jobs share the machine)."""
    workers = cluster_workers(client)
    spins = [client.submit(_spin, seconds, workers=[w], pure=False) for w in workers]
    got = sum(client.gather(spins)) / seconds
    client.cancel(spins)
    return min(got, float(cpu_cores()))


def background_cpu(client, seconds: float = 2.0) -> float:
    """cpu_background: CPU-s per s the cluster's processes spend with a task running on every
    worker (a sleeping one: dask's profiler, when on, samples it as it samples a group's loop)."""
    from distributed import wait

    busy = [
        client.submit(time.sleep, seconds + 1.0, workers=[w], pure=False) for w in cluster_workers(client)
    ]
    time.sleep(0.5)
    cpu0, t0 = cluster_cpu_seconds(client), time.perf_counter()
    time.sleep(seconds)
    cpu = cluster_cpu_seconds(client) - cpu0
    rate = cpu / (time.perf_counter() - t0)
    wait(busy)
    client.cancel(busy)
    return rate


def busy_phase_seconds(client, case: Case, X: np.ndarray, y: np.ndarray, batch: int) -> dict[str, float]:
    """`phase_seconds` at `batch` images on every worker at once (as the groups compute: every core
    busy), each worker on its own copy of the data; the medians over the workers."""
    workers = sorted(cluster_workers(client))
    shard = replace(case, batch_size=int(batch))
    n = case.calibration_batches * int(batch)
    futures, runs = [], []
    for w in workers:
        Xf, yf = client.scatter([X[:n], y[:n]], workers=[w])
        futures += [Xf, yf]
        runs.append(client.submit(phase_seconds, shard, Xf, yf, BLAS_THREADS, workers=[w], pure=False))
    results = client.gather(runs)
    client.cancel(futures + runs)
    return {key: float(np.median([r[key] for r in results])) for key in results[0]}


class Carrier:
    """An actor that answers a call with as many bytes as it is told: a remote shard's call, its
    compute aside."""

    def call(self, payload, n_back: int):
        return np.ones(max(1, int(n_back) // 4), dtype=np.float32)


def _compute(stop, seconds: float | None = None) -> None:
    """Single-thread SGEMM until `stop` is set (or for `seconds`): a core kept busy as a group's
    conv kernels keep it (BLAS releases the GIL, as they do)."""
    from threadpoolctl import threadpool_limits

    a = np.ones((256, 256), dtype=np.float32)
    t0 = time.perf_counter()
    with threadpool_limits(limits=1):
        while not stop.is_set() and (seconds is None or time.perf_counter() - t0 < seconds):
            a @ a


def _busy_for(seconds: float) -> None:
    """A task computing on its worker's core for `seconds`."""
    import threading

    _compute(threading.Event(), seconds)


def carried_round_trip(actor, n_out: int, n_back: int, reps: int, busy: bool) -> float:
    """Median round trip of `reps` calls to a `Carrier` carrying `n_out` bytes out and `n_back`
    back (the first not counted); with `busy`, while a thread of this process computes (the lead
    computes its own shard while the remote one's call is out)."""
    import threading

    payload = np.ones(max(1, int(n_out) // 4), dtype=np.float32)
    stop = threading.Event()
    computing = threading.Thread(target=_compute, args=(stop,), daemon=True)
    if busy:
        computing.start()
    try:
        return median_seconds(lambda: actor.call(payload, n_back).result(timeout=60), reps)
    finally:
        stop.set()
        if busy:
            computing.join()


def shard_call_seconds(client, case: Case, X: np.ndarray, reps: int = 30) -> float:
    """t_shard_call: the mean of a remote shard's forward and backward round trip, from a task on
    one worker to an actor on the other, with the bytes each carries (forward: the conv weights and
    the shard's images out, its activations back; backward: the activations' gradient out, the
    weights' gradient back), every core computing meanwhile as in a group's iteration."""
    b = case.batch_size // N_WORKERS
    net = case.make_net()
    conv, _ = net.split_phases()
    weights = sum(int(v.nbytes) for v in conv.get_params().values())
    acts = int(phase_costs(net, b)["split_activation_bytes"])
    images = int(X[:b].nbytes)
    lead, other = sorted(cluster_workers(client))[:2]
    actor = client.submit(Carrier, workers=[other], actor=True, pure=False).result(timeout=60)
    seconds = []
    for out, back in ((weights + images, acts), (acts, weights)):
        busy = client.submit(_busy_for, 0.6 + reps * 0.02, workers=[other], pure=False)
        trip = client.submit(carried_round_trip, actor, out, back, reps, True, workers=[lead], pure=False)
        seconds.append(trip.result(timeout=600))
        busy.result(timeout=600)
        client.cancel([busy, trip])
    del actor
    return float(np.mean(seconds))


def conv_fixed(t_conv_1: float, t_conv_shard: float, k: int) -> float:
    """The per-batch part c of T_cc from t_conv at b and at b/k: t(b/k) = (T_cc − c)/k + c, so
    c = (k · t(b/k) − T_cc) / (k − 1), held within [0, T_cc]."""
    c = (k * t_conv_shard - t_conv_1) / (k - 1)
    return float(min(max(c, 0.0), t_conv_1))


def calibrate(client, case: Case, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The HE model's parameters on the cluster's workers, every worker computing at once (as the
    groups do), at the batch and at a shard of it; and t_conv(1), t_fc in this process, alone."""
    measured = busy_phase_seconds(client, case, X, y, case.batch_size)
    shard = busy_phase_seconds(client, case, X, y, case.batch_size // N_WORKERS)
    n = case.calibration_batches * case.batch_size
    here = phase_seconds(case, X[:n], y[:n], BLAS_THREADS)
    conv, _ = case.make_net().split_phases()
    background = background_cpu(client)
    t_call, cpu_call = call_seconds(client, background)
    workers = sorted(cluster_workers(client))
    return {
        **measured,
        "t_conv_shard": shard["t_conv_1"],
        "t_conv_fixed": conv_fixed(measured["t_conv_1"], shard["t_conv_1"], N_WORKERS),
        "t_shard_call": shard_call_seconds(client, case, X),
        "T_nc": network_seconds(client, workers[0], conv.get_params()),
        "t_call": t_call,
        "cpu_call": cpu_call,
        "cpu_background": background,
        "cores": available_cores(client),
        "conv_model_bytes": phase_costs(case.make_net(), case.batch_size)["conv_model_bytes"],
        "t_conv_1_in_process": here["t_conv_1"],
        "t_fc_in_process": here["t_fc"],
    }


def model_of(cal: dict[str, float], in_process: bool = False) -> HEModel:
    """`HEModel.from_measurements` with the bandwidth that makes T_nc the measured round trip, the
    measured `t_call`, and group 0's lead on the servers' worker (`plan` puts them there)."""
    suffix = "_in_process" if in_process else ""
    return HEModel.from_measurements(
        t_conv_1=cal["t_conv_1" + suffix],
        t_fc=cal["t_fc" + suffix],
        n_workers=N_WORKERS,
        conv_model_bytes=cal["conv_model_bytes"],
        bandwidth_bytes_per_s=2.0 * cal["conv_model_bytes"] / cal["T_nc"],
        t_call=cal["t_call"],
        local_groups=1,
        cores=cal["cores"],
        cpu_call=cal["cpu_call"],
        cpu_background=cal["cpu_background"],
        cpu_work=cal["cpu_work"],
        t_conv_fixed=0.0 if in_process else cal["t_conv_fixed"],
        t_shard_call=cal["t_shard_call"],
    )


TRANSFERS = ("to_device", "to_device_bytes", "to_host", "to_host_bytes")


def measure(client, case: Case, X, y, reps: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Measured time per iteration, shape (len(GROUPS), reps), g values interleaved per repetition;
    and the workers' host↔device transfers per iteration (`cluster_transfers`), (len(GROUPS), 4)."""
    engine = DaskEngine(client, blas_threads=BLAS_THREADS, timeout=120)
    engine.run(case.make_net(), X, y, case.config(2), Budget(iterations=2 * WARMUP + 2))  # warm-up
    out = np.full((len(GROUPS), reps), np.nan)
    moved = np.zeros((len(GROUPS), len(TRANSFERS)))
    for r in range(reps):
        for i, g in enumerate(GROUPS):
            before = cluster_transfers(client)
            trace = engine.run(
                case.make_net(), X, y, case.config(g), Budget(iterations=case.iterations)
            ).trace
            after = cluster_transfers(client)
            out[i, r] = time_per_iteration(trace, warmup=WARMUP)
            moved[i] = [(after[k] - before[k]) / len(trace) for k in TRANSFERS]
            assert engine.placement_ is not None and engine.placement_.n_groups == g
            print(
                f"  {case.name} g={g} rep {first + r}: {out[i, r] * 1e3:.1f} ms/iteration; per iteration "
                f"{moved[i, 0]:.1f} copies ({moved[i, 1] / 1024:.0f} KiB) to device, "
                f"{moved[i, 2]:.1f} ({moved[i, 3] / 1024:.0f} KiB) to host",
                flush=True,
            )
    return out, moved


def calibration_line(case: Case, cal: dict[str, float]) -> str:
    """One repetition's calibration, in ms."""
    ms = {key: value * 1e3 for key, value in cal.items()}
    return (
        f"{case.name}: t_conv(1) = {ms['t_conv_1']:.1f} ms (b/{N_WORKERS}: {ms['t_conv_shard']:.1f}, "
        f"t_conv_fixed {ms['t_conv_fixed']:.1f}), t_fc = {ms['t_fc']:.2f} ms, T_nc = {ms['T_nc']:.2f} ms, "
        f"t_call = {ms['t_call']:.2f} ms, t_shard_call = {ms['t_shard_call']:.2f} ms, "
        f"cpu_call = {ms['cpu_call']:.2f} ms, cpu_background = {ms['cpu_background']:.0f} CPU-ms/s, "
        f"cores = {cal['cores']:.2f} (workers, all computing); in this process, alone, "
        f"t_conv(1) = {ms['t_conv_1_in_process']:.1f} ms"
    )


def run(quick: bool, reps: int, gpu: bool = False) -> xr.Dataset:
    """Calibrate, predict and measure every case; the record as a Dataset (dims net, groups, rep).

    `gpu`: the workers get resource GPU=1 and compute with CuPy (the calibration stays on numpy)."""
    cases = CASES[quick]
    info = device_info()
    load_start = os.getloadavg()[0]
    cal_reps, measured, transfers = [], [], []
    resources = {"GPU": 1} if gpu else {}
    with local_client(n_workers=N_WORKERS, threads_per_worker=1, resources=resources) as client:
        for case in cases:
            X, y = client.persist(list(case.data()))
            Xn, yn = X.compute(), y.compute()
            cals, times, moved = [], [], None
            for r in range(reps):  # each repetition calibrated just before its runs
                cals.append(calibrate(client, case, Xn, yn))
                print(calibration_line(case, cals[-1]), flush=True)
                t, moved = measure(client, case, X, y, 1, first=r)
                times.append(t[:, 0])
            cal_reps.append(cals)
            measured.append(np.stack(times, axis=-1))
            transfers.append(moved)
            client.cancel([X, y])
    cal_rows = [{key: float(np.median([c[key] for c in cals])) for key in cals[0]} for cals in cal_reps]
    models = [model_of(c) for c in cal_rows]
    models_here = [model_of(c, in_process=True) for c in cal_rows]
    measured_arr = np.stack(measured)
    median = np.median(measured_arr, axis=-1)
    predicted_rep = np.array([[[model_of(c).he(g) for c in cals] for g in GROUPS] for cals in cal_reps])
    predicted = np.median(predicted_rep, axis=-1)
    ratio = np.median(measured_arr / predicted_rep, axis=-1)
    ng, nets = ("net", "groups"), ("net",)

    def per_net(key: str) -> np.ndarray:
        return np.array([c[key] for c in cal_rows], dtype=float)

    ds = xr.Dataset(
        {
            "time_per_iter_predicted": (
                ng,
                predicted,
                {
                    "units": "s",
                    "description": "HE(g) = max{t_fc, 1 / sum_i 1/t_i}, t_i = t_conv(k) + t_fc + "
                    "round trips * t_call, worker calibration",
                },
            ),
            "time_per_iter_predicted_in_process": (
                ng,
                np.array([[m.he(g) for g in GROUPS] for m in models_here]),
                {"units": "s", "description": "HE(g) calibrated in the driver process instead"},
            ),
            "time_per_iter_measured": (
                ng,
                median,
                {
                    "units": "s",
                    "description": f"median over repetitions of time_per_iteration(trace, {WARMUP})",
                },
            ),
            "time_per_iter_measured_rep": (
                (*ng, "rep"),
                measured_arr,
                {"units": "s", "description": "every repetition"},
            ),
            "time_per_iter_predicted_rep": (
                (*ng, "rep"),
                predicted_rep,
                {"units": "s", "description": "HE(g) of each repetition's own calibration"},
            ),
            "ratio": (
                ng,
                ratio,
                {
                    "units": "1",
                    "description": "median over repetitions of measured / that repetition's prediction",
                },
            ),
            "transfers_per_iter": (
                (*ng, "transfer"),
                np.stack(transfers),
                {
                    "units": "copies or bytes per iteration",
                    "description": "host-device copies of all workers (backend.transfer_counts), last "
                    "repetition; numpy workers count the copies a GPU worker would make",
                },
            ),
            "k": (
                ng,
                np.array([[m.group_size(g) for g in GROUPS] for m in models], dtype=np.int64),
                {"units": "workers", "description": "workers per group, N // g"},
            ),
            "t_conv": (
                ng,
                np.array([[m.t_conv(m.group_size(g)) for g in GROUPS] for m in models]),
                {"units": "s", "description": "max(T_cc / k, T_nc * k)"},
            ),
            "fc_saturated": (
                ng,
                np.array([[m.saturates(g) for g in GROUPS] for m in models], dtype=np.int8),
                {"units": "1", "description": "t_conv(k) + t_fc < g t_fc"},
            ),
            "t_conv_1": (nets, per_net("t_conv_1"), {"units": "s", "description": "T_cc, on a worker"}),
            "t_fc": (nets, per_net("t_fc"), {"units": "s", "description": "FC step, on a worker"}),
            "T_nc": (nets, per_net("T_nc"), {"units": "s", "description": "conv weights out and back"}),
            "t_call": (nets, per_net("t_call"), {"units": "s", "description": "an actor call's round trip"}),
            "t_shard_call": (
                nets,
                per_net("t_shard_call"),
                {
                    "units": "s",
                    "description": "a remote shard's call with its bytes (forward, backward: mean)",
                },
            ),
            "t_conv_shard": (
                nets,
                per_net("t_conv_shard"),
                {"units": "s", "description": f"t_conv at b / {N_WORKERS}, every worker computing"},
            ),
            "t_conv_fixed": (
                nets,
                per_net("t_conv_fixed"),
                {"units": "s", "description": "the per-batch part of T_cc, from t_conv at b and b / k"},
            ),
            "cpu_call": (
                nets,
                per_net("cpu_call"),
                {"units": "s", "description": "CPU of all processes per actor call's round trip"},
            ),
            "cpu_background": (
                nets,
                per_net("cpu_background"),
                {"units": "s/s", "description": "CPU of all processes per second, a task on each worker"},
            ),
            "cores": (nets, per_net("cores"), {"units": "cores", "description": "CPU-s/s busy workers get"}),
            "t_cpu": (
                ng,
                np.array([[m.t_cpu(g) for g in GROUPS] for m in models]),
                {"units": "s", "description": "CPU bound: CPU per iteration / (cores - cpu_background)"},
            ),
            "t_conv_1_in_process": (nets, per_net("t_conv_1_in_process"), {"units": "s"}),
            "t_fc_in_process": (nets, per_net("t_fc_in_process"), {"units": "s"}),
            "conv_model_bytes": (nets, per_net("conv_model_bytes"), {"units": "bytes"}),
            "batch_size": (
                nets,
                np.array([c.batch_size for c in cases], dtype=np.int64),
                {"units": "images"},
            ),
        },
        coords={
            "net": [c.name for c in cases],
            "groups": np.array(GROUPS, dtype=np.int64),
            "rep": np.arange(reps, dtype=np.int64),
            "transfer": list(TRANSFERS),
        },
    )
    ds.attrs = {
        "experiment": "he_check",
        "mirrors": "Omnivore §IV-B HE model; Fig. 5(b) / Fig. 7(a) predicted vs measured time per iteration",
        "engine": "dask",
        "cluster": f"local_client(n_workers={N_WORKERS}, threads_per_worker=1), worker processes"
        + (", GPU=1 each (CuPy)" if gpu else ", numpy"),
        "n_workers": N_WORKERS,
        "blas_threads": BLAS_THREADS,
        "time_unit": "s",
        "device": ", ".join(f"{k}={v}" for k, v in info.items()),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg()[0],
        "dasknn_version": __version__,
    }
    return ds


def table(ds: xr.Dataset) -> str:
    """Markdown: predicted vs measured time per iteration per net and g, then the calibration."""

    def ms(value) -> str:
        return f"{float(value) * 1e3:.1f}"

    lines = [
        "| net | g | k | t_conv(k) (ms) | t_fc (ms) | t_cpu (ms) | HE predicted (ms) | measured (ms) | "
        "measured / predicted | FC saturated | predicted, in-process calibration (ms) | "
        "to device per iteration (copies / KiB) | to host (copies / KiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for net in ds["net"].values:
        for g in ds["groups"].values:
            s = ds.sel(net=net, groups=g)
            cells = [net, str(g), str(int(s["k"])), ms(s["t_conv"]), ms(s["t_fc"]), ms(s["t_cpu"])]
            cells += [ms(s["time_per_iter_predicted"]), ms(s["time_per_iter_measured"])]
            cells += [f"{float(s['ratio']):.2f}", "yes" if int(s["fc_saturated"]) else "no"]
            cells += [ms(s["time_per_iter_predicted_in_process"])]
            t = s["transfers_per_iter"]
            for way in ("to_device", "to_host"):
                copies, nbytes = float(t.sel(transfer=way)), float(t.sel(transfer=f"{way}_bytes"))
                cells.append(f"{copies:.1f} / {nbytes / 1024:.0f}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| net | b | t_conv(1) workers (ms) | t_conv(b/k) (ms) | t_conv_fixed (ms) | t_fc workers (ms) | "
        "T_nc (ms) | t_call (ms) | t_shard_call (ms) | cpu_call (ms) | cpu_background (CPU-ms/s) | cores | "
        "conv model (KiB) | t_conv(1) in-process (ms) | t_fc in-process (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for net in ds["net"].values:
        s = ds.sel(net=net)
        cells = [
            net,
            str(int(s["batch_size"])),
            ms(s["t_conv_1"]),
            ms(s["t_conv_shard"]),
            ms(s["t_conv_fixed"]),
            ms(s["t_fc"]),
            f"{float(s['T_nc']) * 1e3:.2f}",
            f"{float(s['t_call']) * 1e3:.2f}",
            f"{float(s['t_shard_call']) * 1e3:.2f}",
            f"{float(s['cpu_call']) * 1e3:.2f}",
            f"{float(s['cpu_background']) * 1e3:.0f}",
            f"{float(s['cores']):.2f}",
        ]
        cells += [f"{float(s['conv_model_bytes']) / 1024:.0f}", ms(s["t_conv_1_in_process"])]
        cells += [ms(s["t_fc_in_process"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Device: {ds.attrs['device']}; {ds.attrs['cluster']}; BLAS threads {ds.attrs['blas_threads']}; "
        f"load average {ds.attrs['load_average_start']:.2f} → {ds.attrs['load_average_end']:.2f} "
        f"(shared machine); measured = median of {ds.sizes['rep']} runs, each calibrated just before "
        "it; measured / predicted = the median of each run's ratio to its own calibration's HE(g); "
        "the calibration columns are medians over the runs.",
    ]
    ceilings = {k.removeprefix("ceiling "): v for k, v in ds.attrs.items() if k.startswith("ceiling ")}
    if ceilings:
        lines.append(
            f"The machine's ceiling, {ds.attrs['n_workers']} processes computing the phases at once ÷ one: "
            + ", ".join(f"{net} {value:.2f}×" for net, value in ceilings.items())
            + "."
        )
    return "\n".join(lines)


def plot(ds: xr.Dataset, fig) -> None:
    nets = list(ds["net"].values)
    axes = fig.subplots(1, len(nets))
    for ax, net in zip(np.atleast_1d(axes), nets, strict=True):
        s = ds.sel(net=net)
        g = ds["groups"].values
        ax.plot(g, s["time_per_iter_predicted"] * 1e3, "o-", label="HE(g) predicted")
        ax.plot(g, s["time_per_iter_measured"] * 1e3, "s--", label="measured (median)")
        for r in ds["rep"].values:
            ax.plot(g, s["time_per_iter_measured_rep"].sel(rep=r) * 1e3, ".", color="C1", alpha=0.4)
        ax.axhline(float(s["t_fc"]) * 1e3, color="k", ls=":", lw=1, label="t_fc")
        ax.set_xticks(g, [f"g={v}\nk={int(k)}" for v, k in zip(g, s["k"].values, strict=True)])
        ax.set_ylim(bottom=0)
        ax.set_ylabel("time per iteration (ms)")
        ax.set_title(f"{net}, b = {int(s['batch_size'])}, N = {ds.attrs['n_workers']} workers")
        ax.legend(fontsize=7)


def _phases_per_second(net: str, quick: bool, start: float, seconds: float) -> float:
    """Batches per second of `phase_seconds` (conv and FC phases, no engine) in this process, from
    the wall-clock time `start` for `seconds`."""
    case = next(c for c in CASES[quick] if c.net == net)
    X, y = (np.asarray(a.compute()) for a in case.data())
    n = 4 * case.batch_size
    phase_seconds(case, X[:n], y[:n], BLAS_THREADS)  # warm-up
    while time.time() < start:
        time.sleep(0.001)
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        phase_seconds(case, X[:n], y[:n], BLAS_THREADS)
        done += 4
    return done / (time.perf_counter() - t0)


def parallel_ceiling(quick: bool, seconds: float = 4.0, reps: int = 3) -> dict[str, float]:
    """The machine's ceiling for "2 workers ÷ 1 process": N_WORKERS processes computing the conv
    and FC phases at once (no engine, no messages) over one alone, batches per second, medians of
    `reps`. Cores that share a physical core or memory bandwidth give less than N_WORKERS here."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    out = {}
    with ProcessPoolExecutor(N_WORKERS, mp_context=get_context("spawn")) as pool:
        for case in CASES[quick]:
            one, many = [], []
            for _ in range(reps):
                start = time.time() + 8.0  # every process has loaded its data by then
                one.append(pool.submit(_phases_per_second, case.net, quick, start, seconds).result())
                start = time.time() + 8.0
                runs = [
                    pool.submit(_phases_per_second, case.net, quick, start, seconds) for _ in range(N_WORKERS)
                ]
                many.append(sum(r.result() for r in runs))
            out[case.name] = float(np.median(many) / np.median(one))
            print(f"{case.name}: {N_WORKERS} processes at once ÷ one: {out[case.name]:.2f}×", flush=True)
    return out


def main(argv: list[str] | None = None) -> xr.Dataset:
    cli = parser(__doc__, quick="fewer iterations and 2 repetitions (~1 min)", reps=(3, 2))
    cli.add_argument("--gpu", action="store_true", help="GPU=1 workers computing with CuPy")
    cli.add_argument(
        "--ceiling",
        action="store_true",
        help="also time the phases in 2 processes at once against 1 (the machine's ceiling, ~1 min)",
    )
    args = cli.parse_args(argv)
    if args.gpu and not cupy_available():
        cli.error("--gpu needs CuPy and a CUDA GPU on this machine")
    t0 = time.perf_counter()
    ds = run(args.quick, repetitions(args), gpu=args.gpu)
    if args.ceiling:
        ds.attrs.update({f"ceiling {net}": value for net, value in parallel_ceiling(args.quick).items()})
    text = table(ds)
    result = Experiment(ds, text, plot, figsize=(4.5 * ds.sizes["net"], 3.6))
    paths = write(NAME, result, title="HE model vs measured Dask-engine runs")
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s; wrote {', '.join(str(p) for p in paths.values())}")
    return ds


if __name__ == "__main__":
    main()
