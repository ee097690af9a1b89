"""Tuners as scikit-learn objects: nested parameters through DistributedCNN, a real GridSearchCV
over a tuner's option on the simulated engine, and a saved model's tuner loaded back."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV

from dasknn.estimator import DistributedCNN
from dasknn.optimizer import AutoPolicy, GridPolicy, OnlinePolicy

COMMON = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 2, "batch_size": 32,
          "time_budget": None, "eval_size": 200, "max_epochs": 1}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def test_a_tuners_options_are_nested_parameters_of_the_estimator():
    est = DistributedCNN(tuner=AutoPolicy(window=32))
    assert est.get_params()["tuner__window"] == 32
    est.set_params(tuner__window=16, tuner__max_drops=3)
    assert (est.tuner.window, est.tuner.max_drops) == (16, 3)
    copy = clone(est)
    assert copy.tuner is not est.tuner and copy.get_params()["tuner__window"] == 16
    assert "tuner__window" not in DistributedCNN(tuner="auto").get_params()  # a name has no options
    for cls in (AutoPolicy, GridPolicy, OnlinePolicy):  # a fit's settings are not parameters
        assert not {"n_groups", "learning_rate", "momentum", "verbose"} & set(cls().get_params())


def test_grid_search_cv_reaches_the_tuners_window(digits):
    X, y = digits
    search = GridSearchCV(DistributedCNN(**COMMON, tuner=AutoPolicy()), {"tuner__window": [16, 32]}, cv=2)
    search.fit(X[:600], y[:600])
    assert [p["tuner__window"] for p in search.cv_results_["params"]] == [16, 32]
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    best = search.best_estimator_
    window = search.best_params_["tuner__window"]
    assert best.tuner.window == window
    assert best.decisions_.iloc[0]["reason"].endswith(f"w = {window}")  # the fit ran that window
    assert search.estimator.tuner.window is None  # the searched estimator's tuner: never changed


def test_a_saved_tuner_object_loads_back_and_its_data_is_checked(digits, tmp_path):
    X, y = digits
    tuner = AutoPolicy(window=16, solver={"base_lr": 0.02, "momentum": 0.8})
    est = DistributedCNN(**COMMON, tuner=tuner).fit(X, y)
    assert est.decisions_.iloc[0]["lr"] == 0.02  # the solver option reached the prior
    est.save(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["params"]["tuner"] == {
        "__tuner__": {"name": "auto", "params": {"solver": {"base_lr": 0.02, "momentum": 0.8}, "window": 16}}
    }  # its name and the options it sets: data
    loaded = DistributedCNN.load(tmp_path / "m")
    assert isinstance(loaded.tuner, AutoPolicy) and loaded.tuner.get_params() == tuner.get_params()
    np.testing.assert_array_equal(loaded.predict(X[:50]), est.predict(X[:50]))
