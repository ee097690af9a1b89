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

The timers wrap the engine's functions in the worker processes (this benchmark only). Prints one
table per net and g, in ms per iteration (medians of the runs' means):

    python -m experiments.bench_breakdown [--quick] [--reps N] [--net lenet|cifar10_quick]
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    trace = engine.run(case.make_net(), X, y, case.config(g), engine_budget(case)).trace
    after = client.run(request_counts)
    timers = client.run(read_timers)
    n = len(trace)
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
    }


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


def main(argv: list[str] | None = None) -> None:
    cli = parser(__doc__, quick="fewer iterations and 2 repetitions", reps=(3, 2))
    cli.add_argument("--net", choices=("lenet", "cifar10_quick"), help="only this net")
    args = cli.parse_args(argv)
    reps = repetitions(args)
    out = []
    # the timers by reference (run as __main__, cloudpickle would send copies of their globals)
    from experiments.bench_breakdown import install_timers

    with local_client(n_workers=2, threads_per_worker=1) as client:
        client.run(install_timers)
        client.run(count_requests)
        engine = DaskEngine(client, blas_threads=1, timeout=120)
        for case in [c for c in CASES[args.quick] if args.net in (None, c.net)]:
            X, y = client.persist(list(case.data()))
            engine.run(case.make_net(), X, y, case.config(2), engine_budget(case))  # warm-up
            runs = {g: [] for g in (1, 2)}
            for _ in range(reps):
                for g in (1, 2):
                    runs[g].append(one_run(client, engine, case, X, y, g))
            for g in (1, 2):
                out.append(table(case, g, runs[g]))
                print(out[-1], flush=True)
            client.cancel([X, y])
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
