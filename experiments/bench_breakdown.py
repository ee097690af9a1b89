"""Where one group's iteration on Dask spends its time, and how many messages it sends.

Runs `DaskEngine` on `local_client(n_workers=2)` (single-threaded workers, BLAS 1 thread) for LeNet
(b = 64) and CIFAR-10 quick (b = 128), at g = 1 (one group of k = 2: the lead's shard inline, the
other on the second worker's ShardServer) and g = 2 (two groups of one worker; group 1's lead is
not on the servers' worker), and times, in every worker process, the pieces of
`iteration.run_iteration` (Omnivore §III-B): the batch read, the pull, the forward (the lead's own
conv forward and the wait for the remote shard), the FC server call, the backward, the push;
and on the servers' side the time their methods compute (`ConvModelServer.pull`/`push`,
`FCServer.step`, the ShardServer's forward and backward). What a call takes beyond the compute it
asks for is its messages, serialisation, thread hops and waits.

Messages: every request a worker answers (`engine.dask.messages`: actor calls by method, gathers),
counted over a run and divided by its iterations; `progress` (the stop check, every 0.5 s) and
`drain` (the driver's poll) are time-driven and listed apart.

CPU: the CPU-seconds (user + system) of every process over each run, by thread (/proc: the
driver, whose event loop also runs LocalCluster's scheduler and nannies, and each
worker: its event loop, the actor thread that runs the servers' calls from other workers, the
shard server's thread, and the group's task thread, which ends with the run), per iteration,
against the wall time of the run times the cores; and the thread pools (OpenBLAS, OpenMP, oneDNN)
each worker uses.

The timers wrap the engine's functions in the worker processes (this benchmark only). Prints one
table per net and g, in ms per iteration (medians of the runs' means):

    python -m experiments.bench_breakdown [--quick] [--reps N] [--net lenet|cifar10_quick]
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import cpu_cores  # noqa: E402
from dasknn.engine.dask import DaskEngine, local_client  # noqa: E402
from dasknn.engine.dask.messages import TIME_DRIVEN, count_requests, request_counts  # noqa: E402
from dasknn.tradeoff import time_per_iteration  # noqa: E402
from experiments.common import machine_line, parser, repetitions  # noqa: E402
from experiments.he_check import CASES, WARMUP  # noqa: E402

_TIMES: dict[str, float] = defaultdict(float)
_CALLS: Counter = Counter()


def _timed(name, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        label = f"{name} {args[1]}" if name == "call" else name
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _TIMES[label] += time.perf_counter() - t0
            _CALLS[label] += 1

    return timed


def install_timers() -> bool:
    """Wrap the iteration's pieces in this worker process (once)."""
    from dasknn.engine import servers
    from dasknn.engine.dask import batches, iteration, tasks

    if getattr(iteration, "_breakdown_timed", False):
        return False
    iteration._breakdown_timed = True
    iteration.run_iteration = _timed("iteration", iteration.run_iteration)
    iteration._call = _timed("call", iteration._call)
    iteration._forward = _timed("lead conv forward", iteration._forward)
    iteration._backward = _timed("lead conv backward", iteration._backward)
    for cls in (iteration.Inline, iteration.ShardActors):
        cls.forward = _timed("forward", cls.forward)
        cls.backward = _timed("backward", cls.backward)
    batches._PersistedBatches.get = _timed("read batch", batches._PersistedBatches.get)
    servers.ConvModelServer.pull = _timed("server pull", servers.ConvModelServer.pull)
    servers.ConvModelServer.push = _timed("server push", servers.ConvModelServer.push)
    servers.FCServer.step = _timed("server FC step", servers.FCServer.step)
    tasks.ShardServer._forward = _timed("shard server forward", tasks.ShardServer._forward)
    tasks.ShardServer._backward = _timed("shard server backward", tasks.ShardServer._backward)
    return True


def cpu_by_thread() -> dict:
    """This process's CPU seconds (user + system) so far: {"pid", "process": total, "threads":
    {thread id: (label, seconds)}}, from /proc; Python threads labelled by their name (pool
    numbers dropped), the others (OpenMP, OpenBLAS) by their OS name."""
    import threading

    names = {t.native_id: re.sub(r"(-\d+)+$", "", t.name) for t in threading.enumerate()}
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            seconds = _stat_seconds(task / "stat")
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        tid = int(task.name)
        threads[tid] = (names.get(tid) or f"{comm} (no Python thread)", seconds)
    times = os.times()
    return {"pid": os.getpid(), "process": times.user + times.system, "threads": threads}


