"""Saving during a fit (`DistributedCNN.save` from a callback's `on_evaluation`) and the
`ModelCheckpoint` callback that keeps the best model or one every N evaluations (Keras'
ModelCheckpoint, skorch's Checkpoint), on the simulated engine with the digits MLP."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.callbacks import Callback, ModelCheckpoint
from dasknn.estimator import DistributedCNN

MLP = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 1, "batch_size": 32,
       "n_groups": 1, "learning_rate": 0.05, "momentum": 0.9, "time_budget": None}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def test_model_checkpoint_keeps_the_model_of_the_best_held_out_accuracy(digits, tmp_path):
    X, y = digits
    best = ModelCheckpoint(tmp_path / "best", monitor="val_accuracy")
    est = DistributedCNN(**MLP, max_epochs=3, validation_fraction=0.2, callbacks=[best]).fit(X, y)
    scores = [row["val_accuracy"] for row in est.history_]
    assert best.best == max(scores) and len(best.saved) >= 2
    assert best.best_iteration == est.history_[scores.index(max(scores))]["iteration"]
    loaded = DistributedCNN.load(tmp_path / "best")
    assert loaded.n_iter_ == best.best_iteration and loaded.callbacks is None
    held_out = est.parts_.validation
    assert loaded.score(X[held_out], y[held_out]) == pytest.approx(best.best, abs=1e-12)
    assert loaded.history_[-1]["iteration"] == best.best_iteration


def test_model_checkpoint_every_n_evaluations_writes_one_folder_each(digits, tmp_path):
    X, y = digits
    every = ModelCheckpoint(tmp_path / "it{iteration}", every=2)
    est = DistributedCNN(**MLP, max_epochs=2, callbacks=[every]).fit(X, y)
    iterations = [row["iteration"] for row in est.history_][1::2]
    assert [p.name for p in every.saved] == [f"it{i}" for i in iterations] and iterations
    last = DistributedCNN.load(every.saved[-1])
    np.testing.assert_array_equal(
        last.state_.params["ip1.weight"].shape, est.state_.params["ip1.weight"].shape
    )
    with pytest.raises(ValueError, match="every"):
        ModelCheckpoint(tmp_path, every=0)


def test_a_callback_saves_the_model_being_fitted_at_its_first_evaluation(digits, tmp_path):
    X, y = digits

    class SaveFirst(Callback):
        def on_evaluation(self, est, record):
            if record["iteration"] == 0:
                with pytest.warns(UserWarning, match="without callbacks"):
                    est.save(tmp_path / "first")

    held = {"validation_fraction": 0.2}  # the start row's only score (no iteration yet: no training figure)
    est = DistributedCNN(**MLP, **held, max_epochs=1, callbacks=[SaveFirst()]).fit(X, y)
    first = DistributedCNN.load(tmp_path / "first")
    assert first.n_iter_ == 0 and est.n_iter_ > 0
    start = DistributedCNN(**MLP, **held, max_epochs=1).fit(X, y)  # the same seed: the same first weights
    assert first.history_[0]["val_loss"] == pytest.approx(start.history_[0]["val_loss"])
    assert not hasattr(est, "_evaluation")


def test_model_checkpoint_names_a_monitor_the_history_lacks(digits, tmp_path):
    X, y = digits
    cb = ModelCheckpoint(tmp_path / "best")  # val_loss, but no validation data
    with pytest.raises(ValueError, match="no val_loss"):
        DistributedCNN(**MLP, max_epochs=0.5, callbacks=[cb]).fit(X, y)
