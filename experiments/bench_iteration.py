"""Benchmark: one full training iteration (forward, backward, SGD update) of dasknn vs PyTorch.

Every kernel backend of dasknn installed here ("lowering", the papers' batched lowering; "onednn"; "auto",
which picks oneDNN for float32 CPU layers) beside PyTorch CPU: same net shapes, same batch, same SGD
with momentum and weight decay, the same number of threads on every side (dasknn's
`backend.blas_threads`, torch.set_num_threads; the BLAS, oneDNN and PyTorch counts are printed), every
side at every thread count timed once per round, rounds interleaved. Each iteration is split into the
conv phase (forward and backward), the FC phase (forward, loss, backward), the solver's update and the
rest. The table reports medians, the spread (min..max), the ratio over PyTorch's median at the same
thread count (below 1: dasknn is faster) and the scaling, a side's median over its own at the first
thread count (t(2)/t(1) for `--threads 1 2`: below 1, more threads help); a second table names the
backend and oneDNN implementation each layer ran.

Targets of "auto" at 1 thread: LeNet (b = 64) ≤ 1.05× PyTorch, CIFAR-10 quick (b = 128) ≤ 1.1×,
CaffeNet (b = 32, 1000 classes) ≤ 1.1×.

Targets of "auto" at 2 threads: CIFAR-10 quick ≤ 0.65× its own 1-thread time and ≤ 1.0× PyTorch,
LeNet and CaffeNet ≤ 1.0× PyTorch.

    python -m experiments.bench_iteration [--repeats 30] [--threads 1 2]
        [--nets lenet cifar10_quick caffenet] [--backends lowering onednn auto]

Writes experiments/results/bench_iteration/bench_iteration_t{threads}_{nets}.csv and
backends_t{threads}_{nets}.csv (threads joined by "-", e.g. t1-2).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import device_info  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.nn.solver import SGD  # noqa: E402
from experiments.common import RESULTS_ROOT, machine_line, parser, write_tables  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_iteration"
NETS = {
    "lenet": ((1, 28, 28), 64, 10),
    "cifar10_quick": ((3, 32, 32), 128, 10),
    "caffenet": ((3, 227, 227), 32, 1000),
}
TARGETS = {"lenet": 1.05, "cifar10_quick": 1.1, "caffenet": 1.1}
"""Targets of backend "auto" at 1 thread: dasknn's iteration time over PyTorch's."""


def torch_net(name: str):
    """The same architecture in PyTorch (Caffe's ceil-mode pooling)."""
    import torch.nn as tnn

    if name == "caffenet":
        return _torch_caffenet()
    if name == "lenet":
        return tnn.Sequential(
            tnn.Conv2d(1, 20, 5),
            tnn.MaxPool2d(2, 2),
            tnn.Conv2d(20, 50, 5),
            tnn.MaxPool2d(2, 2),
            tnn.Flatten(),
            tnn.Linear(800, 500),
            tnn.ReLU(),
            tnn.Linear(500, 10),
        )
    return tnn.Sequential(
        tnn.Conv2d(3, 32, 5, padding=2),
        tnn.MaxPool2d(3, 2, ceil_mode=True),
        tnn.ReLU(),
        tnn.Conv2d(32, 32, 5, padding=2),
        tnn.ReLU(),
        tnn.AvgPool2d(3, 2, ceil_mode=True),
        tnn.Conv2d(32, 64, 5, padding=2),
        tnn.ReLU(),
        tnn.AvgPool2d(3, 2, ceil_mode=True),
        tnn.Flatten(),
        tnn.Linear(64 * 4 * 4, 64),
        tnn.Linear(64, 10),
    )


def _torch_caffenet():
    """CaffeNet as zoo.caffenet: two towers in conv2, conv4, conv5, LRN after the first two pools."""
    import torch.nn as tnn

    def lrn():
        return tnn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)

    return tnn.Sequential(
        tnn.Conv2d(3, 96, 11, stride=4),
        tnn.ReLU(),
        tnn.MaxPool2d(3, 2, ceil_mode=True),
        lrn(),
        tnn.Conv2d(96, 256, 5, padding=2, groups=2),
        tnn.ReLU(),
        tnn.MaxPool2d(3, 2, ceil_mode=True),
        lrn(),
        tnn.Conv2d(256, 384, 3, padding=1),
        tnn.ReLU(),
        tnn.Conv2d(384, 384, 3, padding=1, groups=2),
        tnn.ReLU(),
        tnn.Conv2d(384, 256, 3, padding=1, groups=2),
        tnn.ReLU(),
        tnn.MaxPool2d(3, 2, ceil_mode=True),
        tnn.Flatten(),
        tnn.Linear(256 * 6 * 6, 4096),
        tnn.ReLU(),
        tnn.Dropout(0.5),
        tnn.Linear(4096, 4096),
        tnn.ReLU(),
        tnn.Dropout(0.5),
        tnn.Linear(4096, 1000),
    )


