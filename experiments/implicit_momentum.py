"""Implicit momentum of asynchrony: measured vs Theorem 1's 1 − 1/g (Omnivore §IV-C, Fig. 6).

Mirrors Omnivore Fig. 6 (§IV-C: "Predicted and measured momentum moduli: (Left) Predicted,
Theorem 1 (Middle) Measured, CIFAR (Right) Measured, ImageNet"). The paper found that with g
asynchronous groups and explicit momentum µ = 0 the updates behave like momentum SGD with
momentum 1 − 1/g (Theorem 1, §IV-C), that the measured momentum follows that prediction (§IV-C),
and that the best explicit momentum falls as g grows, to 0 at g = 32 on ImageNet (appendix E).

Here the "system" is asynchronous SGD with µ = 0 on a least-squares problem: g groups each read
the model, compute a minibatch gradient, and write it when their step time ends (discrete events,
as the SimulatedEngine runs them). 1,000 replicas from one start estimate E V(t+1) and E ∇ℓ(W(t)),
and a least-squares fit of E V(t+1) ≈ m·E V(t) − c·E ∇ℓ(W(t)) gives the measured momentum m (and c,
which Theorem 1 predicts to be η/g). Two timing models: exponential step times (Theorem 1's
assumption A2) and nearly round-robin ones (gamma, CV 6%: Omnivore measured < 6%, §III-B and appendix D-D).

What it found (5 seeds, mean ± sd): with exponential step times the measured momentum is within
0.01 of 1 − 1/g for g = 1..32 (0.007, 0.492, 0.747, 0.872, 0.934, 0.964 against 0, 0.5, 0.75,
0.875, 0.938, 0.969) and c is η/g within 3%: Theorem 1 holds. With nearly round-robin groups the
update is a gradient of fixed delay g − 1 rather than a momentum process; the one-lag fit then gives
0.43, 0.82, 1.02, 1.04, 1.04 for g = 2..32 and c 1.2-1.7 × η/g: asynchrony still adds momentum
that grows with g, but 1 − 1/g is exact only under assumption A2.

    dasknn experiment implicit_momentum [--seeds 5] [--tiny]    (or python -m experiments.implicit_momentum)

Writes experiments/results/implicit_momentum/{implicit_momentum.nc, implicit_momentum.png, table.md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import xarray as xr

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn.tradeoff import implicit_momentum, measure_implicit_momentum  # noqa: E402
from experiments.common import Experiment, main_for, stamp  # noqa: E402

NAME = "implicit_momentum"
MIRRORS = "Omnivore Fig. 6 / Theorem 1"
VARIABLES = ("momentum", "lr_scale", "r2", "predicted_momentum", "lr")
GROUPS = (1, 2, 4, 8, 16, 32)
TIMINGS = {
    "exponential": {"variability": "exponential"},
    "round_robin_cv6": {"variability": "gamma", "cv": 0.06},
}


def measure(seeds: int, replicas: int = 1000) -> xr.Dataset:
    """Measured momentum, step scale and fit quality per (timing, n_groups, seed)."""
    shape = (len(TIMINGS), len(GROUPS), seeds)
    out = {name: np.full(shape, np.nan) for name in ("momentum", "lr_scale", "r2")}
    lr = np.array([0.8 / np.sqrt(g) for g in GROUPS])
    for ti, options in enumerate(TIMINGS.values()):
        for gi, g in enumerate(GROUPS):
            for seed in range(seeds):
                fit = measure_implicit_momentum(g, lr=lr[gi], seed=seed, replicas=replicas, **options)
                out["momentum"][ti, gi, seed] = fit.momentum
                out["lr_scale"][ti, gi, seed] = fit.lr_scale
                out["r2"][ti, gi, seed] = fit.r2
    dims = ("timing", "groups", "seed")
    ds = xr.Dataset(
        {
            "momentum": (
                dims,
                out["momentum"],
                {"units": "1", "description": "fitted m in E V(t+1) = m E V(t) - c E grad"},
            ),
            "lr_scale": (
                dims,
                out["lr_scale"],
                {"units": "1", "description": "fitted c (Theorem 1: lr / g)"},
            ),
            "r2": (dims, out["r2"], {"units": "1", "description": "fraction of E V(t+1) the fit explains"}),
            "predicted_momentum": (
                ("groups",),
                [implicit_momentum(g) for g in GROUPS],
                {"units": "1", "description": "Theorem 1: 1 - 1/g"},
            ),
            "lr": (("groups",), lr, {"units": "1", "description": "SGD step size used (0.8 / sqrt(g))"}),
        },
        coords={
            "timing": list(TIMINGS),
            "groups": np.asarray(GROUPS, dtype=np.int64),
            "seed": np.arange(seeds, dtype=np.int64),
        },
    )
    ds["groups"].attrs = {"units": "1", "description": "n_groups, asynchronous compute groups"}
    ds.attrs["problem"] = f"least squares, d = 8, n = 512, batch 16, 100 updates, {replicas} replicas, mu = 0"
    return ds


def table(ds: xr.Dataset) -> str:
    """A markdown table: predicted vs measured momentum (mean ± sd over seeds) per timing model."""
    head = (
        "| g | predicted 1 − 1/g | measured, exponential (A2) | c·g/η | measured, round-robin CV 6% | c·g/η |"
    )
    lines = [head, "|" + "---|" * 6]
    for g in GROUPS:
        cells = [str(g), f"{implicit_momentum(g):.3f}"]
        for timing in TIMINGS:
            sel = ds.sel(timing=timing, groups=g)
            m = sel["momentum"]
            scale = sel["lr_scale"] * g / sel["lr"]
            cells += [f"{float(m.mean()):.3f} ± {float(m.std()):.3f}", f"{float(scale.mean()):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(ds: xr.Dataset, fig) -> None:
    """Measured momentum (mean ± sd over seeds) per timing model against Theorem 1's curve."""
    ax = fig.add_subplot()
    gs = np.asarray(GROUPS)
    ax.plot(gs, ds["predicted_momentum"], "k-", label="Theorem 1: 1 − 1/g")
    for timing, marker in zip(TIMINGS, ("o", "s"), strict=True):
        m = ds["momentum"].sel(timing=timing)
        ax.errorbar(
            gs, m.mean("seed"), yerr=m.std("seed"), fmt=marker, capsize=3, label=f"measured ({timing})"
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("compute groups g")
    ax.set_ylabel("momentum seen in the updates")
    ax.set_title("Implicit momentum (µ = 0), cf. Omnivore Fig. 6")
    ax.legend()


def run(tiny: bool = False, seeds: int = 5) -> Experiment:
    """Measure the implicit momentum for every g and timing model (tiny: 1 seed, 200 replicas)."""
    seeds, replicas = (1, 200) if tiny else (seeds, 1000)
    ds = stamp(measure(seeds, replicas), NAME, MIRRORS, tiny, seeds=seeds, replicas=replicas)
    note = (
        "c·g/η is the fitted gradient scale over Theorem 1's η/g (1 = as predicted). "
        f"Mean ± sd over {seeds} seeds."
    )
    return Experiment(ds, table(ds), plot, [note])


main = main_for(
    run, __doc__, [(("--seeds",), {"type": int, "default": 5, "help": "independent problems and runs per g"})]
)

if __name__ == "__main__":
    sys.exit(main())
