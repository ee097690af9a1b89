"""Lowering types: Type 1/2/3 forward+backward time as d/o varies, and where `auto` chooses.

Mirrors Caffe con Troll Fig. 8 (Appendix A; cost model Fig. 6): with the other sizes
fixed, the three lowerings of a k×k convolution over d input and o output channels move different
bytes (∝ k²d + o for Type 1, k(d + o) for Type 2, d + k²o for Type 3), so the ratio d/o decides:
Type 3 wins when d/o is large (few outputs), Type 1 when it is small, by up to an order of
magnitude at the extremes; on common CNNs d/o lies in a narrow band, so the choice matters little.

Here: two layer shapes as in `choose_lowering`'s calibration (k = 3 on 13² with pad 1, batch 32,
d·o = 2¹⁶; k = 5 on 27² with pad 2, batch 16, d·o = 2¹⁴), d/o from 1/16 to 64 with d·o fixed (so
FLOPs are fixed), forward + backward (dx and dW) with each lowering and with "auto"; GFLOP/s counts
the useful FLOPs 3·2·b·m²·o·d·k² (Type 3 also computes the padded border, which it pays for).

What it found (2-core AMD EPYC, medians of 5 interleaved rounds). Quiet machine (load average
< 2, 102 s): the d/o trend reproduces: Type 1's time over Type 3's rises steadily with d/o,
0.48 → 1.36 (k = 3) and 0.29 → 4.3 (k = 5) from d/o = 1/16 to 64; Type 1 is the fastest up to
d/o = 2 (k = 3) or 1 (k = 5), Type 2 in between, Type 3 from d/o = 16 (k = 3) or 8 (k = 5), and the
spread between the best and worst type reaches 4.3× (k = 5, d/o = 64; 3.5× at 1/16). `auto` (Type 1 to
d/o = 2, Type 3 from 16) picked the fastest in 14 of 16 points, at a median 1.01× and at most 1.14×
the best time. A run under load (load average ~10, 795 s, every GFLOP/s 3-8× lower) kept the trend
(Type 1 / Type 3 0.58 → 5.2 and 0.61 → 7.8) but Type 2 won 13 of 16 points and `auto` only 7
(median 1.24× the best): the k²-fold D̂ of Type 1 suffers most when memory bandwidth is shared.
Reproduces (the trend, and where `auto` switches), less steeply than the paper's order of magnitude.

    dasknn experiment lowering_types [--repeats 5] [--tiny]

Writes experiments/results/lowering_types/{lowering_types.nc, lowering_types.png, table.md}.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.nn.lowering import (  # noqa: E402
    LOWERINGS,
    choose_lowering,
    conv_backward,
    conv_forward,
    conv_output_size,
    lowered_bytes,
)
from experiments.batched_lowering import interleaved_medians  # noqa: E402
from experiments.common import Experiment, main_for, markdown_table, stamp  # noqa: E402

NAME = "lowering_types"
MIRRORS = "Caffe con Troll Fig. 8"
BACKEND = "lowering"
"""The kernel backend measured: the papers' batched lowering, pinned (not "auto", which picks
oneDNN where it is installed; `dasknn.nn.onednn`)."""
VARIABLES = ("time_s", "gflops", "auto_time_s", "auto_over_best", "type1_over_type3", "lowered_bytes")

# name: (k, H = W, pad, batch, log2(d·o))
SHAPES = {"k3_13x13": (3, 13, 1, 32, 16), "k5_27x27": (5, 27, 2, 16, 14)}
TINY_SHAPES = {"k3_8x8": (3, 8, 1, 4, 10)}
RATIOS = (1 / 16, 1 / 4, 1, 2, 4, 8, 16, 64)
TINY_RATIOS = (1 / 4, 4, 64)


def channels(log2_product: int, ratio: float) -> tuple[int, int]:
    """(d, o) with d·o ≈ 2^log2_product and d/o ≈ ratio (rounded to integers ≥ 1)."""
    d = max(1, round(math.sqrt(2.0**log2_product * ratio)))
    o = max(1, round(2.0**log2_product / d))
    return d, o


def measure(shapes: dict, ratios: tuple[float, ...], repeats: int) -> xr.Dataset:
    """Time of forward + backward per (shape, ratio, lowering), and `auto`'s choice and time."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ns, nr, nl = len(shapes), len(ratios), len(LOWERINGS)
    t = np.full((ns, nr, nl), np.nan)
    auto_t = np.full((ns, nr), np.nan)
    nbytes = np.zeros((ns, nr, nl), np.int64)
    gflop = np.zeros((ns, nr))
    d_arr, o_arr = np.zeros((ns, nr), np.int64), np.zeros((ns, nr), np.int64)
    auto = np.empty((ns, nr), dtype=object)
    rng = np.random.default_rng(0)
    for si, (k, h, pad, batch, log2p) in enumerate(shapes.values()):
        m = conv_output_size(h, k, 1, pad)
        for ri, ratio in enumerate(ratios):
            d, o = channels(log2p, ratio)
            d_arr[si, ri], o_arr[si, ri] = d, o
            x = rng.standard_normal((batch, d, h, h), dtype=np.float32)
            w = rng.standard_normal((o, d, k, k), dtype=np.float32) / np.float32(math.sqrt(d * k * k))
            dy = rng.standard_normal((batch, o, m, m), dtype=np.float32)
            gflop[si, ri] = 3 * 2.0 * batch * m * m * o * d * k * k / 1e9
            auto[si, ri] = choose_lowering(x.shape, w.shape, 1, pad)

            def step(lowering: str, x=x, w=w, dy=dy, pad=pad) -> object:
                _, cache = conv_forward(x, w, 1, pad, lowering=lowering)
                return conv_backward(dy, cache)

            steps = {lw: (lambda lw=lw: step(lw)) for lw in (*LOWERINGS, "auto")}
            medians = interleaved_medians(steps, repeats)  # the four timed under the same load
            for li, lowering in enumerate(LOWERINGS):
                t[si, ri, li] = medians[lowering]
                nbytes[si, ri, li] = lowered_bytes((d, h, h), w.shape, 1, pad, batch, lowering)
            auto_t[si, ri] = medians["auto"]
    dims = ("shape", "ratio", "lowering")
    best = t.min(axis=2)
    ds = xr.Dataset(
        {
            "time_s": (dims, t, {"units": "s", "description": "median forward + backward (dx, dW) time"}),
            "gflops": (
                dims,
                gflop[:, :, None] / t,
                {"units": "GFLOP/s", "description": "useful FLOPs 3·2·b·m²·o·d·k² / time"},
            ),
            "auto_time_s": (
                ("shape", "ratio"),
                auto_t,
                {"units": "s", "description": "median time with lowering='auto'"},
            ),
            "auto_lowering": (
                ("shape", "ratio"),
                auto.astype(str),
                {"description": "what choose_lowering picks"},
            ),
            "fastest_lowering": (
                ("shape", "ratio"),
                np.asarray(LOWERINGS)[t.argmin(axis=2)],
                {"description": "the lowering with the least measured time"},
            ),
            "auto_over_best": (
                ("shape", "ratio"),
                auto_t / best,
                {"units": "1", "description": "auto's time over the fastest lowering's (1 = best)"},
            ),
            "type1_over_type3": (
                ("shape", "ratio"),
                t[:, :, 0] / t[:, :, 2],
                {"units": "1", "description": "Type 1 time over Type 3 time (> 1: Type 3 faster)"},
            ),
            "lowered_bytes": (
                dims,
                nbytes,
                {"units": "B", "description": "D̂ (+ R̂ that lifting reads) bytes, lowered_bytes()"},
            ),
            "d": (("shape", "ratio"), d_arr, {"units": "channels", "description": "input channels"}),
            "o": (("shape", "ratio"), o_arr, {"units": "channels", "description": "output channels"}),
            "gflop": (("shape", "ratio"), gflop, {"units": "GFLOP", "description": "useful FLOPs"}),
        },
        coords={"shape": list(shapes), "ratio": np.asarray(ratios, float), "lowering": list(LOWERINGS)},
    )
    ds["ratio"].attrs = {"units": "1", "description": "nominal d/o (input over output channels)"}
    ds.attrs["shapes"] = "; ".join(
        f"{name}: k {k}, {h}x{h}, pad {p}, batch {b}, d·o = 2^{e}" for name, (k, h, p, b, e) in shapes.items()
    )
    ds.attrs["repeats"] = repeats
    return ds


