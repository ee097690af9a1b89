"""FLOPS proportionality: conv-layer throughput as a share of the device's measured SGEMM speed.

Mirrors Omnivore Fig. 3 (§III-A, appendix C-C) and the CPU column of Fig. 11: forward +
backward of all five conv layers of CaffeNet/AlexNet, batch 256. The paper found Omnivore's batched
lowering at ~50% of device peak on every device (1× CPU 56%, 2× CPU 40%, 1× GPU 54%, 2× GPU 52%,
against SGEMM at 81%, 71%, 99%, 99% of peak, i.e. 55-69% of SGEMM) while Caffe (one image per GEMM)
reached 18% and 8% of peak on the CPUs and 53%/26% on the GPUs; so a device is a black box whose
speed is its FLOPS, and on one CPU Omnivore was 3.9× faster than Caffe end to end (Fig. 11).

Here: each Convolution layer of CaffeNet (the layer objects of `dasknn.nn.zoo.caffenet`, bias
included, groups = 1 and Caffe's groups = 2), batch 64 by default (`--batch 256` as the paper:
~4× the time and memory), forward + backward (dW and db; dx too except for conv1, whose input is
the data, as Caffe does); useful FLOPs are `Layer.flops()` × 2 for conv1 (forward and dW only)
and × 3 for the others. "batched" lowers the whole batch per GEMM (Omnivore), "bp1" one image per
GEMM (Caffe's way). Every layer, both ways, and an n = 2048 SGEMM are timed once per round (3
rounds after a warm-up by default; medians), so "% of SGEMM" compares them under the same load from the other
processes on this shared machine; "% of best SGEMM" is against the fastest SGEMM probe
(conservative). The device dimension holds "cpu" and "gpu"; GPU rows are filled only where CuPy and a
CUDA GPU are present (NaN otherwise; this machine has none).

What it found (b = 64, 2-core AMD EPYC). Quiet machine (load average < 1, default 3 rounds,
52 s; SGEMM 188 GFLOP/s in the rounds, 192 at best): all five conv layers batched reach 65% of
SGEMM with groups = 1 (conv2-conv5 70-79%, conv1 26%: stride 4, 3 input channels) and 51% with
Caffe's groups = 2 (two half-width GEMMs per layer); the paper's 1× CPU: 56% of peak = 69% of
SGEMM. But one image per GEMM (Caffe's way) is as fast here: 70% and 61% of SGEMM (batched / bp1
time 0.93× and 0.83×; conv1 at bp = 1 is 1.9× faster): with 2 cores each image's GEMM (e.g.
729 × 2400 × 256 for conv2) is big enough, so the paper's 3.1× over Caffe does not appear. Under
load (load average 6-10, `--repeats 5`, 1362 s; SGEMM 41-50 GFLOP/s) batched reached 43% / 24% of
SGEMM and bp = 1 only 14.5% / 7.6%, 3.0-3.1× slower: the many small GEMMs suffer most when the
cores are shared. Partly reproduces: FLOPS proportionality (conv near SGEMM speed) yes; the
batched-over-Caffe gap only on a loaded machine. No GPU rows: this machine has no CuPy + CUDA GPU.

    dasknn experiment flops_proportionality [--net caffenet] [--batch 64] [--repeats 3] [--tiny]

Writes experiments/results/flops_proportionality/{flops_proportionality.nc, .png, table.md}.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.backend import cupy_available, device_info, get_xp  # noqa: E402
from dasknn.nn import zoo  # noqa: E402
from dasknn.nn.layers import Convolution  # noqa: E402
from experiments.batched_lowering import interleaved_medians  # noqa: E402
from experiments.common import Experiment, main_for, markdown_table, stamp  # noqa: E402

NAME = "flops_proportionality"
MIRRORS = "Omnivore Fig. 3 / Fig. 11"
BACKEND = "lowering"
"""The kernel backend measured: the papers' batched lowering, pinned (not "auto", which picks
oneDNN where it is installed; `dasknn.nn.onednn`)."""
VARIABLES = ("time_s", "gflop", "gflops", "pct_sgemm", "pct_sgemm_best", "sgemm_gflops", "speedup_vs_bp1")
DEVICES = ("cpu", "gpu")
STRATEGIES = ("batched", "bp1")
ALL = "all conv"
PAPER_PCT_PEAK = {
    "1x CPU": (18, 56, 81),
    "2x CPU": (8, 40, 71),
    "1x GPU": (53, 54, 99),
    "2x GPU": (26, 52, 99),
}
"""Omnivore Fig. 3: (Caffe, Omnivore, SGEMM) as % of device peak."""
SGEMM_N = 2048


def _sync(xp) -> None:
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def sgemm_probe(xp, n: int = SGEMM_N, calls: int = 3) -> float:
    """GFLOP/s of the best of `calls` n×n×n float32 products on the device of `xp` (after a warm-up)."""
    a = xp.asarray(np.random.default_rng(1).standard_normal((n, n), dtype=np.float32))
    out = xp.empty_like(a)
    xp.matmul(a, a, out=out)
    _sync(xp)
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        xp.matmul(a, a, out=out)
        _sync(xp)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def make_nets(net: str, groups: tuple[int, ...]) -> dict:
    """{groups: Net}: CaffeNet per group count, or one LeNet / CIFAR-10 quick (groups = 1 only)."""
    if net == "caffenet":
        return {g: zoo.caffenet(groups=g, backend=BACKEND) for g in groups}
    if 2 in groups:
        raise ValueError(f"net {net!r} has no grouped convolutions; use --groups 1")
    return {1: zoo.get_net(net, backend=BACKEND)}


def conv_layers(net) -> list[Convolution]:
    return [layer for layer in net.layers if isinstance(layer, Convolution)]


def measure_device(
    device: str, nets: dict, batch: int, repeats: int, sgemm_n: int = SGEMM_N
) -> tuple[np.ndarray, float, float]:
    """time_s (groups, strategy, layer) on one device, its SGEMM GFLOP/s timed in the same rounds
    (median), and its best SGEMM GFLOP/s (probes before and after)."""
    xp = get_xp(device)
    best = [sgemm_probe(xp, sgemm_n)]
    first = next(iter(nets.values()))
    rng = np.random.default_rng(0)
    steps = {}
    for gi, net in enumerate(nets.values()):
        net = net if xp is np else net.copy().to(xp)
        for li, layer in enumerate(conv_layers(net)):
            x = xp.asarray(rng.standard_normal((batch, *layer.in_shape), dtype=np.float32))
            dy = xp.asarray(rng.standard_normal((batch, *layer.out_shape), dtype=np.float32))
            for si, bp in enumerate((None, 1)):

                def step(layer=layer, x=x, dy=dy, need_dx=li > 0, bp=bp) -> object:
                    layer.bp = bp  # conv1's input is the data: no dx (need_dx False), as in Caffe
                    y, cache = layer.forward(x, train=True)
                    out = layer.backward(dy, cache, need_dx=need_dx)
                    _sync(xp)
                    layer.bp = None
                    return y, out

                steps[(gi, si, li)] = step
    a = xp.asarray(np.random.default_rng(1).standard_normal((sgemm_n, sgemm_n), dtype=np.float32))
    c = xp.empty_like(a)

    def sgemm() -> object:
        out = xp.matmul(a, a, out=c)
        _sync(xp)
        return out

    steps["sgemm"] = sgemm
    medians = interleaved_medians(steps, repeats)  # every round: all layers, both ways, and SGEMM
    t = np.full((len(nets), len(STRATEGIES), len(conv_layers(first))), np.nan)
    for key, value in medians.items():
        if key != "sgemm":
            t[key] = value
    best.append(sgemm_probe(xp, sgemm_n))
    return t, 2.0 * sgemm_n**3 / medians["sgemm"] / 1e9, max(best)


def measure(
    net: str, batch: int, groups: tuple[int, ...], repeats: int, sgemm_n: int = SGEMM_N
) -> xr.Dataset:
    """Per (device, groups, strategy, layer): time, GFLOP/s and % of SGEMM; 'all conv' sums them."""
    if batch < 1 or repeats < 1:
        raise ValueError(f"need batch >= 1 and repeats >= 1; got {batch}, {repeats}")
    nets = make_nets(net, groups)
    first = next(iter(nets.values()))
    names = [layer.name for layer in conv_layers(first)]
    gflop = np.array(
        [
            [(3 if li > 0 else 2) * layer.flops() * batch / 1e9 for li, layer in enumerate(conv_layers(n))]
            for n in nets.values()
        ]
    )
    shape = (len(DEVICES), len(nets), len(STRATEGIES), len(names))
    t = np.full(shape, np.nan)
    sgemm, sgemm_best = np.full(len(DEVICES), np.nan), np.full(len(DEVICES), np.nan)
    for di, device in enumerate(DEVICES):
        if device == "gpu" and not cupy_available():
            continue
        t[di], sgemm[di], sgemm_best[di] = measure_device(device, nets, batch, repeats, sgemm_n)
    t_all = np.concatenate([t, t.sum(axis=-1, keepdims=True)], axis=-1)
    f_all = np.concatenate([gflop, gflop.sum(axis=-1, keepdims=True)], axis=-1)
    speed = f_all[None, :, None, :] / t_all
    dims = ("device", "groups", "strategy", "layer")
    ds = xr.Dataset(
        {
            "time_s": (dims, t_all, {"units": "s", "description": "median forward + backward time"}),
            "gflop": (
                ("groups", "layer"),
                f_all,
                {"units": "GFLOP", "description": "useful FLOPs of forward + backward for the batch"},
            ),
            "gflops": (dims, speed, {"units": "GFLOP/s", "description": "useful FLOPs / time"}),
            "pct_sgemm": (
                dims,
                100 * speed / sgemm[:, None, None, None],
                {"units": "%", "description": "GFLOP/s over the SGEMM GFLOP/s timed in the same rounds"},
            ),
            "pct_sgemm_best": (
                dims,
                100 * speed / sgemm_best[:, None, None, None],
                {"units": "%", "description": "GFLOP/s over the best SGEMM GFLOP/s seen (conservative)"},
            ),
            "sgemm_gflops": (
                ("device",),
                sgemm,
                {
                    "units": "GFLOP/s",
                    "description": f"n = {sgemm_n} SGEMM, median of the rounds (NaN: absent)",
                },
            ),
            "sgemm_best_gflops": (
                ("device",),
                sgemm_best,
                {"units": "GFLOP/s", "description": f"best n = {sgemm_n} SGEMM, probes before and after"},
            ),
            "speedup_vs_bp1": (
                ("device", "groups", "layer"),
                t_all[:, :, 1] / t_all[:, :, 0],
                {"units": "1", "description": "time with one image per GEMM over batched time"},
            ),
        },
        coords={
            "device": list(DEVICES),
            "groups": np.asarray(list(nets), np.int64),
            "strategy": list(STRATEGIES),
            "layer": [*names, ALL],
        },
    )
    ds["groups"].attrs = {"units": "1", "description": "convolution groups of conv2, conv4, conv5"}
    ds["strategy"].attrs = {"description": "batched: whole batch per GEMM (Omnivore); bp1: one image (Caffe)"}
    ds.attrs.update(net=net, batch=batch, repeats=repeats, sgemm_n=sgemm_n, gpu_present=int(cupy_available()))
    return ds


def table(ds: xr.Dataset) -> str:
    """One row per (device, groups, layer): GFLOP/s and % SGEMM batched and bp = 1, and the speedup."""
    rows = []
    for device in ds["device"].values:
        for g in ds["groups"].values:
            for layer in ds["layer"].values:
                sel = ds.sel(device=device, groups=g, layer=layer)
                if not np.isfinite(float(sel["time_s"].sel(strategy="batched"))):
                    rows.append({"device": str(device), "groups": int(g), "layer": str(layer)})
                    continue
                rows.append(
                    {
                        "device": str(device),
                        "groups": int(g),
                        "layer": str(layer),
                        "GFLOP": float(sel["gflop"]),
                        "batched s": float(sel["time_s"].sel(strategy="batched")),
                        "batched GFLOP/s": float(sel["gflops"].sel(strategy="batched")),
                        "batched % SGEMM": float(sel["pct_sgemm"].sel(strategy="batched")),
                        "batched % best SGEMM": float(sel["pct_sgemm_best"].sel(strategy="batched")),
                        "bp=1 % SGEMM": float(sel["pct_sgemm"].sel(strategy="bp1")),
                        "batched speedup vs bp=1": float(sel["speedup_vs_bp1"]),
                    }
                )
    df = pd.DataFrame(rows)
    gpu = ds.sel(device="gpu")
    if not np.isfinite(gpu["time_s"].values).any():
        df = df[df["device"] != "gpu"]
        df = pd.concat(
            [df, pd.DataFrame([{"device": "gpu", "layer": "not measured: no CuPy + CUDA GPU here"}])]
        )
    return markdown_table(df)


def plot(ds: xr.Dataset, fig) -> None:
    """% of SGEMM per conv layer, batched vs one image per GEMM, per device and group count."""
    ax = fig.add_subplot()
    layers = list(ds["layer"].values)
    xs = np.arange(len(layers))
    series = [
        (device, g, strategy)
        for device in ds["device"].values
        for g in ds["groups"].values
        for strategy in ds["strategy"].values
        if np.isfinite(ds["time_s"].sel(device=device, groups=g, strategy=strategy).values).any()
    ]
    width = 0.8 / max(1, len(series))
    for i, (device, g, strategy) in enumerate(series):
        pct = ds["pct_sgemm"].sel(device=device, groups=g, strategy=strategy)
        ax.bar(
            xs + (i - (len(series) - 1) / 2) * width, pct, width, label=f"{device}, groups {g}, {strategy}"
        )
    ax.axhline(100, color="k", lw=0.8)
    ax.set_xticks(xs, layers, rotation=20)
    ax.set_ylabel("% of measured SGEMM GFLOP/s")
    ax.set_title(f"{ds.attrs['net']} conv layers, batch {ds.attrs['batch']} (cf. Omnivore Fig. 3)")
    ax.legend(fontsize=7)


def run(
    tiny: bool = False,
    net: str = "caffenet",
    batch: int = 64,
    groups: tuple[int, ...] | None = None,
    repeats: int = 3,
) -> Experiment:
    """Measure every conv layer batched and with bp = 1 on each present device (tiny: LeNet, b = 8)."""
    if tiny:
        net, batch, repeats, groups = "lenet", 8, 1, (1,)
    groups = tuple(sorted(set(groups or ((1, 2) if net == "caffenet" else (1,)))))
    ds = stamp(measure(net, batch, groups, repeats, 1024 if tiny else SGEMM_N), NAME, MIRRORS, tiny)
    cpu = ds.sel(device="cpu", layer=ALL)
    notes = [
        f"{net}, batch {batch}, medians of {repeats}; "
        f"SGEMM (n = {ds.attrs['sgemm_n']}): {float(ds['sgemm_gflops'].sel(device='cpu')):.0f} GFLOP/s "
        f"in the rounds, {float(ds['sgemm_best_gflops'].sel(device='cpu')):.0f} at best, "
        f"on {device_info()['model']} "
        f"({device_info()['cores']} cores).",
        "All conv layers, batched: "
        + ", ".join(
            f"groups {int(g)}: {float(cpu['pct_sgemm'].sel(groups=g, strategy='batched')):.0f}% of SGEMM "
            f"({float(cpu['speedup_vs_bp1'].sel(groups=g)):.2f}× over bp = 1)"
            for g in ds["groups"].values
        ),
        "Paper (Omnivore Fig. 3, % of device peak, Caffe / Omnivore / SGEMM): "
        + "; ".join(f"{k} {a}/{b}/{c}" for k, (a, b, c) in PAPER_PCT_PEAK.items()),
        "GPU rows: " + ("measured." if ds.attrs["gpu_present"] else "not measured, no CuPy + CUDA GPU here."),
        "Timings on a shared 2-core machine are noisy (other processes run beside it).",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [
        (("--net",), {"default": "caffenet", "choices": ["caffenet", "lenet", "cifar10_quick"]}),
        (("--batch",), {"type": int, "default": 64, "help": "images per batch (the paper: 256)"}),
        (("--groups",), {"type": int, "nargs": "+", "choices": [1, 2], "help": "CaffeNet conv groups"}),
        (("--repeats",), {"type": int, "default": 3, "help": "timed rounds (median per point)"}),
    ],
)

if __name__ == "__main__":
    sys.exit(main())
