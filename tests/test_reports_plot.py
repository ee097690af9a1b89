"""reports.plot_accuracy: accuracy over time, and below it the training loss with η changes and
rollbacks marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.datasets import load_digits

from dasknn.estimator import DistributedCNN
from dasknn.reports import lr_changes, plot_accuracy


def test_the_loss_panel_marks_each_rollback_and_each_change_of_eta(tmp_path):
    d = load_digits()
    X, y = (d.data[:600] / 16).astype(np.float32), d.target[:600]
    est = DistributedCNN(net="mlp", input_shape="flat", engine="simulated", n_workers=1, batch_size=32,
                         n_groups=1, learning_rate=20.0, momentum=0.9, max_epochs=1, time_budget=None,
                         eval_size=200).fit(X, y)  # fmt: skip
    history = pd.DataFrame(est.history_)
    rollbacks = est.decisions_.loc[est.decisions_["action"] == "rollback", "time"].tolist()
    changes = lr_changes(history)
    assert rollbacks and changes and all(after < before for _, before, after in changes)
    fig = plot_accuracy({"run": history}, tmp_path / "accuracy.png", decisions={"run": est.decisions_})
    accuracy, loss = fig.axes
    assert loss.get_ylabel() == "training loss" and accuracy.get_shared_x_axes().joined(accuracy, loss)
    curve = [ln for ln in loss.lines if ln.get_marker() == "o"][0]
    # the rows with a training figure: the start and the rollback's row (the start state again) have
    # no iteration since the last evaluation, hence no running mean
    assert history["loss"].isna().tolist() == [True, True, False]
    np.testing.assert_allclose(curve.get_ydata(), history["loss"].dropna())
    marks = {ln.get_linestyle(): [] for ln in loss.lines}
    for ln in loss.lines:
        marks[ln.get_linestyle()].append(ln.get_xdata()[0])
    assert sorted(marks["--"]) == sorted(rollbacks)  # a dashed line at each rollback
    assert sorted(marks[":"]) == sorted(t for t, _, _ in changes)  # a dotted line at each η change
    assert sorted(loss.get_legend_handles_labels()[1]) == ["rollback (η lowered)", "η changed"]
    assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_the_tuners_eta_changes_are_its_chosen_decisions():
    history = pd.DataFrame({"time": [0.0, 9.0], "loss": [2.3, 0.5]})  # a tuner's history: no lr
    decisions = pd.DataFrame(
        {"action": ["probe", "choose_lr", "probe", "choose_lr", "anneal"], "lr": [0.1, 0.1, 0.01, 0.1, 0.05],
         "time": [1.0, 2.0, 3.0, 4.0, 6.0], "chosen": [False, True, False, True, True]}
    )  # fmt: skip
    changes = lr_changes(history, decisions)
    assert [(t, after) for t, _, after in changes] == [(2.0, 0.1), (6.0, 0.05)]
    assert np.isnan(changes[0][1]) and changes[1][1] == 0.1
