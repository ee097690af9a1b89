"""Momentum lesion: at the chosen g, µ = 0.9 vs µ tuned for sync vs µ tuned for g (time to a loss).

Mirrors Omnivore Fig. 13 (§VI-C): on CPU-L at the optimal g = 4 (ImageNet-8), momentum
(i) fixed at 0.9 (AlexNet's default, also the best for sync), (ii) tuned for a synchronous system,
(iii) tuned by Omnivore's optimizer for g groups. The paper found that without tuning for the
asynchrony Omnivore would be 1.5× slower (up to 2× in further experiments, 2.4× on TensorFlow).

Here: the simulated CPU-L-like cluster of experiment 5 (the HE model of CaffeNet on CPU-L as the
clock, real SGD of the small LeNet on the MNIST sample, b = 32). The sync grid (g = 1, µ ∈ {0, 0.3,
0.6, 0.9} × η ∈ {0.1, 0.01}) gives µ*_sync, η*_sync; the grid at g (µ × {η*_sync, η*_sync/10})
gives, for each of the three momentum rules, its best η at g. ℓ_F is the highest final smoothed
loss of the three; the slowdown of a rule is its simulated time to ℓ_F over the g-tuned rule's.
g: `--groups`, else the g experiment 5's optimizer chose (experiments/results/tradeoff/tradeoff.nc),
else the smallest g dividing 32 that saturates the FC server (8).

What it found (default setting, g = 8, 2 seeds averaged, 400 updates per run; 53 s at load 5-7):
µ*_sync = 0.6 (η 0.01) but at g = 8 the best is µ = 0.9 (η 0.01): the rule "µ = 0.9" is the g-tuned
rule, and "µ tuned for sync" (0.6) is 1.12× slower to ℓ_F. That is the opposite of the paper's
direction (µ* should fall as g rises) and does not reproduce its 1.5×. Experiment 5 (one seed, 300
updates) found µ* 0.9 at g ≤ 4 and 0.6 at g ≥ 8, and a one-seed run of this experiment found
µ = 0.9 fastest early but 0.6 lowest at the end: with a net this small on the MNIST sample, µ ∈ {0.6,
0.9} differ by less than the seed-to-seed noise, so no lesion effect can be resolved at this size.

    python -m experiments.momentum_lesion [--tiny] [--groups G] [--iterations N]

Writes experiments/results/momentum_lesion/{momentum_lesion.nc, momentum_lesion.png, table.md}.
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

from dasknn.engine.trace import RunConfig  # noqa: E402
from dasknn.tradeoff.record import load  # noqa: E402
from dasknn.tradeoff.statistical import final_loss, iterations_to_target, smoothed_loss  # noqa: E402
from experiments.common import (  # noqa: E402
    GROUPS_OPTION,
    ITERATIONS_OPTION,
    NET_OPTION,
    RESULTS_ROOT,
    Experiment,
    main_for,
    markdown_table,
    stamp,
)
from experiments.sgd_grid import (  # noqa: E402
    MOMENTA,
    best_by_final_loss,
    cpu_l_model,
    dataset,
    engine_for_groups,
    make_net,
    train,
)

NAME = "momentum_lesion"
MIRRORS = "Omnivore Fig. 13"
VARIABLES = (
    "loss_smoothed",
    "time",
    "final_loss",
    "iters_to_target",
    "time_to_target",
    "slowdown",
    "momentum_used",
    "lr_used",
    "target_loss",
    "sync_final_loss",
    "grid_final_loss",
)
RULES = ("mu=0.9", "mu tuned for sync", "mu tuned for g")
PAPER_SLOWDOWN = 1.5
WEIGHT_DECAY = 5e-4
SETTINGS = {
    False: {
        "momenta": MOMENTA,
        "lrs": (0.1, 0.01),
        "iterations": 400,
        "seeds": 2,
        "n_samples": 5000,
        "data": "mnist-sample",
    },
    True: {
        "momenta": (0.0, 0.9),
        "lrs": (0.1,),
        "iterations": 10,
        "seeds": 1,
        "n_samples": 320,
        "data": "mnist-synthetic",
    },
}


def default_groups() -> tuple[int, str]:
    """Experiment 5's optimizer choice when its result exists, else the HE model's saturating g."""
    path = RESULTS_ROOT / "tradeoff" / "tradeoff.nc"
    if path.is_file():
        ds = load(path)
        if "chosen_groups" in ds:
            return int(ds["chosen_groups"]), f"chosen by experiment 5's optimizer ({path.name})"
    model = cpu_l_model()
    g = model.smallest_saturating_g([d for d in range(1, 33) if 32 % d == 0]) or 1
    return int(g), "smallest g dividing 32 that saturates the FC server (HE model)"


def seed_mean(traces: list[pd.DataFrame]) -> pd.DataFrame:
    """One trace whose loss and t_end are the seeds' means update by update (NaN past a diverged end)."""
    n = max(len(t) for t in traces)

    def column(name: str) -> np.ndarray:
        rows = [t.sort_values(["t_end", "group"], kind="stable")[name].to_numpy(dtype=float) for t in traces]
        return np.mean([np.pad(r, (0, n - len(r)), constant_values=np.nan) for r in rows], axis=0)

    return pd.DataFrame({"group": 0, "loss": column("loss"), "t_end": column("t_end")})


