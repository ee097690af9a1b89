"""Shared pieces of the training experiments 5-8 and 10: data, nets, simulated clusters, grid runs.

Omnivore §V / appendix E-D (the per-staleness grid search) and §IV-B (the HE model that gives the
simulated clock). Every run is real SGD on the SimulatedEngine; only its clock is a model. A group
count g runs on a SimulatedEngine of g workers (k = 1 in the simulator) whose conv time is the
modeled cluster's t_conv(N // g): the same clock as N workers in groups of N // g, and the same
maths (a group's sum of its k shard gradients is its batch gradient, up to float rounding), without
cutting every batch into N // g shards on this 2-core machine.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

import dask
import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn import zoo
from dasknn.nn.layers import Convolution, Filler, InnerProduct, Pooling, ReLU
from dasknn.nn.net import Net
from dasknn.tradeoff.hardware import HEModel
from dasknn.tradeoff.statistical import final_loss

__all__ = [
    "ACCURACY_WINDOW",
    "BLAS_THREADS",
    "MOMENTA",
    "NETS",
    "cpu_l_model",
    "dataset",
    "engine_for_groups",
    "iterations_to_accuracy",
    "lenet_small",
    "make_net",
    "next_grid",
    "best_by_final_loss",
    "check_seeds",
    "positive_ints",
    "run_all",
    "smoothed_accuracy",
    "spread",
    "train",
]

MOMENTA = (0.0, 0.3, 0.6, 0.9)
"""Omnivore's momentum grid (appendix E-D)."""

BLAS_THREADS = 1
"""BLAS threads while training: small GEMMs gain nothing from more, and on a shared 2-core machine a
multithreaded BLAS spinning against other processes made LeNet-sized iterations ~30× slower."""

ACCURACY_WINDOW = 20
"""Batches in the trailing mean of the training batch accuracy (a target is reached on this mean)."""

CPU_L = {"n_workers": 32, "device_gflops": 742.0, "bandwidth_bytes_per_s": 1e9 / 8, "batch_size": 256}
"""Omnivore's CPU-L: 32 conv + 1 FC c4.4xlarge at 742 GFLOP/s, 1 Gbit/s; CaffeNet b = 256 (§VI-A, Fig. 9)."""


def lenet_small(input_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10, seed: int = 0) -> Net:
    """LeNet's layout (2 conv + 2 max-pool, 2 FC) with 8/16 filters and 64 hidden units (~9× cheaper)."""

    def conv(name: str, n: int) -> Convolution:
        return Convolution(name, n, 5, weight_filler=Filler("xavier"), lr_mult=(1.0, 2.0))

    def ip(name: str, n: int) -> InnerProduct:
        return InnerProduct(name, n, weight_filler=Filler("xavier"), lr_mult=(1.0, 2.0))

    layers = [
        conv("conv1", 8),
        Pooling("pool1", "max", 2, stride=2),
        conv("conv2", 16),
        Pooling("pool2", "max", 2, stride=2),
        ip("ip1", 64),
        ReLU("relu1"),
        ip("ip2", num_classes),
    ]
    return Net(layers, input_shape, name="LeNet-small", seed=seed)


NETS: dict[str, Callable[..., Net]] = {
    "lenet": zoo.lenet,
    "lenet_small": lenet_small,
    "cifar10_quick": zoo.cifar10_quick,
}


def make_net(name: str, seed: int = 0) -> Net:
    """A fresh net by name (one of `NETS`), the same weights for the same seed."""
    if name not in NETS:
        raise ValueError(f"unknown net {name!r}; valid: {sorted(NETS)}")
    return NETS[name](seed=seed)


SYNTHETIC_SHAPES = {"cifar-synthetic": (3, 32, 32), "mnist-synthetic": (1, 28, 28)}


@functools.lru_cache(maxsize=4)
def dataset(name: str, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) as numpy: 'mnist-sample' (first n of the 5,000), 'cifar-synthetic' or 'mnist-synthetic'.

    The synthetic ones are `load('synthetic')` with CIFAR-10's shape (3×32×32, 10 classes; CIFAR-10
    itself is not on this machine) or MNIST's (1×28×28; the tiny settings use it: it costs nothing
    to load, while the MNIST sample's CSV takes seconds). Cached: every run sees the same arrays.
    """
    if not 1 <= int(n_samples):
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if name == "mnist-sample":
        X, y = load("mnist-sample")
        X, y = dask.compute(X[:n_samples], y[:n_samples])
    elif name in SYNTHETIC_SHAPES:
        shape = SYNTHETIC_SHAPES[name]
        X, y = dask.compute(*load("synthetic", n_samples=int(n_samples), shape=shape, n_classes=10))
    else:
        raise ValueError(f"unknown dataset {name!r}; valid: {['mnist-sample', *SYNTHETIC_SHAPES]}")
    return np.ascontiguousarray(X, dtype=np.float32), np.asarray(y, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def cpu_l_model() -> HEModel:
    """Omnivore's CPU-L through the HE model: CaffeNet (single tower) on 32 conv machines (whatif_cpu_l)."""
    return HEModel.estimate(
        zoo.caffenet(groups=1),
        CPU_L["batch_size"],
        CPU_L["n_workers"],
        CPU_L["device_gflops"],
        CPU_L["bandwidth_bytes_per_s"],
    )


