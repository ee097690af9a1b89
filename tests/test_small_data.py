"""Small data the scikit-learn way: a batch clipped to the data, no batch split over workers the
user did not ask for, and warnings about X that are right and name the user's line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.preprocessing import StandardScaler

from dasknn.data import check_X_y
from dasknn.estimator import DistributedCNN

QUICK = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "time_budget": None}
FIXED = {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.data / 16).astype(np.float32), d.target


def _caught(fit) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return caught


def test_a_batch_larger_than_the_data_is_clipped_with_one_warning(digits):
    X, y = digits
    est = DistributedCNN(**QUICK, **FIXED, n_workers=1, max_epochs=2)
    caught = _caught(lambda: est.fit(X[:30], y[:30]))
    clipped = [w for w in caught if "clipped" in str(w.message)]
    assert len(clipped) == 1
    assert str(clipped[0].message) == (
        "batch_size=64 is larger than the 30 samples trained on; it is clipped to 30"
    )
    assert clipped[0].filename == __file__  # the user's line, not the package's
    assert est.batch_size_ == 30 and est.batch_size == 64 and est.config_.batch_size == 30
    assert est.n_iter_ == 2  # two epochs of one batch each
    # a batch the data holds is left alone, without a warning
    caught = _caught(lambda: est.set_params(batch_size=16).fit(X[:30], y[:30]))
    assert est.batch_size_ == 16 and not [w for w in caught if "clipped" in str(w.message)]


def test_an_untrained_net_on_raw_inputs_trains_instead_of_rolling_back_forever():
    # loss at the start ~8.5, beyond twice uniform guessing: one iteration from it is not a blow-up
    rng = np.random.RandomState(0)
    X, y = rng.normal(loc=100, size=(75, 2)), rng.randint(0, 2, 75)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # X unscaled, the batch clipped: warned about
        est = DistributedCNN(**QUICK, **FIXED, n_workers=1, max_epochs=1).fit(X, y)
    assert est.n_iter_ == 1 and (est.decisions_["action"] == "rollback").sum() <= 2
    assert est.predict(X).shape == (75,)


def test_auto_knobs_with_a_small_batch_never_split_it_over_default_workers(digits):
    X, y = digits
    est = DistributedCNN(**QUICK, batch_size=4, max_epochs=0.05)
    est.partial_fit(X[:400], y[:400])  # cold start: one group of all the simulated workers
    assert est.trace_.attrs["n_workers"] == 4
    fixed = DistributedCNN(**QUICK, **FIXED, batch_size=2, max_epochs=0.02).fit(X[:400], y[:400])
    assert fixed.trace_.attrs["n_workers"] == 2


def test_workers_the_user_asked_for_that_split_a_batch_too_far_are_refused_by_name(digits):
    X, y = digits
    est = DistributedCNN(**QUICK, **FIXED, n_workers=8, batch_size=4, max_epochs=0.05)
    with pytest.raises(ValueError, match=r"batch_size=4 .* 8 workers .*n_workers=8, n_groups=1.*batch_size"):
        est.fit(X[:400], y[:400])
    with pytest.raises(ValueError, match=r"batch_size=4 .* 8 workers .*n_groups"):
        DistributedCNN(**QUICK, n_workers=8, batch_size=4, max_epochs=0.05).partial_fit(X[:400], y[:400])


def test_standardized_data_with_outliers_is_not_called_unscaled(digits):
    X, y = digits
    Z = StandardScaler().fit_transform(X).astype(np.float32)
    assert Z.max() > 20  # digits' rare pixels standardize far out (42 here)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_X_y(Z.reshape(-1, 64, 1, 1), y)


@pytest.mark.parametrize(
    ("scale", "pixels"),
    [
        (lambda X: np.round(X * 255), True),  # 8-bit pixels
        (lambda X: X * 255 + 0.5, False),  # 0-255, not whole numbers
        (lambda X: X * 1000 - 500, False),  # centred, far from order 1
    ],
)
def test_unscaled_data_is_warned_about(digits, scale, pixels):
    X, y = digits
    caught = _caught(lambda: check_X_y(scale(X).reshape(-1, 64, 1, 1), y))
    assert len(caught) == 1 and "X looks unscaled" in str(caught[0].message)
    assert ("(8-bit pixels)" in str(caught[0].message)) == pixels


def test_the_unscaled_warning_names_the_users_line(digits):
    X, y = digits
    est = DistributedCNN(**QUICK, **FIXED, n_workers=1, max_epochs=0.01)
    caught = _caught(lambda: est.fit(np.round(X * 255), y))
    unscaled = [w for w in caught if "unscaled" in str(w.message)]
    assert len(unscaled) == 1 and unscaled[0].filename == __file__
