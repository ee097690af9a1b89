"""Benchmark of batched lowering: conv forward+backward speed against SGEMM, bp = 1 and PyTorch.

Caffe con Troll §2.2: lowering a batch partition of bp images into one GEMM runs convolutions near
the device's GEMM speed, much faster than one image per GEMM (Caffe's way). For the LeNet and
CaffeNet conv layers (and CIFAR-10 quick's) at several batch sizes this prints, per layer: the
median time of `conv_forward` + `conv_backward` (dx and dW) with the default partition
(`default_bp`, column bp), its GFLOP/s (useful FLOPs, 3 · 2·N·m²·o·d·k²), the percentage of SGEMM
GFLOP/s measured in the same run, the lowering "auto" chose, the speedup over bp = 1, and PyTorch's
conv2d forward+backward time over ours where torch imports, both sides on --threads threads.

    python experiments/bench_lowering.py [--quick] [--batch 16 64 128] [--repeats 5] [--threads N]
    python -m experiments.bench_lowering

Writes a CSV under experiments/results/bench_lowering/. Timings on a shared machine are noisy, so
every number is a median of repeats, and "% SGEMM" (pct_sgemm) is against an SGEMM probe timed
right after each of our runs (see `median_times`); pct_sgemm_best, the conservative figure, is
against the best SGEMM seen in the run (`sgemm_gflops()` at the start, or any probe).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import blas_threads, device_info, sgemm_gflops  # noqa: E402
from dasknn.nn.lowering import (  # noqa: E402
    choose_lowering,
    conv_backward,
    conv_forward,
    conv_output_size,
    default_bp,
)

# name: (C, O, k, stride, pad, H=W) -- LeNet (Caffe's MNIST example) and CaffeNet, groups = 1.
LAYERS = {
    "lenet.conv1": (1, 20, 5, 1, 0, 28),
    "lenet.conv2": (20, 50, 5, 1, 0, 12),
    "cifar10_quick.conv1": (3, 32, 5, 1, 2, 32),
    "cifar10_quick.conv2": (32, 32, 5, 1, 2, 16),
    "cifar10_quick.conv3": (32, 64, 5, 1, 2, 8),
    "caffenet.conv1": (3, 96, 11, 4, 0, 227),
    "caffenet.conv2": (96, 256, 5, 1, 2, 27),
    "caffenet.conv3": (256, 384, 3, 1, 1, 13),
    "caffenet.conv4": (384, 384, 3, 1, 1, 13),
    "caffenet.conv5": (384, 256, 3, 1, 1, 13),
}
TARGET_LAYERS = ("caffenet.conv2", "caffenet.conv3", "caffenet.conv4", "caffenet.conv5")
TARGET_BATCH, TARGET_PCT = 64, 85.0
BP1_MAX_GFLOP = 200.0
"""bp = 1 is skipped where one forward+backward is more useful GFLOP than this (b = 256 on CaffeNet
conv2-conv5), to keep the default run under ~10 minutes."""
RESULTS = Path(__file__).resolve().parent / "results" / "bench_lowering"
Step = Callable[[], object]
SHOWN = ["layer", "batch", "lowering", "bp", "gflop", "time_s", "gflops", "pct_sgemm", "pct_sgemm_best"]
SHOWN += ["speedup_vs_bp1", "torch_time_over_ours"]


SETTLE_S = 0.2
"""Pause before a step of the other library (numpy/torch): idle BLAS and OpenMP threads spin for a
while after a call and, measured here, slow the other library's next call up to 50× on small layers."""
SGEMM_N = 1024


