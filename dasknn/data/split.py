"""The three disjoint parts of a training set: training samples, the selection part, validation.

The optimizer judges its probes on a small *selection* part, and held-out accuracy is reported and
targeted on the *validation* part; neither is ever trained on, and they share no sample, so no
reported number is biased by a choice made on it (the train / validation / test discipline of
sklearn's `MLPClassifier(validation_fraction=...)` and skorch's `train_split`, one level deeper).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Parts", "split_parts", "stratified_take"]


@dataclass(frozen=True)
class Parts:
    """Sorted sample indices of the three parts of X (disjoint; together they are every sample)."""

    train: np.ndarray
    selection: np.ndarray
    validation: np.ndarray


def stratified_take(y: np.ndarray, candidates: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` of `candidates` (indices into y) drawn at random with each class in proportion to its count.

    Each class gets floor(n · share); the samples left over go to the classes with the largest
    remainders, so the total is exactly `n` and a class is never asked for more than it has.
    """
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    labels = y[candidates]
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / len(candidates)
    take = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - take), kind="stable")[: n - int(take.sum())]:
        take[i] += 1
    picked = [
        rng.choice(candidates[labels == c], size=int(k), replace=False)
        for c, k in zip(classes, take, strict=True)
        if k
    ]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def split_parts(y: np.ndarray, validation_fraction: float | None, selection_size: int, seed: int) -> Parts:
    """Stratified, seeded train / selection / validation indices of the labels `y`.

    The validation part is `validation_fraction` of the samples (none when None), drawn first;
    the selection part is `selection_size` samples of the rest, but never more than a tenth of
    them, so a small X is still mostly trained on. The same labels and seed give the same parts.
    """
    y = np.asarray(y)
    n = len(y)
    if validation_fraction is not None and not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    if selection_size < 0:
        raise ValueError(f"selection_size must be >= 0, got {selection_size!r}")
    rng = np.random.default_rng(seed)
    everything = np.arange(n, dtype=np.int64)
    n_val = 0 if validation_fraction is None else int(round(n * validation_fraction))
    if validation_fraction is not None and not 1 <= n_val < n:
        raise ValueError(
            f"validation_fraction={validation_fraction} of {n} samples leaves {n_val} for validation "
            f"and {n - n_val} for training; both need at least one"
        )
    validation = stratified_take(y, everything, n_val, rng)
    rest = np.setdiff1d(everything, validation, assume_unique=True)
    n_sel = min(int(selection_size), len(rest) // 10)
    selection = stratified_take(y, rest, n_sel, rng)
    train = np.setdiff1d(rest, selection, assume_unique=True)
    return Parts(train=train, selection=selection, validation=validation)