def _stat_seconds(path: Path) -> float:
    """utime + stime of a /proc stat file, in seconds (fields 14 and 15, after the command)."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_pools() -> dict[str, int]:
    """The thread pools this process would use: threadpoolctl's (OpenBLAS, OpenMP) and oneDNN's."""
    from threadpoolctl import threadpool_info

    from dasknn.nn import onednn

    out = {f"{p['internal_api']} ({Path(p['filepath']).name})": p["num_threads"] for p in threadpool_info()}
    found = onednn.info()
    if found.get("available"):
        out["oneDNN"] = found["threads"]
    out["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "unset")
    return out


def read_timers(reset: bool = True) -> dict[str, tuple[float, int]]:
    out = {k: (_TIMES[k], _CALLS[k]) for k in _TIMES}
    if reset:
        _TIMES.clear()
        _CALLS.clear()
    return out


ROWS = (
    # (label, lead-side wall time, compute inside it on the serving side)
    ("read batch", "read batch", None),
    ("pull", "call pull", "server pull"),
    ("forward", "forward", ("lead conv forward",)),
    ("FC step call", "call step", "server FC step"),
    ("backward", "backward", ("lead conv backward",)),
    ("push (its reply: the next pull)", ("call push", "call push_pull"), "server push"),
)


def one_run(client, engine, case, X, y, g: int) -> dict:
    """One engine run: per-worker timers and request counts, per iteration."""
    from experiments.bench_breakdown import read_timers

    client.run(read_timers)
    before = client.run(request_counts)
    cpu_before = cpu_snapshot(client)
    t0 = time.perf_counter()
    trace = engine.run(case.make_net(), X, y, case.config(g), engine_budget(case)).trace
    wall = time.perf_counter() - t0
    cpu_after = cpu_snapshot(client)
    after = client.run(request_counts)
    timers = client.run(read_timers)
    n = len(trace)
    roles = engine.placement_.roles()
    total: dict[str, float] = defaultdict(float)
    for per in timers.values():
        for k, (t, _) in per.items():
            total[k] += t
    requests: Counter = Counter()
    for w in after:
        requests.update({k: v - before.get(w, {}).get(k, 0) for k, v in after[w].items()})
    return {
        "period": time_per_iteration(trace, warmup=WARMUP),
        "ms": {k: 1e3 * v / n for k, v in total.items()},
        "requests": {k: v / n for k, v in requests.items() if v},
        "iterations": n,
        "cpu_ms": cpu_ms(cpu_before, cpu_after, n),
        "wall_ms": 1e3 * wall / n,
        "roles": {_short(w): ", ".join(r) for w, r in roles.items()},
    }


def _short(address: str) -> str:
    return "worker :" + address.rsplit(":", 1)[-1]


def cpu_snapshot(client) -> dict[str, dict]:
    """`cpu_by_thread` of every process of the cluster, by process: this one (the driver; its event
    loop also runs LocalCluster's scheduler, the nannies and the client) and each worker."""
    from experiments.bench_breakdown import cpu_by_thread

    out = {"driver + scheduler + nannies": cpu_by_thread()}
    out.update({_short(w): per for w, per in client.run(cpu_by_thread).items()})
    return out


def cpu_ms(before: dict[str, dict], after: dict[str, dict], n: int) -> dict[tuple[str, str], float]:
    """CPU-ms per iteration between two `cpu_snapshot`s, by (process, thread label); a thread that
    ended in between (a task's thread that seceded) counts as "threads ended"."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for proc, now in after.items():
        was = before.get(proc, {"process": 0.0, "threads": {}})
        alive = 0.0
        for tid, (label, seconds) in now["threads"].items():
            spent = seconds - was["threads"].get(tid, (label, 0.0))[1]
            out[(proc, label)] += 1e3 * spent / n
            alive += spent
        out[(proc, "process")] = 1e3 * (now["process"] - was["process"]) / n
        out[(proc, "threads ended during the run")] = out[(proc, "process")] - 1e3 * alive / n
    return dict(out)


def engine_budget(case):
    from dasknn.engine.trace import Budget

    return Budget(iterations=case.iterations)


def table(case, g: int, runs: list[dict]) -> str:
    ms = {k: float(np.median([r["ms"].get(k, 0.0) for r in runs])) for r in runs for k in r["ms"]}
    period = 1e3 * float(np.median([r["period"] for r in runs]))
    per_group = period * g  # one group's iteration takes g periods of the whole run
    lines = [
        f"### {case.name} b{case.batch_size}, g = {g} (k = {2 // g}): {period:.1f} ms per iteration "
        f"(one group's iteration {per_group:.1f} ms; {machine_line()})",
        "",
        "| piece | wall on the lead (ms) | compute inside (ms) "
        "| rest: messages, serialisation, copies, waits (ms) |",
        "|---|---|---|---|",
    ]
    for label, wall_key, inside in ROWS:
        wall = sum(ms.get(k, 0.0) for k in ((wall_key,) if isinstance(wall_key, str) else wall_key))
        keys = (inside,) if isinstance(inside, str) else (inside or ())
        comp = sum(ms.get(k, 0.0) for k in keys)
        lines.append(f"| {label} | {wall:.2f} | {comp:.2f} | {wall - comp:.2f} |")
    remote = ms.get("shard server forward", 0.0) + ms.get("shard server backward", 0.0)
    loop = ms.get("iteration", 0.0)
    lines.append(f"| remote shard compute (in forward/backward's wait) | {remote:.2f} | | |")
    lines.append(f"| run_iteration (mean of all, the first ones' setup included) | {loop:.2f} | | |")
    requests = {
        k: float(np.median([r["requests"].get(k, 0.0) for r in runs])) for r in runs for k in r["requests"]
    }
    counted = {k: v for k, v in requests.items() if k not in TIME_DRIVEN}
    lines += [
        "",
        f"Requests per iteration (all groups): {sum(counted.values()):.2f} — "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(counted.items()))
        + "; time-driven: "
        + ", ".join(f"{k} {requests.get(k, 0.0):.2f}" for k in TIME_DRIVEN),
    ]
    return "\n".join(lines)


def cpu_table(case, g: int, runs: list[dict]) -> str:
    """Markdown: CPU-ms per iteration by process and thread (medians over runs), against the wall
    time per iteration times the cores."""
    keys = sorted({k for r in runs for k in r["cpu_ms"]})
    cpu = {k: float(np.median([r["cpu_ms"].get(k, 0.0) for r in runs])) for k in keys}
    wall = float(np.median([r["wall_ms"] for r in runs]))
    roles = runs[-1]["roles"]
    cores = cpu_cores()
    lines = [
        f"CPU-ms per iteration by process/thread, {case.name} g = {g} (run's wall {wall:.1f} ms per "
        f"iteration, × {cores} cores = {wall * cores:.1f} CPU-ms available)",
        "",
        "| process | thread | CPU-ms per iteration |",
        "|---|---|---|",
    ]
    total = 0.0
    for proc in sorted({p for p, _ in keys}):
        role = f" ({roles[proc]})" if proc in roles else ""
        for p, thread in keys:
            if p == proc and thread != "process" and cpu[(p, thread)] >= 0.05:
                lines.append(f"| {proc}{role} | {thread} | {cpu[(p, thread)]:.2f} |")
        lines.append(f"| {proc}{role} | **all threads** | **{cpu[(proc, 'process')]:.2f}** |")
        total += cpu[(proc, "process")]
    lines.append(f"| **all processes** | | **{total:.2f}** ({total / (wall * cores):.0%} of the cores) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    cli = parser(__doc__, quick="fewer iterations and 2 repetitions", reps=(3, 2))
    cli.add_argument("--net", choices=("lenet", "cifar10_quick"), help="only this net")
    cli.add_argument(
        "--dask-diagnostics",
        action="store_true",
        help="dask's default diagnostics (profiler on, 20 ms tick) instead of local_client's quiet ones",
    )
    args = cli.parse_args(argv)
    reps = repetitions(args)
    out = []
    # the timers by reference (run as __main__, cloudpickle would send copies of their globals)
    from experiments.bench_breakdown import install_timers, thread_pools

    quiet = not args.dask_diagnostics
    with local_client(n_workers=2, threads_per_worker=1, quiet_diagnostics=quiet) as client:
        client.run(install_timers)
        client.run(count_requests)
        engine = DaskEngine(client, blas_threads=1, timeout=120)
        for case in [c for c in CASES[args.quick] if args.net in (None, c.net)]:
            X, y = client.persist(list(case.data()))
            engine.run(case.make_net(), X, y, case.config(2), engine_budget(case))  # warm-up
            for w, pools in client.run(thread_pools).items():
                out.append(f"Thread pools in {_short(w)}: " + ", ".join(f"{k} {v}" for k, v in pools.items()))
                print(out[-1], flush=True)
            runs = {g: [] for g in (1, 2)}
            for _ in range(reps):
                for g in (1, 2):
                    runs[g].append(one_run(client, engine, case, X, y, g))
            for g in (1, 2):
                out += [table(case, g, runs[g]), cpu_table(case, g, runs[g])]
                print(out[-2] + "\n\n" + out[-1], flush=True)
            client.cancel([X, y])
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