def median_times(steps: dict[str, tuple[str, Step]], repeats: int, max_seconds: float = 20.0) -> dict:
    """Median seconds of each (library, step), and "sgemm": the SGEMM GFLOP/s around the first step.

    Each step runs as a block: one warm-up call, then up to `repeats` timed calls back to back (at
    least 3; fewer once `max_seconds` have passed). Back to back, because on the dev VM fresh memory
    costs far more to touch once a few seconds have passed since the process freed it (448 MB:
    ~0.09 s just after, 0.6-0.9 s after 3 s), which would tax whichever step allocates big buffers
    after the others ran; a training loop reuses its memory at once. After each timed call of the
    first step, an SGEMM probe (best of three SGEMM_N³ products, no allocation) measures the GEMM
    speed of that moment, so "% of SGEMM" compares the two under the same load from other processes.
    """
    a = np.random.default_rng(1).standard_normal((SGEMM_N, SGEMM_N), dtype=np.float32)
    out = np.empty_like(a)
    medians: dict[str, float] = {}
    probes: list[float] = []
    previous = None
    for name, (library, step) in steps.items():
        if library != previous:
            time.sleep(SETTLE_S)
        previous = library
        step()
        times: list[float] = []
        while len(times) < repeats and (len(times) < 3 or sum(times) < max_seconds):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            if not medians:  # the first step: probe SGEMM right after it
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    np.matmul(a, a, out=out)
                    best = min(best, time.perf_counter() - t0)
                probes.append(2.0 * SGEMM_N**3 / best / 1e9)
        medians[name] = float(np.median(times))
    medians["sgemm"] = float(np.median(probes))
    return medians


def ours(x: np.ndarray, w: np.ndarray, stride: int, pad: int, bp: int | None, dy: np.ndarray) -> Step:
    """dasknn conv_forward + conv_backward (dx and dW) with bp images per GEMM (None: default_bp)."""

    def step() -> object:
        _, cache = conv_forward(x, w, stride, pad, lowering="auto", bp=bp)
        return conv_backward(dy, cache)

    return step


def torch_step(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dy: np.ndarray) -> Step | None:
    """PyTorch conv2d forward + autograd backward (dx and dW) on the same float32 arrays, or None."""
    try:
        import torch
    except ImportError:
        return None
    xt = torch.from_numpy(x).requires_grad_(True)
    wt = torch.from_numpy(w).requires_grad_(True)
    dyt = torch.from_numpy(dy)

    def step() -> object:
        xt.grad = wt.grad = None
        torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad).backward(dyt)
        return xt.grad, wt.grad

    return step


def bench_layer(name: str, batch: int, repeats: int) -> dict[str, object]:
    """One row of the table: layer `name` at batch size `batch`."""
    c, o, k, stride, pad, h = LAYERS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32) * np.float32(1.0 / np.sqrt(c * k * k))
    m = conv_output_size(h, k, stride, pad)
    dy = rng.standard_normal((batch, o, m, m), dtype=np.float32)
    gflop = 3 * 2 * batch * m * m * o * c * k * k / 1e9
    steps = {"ours": ("numpy", ours(x, w, stride, pad, None, dy))}
    if 1 < batch and gflop <= BP1_MAX_GFLOP:
        steps["bp1"] = ("numpy", ours(x, w, stride, pad, 1, dy))
    reference = torch_step(x, w, stride, pad, dy)
    if reference is not None:
        steps["torch"] = ("torch", reference)
    t = median_times(steps, repeats)
    row: dict[str, object] = {
        "layer": name,
        "batch": batch,
        "lowering": choose_lowering(x.shape, w.shape, stride, pad),
        "bp": default_bp(x.shape, w.shape, stride, pad, choose_lowering(x.shape, w.shape, stride, pad)),
        "gflop": round(gflop, 3),
        "time_s": t["ours"],
        "gflops": gflop / t["ours"],
        "sgemm_gflops": t["sgemm"],
        "pct_sgemm": 100 * gflop / t["ours"] / t["sgemm"],
        "time_bp1_s": t["ours"] if batch == 1 else t.get("bp1", np.nan),
        "time_torch_s": t.get("torch", np.nan),
    }
    row["speedup_vs_bp1"] = row["time_bp1_s"] / t["ours"]
    row["torch_time_over_ours"] = row["time_torch_s"] / t["ours"]
    return row


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches 1 and 16, 3 repeats (~1 minute)")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 1 16 64 256)")
    parser.add_argument("--threads", type=int, help="BLAS and torch threads (default: all cores)")
    parser.add_argument("--layers", nargs="+", choices=list(LAYERS), default=list(LAYERS))
    parser.add_argument("--repeats", type=int, help="timed runs per number (default 5, quick 3)")
    args = parser.parse_args(argv)
    batches = args.batch or ([1, 16] if args.quick else [1, 16, 64, 256])
    repeats = args.repeats or (3 if args.quick else 5)

    info = device_info()
    threads = args.threads or int(info["cores"])
    try:
        import torch

        torch.set_num_threads(threads)
        torch_version = f"{torch.__version__} on {torch.get_num_threads()} threads"
    except ImportError:
        torch_version = "not installed (no torch column)"
    with blas_threads(threads):
        sgemm = sgemm_gflops()
        print(f"machine: {info}; load average (1, 5, 15 min): {os.getloadavg()}")
        print(f"SGEMM (numpy, n=1024, {threads} BLAS threads): {sgemm:.1f} GFLOP/s; torch: {torch_version}")
        print(f"repeats: {repeats} (median)")
        table = _run(batches, repeats, args.layers)
    table["threads"] = threads
    return _report(table, info, sgemm)


