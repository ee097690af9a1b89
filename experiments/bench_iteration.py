"""Benchmark: one full training iteration (forward, backward, SGD update) of dasknn vs PyTorch.

The CNN-engine issue's target: a LeNet iteration at batch 64 within 1.3× of PyTorch CPU's time
(goal: faster). Same net shapes (Caffe's LeNet; CIFAR-10 quick as a second net), same batch, same
SGD with momentum and weight decay, same number of threads, timed alternately in one run; the
table reports medians and the ratio dasknn / PyTorch (below 1 means dasknn is faster).

    python -m experiments.bench_iteration [--repeats 30] [--threads N]

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
NETS = {"lenet": ((1, 28, 28), 64), "cifar10_quick": ((3, 32, 32), 128)}


def torch_net(name: str):
    """The same architecture in PyTorch (Caffe's ceil-mode pooling)."""
    import torch.nn as tnn

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


def bench(name: str, repeats: int, threads: int) -> dict:
    import torch
    from threadpoolctl import threadpool_limits

    shape, batch = NETS[name]
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    net = zoo.get_net(name, input_shape=shape, num_classes=10)
    solver = SGD.for_net(net, base_lr=1e-3, momentum=0.9, weight_decay=5e-4)
    torch.set_num_threads(threads)
    tnet = torch_net(name)
    opt = torch.optim.SGD(tnet.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    loss_fn = torch.nn.CrossEntropyLoss()

    def ours():
        train_step(net, solver, x, y)

    def theirs():
        opt.zero_grad()
        loss_fn(tnet(tx), ty).backward()
        opt.step()

    times = {"dasknn": [], "torch": []}
    with threadpool_limits(limits=threads):
        for _ in range(3):
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
        "threads": threads,
        "dasknn_ms": ours_ms,
        "torch_ms": torch_ms,
        "ratio_dasknn_over_torch": ours_ms / torch_ms,
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = parser(__doc__)
    cli.add_argument("--repeats", type=int, default=30)
    cli.add_argument("--threads", type=int, default=None, help="BLAS/torch threads (default: all cores)")
    args = cli.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("this benchmark compares against PyTorch: pip install 'dasknn[bench]' (or torch==2.13.0)")
    threads = args.threads or device_info()["cores"]
    table = pd.DataFrame([bench(name, args.repeats, threads) for name in NETS])
    print(machine_line())
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("target: LeNet ratio <= 1.3 (goal < 1.0)")
    write_tables(RESULTS, {"bench_iteration": table})
    return table


if __name__ == "__main__":
    main()