def engine_for_groups(
    model: HEModel, g: int, strategy: Strategy | None = None, cv: float = 0.06, **options
) -> SimulatedEngine:
    """A SimulatedEngine of g workers whose clock is `model`'s for g groups of N // g (gamma CV 6%)."""
    t_conv = model.t_conv(model.group_size(g))
    return SimulatedEngine(
        t_conv=t_conv,
        t_fc=model.t_fc,
        n_workers=int(g),
        variability="gamma",
        cv=cv,
        verbose=0,
        strategy=strategy,
        **options,
    )


def smoothed_accuracy(trace: pd.DataFrame, window: int = ACCURACY_WINDOW) -> np.ndarray:
    """Trailing mean of the batch accuracy of the last `window` updates, in completion order."""
    acc = trace.sort_values(["t_end", "group"], kind="stable")["accuracy"].to_numpy(dtype=float)
    return pd.Series(acc).rolling(int(window), min_periods=int(window)).mean().to_numpy()


def iterations_to_accuracy(trace: pd.DataFrame, target: float, window: int = ACCURACY_WINDOW) -> float:
    """Updates until the smoothed batch accuracy first is >= target; NaN if never."""
    hit = np.flatnonzero(smoothed_accuracy(trace, window) >= target)
    return float(hit[0] + 1) if len(hit) else math.nan


def train(
    engine,
    net: str,
    X: np.ndarray,
    y: np.ndarray,
    config: RunConfig,
    iterations: int,
    target_accuracy: float | None = None,
    chunk: int = 50,
) -> pd.DataFrame:
    """One run of `iterations` updates from the net's seeded weights; its Trace (one clock).

    With `target_accuracy`, the run goes in chunks of `chunk` updates and stops early once the
    smoothed batch accuracy reached it (the simulator continues a run exactly across chunks).
    A diverged run (non-finite loss) ends at once. BLAS runs on one thread (`BLAS_THREADS`).
    """
    with threadpool_limits(limits=BLAS_THREADS):
        return _train(engine, net, X, y, config, iterations, target_accuracy, chunk)


def _train(engine, net, X, y, config, iterations, target_accuracy, chunk) -> pd.DataFrame:
    model = make_net(net, seed=config.seed)
    if target_accuracy is None:
        return engine.run(model, X, y, config, Budget(iterations=int(iterations))).trace
    state, parts, done = TrainState.from_net(model), [], 0
    while done < iterations:
        result = engine.run(
            model, X, y, config, Budget(iterations=min(chunk, iterations - done)), start=state
        )
        parts.append(result.trace)
        state, done = result.state, done + len(result.trace)
        trace = pd.concat(parts, ignore_index=True)
        trace.attrs = dict(result.trace.attrs)
        if result.trace.attrs.get("diverged") or len(result.trace) == 0:
            break
        if not math.isnan(iterations_to_accuracy(trace, target_accuracy)):
            break
    return trace


def run_all(fn: Callable, tasks: Sequence[tuple], jobs: int = 1) -> list:
    """`[fn(*task) for task in tasks]`, in `jobs` processes when jobs > 1 (the runs are independent
    and seeded, so the results do not depend on jobs). `fn` must be a module-level function."""
    if int(jobs) < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if int(jobs) == 1 or len(tasks) < 2:
        return [fn(*task) for task in tasks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(int(jobs), len(tasks)), mp_context=context) as pool:
        return list(pool.map(fn, *zip(*tasks, strict=True)))


def next_grid(
    lr_last: float, momentum_last: float, momenta: Sequence[float] = MOMENTA
) -> list[tuple[float, float]]:
    """(momentum, lr) pairs of the next staleness: µ × {η*_last, η*_last/10}, no µ > µ*_last at η*_last.

    Omnivore appendix E-D (the cold start's search from one S to the next).
    """
    pairs = [(float(m), float(lr_last)) for m in momenta if m <= momentum_last + 1e-12]
    return pairs + [(float(m), float(lr_last) / 10) for m in momenta]


def best_by_final_loss(traces: dict[tuple[float, float], pd.DataFrame]) -> tuple[float, float]:
    """The (momentum, lr) key of the lowest final smoothed loss (diverged runs excluded)."""
    finals = {key: final_loss(t) for key, t in traces.items()}
    finite = {key: v for key, v in finals.items() if math.isfinite(v)}
    if not finite:
        raise FloatingPointError(f"every run of {sorted(traces)} diverged")
    return min(finite, key=finite.get)


def spread(values, missing: str = "never") -> str:
    """'median [min, max]' of the seeds' values; a non-finite value (a seed that never reached a
    target) counts as the largest and is written as `missing`."""
    v = np.asarray(values, dtype=float)
    v = np.where(np.isfinite(v), v, np.inf)

    def fmt(x: float) -> str:
        return missing if not math.isfinite(x) else f"{x:.3g}"

    return f"{fmt(float(np.median(v)))} [{fmt(float(v.min()))}, {fmt(float(v.max()))}]"


def check_seeds(seeds: int) -> int:
    """`seeds` as an int >= 1, or a ValueError naming it."""
    if int(seeds) < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    return int(seeds)


def positive_ints(values: Iterable[int], name: str) -> tuple[int, ...]:
    """A tuple of ints >= 1, or a ValueError naming `name`."""
    out = tuple(int(v) for v in values)
    if not out or any(v < 1 for v in out):
        raise ValueError(f"{name} must be integers >= 1, got {list(values)}")
    return out
