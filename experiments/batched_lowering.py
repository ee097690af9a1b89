"""Batched lowering: GEMM and conv time vs batch partition bp and BLAS threads; memory vs bp.

Mirrors Omnivore Fig. 4 (§III-B, appendix C-B) and Caffe con Troll Fig. 2 (§2.2):
the GEMM of CaffeNet/AlexNet's largest conv layer (conv2) for a batch of b = 256 images, run as
b/bp GEMMs of bp lowered images each. The papers found that (a) with bp = b the GEMM speeds up
almost linearly with cores up to 4 of 8 (16 threads slightly slower than 8: memory bandwidth),
(b) at 8 threads bp = 256 is 2× faster than bp = 1, and with bp = 1 more threads can even be
slower (CcT: 8 cores 4× slower than 1), and (c) the lowered matrix's memory grows linearly in bp,
so bp should be the largest that fits (on CPUs always b).

Here: the same layer (conv2, groups = 1: 27², d = 96, o = 256, k = 5, pad 2), b = 64 by default
(b = 256 needs 1.8 GB for D̂: `--batch 256`), bp = 1, 2, 4, ..., b, with 1 and 2 BLAS threads (this
machine has 2 cores). Two timings per point: the GEMM alone on D̂ already lowered (the papers'
measure) and `conv_forward` (lowering + GEMM + lifting). Memory: the lowered bytes `lowered_bytes`
predicts, those `conv_forward` allocated, and the peak traced allocation of one `conv_forward`.

What it found (b = 64, 2-core AMD EPYC, medians of 5 interleaved rounds). Quiet machine (load
average 0.6-3, 106 s): memory reproduces exactly: D̂ is 7 MB × bp (448 MB at bp = 64), what
`conv_forward` allocates equals `lowered_bytes`, and its peak grows linearly (82 → 570 MB). The
GEMM: with 2 threads bp ≥ 2 runs at 173-177 GFLOP/s against 131 at bp = 1 (1.36×; the paper: 2× at
8 threads); with 1 thread at 89 GFLOP/s for every bp (1.02×): this layer's single-image GEMM
(729 × 2400 × 256) is already large enough for one core. Threads at bp = b: 1.98× from 1 to 2
(near-linear, Fig. 4(a)), at bp = 1 only 1.48× (Fig. 2(b)'s effect, milder with 2 cores). The whole
`conv_forward` (lowering copy + GEMM + lifting) gets slower as bp grows (bp = 64: 0.70× of bp = 1
with 1 thread, 0.61× with 2): the lowering copy of hundreds of MB of fresh memory costs more than
the bigger GEMM saves here. A run under load 8-10 (386 s) gave GEMM 1.88× (2 threads) and 1.10×
(1 thread) for bp = 64 over bp = 1, 2 threads at bp = 1 slower than 1 (3.1 s vs 1.8 s), and no
thread speedup at bp = b. Partly reproduces: memory ∝ bp and the GEMM's gain from batching with
more threads yes; the conv as a whole does not gain from bp = b on this CPU.

    dasknn experiment batched_lowering [--batch 64] [--layer caffenet.conv2] [--repeats 5] [--tiny]

Writes experiments/results/batched_lowering/{batched_lowering.nc, batched_lowering.png, table.md}.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import device_info  # noqa: E402
from dasknn.nn.lowering import conv_forward, conv_output_size, lowered_bytes  # noqa: E402
from experiments.bench_lowering import LAYERS  # noqa: E402
from experiments.common import Experiment, main_for, markdown_table, stamp  # noqa: E402

NAME = "batched_lowering"
MIRRORS = "Omnivore Fig. 4 / Caffe con Troll Fig. 2"
BACKEND = "lowering"
"""The kernel backend measured: the papers' batched lowering, pinned (not "auto", which picks
oneDNN where it is installed; `dasknn.nn.onednn`)."""
VARIABLES = (
    "time_s",
    "gflops",
    "speedup_vs_bp1",
    "thread_speedup",
    "lowered_bytes",
    "lowered_bytes_measured",
    "peak_bytes",
)
PARTS = ("gemm", "conv_forward")


def median_seconds(step: Callable[[], object], repeats: int, max_seconds: float = 30.0) -> float:
    """Median wall time of `step` over `repeats` calls after one warm-up (fewer past `max_seconds`)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    step()
    times: list[float] = []
    while len(times) < repeats and (not times or sum(times) < max_seconds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def interleaved_medians(
    steps: dict[Hashable, Callable[[], object]],
    repeats: int,
    context: Callable[[Hashable], ContextManager] | None = None,
) -> dict[Hashable, float]:
    """Median wall time of each step, timed in rounds that run every step once (after a warm-up round).

    On a shared machine the load drifts over minutes; timing all the compared steps in each round,
    rather than one step's repeats back to back, exposes them to the same load. `context(key)`, if
    given, is entered around each call (e.g. a BLAS thread limit), outside the timed region.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[Hashable, list[float]] = {key: [] for key in steps}
    for round_ in range(repeats + 1):
        for key, step in steps.items():
            with context(key) if context is not None else nullcontext():
                t0 = time.perf_counter()
                step()
                dt = time.perf_counter() - t0
            if round_:
                times[key].append(dt)
    return {key: float(np.median(v)) for key, v in times.items()}


def blas_threads(n: int):
    """A context limiting numpy's BLAS to n threads (threadpoolctl)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=int(n), user_api="blas")


def partitions(batch: int) -> list[int]:
    """bp = 1, 2, 4, ... up to and including the batch size."""
    bps, bp = [], 1
    while bp < batch:
        bps.append(bp)
        bp *= 2
    return [*bps, batch]


def _check(layer: str, batch: int, threads: Sequence[int], repeats: int) -> None:
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; available: {sorted(LAYERS)}")
    if batch < 1 or repeats < 1 or not threads or min(threads) < 1:
        raise ValueError(f"need batch >= 1, repeats >= 1, threads >= 1; got {batch}, {repeats}, {threads}")


def measure(layer: str, batch: int, threads: Sequence[int], repeats: int) -> xr.Dataset:
    """Time per (threads, part, bp) and the memory per bp for one conv layer's forward pass."""
    _check(layer, batch, threads, repeats)
    c, o, k, stride, pad, h = LAYERS[layer]
    m = conv_output_size(h, k, stride, pad)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32) / np.float32(np.sqrt(c * k * k))
    bps = partitions(batch)
    gflop = 2.0 * batch * m * m * o * c * k * k / 1e9
    # D̂ of the whole batch, lowered once: the GEMM-alone timing multiplies slices of it
    _, cache = conv_forward(x, w, stride, pad, lowering="type1", bp=batch)
    rows = m * m
    buf = {"d_hat": cache.lowered, "k_hat_t": cache.k_hat.T, "r": np.empty((batch * rows, o), np.float32)}
    del cache

    def gemm(bp: int) -> Callable[[], object]:
        def step() -> object:
            for a in range(0, batch, bp):
                b = min(batch, a + bp)
                np.matmul(
                    buf["d_hat"][a * rows : b * rows], buf["k_hat_t"], out=buf["r"][a * rows : b * rows]
                )
            return buf["r"]

        return step

    def forward(bp: int) -> Callable[[], object]:
        return lambda: conv_forward(x, w, stride, pad, lowering="type1", bp=bp)

    steps = {
        (n, part, bp): make(bp)
        for n in threads
        for part, make in zip(PARTS, (gemm, forward), strict=True)
        for bp in bps
    }
    medians = interleaved_medians(steps, repeats, context=lambda key: blas_threads(key[0]))
    t = np.array([[[medians[(n, part, bp)] for bp in bps] for part in PARTS] for n in threads])
    buf.clear()  # free D̂ before the memory measurement
    image = (c, h, h)
    predicted = [lowered_bytes(image, w.shape, stride, pad, bp, "type1") for bp in bps]
    measured, peak = [], []
    for bp in bps:
        tracemalloc.start()
        _, cache = conv_forward(x, w, stride, pad, lowering="type1", bp=bp)
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        measured.append(cache.lowered_nbytes)
        del cache
    dims = ("threads", "part", "bp")
    ds = xr.Dataset(
        {
            "time_s": (dims, t, {"units": "s", "description": f"median time for all {batch} images"}),
            "gflops": (dims, gflop / t, {"units": "GFLOP/s", "description": "useful forward FLOPs / time"}),
            "speedup_vs_bp1": (
                dims,
                t[:, :, :1] / t,
                {"units": "1", "description": "time at bp = 1 over time at bp (same threads)"},
            ),
            "thread_speedup": (
                dims,
                t[:1] / t,
                {"units": "1", "description": f"time with {threads[0]} thread(s) over time with these"},
            ),
            "lowered_bytes": (
                ("bp",),
                np.asarray(predicted, np.int64),
                {"units": "B", "description": "D̂ bytes predicted by lowered_bytes (CcT §2.2)"},
            ),
            "lowered_bytes_measured": (
                ("bp",),
                np.asarray(measured, np.int64),
                {"units": "B", "description": "lowering buffers conv_forward allocated"},
            ),
            "peak_bytes": (
                ("bp",),
                np.asarray(peak, np.int64),
                {"units": "B", "description": "peak traced allocation of one conv_forward (tracemalloc)"},
            ),
        },
        coords={
            "threads": np.asarray(threads, np.int64),
            "part": list(PARTS),
            "bp": np.asarray(bps, np.int64),
        },
    )
    ds["threads"].attrs = {"units": "1", "description": "BLAS threads (threadpoolctl)"}
    ds["bp"].attrs = {"units": "images", "description": "images lowered per GEMM (batch partition)"}
    ds.attrs.update(layer=layer, batch=batch, gflop=gflop, repeats=repeats, lowering="type1")
    ds.attrs["shape"] = f"x ({batch}, {c}, {h}, {h}), w ({o}, {c}, {k}, {k}), stride {stride}, pad {pad}"
    return ds


