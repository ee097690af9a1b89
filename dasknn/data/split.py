"""The three disjoint parts of a training set: training samples, the selection part, validation.

The tuner judges its probes on a small *selection* part, and held-out accuracy is reported and
targeted on the *validation* part; neither is ever trained on, and they share no sample, so no
reported number is biased by a choice made on it (the train / validation / test discipline of
sklearn's `MLPClassifier(validation_fraction=...)` and skorch's `train_split`, one level deeper).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Carved", "Parts", "carve", "split_parts", "stratified_take"]


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


@dataclass
class Carved:
    """A fit's data cut into its parts: the training samples (dask, streamed or persisted), and as
    numpy the selection part (None when empty), the validation data (None when there is none) and
    the "auto" tuner's fixed training samples (`tuner`, None for other fits)."""

    X: Any
    y: Any
    selection: tuple[np.ndarray, np.ndarray] | None
    validation: tuple[np.ndarray, np.ndarray] | None
    tuner: tuple[np.ndarray, np.ndarray] | None = None


def carve(
    X,
    y,
    parts: Parts,
    *,
    view: Callable[[Any], Any],
    train_from,
    rows_per_chunk: int,
    given: tuple[Any, Any] | None = None,
    tuner_rows: np.ndarray | None = None,
) -> Carved:
    """Cut (X, y) into `parts`: the training part from `train_from` (X itself, or for a streamed fit
    the stored array the workers convert), rechunked to `rows_per_chunk`; the selection and
    validation parts and the `tuner_rows` training samples computed together through `view` (the
    net's input shape), so a chunk of a store is read once for all three. `given`: validation data
    passed by the user (X_val, class indices), used instead of the validation part."""
    import dask

    from dasknn.data.chunks import take_rows

    sel, val = parts.selection, parts.validation
    tuned = np.zeros(0, dtype=int) if tuner_rows is None else tuner_rows
    X_sel, y_sel, X_val, y_val, X_tuner, y_tuner = dask.compute(
        view(take_rows(X, sel)), take_rows(y, sel), view(take_rows(X, val)), take_rows(y, val),
        view(take_rows(X, tuned)), take_rows(y, tuned),
    )  # fmt: skip
    if given is not None:
        X_val, y_val = dask.compute(view(given[0]), given[1])
    X_train, y_train = train_from, y
    if len(parts.train) < X_train.shape[0]:
        X_train = take_rows(X_train, parts.train).rechunk({0: rows_per_chunk})
        y_train = take_rows(y, parts.train).rechunk({0: X_train.chunks[0]})
    return Carved(
        X_train,
        y_train,
        (X_sel, np.asarray(y_sel)) if len(sel) else None,
        (X_val, np.asarray(y_val)) if len(y_val) else None,
        None if tuner_rows is None else (X_tuner, np.asarray(y_tuner)),
    )
