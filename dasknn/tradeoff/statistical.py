"""Statistical efficiency: iterations to a target loss, and the momentum that asynchrony adds.

Omnivore §IV-C: SE = iterations to reach a target loss. Theorem 1: with g asynchronous
groups and explicit momentum 0, E V(t+1) = (1 − 1/g) E V(t) − (η/g) E ∇ℓ(W(t)), i.e. asynchrony is
implicit momentum 1 − 1/g. `measure_implicit_momentum` checks that by real asynchronous SGD on a
least-squares problem and a least-squares fit of the expected update sequence.

One loss-smoothing rule is used everywhere (traces, records, targets): the smoothed loss after
update t is the mean of the last `SMOOTHING_WINDOW` = 10 logged losses (fewer at the start), as in
the Omnivore reference implementation (HazyResearch/Omnivore omnivore.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "SMOOTHING_WINDOW",
    "TARGET_LOSS_RULE",
    "MomentumFit",
    "async_sgd_least_squares",
    "final_loss",
    "fit_momentum",
    "implicit_momentum",
    "iterations_to_target",
    "measure_implicit_momentum",
    "smoothed_loss",
    "target_loss",
]

SMOOTHING_WINDOW = 10

TARGET_LOSS_RULE = (
    "smoothed loss = trailing mean of the last 10 logged losses (fewer at the start); "
    "l_F = the highest final smoothed loss among the finite runs compared (the lowest loss every run "
    "reached); SE = updates until the smoothed loss first is <= l_F"
)


def _losses(trace_or_losses) -> np.ndarray:
    if isinstance(trace_or_losses, pd.DataFrame):
        df = trace_or_losses
        if "t_end" in df and not df["t_end"].is_monotonic_increasing:
            df = df.sort_values(["t_end", "group"], kind="stable")
        return df["loss"].to_numpy(dtype=float)
    return np.asarray(trace_or_losses, dtype=float).ravel()


def smoothed_loss(trace_or_losses, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """The trailing mean of the last `window` losses after each update (a Trace's rows in order)."""
    losses = _losses(trace_or_losses)
    return pd.Series(losses).rolling(int(window), min_periods=1).mean().to_numpy()


def final_loss(trace_or_losses, window: int = SMOOTHING_WINDOW) -> float:
    """The smoothed loss at the end of a run (NaN for an empty one)."""
    s = smoothed_loss(trace_or_losses, window)
    return float(s[-1]) if len(s) else float("nan")


def iterations_to_target(trace_or_losses, target: float, window: int = SMOOTHING_WINDOW) -> float:
    """SE: the number of updates until the smoothed loss is first <= `target`; NaN if never (§IV-C)."""
    s = smoothed_loss(trace_or_losses, window)
    hit = np.flatnonzero(s <= target)
    return float(hit[0] + 1) if len(hit) else float("nan")


def target_loss(final_losses: Iterable[float]) -> float:
    """ℓ_F: the lowest final loss that every run reached = the highest finite final loss (appendix F-C)."""
    finals = np.asarray(list(final_losses), dtype=float)
    finals = finals[np.isfinite(finals)]
    return float(finals.max()) if len(finals) else float("nan")


def implicit_momentum(n_groups: int) -> float:
    """Theorem 1's implicit momentum of g asynchronous groups: 1 − 1/g (Omnivore §IV-C)."""
    return 1.0 - 1.0 / int(n_groups)


@dataclass(frozen=True)
class MomentumFit:
    """A least-squares fit of E V(t+1) ≈ momentum · E V(t) − lr_scale · E ∇ℓ(W(t)) (Theorem 1)."""

    momentum: float
    lr_scale: float
    r2: float
    n_steps: int


def fit_momentum(updates: np.ndarray, gradients: np.ndarray) -> MomentumFit:
    """Fit the momentum actually seen in a sequence of updates (Omnivore Theorem 1, Fig. 6).

    `updates[t]` = V(t+1) = W(t+1) − W(t) and `gradients[t]` = ∇ℓ(W(t)), shape (T, d), or
    (replicas, T, d): replicas are averaged first, estimating the expectations of Theorem 1.
    Least squares of V(t+1) on [V(t), −∇ℓ(W(t))] over t = 1..T−1 and all coordinates.
    """
    V, G = np.asarray(updates, dtype=float), np.asarray(gradients, dtype=float)
    if V.ndim == 3:
        V, G = V.mean(axis=0), G.mean(axis=0)
    if V.ndim == 1:
        V, G = V[:, None], G[:, None]
    if V.shape != G.shape or V.shape[0] < 3:
        raise ValueError(f"updates and gradients need the same shape (T >= 3, d); got {V.shape}, {G.shape}")
    y = V[1:].ravel()
    X = np.stack([V[:-1].ravel(), -G[1:].ravel()], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    r2 = 1.0 - float(resid @ resid) / float(y @ y) if float(y @ y) > 0 else float("nan")
    return MomentumFit(momentum=float(coef[0]), lr_scale=float(coef[1]), r2=r2, n_steps=len(V))


def _least_squares_problem(n_samples: int, dim: int, rng: np.random.Generator):
    """A, b with the Hessian AᵀA/n spread over [0.1, 1] and a little label noise."""
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scales = np.sqrt(np.linspace(0.1, 1.0, dim))
    A = rng.standard_normal((n_samples, dim)) @ (q * scales) @ q.T
    w_true = rng.standard_normal(dim)
    b = A @ w_true + 0.1 * rng.standard_normal(n_samples)
    return A, b


def _step_times(rng: np.random.Generator, shape, variability: str, cv: float) -> np.ndarray:
    """Per-step durations of mean 1: 'exponential' (Theorem 1's A2), 'gamma' with a CV, 'deterministic'."""
    if variability == "exponential":
        return rng.exponential(1.0, size=shape)
    if variability == "gamma":
        if cv <= 0:
            return np.ones(shape)
        return rng.gamma(1.0 / cv**2, cv**2, size=shape)
    if variability == "deterministic":
        return np.ones(shape)
    raise ValueError(f"variability must be 'exponential', 'gamma' or 'deterministic', got {variability!r}")


def async_sgd_least_squares(
    n_groups: int,
    *,
    lr: float | None = None,
    steps: int = 100,
    replicas: int = 1000,
    batch_size: int = 16,
    n_samples: int = 512,
    dim: int = 8,
    variability: str = "exponential",
    cv: float = 0.06,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Asynchronous SGD with µ = 0 on least squares; returns the expected (updates, gradients).

    g groups each read the model, compute a minibatch gradient on it, and write it back when their
    step time ends (discrete events, as in SimulatedEngine); the next read is immediate. The run is
    repeated on `replicas` independent draws of step times and batches from the same start, and the
    replica means estimate E V(t+1) and E ∇ℓ(W(t)) (= ∇ℓ(E W(t)), ℓ being quadratic). Returns two
    (steps, dim) arrays: updates[t] = E V(t+1), gradients[t] = E ∇ℓ(W(t)). Omnivore Theorem 1.

    The default lr, 0.8/√g, keeps η·λ_max·g of order 1 (Hessian eigenvalues in [0.1, 1]): with a
    much smaller step the expected updates are quasi-static, V ≈ −η∇, and any (m, c = η(1 − m))
    fits them equally well, so the momentum cannot be identified from them.
    """
    g = int(n_groups)
    if g < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}")
    lr = 0.8 / np.sqrt(g) if lr is None else float(lr)
    A, b = _least_squares_problem(n_samples, dim, np.random.default_rng([seed, 0]))
    rng = np.random.default_rng([seed, 1, g])
    H, q = A.T @ A / n_samples, A.T @ b / n_samples
    R = int(replicas)
    rows = np.arange(R)

    def minibatch_gradient(W: np.ndarray) -> np.ndarray:
        idx = rng.integers(0, n_samples, size=(W.shape[0], batch_size))
        Ab = A[idx]
        resid = np.einsum("rbd,rd->rb", Ab, W) - b[idx]
        return np.einsum("rbd,rb->rd", Ab, resid) / batch_size

    W = np.zeros((R, dim))
    grads_read = np.stack([minibatch_gradient(W) for _ in range(g)], axis=1)
    finish = _step_times(rng, (R, g), variability, cv)
    finish = finish + 1e-9 * np.arange(g)
    means = [W.mean(axis=0)]
    for _ in range(steps):
        writer = np.argmin(finish, axis=1)
        W = W - lr * grads_read[rows, writer]
        grads_read[rows, writer] = minibatch_gradient(W)
        finish[rows, writer] += _step_times(rng, R, variability, cv)
        means.append(W.mean(axis=0))
    Wm = np.asarray(means)
    return np.diff(Wm, axis=0), Wm[:-1] @ H - q


def measure_implicit_momentum(n_groups: int, **options) -> MomentumFit:
    """The momentum measured in asynchronous SGD with µ = 0 and g groups (Theorem 1 predicts 1 − 1/g).

    `options` go to `async_sgd_least_squares` (lr, steps, replicas, variability, seed, ...).
    """
    updates, gradients = async_sgd_least_squares(n_groups, **options)
    return fit_momentum(updates, gradients)
