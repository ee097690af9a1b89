"""Benchmark: a GPU worker's training iteration against PyTorch's on the same GPU.

Three sides per net, timed in the same run, repetitions interleaved (each repetition times every
side once), all on one CUDA device:

- `torch`: the same architecture in PyTorch (`bench_iteration.torch_net`), its batches already on
  the device, SGD with momentum and weight decay; one iteration = zero_grad, forward, loss,
  backward, step, then `torch.cuda.synchronize()`;
- `cupy`: dasknn's own maths on CuPy arrays in this process (`Net.to(cupy)`, `nn.train.train_step`,
  the batches on the device, a device synchronize per iteration): what the kernels cost, no engine;
- `engine`: `DaskEngine` with one group on one dask worker with resource GPU=1 (the GPU path:
  `DeviceNet`, the FC server on the worker's device), its steady time per iteration from the run's
  trace (`bench_overhead.engine_run`): what a GPU worker in a fit costs, host↔device copies,
  tasks, actors and the batch reader included.

The same nets and batches as `bench_overhead` (LeNet b = 64 on 28×28 digits, CIFAR-10 quick
b = 128 on synthetic 3×32×32). Medians over `--reps` repetitions of `--iterations` iterations each;
the table gives ms per iteration and the ratio over PyTorch's median (above 1: dasknn is slower).

    python -m experiments.bench_gpu_torch [--reps 5] [--iterations 40]

Needs CuPy, PyTorch with CUDA and a GPU. Writes experiments/results/bench_gpu_torch/table.csv.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import cupy_available  # noqa: E402
from dasknn.engine.dask import DaskEngine  # noqa: E402
from dasknn.nn.solver import SGD  # noqa: E402
from dasknn.nn.train import train_step  # noqa: E402
from experiments import bench_iteration, bench_overhead, common  # noqa: E402

RESULTS = common.RESULTS_ROOT / "bench_gpu_torch"
ZOO_NAME = {"LeNet": "lenet", "CIFAR-10 quick": "cifar10_quick"}


def device_batches(Xn: np.ndarray, yn: np.ndarray, batch_size: int, n: int, module) -> list[tuple]:
    """`n` batches of (images, labels) in order, on the device of `module` (cupy or torch)."""
    out = []
    for b in range(n):
        idx = np.arange(b * batch_size, (b + 1) * batch_size) % len(Xn)
        x, y = np.ascontiguousarray(Xn[idx], dtype=np.float32), yn[idx].astype(np.int64)
        if module.__name__ == "torch":
            out.append((module.from_numpy(x).cuda(), module.from_numpy(y).cuda()))
        else:
            out.append((module.asarray(x), module.asarray(y)))
    return out


def torch_side(case, batches):
    """A function timing `len(batches)` PyTorch iterations (s per iteration)."""
    import torch

    tnet = bench_iteration.torch_net(ZOO_NAME[case.name]).cuda()
    cfg = case.config()
    opt = torch.optim.SGD(tnet.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()

    def run() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            loss_fn(tnet(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(batches)

    return run


def cupy_side(case, batches):
    """A function timing dasknn's own maths on CuPy in this process (s per iteration)."""
    import cupy

    cfg = case.config()
    net = case.make_net().to(cupy)
    solver = SGD.for_net(net, base_lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def run() -> float:
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for x, y in batches:
            train_step(net, solver, x, y, lr=cfg.lr, momentum=cfg.momentum)
        cupy.cuda.Device().synchronize()
        return (time.perf_counter() - t0) / len(batches)

    return run


def bench(reps: int, iterations: int) -> pd.DataFrame:
    import cupy
    import torch

    rows = []
    with bench_overhead.cluster({}, gpu=True) as client:
        engine = DaskEngine(client, blas_threads=1)
        for case in bench_overhead.CASES:
            X, y = client.persist(list(case.data()))
            Xn, yn = X.compute(), y.compute()
            sides = {
                "torch": torch_side(case, device_batches(Xn, yn, case.batch_size, iterations, torch)),
                "cupy": cupy_side(case, device_batches(Xn, yn, case.batch_size, iterations, cupy)),
                "engine": lambda case=case, X=X, y=y: bench_overhead.engine_run(
                    client, engine, case, X, y, iterations
                )["engine_s_per_iter"],
            }
            for run in sides.values():  # warm-up: kernels compiled, cuDNN plans, the worker's net
                run()
            times: dict[str, list[float]] = {side: [] for side in sides}
            for rep in range(reps):
                for side, run in sides.items():
                    times[side].append(run())
                print(
                    f"  {case.name} rep {rep}: "
                    + ", ".join(f"{s} {1e3 * t[-1]:.2f} ms" for s, t in times.items()),
                    flush=True,
                )
            ref = float(np.median(times["torch"]))
            for side, ts in times.items():
                rows.append(
                    {
                        "net": case.name,
                        "batch_size": case.batch_size,
                        "side": side,
                        "reps": reps,
                        "iterations": iterations,
                        "ms_per_iter": 1e3 * float(np.median(ts)),
                        "ms_min": 1e3 * min(ts),
                        "ms_max": 1e3 * max(ts),
                        "ratio_over_torch": float(np.median(ts)) / ref,
                    }
                )
            client.cancel([X, y])
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cli = common.parser(__doc__)
    cli.add_argument("--reps", type=int, default=5)
    cli.add_argument("--iterations", type=int, default=40)
    args = cli.parse_args(argv)
    try:
        import torch
    except ImportError:
        cli.error("this benchmark compares against PyTorch: install torch with CUDA")
    if not (cupy_available() and torch.cuda.is_available()):
        cli.error("needs CuPy, PyTorch with CUDA and a CUDA GPU on this machine")
    gpu = torch.cuda.get_device_name(0)
    print(common.machine_line(), f"| GPU: {gpu}, torch {torch.__version__}", flush=True)
    table = bench(args.reps, args.iterations)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    common.write_tables(RESULTS, {"table": table})
    return table


if __name__ == "__main__":
    main()
