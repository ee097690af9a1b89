"""What a fit is handed, checked before any work: X and y, validation_data, and the net for them.

scikit-learn's gate (`check_array`, `column_or_1d`, `check_classification_targets`) for arrays in
memory, dask arrays kept lazy, both through the package's shared gate (`dasknn.data.check_X_y`),
then `input_shape`'s reshape. The net is built for the samples' shape and the labels' count, and
tried on the first batch, so that a net that cannot read X, or X that overflows it, is a ValueError
before any cluster starts (docs/architecture.md, "What a user hands in: Caffe files and arrays").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dasknn.data import check_X_y
from dasknn.data.chunks import is_dask_array
from dasknn.data.validation import channels_last_hint
from dasknn.engine import checkpoint
from dasknn.user_warning import warn_user

if TYPE_CHECKING:
    from dasknn.nn.net import Net

__all__ = [
    "as_array",
    "build_net",
    "check_fit_input",
    "check_net_on_data",
    "check_validation_data",
    "clipped_batch",
    "shape_X",
    "smallest_rate",
]


def row_shape(input_shape, n_features: int) -> tuple[int, ...] | None:
    """The (C, H, W) that `input_shape` ("flat" or (C, H, W)) makes of a row of `n_features`
    (None for None)."""
    if input_shape is None:
        return None
    return (n_features, 1, 1) if input_shape == "flat" else tuple(int(s) for s in input_shape)


def shape_X(X, input_shape):
    """X reshaped by `input_shape` ("flat" or (C, H, W)) from 2-D (n_samples, n_features); X as it
    is when `input_shape` is None."""
    if input_shape is None:
        return X
    if np.ndim(X) != 2:
        raise ValueError(
            f"input_shape={input_shape!r} reshapes 2-D X (n_samples, n_features); X is {np.ndim(X)}-D"
        )
    n_features = X.shape[1]
    target = row_shape(input_shape, n_features)
    if len(target) != 3 or math.prod(target) != n_features:
        raise ValueError(f"input_shape {input_shape!r} does not hold {n_features} features per sample")
    return X.reshape((X.shape[0], *target))


def as_array(X, input_shape, n_features_in: int | None = None):
    """Dask arrays stay lazy; anything else goes through scikit-learn's gate (sparse, complex,
    object, empty and 1-D inputs get its standard errors), then the input_shape reshape.
    With `n_features_in` (a fitted estimator's), 2-D input must have that many features."""
    if not is_dask_array(X):
        from sklearn.utils.validation import check_array

        X = check_array(
            X,
            accept_sparse=False,
            dtype="numeric",
            allow_nd=True,
            ensure_all_finite=False,
            ensure_2d=True,
            input_name="X",
        )
        if n_features_in is not None and X.ndim == 2 and X.shape[1] != n_features_in:
            raise ValueError(
                f"X has {X.shape[1]} features, but DistributedCNN is expecting {n_features_in} "
                "features as input"
            )
    return shape_X(X, input_shape)


def check_fit_input(X, y, input_shape, batch_size: int):
    """(X, y, the classes in y, X as stored): every input error raised before any work.

    X as stored is kept in its integer dtype (uint8 pixels) for a streamed fit, which sends it to
    the workers as it is (None for float X, which needs no copy: the checked X is it)."""
    if y is None:
        raise ValueError("DistributedCNN requires y to be passed, but the target y is None")
    X = stored = as_array(X, input_shape)
    batch_size = min(batch_size, X.shape[0])  # a larger batch is clipped to the data (`clipped_batch`)
    stored = stored if is_dask_array(stored) and stored.dtype.kind in "biu" else None
    if is_dask_array(y):
        X, y = check_X_y(X, y, batch_size=batch_size)
        return X, y, np.unique(y.compute()), stored
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import column_or_1d

    y = column_or_1d(y, warn=True)
    check_classification_targets(y)
    labels = np.unique(y)
    # the shared gate checks X and the lengths; labels of any type are encoded by the caller
    X, _ = check_X_y(X, np.searchsorted(labels, y), batch_size=batch_size)
    return X, y, labels, stored


def check_validation_data(data, classes: np.ndarray, sample_shape, input_shape, batch_size: int):
    """validation_data (X_val, y_val) through the same gate as (X, y), its errors naming it; its
    classes must be among y's and its samples of X's shape."""
    X, y = data
    try:
        X = as_array(X, input_shape)
        batch_size = min(batch_size, X.shape[0])  # held-out samples are scored, not batched
        if is_dask_array(y):
            X, y = check_X_y(X, y, batch_size=batch_size)
            labels = np.unique(y.compute())
        else:
            y = np.asarray(y)
            if y.ndim != 1:
                raise ValueError(f"y must be 1-D, got shape {y.shape}")
            labels = np.unique(y)
            X, _ = check_X_y(X, np.searchsorted(labels, y), batch_size=batch_size)
    except ValueError as err:
        raise ValueError(f"validation_data: {err}") from None
    unseen = np.setdiff1d(labels, classes)
    if unseen.size:
        raise ValueError(f"validation_data has classes {unseen.tolist()} that y does not have")
    if tuple(X.shape[1:]) != tuple(sample_shape):
        raise ValueError(
            f"validation_data has samples of shape {tuple(X.shape[1:])}; X has {tuple(sample_shape)}"
        )
    return X, y


def clipped_batch(batch_size: int, n_train: int) -> int:
    """The batch size a fit trains with: `batch_size`, or the `n_train` samples it trains on when
    those are fewer, with one warning (as scikit-learn's MLPClassifier clips its batch)."""
    if batch_size <= n_train:
        return batch_size
    warn_user(
        f"batch_size={batch_size} is larger than the {n_train} samples trained on; it is clipped to {n_train}"
    )
    return n_train


def build_net(spec: Any, input_shape, n_classes: int, seed: int, backend: str | None) -> Net:
    """The net `spec` (a zoo name, a Net, a .prototxt path) for samples of `input_shape`; where X
    looks channels-last, a hint is added to the error, or warned when the net builds anyway (a conv
    net would read rows as channels)."""
    hint = channels_last_hint(tuple(input_shape))
    try:
        net = _net_for(spec, input_shape, n_classes, seed, backend)
    except ValueError as err:
        if not hint or not err.args or not isinstance(err.args[0], str):
            raise
        raise type(err)(err.args[0] + hint) from err
    if hint:
        shape = ", ".join(map(str, input_shape))
        warn_user(f"net {net.name!r} reads X as (n, C, H, W) = (n, {shape}){hint}")
    return net


def _net_for(spec: Any, input_shape, n_classes: int, seed: int, backend: str | None) -> Net:
    from dasknn.nn import zoo
    from dasknn.nn.net import Net

    if isinstance(spec, Net):
        net = spec.copy()
    elif isinstance(spec, str) and spec.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_net

        net = read_net(spec, input_shape=tuple(input_shape))
    elif isinstance(spec, str):
        net = zoo.get_net(spec, input_shape=tuple(input_shape), num_classes=n_classes, seed=seed)
    else:
        raise ValueError(f"net must be a zoo name, a Net or a .prototxt path, got {type(spec).__name__}")
    if backend is not None:
        net.backend = backend
    if net.input_shape != tuple(input_shape):
        raise ValueError(f"net {net.name!r} takes inputs {net.input_shape}, but X has {tuple(input_shape)}")
    if net.num_classes != n_classes:
        raise ValueError(f"net {net.name!r} outputs {net.num_classes} classes, but y has {n_classes}")
    return net


def check_net_on_data(net: Net, X, split: str | None, batch_size: int, rate: float, augment=None) -> None:
    """Before any cluster starts: `split` names a layer where the net can be split, and the first
    batch (as the net sees it: `augment`'s test view) gives finite outputs in the forward pass and
    a first update at learning rate `rate` (the smallest the fit may use) below
    `checkpoint.WEIGHT_LIMIT`, the size the fit calls divergence."""
    if split not in (None, "auto"):
        try:
            net.split_phases(split)
        except KeyError:
            raise ValueError(
                f"split={split!r} is not a layer of net {net.name!r}; give one of its layer names "
                "(`dasknn summary NET` lists them), 'auto' or None"
            ) from None
        except ValueError as err:
            raise ValueError(f"split={split!r}: {err}") from None
    first = X[:batch_size] if augment is None else augment.test(X[:batch_size])
    first = np.asarray(first.compute() if is_dask_array(first) else first, dtype=np.float32)
    labels = np.zeros(len(first), dtype=np.int64)  # any labels: the size of the step is the point
    with np.errstate(all="ignore"):
        # the training forward pass: a test-mode pass of an untrained net with BatchNorm divides
        # by running statistics that are still zero, which overflows whatever X is
        loss, _, grads = net.copy().loss_and_grads(first, labels, rng=np.random.default_rng(0))
    learned = [g for k, g in grads.items() if k not in net.statistics]  # statistics: no rate
    step = rate * max((float(np.max(np.abs(g))) for g in learned), default=0.0)
    if not (math.isfinite(float(loss)) and math.isfinite(step) and step < checkpoint.WEIGHT_LIMIT):
        raise ValueError(
            f"the first batch of X (largest |value| {float(np.max(np.abs(first))):.3g}) overflows "
            f"net {net.name!r}: the forward pass or the first update at learning rate "
            f"{rate:g} is non-finite or beyond {checkpoint.WEIGHT_LIMIT:g}; "
            "scale X (e.g. to [0, 1])"
        )


def smallest_rate(params: dict[str, Any]) -> float:
    """The learning rate of a fit with these parameters, or with "auto" the smallest its tuner may
    start at (the tuner says: `Tuner.smallest_start_rate`)."""
    if params["learning_rate"] != "auto":
        return float(params["learning_rate"])
    from dasknn.estimator_params import tuner_object

    return tuner_object(params["tuner"]).smallest_start_rate(params["net"])