PHASES = ("conv", "fc", "solver", "rest")
"""Parts of one iteration on both sides: the conv phase's forward and backward, the FC phase's
forward, loss and backward, the SGD update, and the rest of the step (the wall time not in those)."""


def split_torch(tnet):
    """(conv part, FC part) of a torch Sequential, cut at its Flatten as `Net.split_phases` cuts."""
    import torch.nn as tnn

    cut = next(i for i, m in enumerate(tnet) if isinstance(m, tnn.Flatten))
    return tnet[:cut], tnet[cut:]


def ours_step(conv, fc, solver, x, y, rng) -> dict[str, float]:
    """One dasknn iteration in its phases (Omnivore §II-B), timed part by part."""
    t0 = time.perf_counter()
    acts, caches = conv.forward(x, train=True, rng=rng)
    t1 = time.perf_counter()
    out = fc.train_step(acts, y, rng=rng, need_dx=True)
    t2 = time.perf_counter()
    _, grads = conv.backward(out["dx"], caches)
    grads.update(out["grads"])
    t3 = time.perf_counter()
    solver.step(solver_params(conv, fc), grads)
    t4 = time.perf_counter()
    return {"conv": (t1 - t0) + (t3 - t2), "fc": t2 - t1, "solver": t4 - t3, "total": t4 - t0}


def solver_params(conv, fc) -> dict:
    return {**conv.params, **fc.params}


def torch_step(tconv, tfc, opt, loss_fn, tx, ty) -> dict[str, float]:
    """One PyTorch iteration cut the same way: conv forward, FC forward+loss+backward (to the
    activations), conv backward, SGD step."""
    t0 = time.perf_counter()
    opt.zero_grad()
    acts = tconv(tx)
    t1 = time.perf_counter()
    cut = acts.detach().requires_grad_()
    loss_fn(tfc(cut), ty).backward()
    t2 = time.perf_counter()
    acts.backward(cut.grad)
    t3 = time.perf_counter()
    opt.step()
    t4 = time.perf_counter()
    return {"conv": (t1 - t0) + (t3 - t2), "fc": t2 - t1, "solver": t4 - t3, "total": t4 - t0}


def backends_available() -> list[str]:
    """The kernel backends this install can run: lowering always, oneDNN (and auto) when installed."""
    from dasknn.nn.onednn import available

    return ["lowering", "onednn", "auto"] if available() else ["lowering", "auto"]


