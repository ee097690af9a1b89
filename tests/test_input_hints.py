"""Common input mistakes get a hint that names the fix, before any work starts."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.callbacks import Callback
from dasknn.data import check_X_y
from dasknn.engine.dask import local_client
from dasknn.estimator import DistributedCNN

QUICK = {"engine": "simulated", "n_workers": 1, "time_budget": None, "eval_size": 100, "n_groups": 1}
QUICK.update(learning_rate=0.01, momentum=0.9, max_epochs=0.2)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.data / 16).astype(np.float32).reshape(-1, 1, 8, 8), d.target


def test_channels_last_images_get_a_hint_to_transpose():
    X = np.random.default_rng(0).random((128, 28, 28, 1), dtype=np.float32)
    with pytest.raises(ValueError, match=r"channels-last.*\(n, 28, 28, 1\).*X\.transpose\(0, 3, 1, 2\)"):
        DistributedCNN(net="lenet", **QUICK).fit(X, np.arange(128) % 10)
    with pytest.warns(UserWarning, match=r"net 'MLP' reads X as .*channels-last.*X\.transpose"):
        DistributedCNN(net="mlp", **QUICK).fit(X, np.arange(128) % 10)  # it builds: a warning


def test_three_d_images_get_a_hint_to_add_the_channel_axis(digits):
    X, y = digits
    with pytest.raises(ValueError, match=r"3-D.*X\[:, None\].*\(1797, 1, 8, 8\)"):
        DistributedCNN(net="mlp", **QUICK).fit(X[:, 0], y)


class _Seen(Callback):
    """Records, at the first evaluation, the warnings issued so far."""

    def __init__(self, caught: list) -> None:
        self.caught, self.before_training = caught, None

    def on_evaluation(self, est, record) -> None:
        if self.before_training is None:
            self.before_training = [str(w.message) for w in self.caught]


def test_unscaled_pixels_are_warned_about_before_training(digits):
    X, y = digits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _Seen(caught)
        DistributedCNN(net="mlp", callbacks=[seen], **QUICK).fit(X * 255, y)
    unscaled = [m for m in seen.before_training if "unscaled" in m]
    assert len(unscaled) == 1 and "reach 255" in unscaled[0] and "X / 255" in unscaled[0]
    # the gate itself: the same digits scaled to [0, 1] pass without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_X_y(X, y)


def test_overflow_warnings_of_a_diverging_run_stay_off_the_console(digits, capfd):
    X, y = digits
    params = {**QUICK, "engine": "dask", "learning_rate": 1e4, "max_epochs": 0.5}
    with local_client(n_workers=1, threads_per_worker=1):
        capfd.readouterr()
        est = DistributedCNN(net="mlp", **params).fit(X.reshape(-1, 64, 1, 1), y)
    err = capfd.readouterr().err
    assert (est.decisions_["action"] == "rollback").sum() >= 2  # the runs did diverge on the workers
    assert "RuntimeWarning" not in err and "encountered in" not in err


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_a_constant_x_is_warned_about_before_training(digits, value):
    X, y = digits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _Seen(caught)
        DistributedCNN(net="mlp", callbacks=[seen], **QUICK).fit(np.full_like(X, value), y)
    constant = [m for m in seen.before_training if "constant" in m]
    assert len(constant) == 1 and f"every value is {value:g}" in constant[0], seen.before_training
    assert caught[0].filename == __file__  # the user's line
    # the gate itself: one sample that differs is enough
    varied = np.full_like(X, value)
    varied[0, 0, 0, 0] += 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_X_y(varied, y)