def _run(batches: list[int], repeats: int, layers: list[str]) -> pd.DataFrame:
    rows = []
    for batch in batches:
        for name in layers:
            rows.append(bench_layer(name, batch, repeats))
            gflops, pct = rows[-1]["gflops"], rows[-1]["pct_sgemm"]
            print(f"  {name:15s} b={batch:<4d} {gflops:7.1f} GFLOP/s  {pct:5.1f}% SGEMM", flush=True)
    return pd.DataFrame(rows)


def _report(table: pd.DataFrame, info: dict, sgemm: float) -> pd.DataFrame:
    table["cpu"], table["cores"], table["sgemm_gflops_start"] = info["model"], info["cores"], sgemm
    best_sgemm = max(sgemm, table["sgemm_gflops"].max())
    table.insert(table.columns.get_loc("pct_sgemm") + 1, "pct_sgemm_best", 100 * table["gflops"] / best_sgemm)

    shown = table[[*SHOWN, "time_bp1_s", "time_torch_s"]]
    print()
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    skipped = table[(table["batch"] > 1) & table["time_bp1_s"].isna()]
    if len(skipped):
        print(
            f"\nbp=1 skipped (one pass > {BP1_MAX_GFLOP:g} GFLOP, for run time): "
            + ", ".join(f"{r.layer} b={r.batch}" for r in skipped.itertuples())
        )
    target = table[table["layer"].isin(TARGET_LAYERS) & (table["batch"] == TARGET_BATCH)]
    if len(target):  # FLOPs over the FLOPs SGEMM would have done in the same time, layer by layer
        pct = 100 * target["gflop"].sum() / (target["time_s"] * target["sgemm_gflops"]).sum()
        pct_best = 100 * target["gflop"].sum() / target["time_s"].sum() / best_sgemm
        print(
            f"\nCaffeNet conv2-conv5 at b={TARGET_BATCH} (target {TARGET_PCT:g}%): {pct:.1f}% of SGEMM "
            f"(probes), {pct_best:.1f}% of the best SGEMM of the run ({best_sgemm:.0f} GFLOP/s); per layer "
            + ", ".join(f"{p:.0f}%" for p in target["pct_sgemm"])
        )

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"bench_lowering_{datetime.now():%Y%m%d_%H%M%S}.csv"
    table.to_csv(path, index=False)
    print(f"\nwrote {path}")
    return table


if __name__ == "__main__":
    main()