def grid(
    net: str, X, y, g: int, pairs, iterations: int, seeds: int
) -> dict[tuple[float, float], pd.DataFrame]:
    """Seed-mean traces keyed (µ, η) of g groups on the simulated CPU-L-like clock."""
    model = cpu_l_model()
    return {
        (m, lr): seed_mean(
            [
                train(
                    engine_for_groups(model, g),
                    net,
                    X,
                    y,
                    RunConfig(g, lr, m, WEIGHT_DECAY, 32, seed=seed),
                    iterations,
                )
                for seed in range(seeds)
            ]
        )
        for m, lr in pairs
    }


def lesion(sync: dict, at_g: dict) -> dict[str, tuple[float, float]]:
    """(µ, η) of each rule: 0.9, the sync optimum's µ, the g optimum; each with its best η at g."""
    mu_sync, _ = best_by_final_loss(sync)

    def best_eta(mu: float) -> tuple[float, float]:
        return best_by_final_loss({k: t for k, t in at_g.items() if math.isclose(k[0], mu)})

    return {RULES[0]: best_eta(0.9), RULES[1]: best_eta(mu_sync), RULES[2]: best_by_final_loss(at_g)}


def build(sync: dict, at_g: dict, chosen: dict, g: int) -> xr.Dataset:
    """The Dataset: each rule's loss curve and clock, ℓ_F, time to it, and both grids' final losses."""
    traces = {rule: at_g[key] for rule, key in chosen.items()}
    n = max(len(t) for t in traces.values())
    ell = max(final_loss(t) for t in traces.values())
    curves, clocks, its, times = [], [], [], []
    for t in traces.values():
        t = t.sort_values(["t_end", "group"], kind="stable")
        pad = np.full(n - len(t), np.nan)
        curves.append(np.concatenate([smoothed_loss(t), pad]))
        clocks.append(np.concatenate([t["t_end"].to_numpy(dtype=float), pad]))
        it = iterations_to_target(t, ell)
        its.append(it)
        times.append(float(t["t_end"].iloc[int(it) - 1]) if math.isfinite(it) else math.nan)
    times = np.asarray(times)

    def grid_array(runs: dict) -> tuple[list[float], list[float], np.ndarray]:
        mus, lrs = sorted({k[0] for k in runs}), sorted({k[1] for k in runs})
        arr = np.full((len(mus), len(lrs)), np.nan)
        for (m, lr), t in runs.items():
            arr[mus.index(m), lrs.index(lr)] = final_loss(t)
        return mus, lrs, arr

    smu, slr, sarr = grid_array(sync)
    gmu, glr, garr = grid_array(at_g)
    rule = ("rule",)
    ds = xr.Dataset(
        {
            "loss_smoothed": (("rule", "iteration"), np.asarray(curves), {"units": "1"}),
            "time": (("rule", "iteration"), np.asarray(clocks), {"units": "simulated s"}),
            "final_loss": (rule, [final_loss(t) for t in traces.values()], {"units": "1"}),
            "iters_to_target": (rule, its, {"units": "iterations", "description": "updates to l_F"}),
            "time_to_target": (rule, times, {"units": "simulated s", "description": "time to l_F"}),
            "slowdown": (
                rule,
                times / times[-1],
                {"units": "1", "description": "time to l_F / tuned-for-g's"},
            ),
            "momentum_used": (rule, [chosen[r][0] for r in RULES], {"units": "1"}),
            "lr_used": (rule, [chosen[r][1] for r in RULES], {"units": "1"}),
            "target_loss": ((), ell, {"units": "1", "description": "l_F: highest final loss of the rules"}),
            "sync_final_loss": (
                ("momentum_sync", "lr_sync"),
                sarr,
                {"units": "1", "description": "g = 1 grid"},
            ),
            "grid_final_loss": (("momentum", "lr"), garr, {"units": "1", "description": f"g = {g} grid"}),
        },
        coords={
            "rule": list(RULES),
            "iteration": np.arange(1, n + 1, dtype=np.int64),
            "momentum_sync": smu,
            "lr_sync": slr,
            "momentum": gmu,
            "lr": glr,
        },
    )
    ds.attrs["n_groups"] = int(g)
    return ds


