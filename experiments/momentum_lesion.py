"""Momentum lesion: at the chosen g, µ = 0.9 vs µ tuned for sync vs µ tuned for g (time to a loss).

Mirrors Omnivore Fig. 13 (§VI-C): on CPU-L at the optimal g = 4 (ImageNet-8), momentum
(i) fixed at 0.9 (AlexNet's default, also the best for sync), (ii) tuned for a synchronous system,
(iii) tuned by Omnivore's optimizer for g groups. The paper found that without tuning for the
asynchrony Omnivore would be 1.5× slower (up to 2× in further experiments, 2.4× on TensorFlow).

Here: the simulated CPU-L-like cluster of experiment 5 (the HE model of CaffeNet on CPU-L as the
clock, real SGD of the small LeNet, b = 32) on the MNIST sample with the training digits shifted by
up to ±2 px (`dasknn.data.augment`; on plain digits this net reaches its plateau so fast that µ ∈
{0.6, 0.9} differed by less than the seeds), 500 updates a run, 3 seeds (data order, augmentation,
initial weights). The sync grid (g = 1, µ ∈ {0, 0.3, 0.6, 0.9} × η ∈ {0.1, 0.01}) gives µ*_sync,
η*_sync; the grid at g (µ × {η*_sync, η*_sync/10, η*_sync/100}: the last so that µ = 0.9 has an η
at which it trains) gives each momentum rule its best η at g, on the seeds' mean final loss. A run
that ends above twice its first loss diverged: no rule takes such a point while another trains. Per seed,
ℓ_F is the highest final smoothed loss of the rules that did not diverge, and a rule's slowdown is
its simulated time to ℓ_F over the g-tuned rule's (a diverged rule never reaches it).
g: `--groups`, else the g experiment 5's optimizer chose at most seeds
(experiments/results/tradeoff/tradeoff.nc), else the smallest g dividing 32 that saturates the FC server (8).

What it found (default setting, g = 8, 3 seeds, `--jobs 12`; 1,010 s at load 8-30): the paper's
µ = 0.9 untuned is 1.5× slower (up to 2×); here 4.62× [4.48, 4.65] (median [range] over the seeds;
per seed 4.62, 4.48, 4.65). At g = 8, µ = 0.9 diverges at η = 0.1 and 0.01 at every seed and trains
only at η = 0.001 (final loss 0.86 [0.79, 0.90]), while the g-tuned rule is µ = 0 at η = 0.1 (0.19
[0.17, 0.22]); µ = 0.3 and 0.6 diverge at η = 0.1 too. Sync (g = 1) is best at µ = 0, η = 0.1
(0.184), µ = 0.9 at η = 0.01 a close second (0.209), so here "µ tuned for sync" is the g-tuned rule,
where in the paper it was µ = 0.9. Direction reproduces, beyond the seeds' spread; the size is
larger than the paper's, because at g = 8 the implicit momentum 1 − 1/g = 0.875 added to µ = 0.9
leaves µ = 0.9 only an η ten times below the best. An earlier run on plain digits (400 updates, 2
seeds) could not tell µ = 0.6 from 0.9 (1.12×, the order flipping between seeds).

    python -m experiments.momentum_lesion [--tiny] [--groups G] [--iterations N] [--seeds S] [--jobs N]

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

from dasknn.data.augment import as_augment  # noqa: E402
from dasknn.engine.trace import RunConfig  # noqa: E402
from dasknn.tradeoff.record import load  # noqa: E402
from dasknn.tradeoff.statistical import final_loss, iterations_to_target, smoothed_loss  # noqa: E402
from experiments.common import (  # noqa: E402
    GROUPS_OPTION,
    ITERATIONS_OPTION,
    JOBS_OPTION,
    NET_OPTION,
    RESULTS_ROOT,
    SEEDS_OPTION,
    Experiment,
    main_for,
    markdown_table,
    stamp,
)
from experiments.sgd_grid import (  # noqa: E402
    MOMENTA,
    cpu_l_model,
    dataset,
    engine_for_groups,
    make_net,
    run_all,
    train,
)
from experiments.tradeoff import most_chosen  # noqa: E402

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
        "iterations": 500,
        "seeds": 3,
        "n_samples": 5000,
        "data": "mnist-sample",
        "augment": "shift",
    },
    True: {
        "momenta": (0.0, 0.9),
        "lrs": (0.1,),
        "iterations": 10,
        "seeds": 2,
        "n_samples": 320,
        "data": "mnist-synthetic",
        "augment": None,
    },
}


def default_groups() -> tuple[int, str]:
    """Experiment 5's optimizer choice when its result exists, else the HE model's saturating g."""
    path = RESULTS_ROOT / "tradeoff" / "tradeoff.nc"
    if path.is_file():
        ds = load(path)
        if "chosen_groups" in ds:
            return most_chosen(ds["chosen_groups"]), f"chosen by experiment 5's optimizer ({path.name})"
    model = cpu_l_model()
    g = model.smallest_saturating_g([d for d in range(1, 33) if 32 % d == 0]) or 1
    return int(g), "smallest g dividing 32 that saturates the FC server (HE model)"


DIVERGED = 2.0
"""A run diverged when its final smoothed loss is above this many times its first loss."""


def diverged(trace: pd.DataFrame) -> bool:
    """Whether a run blew up: its final smoothed loss is not finite or DIVERGED × its first loss."""
    final = final_loss(trace)
    return not math.isfinite(final) or final > DIVERGED * float(smoothed_loss(trace)[0])


def seed_final(traces: list[pd.DataFrame]) -> float:
    """The seeds' mean final smoothed loss; inf if any seed diverged (a rule must hold at every seed)."""
    if any(diverged(t) for t in traces):
        return math.inf
    return float(np.mean([final_loss(t) for t in traces]))