def build_sides(name: str, backends: list[str], x, y, rng) -> tuple[dict, list[dict]]:
    """{side: one timed step} for every dasknn backend and PyTorch, and the backend each layer ran
    (at the thread count in force)."""
    import torch

    from dasknn.nn.onednn import net_backends

    shape, batch, classes = NETS[name]
    sides, layer_rows = {}, []
    for backend in backends:
        net = zoo.get_net(name, input_shape=shape, num_classes=classes, backend=backend)
        conv, fc = net.split_phases()
        solver = SGD.for_net(net, base_lr=1e-3, momentum=0.9, weight_decay=5e-4)
        sides[backend] = lambda conv=conv, fc=fc, solver=solver: ours_step(conv, fc, solver, x, y, rng)
        for row in net_backends(net, batch=batch):
            layer_rows.append({"net": name, "side": backend, **row})
    tnet = torch_net(name)
    tconv, tfc = split_torch(tnet)
    opt = torch.optim.SGD(tnet.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    loss_fn = torch.nn.CrossEntropyLoss()
    sides["torch"] = lambda: torch_step(tconv, tfc, opt, loss_fn, tx, ty)
    return sides, layer_rows


def thread_counts() -> dict[str, int]:
    """The threads each library runs with now: numpy's BLAS, oneDNN's OpenMP (as a kernel built now
    would get them) and PyTorch's."""
    import torch
    from threadpoolctl import threadpool_info

    from dasknn.nn.onednn import info as onednn_info

    blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    return {
        "blas_threads": max(blas, default=0),
        "onednn_threads": onednn_info().get("threads", 0),
        "torch_threads": torch.get_num_threads(),
    }


def at_threads(n: int):
    """A context in which dasknn (`backend.blas_threads`) and PyTorch compute on `n` threads."""
    import contextlib

    import torch

    from dasknn.backend import blas_threads

    stack = contextlib.ExitStack()
    stack.enter_context(blas_threads(n))
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    stack.callback(torch.set_num_threads, before)
    return stack


def bench(name: str, repeats: int, threads: list[int], backends: list[str]) -> tuple[list[dict], list[dict]]:
    """Rows (net, threads, side) with median and spread per phase, every side at every thread count
    timed once per round, rounds interleaved, and the backend that ran per layer."""
    shape, batch, classes = NETS[name]
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, classes, batch)
    counts, layer_rows = {}, []
    with at_threads(threads[0]):
        sides, layer_rows = build_sides(name, backends, x, y, rng)
    for n in threads:
        with at_threads(n):
            counts[n] = thread_counts()
            for _ in range(2 if name == "caffenet" else 3):
                for step in sides.values():
                    step()
    times = {(n, side): [] for n in threads for side in sides}
    for _ in range(repeats):  # interleaved rounds: every side at every thread count once per round
        for n in threads:
            with at_threads(n):
                for side, step in sides.items():
                    time.sleep(0.05)  # let the other library's idle threads stop spinning
                    t0 = time.perf_counter()
                    parts = step()
                    parts["wall"] = time.perf_counter() - t0
                    times[n, side].append(parts)
    medians = {key: 1e3 * float(np.median([t["wall"] for t in runs])) for key, runs in times.items()}
    rows = []
    for (n, side), runs in times.items():
        walls = 1e3 * np.array([t["wall"] for t in runs])
        parts = {p: 1e3 * np.median([t[p] for t in runs]) for p in ("conv", "fc", "solver")}
        parts["rest"] = 1e3 * np.median([t["wall"] - t["conv"] - t["fc"] - t["solver"] for t in runs])
        rows.append(
            {
                "net": name,
                "batch": batch,
                "side": side,
                "threads": n,
                **counts[n],
                "onednn_threads": counts[n]["onednn_threads"] if side in ("onednn", "auto") else 0,
                "runs": repeats,
                "ms": medians[n, side],
                "ms_min": float(walls.min()),
                "ms_max": float(walls.max()),
                **{f"{p}_ms": v for p, v in parts.items()},
                "ratio_over_torch": medians[n, side] / medians[n, "torch"],
                "scaling": medians[n, side] / medians[threads[0], side],
                "target": TARGETS.get(name, np.nan) if side == "auto" and n == 1 else np.nan,
            }
        )
    return rows, layer_rows


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = parser(__doc__)
    cli.add_argument("--repeats", type=int, default=30)
    cli.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="BLAS/oneDNN/torch thread counts, each timed in every round (default: 1 and all cores)",
    )
    cli.add_argument("--nets", nargs="+", choices=list(NETS), default=list(NETS))
    cli.add_argument(
        "--backends",
        nargs="+",
        choices=["lowering", "onednn", "auto"],
        default=None,
        help="dasknn's kernel backends to time (default: every one installed)",
    )
    args = cli.parse_args(argv)
    threads = args.threads or sorted({1, device_info()["cores"]})
    if min(threads) < 1:
        sys.exit(f"--threads must be >= 1; got {threads}")
    # oneDNN first: GNU OpenMP, which PyTorch and oneDNN share, reads its wait policy once, when it
    # loads; loaded by torch, it would spin by default rather than wait as dasknn sets it
    backends = backends_available()  # loads oneDNN
    backends = args.backends or backends
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("this benchmark compares against PyTorch: pip install 'dasknn[bench]' (or torch==2.13.0)")
    print(f"OpenMP wait policy (both sides): {os.environ.get('OMP_WAIT_POLICY', 'the default (spin)')}")
    rows, layers = [], []
    for name in args.nets:
        r, lr = bench(name, args.repeats, threads, backends)
        rows += r
        layers += lr
        print(pd.DataFrame(r).to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)
    table, layer_table = pd.DataFrame(rows), pd.DataFrame(layers)
    print(machine_line())
    print(layer_table.to_string(index=False))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        "targets ('auto' at 1 thread, ratio over PyTorch): LeNet <= 1.05, CIFAR-10 quick <= 1.1, "
        "CaffeNet <= 1.1; at 2 threads: CIFAR-10 quick scaling <= 0.65 and every net's ratio <= 1.0; "
        "medians of `runs` interleaved rounds, spread ms_min..ms_max"
    )
    stem = f"t{'-'.join(map(str, threads))}_{'-'.join(args.nets)}"
    write_tables(RESULTS, {f"bench_iteration_{stem}": table, f"backends_{stem}": layer_table})
    return table


if __name__ == "__main__":
    main()
