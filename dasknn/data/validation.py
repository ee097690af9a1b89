"""The one gate between user input and training: `check_X_y` for fit, `check_X` for predict.

Both turn bad input into a ValueError that names the problem before any work starts, and return
X as a float32 dask array chunked along samples (numpy input is wrapped, chunked for the batch
size) and y as int64. Values are checked with one `dask.compute` of small reductions (NaN and inf
counts, non-integer labels): nothing is materialised on the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.user_warning import warn_user

from .chunks import DEFAULT_BATCH_SIZE, check_batch_size, from_numpy, is_dask_array

if TYPE_CHECKING:
    import dask.array as da

__all__ = ["channels_last_hint", "check_X", "check_X_y"]

_AXES = ("samples", "channels", "height", "width")
UNSCALED_LIMIT = 20.0  # inputs beyond this in absolute value may be unscaled (`_unscaled`)
SCALED_RMS = 4.0  # inputs whose root mean square is at most this are of order 1, whatever their outliers


def channels_last_hint(sample_shape: tuple[int, ...]) -> str:
    """A hint when (C, H, W) looks like channels-last images (H, W, C): "" otherwise.

    Looks channels-last: a last axis of 1, 3 or 4 (grey, RGB, RGBA) after two axes of 8 or more.
    """
    if len(sample_shape) != 3:
        return ""
    h, w, c = sample_shape
    if c not in (1, 3, 4) or min(h, w) < 8:
        return ""
    return (
        f"; X looks channels-last (n, {h}, {w}, {c}) = (n, height, width, channels): dasknn takes "
        f"(n, channels, height, width), so pass X.transpose(0, 3, 1, 2) (shape (n, {c}, {h}, {w}))"
    )


def _as_array(a: Any, name: str) -> da.Array | np.ndarray:
    if is_dask_array(a) or isinstance(a, np.ndarray):
        return a
    try:
        return np.asarray(a)
    except ValueError as err:
        raise ValueError(f"{name} is not a rectangular array: {err}") from err


def _structure_X(X: Any, batch_size: int | None) -> da.Array:
    X = _as_array(X, "X")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; expected numbers (bool, integer or float)")
    if X.ndim != 4:
        hint = ""
        if X.ndim == 3:
            hint = (
                f"; for one-channel images add the channel axis: X[:, None] (shape "
                f"({X.shape[0]}, 1, {X.shape[1]}, {X.shape[2]}))"
            )
        if X.ndim == 2:
            hint = (
                f"; reshape flat images to (n_samples, channels, height, width) first, "
                f"e.g. X.reshape(-1, 1, 28, 28) for {X.shape[1]} = 784 MNIST pixels"
            )
        raise ValueError(
            f"X must be 4-D (n_samples, channels, height, width) but is {X.ndim}-D with shape {X.shape}{hint}"
        )
    if X.shape[0] == 0:
        raise ValueError("X has 0 samples")
    empty = [_AXES[a] for a in range(1, 4) if X.shape[a] == 0]
    if empty:
        raise ValueError(f"X has shape {X.shape}: its {', '.join(empty)} axis is empty")
    if not is_dask_array(X):
        return from_numpy(X, batch_size or DEFAULT_BATCH_SIZE)
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError("X has unknown chunk sizes along samples; call X.compute_chunk_sizes() first")
    split = [f"{_AXES[a]} (axis {a}, {len(X.chunks[a])} chunks)" for a in range(1, 4) if len(X.chunks[a]) > 1]
    if split:
        raise ValueError(
            f"X must be chunked along samples only, but is also chunked along {', '.join(split)}; "
            "use X.rechunk({1: -1, 2: -1, 3: -1})"
        )
    return X


def _structure_y(y: Any, X: da.Array) -> da.Array:
    y = _as_array(y, "y")
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D (n_samples,) but has shape {y.shape}; use y.ravel() for a column")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has {y.shape[0]} labels")
    if y.dtype.kind not in "iuf":
        raise ValueError(
            f"y has dtype {y.dtype}; labels must be integer class indices (encode class names "
            "first, e.g. with sklearn.preprocessing.LabelEncoder)"
        )
    if not is_dask_array(y):
        import dask.array as da

        return da.from_array(y, chunks=(X.chunks[0],))
    return y if y.chunks[0] == X.chunks[0] else y.rechunk({0: X.chunks[0]})


def _check_values(X: da.Array, y: da.Array | None, check_finite: bool, scale: bool = False) -> None:
    """NaN, inf and non-integer labels refused, counted; with `scale`, a constant X and inputs far
    above order 1 warned about (`UNSCALED_LIMIT`). One `dask.compute` of reductions."""
    import dask
    import dask.array as da

    counts: dict[str, da.Array] = {}
    if check_finite and X.dtype.kind == "f":
        counts["nan"] = da.isnan(X).sum()
        counts["inf"] = da.isinf(X).sum()
    if scale:
        counts["largest"], counts["smallest"], counts["most"] = abs(X).max(), X.min(), X.max()
        counts["mean_square"] = (X.astype(np.float64) ** 2).mean()
        counts["integral"] = (X == da.floor(X)).mean()
    if y is not None and y.dtype.kind == "f":
        counts["bad_labels"] = (~da.isfinite(y) | (y != da.floor(y))).sum()
    if not counts:
        return
    (found,) = dask.compute(counts)
    if found.get("nan", 0) or found.get("inf", 0):
        raise ValueError(
            f"X contains {found['nan']} NaN and {found['inf']} inf values (as float32); "
            "remove or replace them before training"
        )
    if found.get("bad_labels", 0):
        raise ValueError(
            f"y contains {found['bad_labels']} non-integer labels (fractional, NaN or inf); "
            "labels must be integer class indices (floats are accepted only when all are whole numbers)"
        )
    if scale and found["smallest"] == found["most"]:
        warn_user(
            f"X is constant: every value is {found['smallest']:g}, so the net cannot tell the samples "
            "apart and learns at most how often each class occurs; check how X was made (a failed "
            "load or conversion, an all-zero array)"
        )
    if scale and _unscaled(found):
        pixels = " (8-bit pixels)" if _pixels(found) else ""
        warn_user(
            f"X looks unscaled: its values reach {found['largest']:g}{pixels}, while the nets, their "
            "initial weights and learning rates expect inputs of order 1, and training on them "
            "diverges; scale X first, e.g. X / 255 for 8-bit pixels (dasknn.data.load scales unless "
            "raw=True) or sklearn.preprocessing.StandardScaler"
        )


def _pixels(found: dict[str, Any]) -> bool:
    """X looks like 8-bit pixels: non-negative, at most 255, nine values in ten whole numbers."""
    return found["smallest"] >= 0 and found["largest"] <= 255 and found["integral"] >= 0.9


def _unscaled(found: dict[str, Any]) -> bool:
    """Values beyond ±UNSCALED_LIMIT, and X either 8-bit pixels or not of order 1 on the whole
    (a root mean square above SCALED_RMS): standardized X, whose rare features reach far out
    while its root mean square is 1, is scaled."""
    if not float(found["largest"]) > UNSCALED_LIMIT:
        return False
    return _pixels(found) or not float(found["mean_square"]) ** 0.5 <= SCALED_RMS


def check_X(X: Any, *, batch_size: int | None = None, check_finite: bool = True) -> da.Array:
    """Validated input for predict: X as a float32 dask array (n, C, H, W) chunked along samples only.

    Rejects, with a ValueError naming the problem: non-numeric dtypes, anything but 4-D (flat
    (n, features) input must be reshaped by the caller; the message says how), empty axes,
    chunking along a non-sample axis, unknown chunk sizes, and (with `check_finite`) NaN or inf,
    counted. numpy (or array-like) input is wrapped, chunked for `batch_size` (default 64).
    """
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    X = _structure_X(X, batch_size).astype(np.float32)
    _check_values(X, None, check_finite)
    return X


def check_X_y(
    X: Any, y: Any = None, *, batch_size: int | None = None, check_finite: bool = True
) -> tuple[da.Array, da.Array | None]:
    """Validated input for fit: X float32 (n, C, H, W), y int64 (n,), dask arrays with equal sample chunks.

    Everything `check_X` checks, plus: y 1-D, as long as X, of integer dtype — float labels are
    accepted and cast when every one is a whole number, other floats (and NaN/inf) are rejected,
    counted; strings and objects are rejected (encode them first) — and, given `batch_size`, at
    least one full batch of samples. Negative or sparse label values pass: mapping them to
    classes is the estimator's job. y is rechunked to X's sample chunks when they differ.
    X that looks unscaled (values beyond ±UNSCALED_LIMIT, and 8-bit pixels or a root mean square
    beyond SCALED_RMS), and a constant X (an all-zero one), are warned about, before any training,
    at the caller's line outside dasknn.
    All value checks run as one `dask.compute` of reductions.
    """
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    X = _structure_X(X, batch_size).astype(np.float32)
    if batch_size is not None and X.shape[0] < batch_size:
        raise ValueError(f"X has {X.shape[0]} samples, fewer than one batch of batch_size={batch_size}")
    y = _structure_y(y, X) if y is not None else None
    _check_values(X, y, check_finite, scale=True)
    return X, (y.astype(np.int64) if y is not None else None)