def table(ds: xr.Dataset) -> str:
    """One row per (shape, d/o): GFLOP/s of each type, the fastest, auto's choice and its cost."""
    rows = []
    for shape in ds["shape"].values:
        for ratio in ds["ratio"].values:
            sel = ds.sel(shape=shape, ratio=ratio)
            rows.append(
                {
                    "shape": str(shape),
                    "d/o": f"{int(sel['d'])}/{int(sel['o'])}",
                    **{f"{lw} GFLOP/s": float(sel["gflops"].sel(lowering=lw)) for lw in LOWERINGS},
                    "fastest": str(sel["fastest_lowering"].values),
                    "auto": str(sel["auto_lowering"].values),
                    "auto time / best": float(sel["auto_over_best"]),
                    "type1 / type3 time": float(sel["type1_over_type3"]),
                }
            )
    return markdown_table(pd.DataFrame(rows))


def plot(ds: xr.Dataset, fig) -> None:
    """GFLOP/s of each lowering against d/o, one panel per shape, auto's pick marked."""
    fig.set_size_inches(5.5 * ds.sizes["shape"], 4.2)
    for i, shape in enumerate(ds["shape"].values):
        ax = fig.add_subplot(1, ds.sizes["shape"], i + 1)
        sel = ds.sel(shape=shape)
        for lw, style in zip(LOWERINGS, ("o-", "s-", "^-"), strict=True):
            ax.plot(sel["ratio"], sel["gflops"].sel(lowering=lw), style, label=lw)
        ax.plot(sel["ratio"], sel["gflop"] / sel["auto_time_s"], "kx", ms=9, label="auto")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d / o (d·o fixed)")
        ax.set_ylabel("forward+backward GFLOP/s")
        ax.set_title(str(shape))
        ax.legend(fontsize=8)
    fig.suptitle("Lowering types vs d/o (cf. CcT Fig. 8)")


def run(tiny: bool = False, repeats: int = 5) -> Experiment:
    """Measure every lowering for every shape and ratio (tiny: one 8×8 shape, 3 ratios, 1 repeat)."""
    shapes, ratios = (TINY_SHAPES, TINY_RATIOS) if tiny else (SHAPES, RATIOS)
    repeats = 1 if tiny else repeats
    ds = stamp(measure(shapes, ratios, repeats), NAME, MIRRORS, tiny)
    hits = int((ds["auto_lowering"] == ds["fastest_lowering"]).sum())
    notes = [
        ds.attrs["shapes"] + f"; medians of {repeats}.",
        f"auto picked the fastest lowering in {hits} of {ds['auto_lowering'].size} cases; at most "
        f"{float(ds['auto_over_best'].max()):.2f}× the best time (median "
        f"{float(ds['auto_over_best'].median()):.2f}×, 'auto' is timed as a fourth step, so noise shows up).",
        "Timings on a shared 2-core machine are noisy (other processes run beside it).",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run, __doc__, [(("--repeats",), {"type": int, "default": 5, "help": "timed rounds (median per point)"})]
)

if __name__ == "__main__":
    sys.exit(main())