def one(net: str, data: tuple[str, int], augment: str | None, config: RunConfig, iterations: int):
    """One run of `config.n_groups` groups on the simulated CPU-L-like clock; its Trace."""
    X, y = dataset(*data)
    engine = engine_for_groups(cpu_l_model(), config.n_groups, augment=as_augment(augment))
    return train(engine, net, X, y, config, iterations)


def grid(
    net: str, data: tuple[str, int], g: int, pairs, iterations: int, seeds: int, augment=None, jobs: int = 1
) -> dict[tuple[float, float], list[pd.DataFrame]]:
    """One trace per seed, keyed (µ, η), of g groups (`jobs` processes at once)."""
    keys = [(m, lr, seed) for m, lr in pairs for seed in range(seeds)]
    tasks = [
        (net, data, augment, RunConfig(g, lr, m, WEIGHT_DECAY, 32, seed=seed), iterations)
        for m, lr, seed in keys
    ]
    traces = dict(zip(keys, run_all(one, tasks, jobs), strict=True))
    return {(m, lr): [traces[m, lr, seed] for seed in range(seeds)] for m, lr in pairs}


def best(runs: dict[tuple[float, float], list[pd.DataFrame]]) -> tuple[float, float]:
    """The (µ, η) of the lowest seed-mean final loss, a point diverging at any seed excluded; if
    every point diverged, the one of the lowest mean final loss (a rule that never trains)."""
    finals = {key: seed_final(traces) for key, traces in runs.items()}
    finite = {key: v for key, v in finals.items() if math.isfinite(v)}
    if finite:
        return min(finite, key=finite.get)

    def raw(key: tuple[float, float]) -> float:
        values = np.array([final_loss(t) for t in runs[key]], dtype=float)
        return float(np.mean(np.where(np.isfinite(values), values, np.inf)))

    return min(runs, key=raw)


def lesion(sync: dict, at_g: dict) -> dict[str, tuple[float, float]]:
    """(µ, η) of each rule: 0.9, the sync optimum's µ, the g optimum; each with its best η at g."""
    mu_sync, _ = best(sync)

    def best_eta(mu: float) -> tuple[float, float]:
        return best({k: t for k, t in at_g.items() if math.isclose(k[0], mu)})

    return {RULES[0]: best_eta(0.9), RULES[1]: best_eta(mu_sync), RULES[2]: best(at_g)}