def table(ds: xr.Dataset) -> str:
    """One row per (threads, bp): GEMM and conv_forward time, GFLOP/s, speedup over bp = 1, memory."""
    rows = []
    for n in ds["threads"].values:
        for bp in ds["bp"].values:
            sel = ds.sel(threads=n, bp=bp)
            rows.append(
                {
                    "threads": int(n),
                    "bp": int(bp),
                    "GEMM s": float(sel["time_s"].sel(part="gemm")),
                    "GEMM GFLOP/s": float(sel["gflops"].sel(part="gemm")),
                    "GEMM speedup vs bp=1": float(sel["speedup_vs_bp1"].sel(part="gemm")),
                    "conv fwd s": float(sel["time_s"].sel(part="conv_forward")),
                    "conv fwd speedup vs bp=1": float(sel["speedup_vs_bp1"].sel(part="conv_forward")),
                    "D̂ MB (predicted)": float(sel["lowered_bytes"]) / 1e6,
                    "D̂ MB (allocated)": float(sel["lowered_bytes_measured"]) / 1e6,
                    "peak MB": float(sel["peak_bytes"]) / 1e6,
                }
            )
    return markdown_table(pd.DataFrame(rows))


def plot(ds: xr.Dataset, fig) -> None:
    """(a) GEMM time vs threads at bp = b, (b) speedup over bp = 1 vs bp, (c) memory vs bp."""
    fig.set_size_inches(12, 4)
    ax1, ax2, ax3 = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    b = int(ds["bp"].values[-1])
    for part, style in zip(PARTS, ("o-", "s--"), strict=True):
        ax1.plot(ds["threads"], ds["time_s"].sel(part=part, bp=b), style, label=part)
    ax1.set_xlabel("BLAS threads")
    ax1.set_ylabel(f"time for {b} images (s), bp = {b}")
    ax1.set_title("(a) threads")
    ax1.legend()
    for n in ds["threads"].values:
        for part, style in zip(PARTS, ("o-", "s--"), strict=True):
            ax2.plot(
                ds["bp"], ds["speedup_vs_bp1"].sel(threads=n, part=part), style, label=f"{part}, {n} thr"
            )
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("bp (images per GEMM)")
    ax2.set_ylabel("speedup over bp = 1")
    ax2.set_title("(b) batch partition")
    ax2.legend(fontsize=7)
    ax3.plot(ds["bp"], ds["lowered_bytes"] / 1e6, "k-", label="D̂ predicted")
    ax3.plot(ds["bp"], ds["lowered_bytes_measured"] / 1e6, "o", label="D̂ allocated")
    ax3.plot(ds["bp"], ds["peak_bytes"] / 1e6, "s", label="peak of conv_forward")
    ax3.set_xlabel("bp (images per GEMM)")
    ax3.set_ylabel("MB")
    ax3.set_title("(c) memory")
    ax3.legend(fontsize=7)
    fig.suptitle(f"Batched lowering, {ds.attrs['layer']} (cf. Omnivore Fig. 4)")