def table(ds: xr.Dataset) -> str:
    rows = [
        {
            "momentum rule": str(r),
            "µ": float(ds["momentum_used"].sel(rule=r)),
            "η": float(ds["lr_used"].sel(rule=r)),
            "final loss": float(ds["final_loss"].sel(rule=r)),
            "iters to ℓ_F": float(ds["iters_to_target"].sel(rule=r)),
            "time to ℓ_F (sim s)": float(ds["time_to_target"].sel(rule=r)),
            "slowdown vs tuned": float(ds["slowdown"].sel(rule=r)),
        }
        for r in ds["rule"].values
    ]
    return markdown_table(pd.DataFrame(rows))


def plot(ds: xr.Dataset, fig) -> None:
    ax = fig.add_subplot()
    for r in ds["rule"].values:
        s = ds.sel(rule=r)
        ax.plot(
            s["time"],
            s["loss_smoothed"],
            label=f"{r} (µ={float(s['momentum_used']):g}, η={float(s['lr_used']):g})",
        )
    ax.axhline(float(ds["target_loss"]), color="k", ls=":", lw=1, label="ℓ_F")
    ax.set_xlabel("simulated seconds (CPU-L-like clock)")
    ax.set_ylabel("training loss (smoothed)")
    ax.set_title(f"Momentum lesion at g = {ds.attrs['n_groups']}, cf. Omnivore Fig. 13", fontsize=9)
    ax.legend(fontsize=7)


def run(
    tiny: bool = False, groups: int | None = None, iterations: int | None = None, net: str = "lenet_small"
) -> Experiment:
    """Experiment 6 (tiny: g = 4, µ ∈ {0, 0.9}, η = 0.1, 10 updates, synthetic MNIST-shaped data)."""
    s = SETTINGS[tiny]
    if iterations is not None and int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if groups is not None and not 1 <= int(groups) <= 32:
        raise ValueError(f"groups must be in [1, 32] (the CPU-L conv machines), got {groups}")
    make_net(net)
    g, why = (
        (int(groups), "given by --groups") if groups else ((4, "tiny setting") if tiny else default_groups())
    )
    iterations = int(iterations or s["iterations"])
    X, y = dataset(s["data"], s["n_samples"])
    sync = grid(net, X, y, 1, [(m, lr) for m in s["momenta"] for lr in s["lrs"]], iterations, s["seeds"])
    _, lr_sync = best_by_final_loss(sync)
    lrs_g = (lr_sync, lr_sync / 10) if len(s["lrs"]) > 1 else (lr_sync,)
    at_g = grid(net, X, y, g, [(m, lr) for m in s["momenta"] for lr in lrs_g], iterations, s["seeds"])
    ds = build(sync, at_g, lesion(sync, at_g), g)
    ds = stamp(
        ds,
        NAME,
        MIRRORS,
        tiny,
        net=net,
        dataset=s["data"],
        iterations=iterations,
        seeds=s["seeds"],
        groups_source=why,
    )
    slow = float(ds["slowdown"].sel(rule=RULES[0]))
    notes = [
        f"g = {g} ({why}); each rule's best η at g from the grid; {iterations} updates per run, b = 32; "
        f"losses and clocks are means over {s['seeds']} seed(s) (data order and initial weights)",
        f"µ = 0.9 is {slow:.2f}× slower to ℓ_F than µ tuned for g (paper: {PAPER_SLOWDOWN}×, up to 2×)",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [
        GROUPS_OPTION,
        ITERATIONS_OPTION,
        NET_OPTION,
    ],
)

if __name__ == "__main__":
    sys.exit(main())