def to_target(traces: list[pd.DataFrame], n: int) -> tuple[np.ndarray, ...]:
    """Per rule and seed: smoothed loss and clock padded to n, final loss, ℓ_F of the seed, its
    iterations and simulated time to it (ℓ_F: the highest final loss of the rules at that seed)."""
    curves, clocks = np.full((len(traces), n), np.nan), np.full((len(traces), n), np.nan)
    finals = np.array([final_loss(t) for t in traces])
    for i, t in enumerate(traces):
        t = t.sort_values(["t_end", "group"], kind="stable")
        curves[i, : len(t)], clocks[i, : len(t)] = smoothed_loss(t), t["t_end"].to_numpy(dtype=float)
    ok = np.array([not diverged(t) for t in traces])
    ell = float(np.max(finals[ok])) if ok.any() else math.nan
    its = np.array(
        [iterations_to_target(t, ell) if good else math.nan for t, good in zip(traces, ok, strict=True)]
    )
    times = np.array([clocks[i, int(it) - 1] if math.isfinite(it) else math.nan for i, it in enumerate(its)])
    return curves, clocks, finals, ell, its, times


def build(sync: dict, at_g: dict, chosen: dict, g: int) -> xr.Dataset:
    """The Dataset: each rule's loss curve and clock per seed, ℓ_F, time to it, both grids' finals."""
    per_rule = [at_g[key] for key in chosen.values()]
    seeds, n = len(per_rule[0]), max(len(t) for ts in per_rule for t in ts)
    shape = (len(RULES), seeds)
    curves, clocks = np.full(shape + (n,), np.nan), np.full(shape + (n,), np.nan)
    finals, its, times, ells = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan), []
    for s in range(seeds):
        c, k, f, ell, it, tt = to_target([ts[s] for ts in per_rule], n)
        curves[:, s], clocks[:, s], finals[:, s], its[:, s], times[:, s] = c, k, f, it, tt
        ells.append(ell)

    def grid_array(runs: dict) -> tuple[list[float], list[float], np.ndarray]:
        mus, lrs = sorted({k[0] for k in runs}), sorted({k[1] for k in runs})
        arr = np.full((len(mus), len(lrs)), np.nan)
        for (m, lr), ts in runs.items():
            arr[mus.index(m), lrs.index(lr)] = seed_final(ts)
        return mus, lrs, arr

    smu, slr, sarr = grid_array(sync)
    gmu, glr, garr = grid_array(at_g)
    rs = ("rule", "seed")
    ds = xr.Dataset(
        {
            "loss_smoothed": (("rule", "seed", "iteration"), curves, {"units": "1"}),
            "time": (("rule", "seed", "iteration"), clocks, {"units": "simulated s"}),
            "final_loss": (rs, finals, {"units": "1"}),
            "iters_to_target": (rs, its, {"units": "iterations", "description": "updates to l_F"}),
            "time_to_target": (rs, times, {"units": "simulated s", "description": "time to l_F"}),
            "slowdown": (rs, times / times[-1], {"units": "1", "description": "time to l_F / tuned-for-g's"}),
            "momentum_used": (("rule",), [chosen[r][0] for r in RULES], {"units": "1"}),
            "lr_used": (("rule",), [chosen[r][1] for r in RULES], {"units": "1"}),
            "target_loss": (
                ("seed",),
                ells,
                {"units": "1", "description": "l_F: highest final loss of the rules"},
            ),
            "sync_final_loss": (
                ("momentum_sync", "lr_sync"),
                sarr,
                {"units": "1", "description": "g = 1 grid, mean over seeds (inf: a seed diverged)"},
            ),
            "grid_final_loss": (
                ("momentum", "lr"),
                garr,
                {"units": "1", "description": f"g = {g} grid, mean over seeds (inf: a seed diverged)"},
            ),
        },
        coords={
            "rule": list(RULES),
            "seed": np.arange(seeds, dtype=np.int64),
            "iteration": np.arange(1, n + 1, dtype=np.int64),
            "momentum_sync": smu,
            "lr_sync": slr,
            "momentum": gmu,
            "lr": glr,
        },
    )
    ds.attrs["n_groups"] = int(g)
    return ds


def spread(values) -> str:
    """'median [min, max]' of the seeds' values."""
    v = np.asarray(values, dtype=float)
    return f"{np.nanmedian(v):.3g} [{np.nanmin(v):.3g}, {np.nanmax(v):.3g}]"


