"""Benchmark: one full training iteration (forward, backward, SGD update) of dasknn vs PyTorch.

Targets: LeNet (b = 64) within 1.0× of PyTorch CPU's time, CIFAR-10 quick (b = 128) within 1.5×
(goal 1.0×); CaffeNet (b = 32, 1000 classes) for reference. Same net shapes, same batch, same SGD
with momentum and weight decay, the same number of threads on both sides (numpy's BLAS through
threadpoolctl, torch.set_num_threads; both printed), timed alternately in one run; the table
reports medians and the ratio dasknn / PyTorch (below 1 means dasknn is faster).

    python -m experiments.bench_iteration [--repeats 30] [--threads N] [--nets lenet cifar10_quick caffenet]

Writes experiments/results/bench_iteration/bench_iteration.csv.
"""

from __future__ import annotations

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
from dasknn.nn.train import train_step  # noqa: E402
from experiments.common import RESULTS_ROOT, machine_line, parser, write_tables  # noqa: E402

RESULTS = RESULTS_ROOT / "bench_iteration"
NETS = {
    "lenet": ((1, 28, 28), 64, 10),
    "cifar10_quick": ((3, 32, 32), 128, 10),
    "caffenet": ((3, 227, 227), 32, 1000),
}
TARGETS = {"lenet": 1.0, "cifar10_quick": 1.5}
CAFFENET_REPEATS = 5
"""CaffeNet iterations take seconds each: at most this many timed runs per side."""


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


def bench(name: str, repeats: int, threads: int) -> dict:
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    shape, batch, classes = NETS[name]
    if name == "caffenet":
        repeats = min(repeats, CAFFENET_REPEATS)
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, classes, batch)
    net = zoo.get_net(name, input_shape=shape, num_classes=classes)
    solver = SGD.for_net(net, base_lr=1e-3, momentum=0.9, weight_decay=5e-4)
    torch.set_num_threads(threads)
    tnet = torch_net(name)
    opt = torch.optim.SGD(tnet.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    loss_fn = torch.nn.CrossEntropyLoss()

    def ours():
        train_step(net, solver, x, y, rng=rng)  # dropout (CaffeNet) draws from a seeded stream

    def theirs():
        opt.zero_grad()
        loss_fn(tnet(tx), ty).backward()
        opt.step()

    times = {"dasknn": [], "torch": []}
    with threadpool_limits(limits=threads):
        blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        for _ in range(2 if name == "caffenet" else 3):
            ours()
            theirs()
        for _ in range(repeats):
            for key, step in (("dasknn", ours), ("torch", theirs)):
                time.sleep(0.05)  # let the other library's idle threads stop spinning
                t0 = time.perf_counter()
                step()
                times[key].append(time.perf_counter() - t0)
    ours_ms, torch_ms = 1e3 * np.median(times["dasknn"]), 1e3 * np.median(times["torch"])
    return {
        "net": name,
        "batch": batch,
        "dasknn_blas_threads": max(blas, default=0),
        "torch_threads": torch.get_num_threads(),
        "runs": repeats,
        "dasknn_ms": ours_ms,
        "torch_ms": torch_ms,
        "ratio_dasknn_over_torch": ours_ms / torch_ms,
        "target": TARGETS.get(name, np.nan),
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = parser(__doc__)
    cli.add_argument("--repeats", type=int, default=30)
    cli.add_argument("--threads", type=int, default=None, help="BLAS/torch threads (default: all cores)")
    cli.add_argument("--nets", nargs="+", choices=list(NETS), default=list(NETS))
    args = cli.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("this benchmark compares against PyTorch: pip install 'dasknn[bench]' (or torch==2.13.0)")
    threads = args.threads or device_info()["cores"]
    table = pd.DataFrame([bench(name, args.repeats, threads) for name in args.nets])
    print(machine_line())
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("targets: LeNet ratio <= 1.0; CIFAR-10 quick <= 1.5 (goal 1.0); medians of `runs` per side")
    write_tables(RESULTS, {"bench_iteration": table})
    return table


if __name__ == "__main__":
    main()