def run(
    tiny: bool = False,
    layer: str = "caffenet.conv2",
    batch: int = 64,
    threads: Sequence[int] | None = None,
    repeats: int = 5,
) -> Experiment:
    """Measure layer `layer` at batch `batch` for every bp and thread count (tiny: LeNet conv2, b = 8)."""
    cores = int(device_info()["cores"])
    threads = sorted({int(n) for n in (threads or range(1, cores + 1))})
    if tiny:
        layer, batch, repeats = "lenet.conv2", 8, 1
    ds = stamp(measure(layer, batch, threads, repeats), NAME, MIRRORS, tiny)
    b = int(ds["bp"].values[-1])
    gemm = ds.sel(part="gemm", bp=b)
    notes = [
        f"{ds.attrs['shape']}; {ds.attrs['gflop']:.1f} GFLOP forward; medians of {repeats}.",
        f"GEMM at bp = b: {float(gemm['gflops'].max()):.0f} GFLOP/s at best; "
        f"speedup of bp = {b} over bp = 1: "
        + ", ".join(
            f"{int(n)} thread(s) {float(ds['speedup_vs_bp1'].sel(threads=n, part='gemm', bp=b)):.2f}×"
            for n in ds["threads"].values
        ),
        "Timings on a shared 2-core machine are noisy (other processes run beside it).",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [
        (("--layer",), {"default": "caffenet.conv2", "choices": sorted(LAYERS), "help": "conv layer"}),
        (("--batch",), {"type": int, "default": 64, "help": "batch size b (bp runs 1, 2, 4, ..., b)"}),
        (("--threads",), {"type": int, "nargs": "+", "help": "BLAS thread counts (default 1..cores)"}),
        (("--repeats",), {"type": int, "default": 5, "help": "timed rounds (median per point)"}),
    ],
)

if __name__ == "__main__":
    sys.exit(main())
