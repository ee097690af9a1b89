"""DistributedCNN(averaging="ema"): the model a fit scores is the model it returns, saves and resumes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint
from dasknn.estimator import DistributedCNN

COMMON = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "simulated_gflops": 10.0,
    "n_workers": 4,
    "batch_size": 32,
    "time_budget": None,
    "max_wall_time": None,
    "n_groups": 2,
    "learning_rate": 0.1,
    "momentum": 0.9,
    "max_epochs": 2,
    "averaging": "ema",
}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    X, y = d.data.astype(np.float32) / 16, d.target
    return X[:1400], y[:1400], X[1400:], y[1400:]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_model_returned_is_the_average_that_was_scored(digits, tmp_path):
    X, y, X_val, y_val = digits
    est = DistributedCNN(**COMMON, validation_data=(X_val, y_val)).fit(X, y)
    last = est.history_[-1]
    assert est.score(X_val, y_val) == pytest.approx(last["val_accuracy"], abs=1e-12)
    weights = est.state_.extra["averaging"]["weights"]
    assert same(est.net_.get_params(), est.state_.params)  # the net holds the average ...
    assert not same(weights, est.state_.params)  # ... not the weights training goes on from
    saved = DistributedCNN.load(est.save(tmp_path / "model"))
    assert np.array_equal(saved.predict_proba(X_val), est.predict_proba(X_val))


def test_a_resumed_fit_carries_the_average_exactly(digits, tmp_path):
    X, y, _, _ = digits
    whole = DistributedCNN(**COMMON, checkpoint_dir=tmp_path / "whole").fit(X, y)
    first = checkpoint.list_checkpoints(tmp_path / "whole")[0]
    (tmp_path / "part").mkdir()
    shutil.copytree(first, tmp_path / "part" / first.name)
    assert "averaging" in checkpoint.load(first).state.extra
    resumed = DistributedCNN(**COMMON, checkpoint_dir=tmp_path / "part", resume=True).fit(X, y)
    assert resumed.n_iter_ == whole.n_iter_
    assert same(resumed.state_.params, whole.state_.params)
    assert same(resumed.state_.extra["averaging"]["weights"], whole.state_.extra["averaging"]["weights"])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_dask_fit_returns_and_saves_the_average_it_scored(digits, tmp_path):
    """On the Dask engine (one worker, g = 1) as on the simulator: the evaluations, in-run ones
    included, score the average, and the fit returns and saves it (≈ 10 s with its cluster)."""
    X, y, X_val, y_val = digits
    params = {**COMMON, "engine": "dask", "n_workers": 1, "n_groups": 1}
    est = DistributedCNN(**params, validation_data=(X_val, y_val)).fit(X, y)
    assert est.trace_.attrs["engine"] == "dask"
    assert est.score(X_val, y_val) == pytest.approx(est.history_[-1]["val_accuracy"], abs=1e-12)
    kept = est.state_.extra["averaging"]
    assert kept["conv_count"] == kept["fc_count"] == est.state_.iterations_done > 0
    assert same(est.net_.get_params(), est.state_.params)  # the net holds the average ...
    assert not same(kept["weights"], est.state_.params)  # ... not the weights training goes on from
    saved = DistributedCNN.load(est.save(tmp_path / "model"))
    assert np.array_equal(saved.predict_proba(X_val), est.predict_proba(X_val))


@pytest.mark.parametrize(
    "params,words",
    [
        ({"averaging": "swa"}, "averaging must be one of"),
        ({"strategy": "sma"}, "strategy='sma'"),
        ({"engine": "dask", "physical_map": "unmerged"}, "physical_map='unmerged'"),
    ],
)
def test_averaging_where_it_cannot_run_is_refused_before_any_work(digits, params, words):
    X, y, _, _ = digits
    with pytest.raises(ValueError, match=words):
        DistributedCNN(**{**COMMON, **params}).fit(X, y)


def test_the_default_averages_where_the_servers_can_and_resumes_a_state_as_it_trained(digits, tmp_path):
    """averaging="auto" (the default): the EMA on Omnivore's groups, none for SMA; a fit that goes
    on from a state trained without an average (a checkpoint written before averaging) goes on
    without one, so it resumes as it ran."""
    X, y, _, _ = digits
    params = {**COMMON, "averaging": "auto", "max_epochs": 1}
    assert DistributedCNN().averaging == "auto"
    est = DistributedCNN(**params).fit(X, y)
    assert est.state_.extra["averaging"]["conv_count"] == est.n_iter_ and est.averaging_ == "ema"
    sma = DistributedCNN(**{**params, "strategy": "sma"}).fit(X, y)
    assert "averaging" not in sma.state_.extra and sma.averaging_ is None
    plain = DistributedCNN(**{**params, "averaging": None, "checkpoint_dir": tmp_path}).fit(X, y)
    assert "averaging" not in plain.state_.extra
    resumed = DistributedCNN(**{**params, "max_epochs": 2, "checkpoint_dir": tmp_path, "resume": True})
    with pytest.raises(ValueError, match="averaging"):  # a resumed fit shares its parameters
        resumed.fit(X, y)