def table(ds: xr.Dataset) -> str:
    rows = [
        {
            "momentum rule": str(r),
            "µ": float(ds["momentum_used"].sel(rule=r)),
            "η": float(ds["lr_used"].sel(rule=r)),
            "final loss, median [range]": spread(ds["final_loss"].sel(rule=r)),
            "time to ℓ_F (sim s)": spread(ds["time_to_target"].sel(rule=r)),
            "slowdown vs tuned": spread(ds["slowdown"].sel(rule=r)),
            "per seed": ", ".join(f"{v:.2f}" for v in ds["slowdown"].sel(rule=r).values),
        }
        for r in ds["rule"].values
    ]
    return markdown_table(pd.DataFrame(rows))


def plot(ds: xr.Dataset, fig) -> None:
    ax = fig.add_subplot()
    for i, r in enumerate(ds["rule"].values):
        s = ds.sel(rule=r)
        for seed in ds["seed"].values:
            ax.plot(
                s["time"].sel(seed=seed),
                s["loss_smoothed"].sel(seed=seed),
                color=f"C{i}",
                lw=1,
                alpha=0.8,
                label=f"{r} (µ={float(s['momentum_used']):g}, η={float(s['lr_used']):g})"
                if seed == 0
                else None,
            )
    ax.axhline(float(ds["target_loss"].max()), color="k", ls=":", lw=1, label="ℓ_F (highest of the seeds)")
    ax.set_xlabel("simulated seconds (CPU-L-like clock)")
    ax.set_ylabel("training loss (smoothed); one line per seed")
    ax.set_title(f"Momentum lesion at g = {ds.attrs['n_groups']}, cf. Omnivore Fig. 13", fontsize=9)
    ax.legend(fontsize=7)


def run(
    tiny: bool = False,
    groups: int | None = None,
    iterations: int | None = None,
    seeds: int | None = None,
    net: str = "lenet_small",
    jobs: int = 1,
) -> Experiment:
    """Experiment 6 (tiny: g = 4, µ ∈ {0, 0.9}, η = 0.1, 10 updates, 2 seeds, synthetic MNIST-shaped data)."""
    s = SETTINGS[tiny]
    if iterations is not None and int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if seeds is not None and int(seeds) < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if groups is not None and not 1 <= int(groups) <= 32:
        raise ValueError(f"groups must be in [1, 32] (the CPU-L conv machines), got {groups}")
    make_net(net)
    g, why = (
        (int(groups), "given by --groups") if groups else ((4, "tiny setting") if tiny else default_groups())
    )
    iterations, seeds = int(iterations or s["iterations"]), int(seeds or s["seeds"])
    data, augment = (s["data"], s["n_samples"]), s["augment"]
    pairs = [(m, lr) for m in s["momenta"] for lr in s["lrs"]]
    sync = grid(net, data, 1, pairs, iterations, seeds, augment, jobs)
    _, lr_sync = best(sync)
    lrs_g = (lr_sync, lr_sync / 10, lr_sync / 100) if len(s["lrs"]) > 1 else (lr_sync,)
    at_g = grid(
        net, data, g, [(m, lr) for m in s["momenta"] for lr in lrs_g], iterations, seeds, augment, jobs
    )
    ds = build(sync, at_g, lesion(sync, at_g), g)
    ds = stamp(
        ds,
        NAME,
        MIRRORS,
        tiny,
        net=net,
        dataset=s["data"],
        augment=str(s["augment"]),
        iterations=iterations,
        seeds=seeds,
        groups_source=why,
    )
    notes = [
        f"g = {g} ({why}); each rule's best η at g from the grid (lowest final loss, mean over the seeds); "
        f"{iterations} updates per run, b = 32, training images augmented: {s['augment']}; "
        f"{seeds} seed(s) (data order, augmentation and initial weights), ℓ_F per seed",
        f"µ = 0.9 is {spread(ds['slowdown'].sel(rule=RULES[0]))}× slower to ℓ_F than µ tuned for g, "
        f"median [range] over the seeds (paper: {PAPER_SLOWDOWN}×, up to 2×)",
    ]
    return Experiment(ds, table(ds), plot, notes)


main = main_for(
    run,
    __doc__,
    [
        GROUPS_OPTION,
        ITERATIONS_OPTION,
        SEEDS_OPTION,
        NET_OPTION,
        JOBS_OPTION,
    ],
)

if __name__ == "__main__":
    sys.exit(main())
