"""Held-out accuracy: validation data and fraction, the selection part, early stopping, callbacks,
the progress bar and the plots; real training on the simulated engine (deterministic, one process)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from dasknn.callbacks import CSVLogger, ProgressBar
from dasknn.data.split import split_parts
from dasknn.estimator import DistributedCNN
from dasknn.reports import plot_accuracy, search_spans

FIXED = {"n_groups": 1, "learning_rate": 0.1, "momentum": 0.9}
SMALL = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 4, "batch_size": 32,
         "time_budget": None}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


class Recorder:
    """Wraps the estimator's real engine and keeps the sample ids (the last feature) of every run."""

    def __init__(self, engine) -> None:
        self.engine, self.seen = engine, set()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, net, X, y, config, budget, start=None):
        self.seen.update(np.rint(np.asarray(X[:, -1, 0, 0]) * 10_000).astype(int).tolist())
        return self.engine.run(net, X, y, config, budget, start=start)


class RecordingCNN(DistributedCNN):
    def _engine(self, stack, net, start=None):
        engine, client = super()._engine(stack, net)
        self.recorder_ = Recorder(engine)
        return self.recorder_, client


def test_a_fraction_never_trains_on_its_held_out_or_selection_samples(digits):
    X, y = digits
    ids = (np.arange(len(y)) / 10_000).astype(np.float32)[:, None]
    est = RecordingCNN(validation_fraction=0.25, max_epochs=2, selection_size=100, tuner="grid", **SMALL)
    est.fit(np.hstack([X, ids]), y)
    parts = est.parts_
    assert est.recorder_.seen == set(parts.train.tolist())  # the optimizer's probes included
    assert len(parts.validation) == round(0.25 * len(y)) and len(parts.selection) == 100
    expected = split_parts(y, 0.25, 100, est.random_state)
    assert np.array_equal(expected.validation, parts.validation)
    assert not set(parts.train) & (set(parts.validation) | set(parts.selection))
    assert not set(parts.validation) & set(parts.selection)
    assert "selection loss" in " ".join(est.decisions_["reason"])


def test_val_accuracy_is_the_score_on_the_validation_data_at_each_recorded_iteration(digits):
    X, y = digits
    X_val, y_val = X[:400], y[:400]
    est = DistributedCNN(validation_data=(X_val, y_val), max_epochs=0.5, **FIXED, **SMALL)
    seen = []
    for _ in range(3):
        est.partial_fit(X[400:], y[400:], classes=np.arange(10))
        row = est.history_[-1]
        assert row["val_accuracy"] == pytest.approx(est.score(X_val, y_val), abs=1e-12)
        seen.append(row["iteration"])
    assert seen == sorted(set(seen)) and len(seen) == 3
    hist = pd.DataFrame(est.history_)
    assert {"val_loss", "val_accuracy", "loss", "accuracy"} <= set(hist.columns)
    assert set(est.report_["metric"]) == {"val_accuracy", "accuracy"}


def test_eval_size_bounds_the_held_out_samples_scored_at_each_evaluation(digits):
    """eval_size=100 of 400 held-out samples: every val_accuracy is a count of 100 samples, the
    final one the model's score on the 100 drawn once, seeded by random_state."""
    X, y = digits
    X_val, y_val = X[:400], y[:400]
    est = DistributedCNN(validation_data=(X_val, y_val), max_epochs=1, eval_size=100, **FIXED, **SMALL)
    est.fit(X[400:], y[400:])
    hist = pd.DataFrame(est.history_)
    assert len(hist) >= 2
    assert all(round(a * 100, 9).is_integer() for a in hist["val_accuracy"])
    kept = np.sort(np.random.default_rng(est.random_state).choice(400, 100, replace=False))
    assert hist["val_accuracy"].iloc[-1] == pytest.approx(est.score(X_val[kept], y_val[kept]), abs=1e-12)


def test_the_target_and_report_use_the_held_out_metric(digits):
    X, y = digits
    est = DistributedCNN(validation_fraction=0.2, max_epochs=20, target_accuracy=0.9, **FIXED, **SMALL)
    est.fit(X, y)
    hist = pd.DataFrame(est.history_)
    assert hist["val_accuracy"].iloc[-1] >= 0.9 and (hist["val_accuracy"].iloc[:-1] < 0.9).all()
    held = est.report_[(est.report_["metric"] == "val_accuracy") & (est.report_["threshold"] == 0.9)].iloc[0]
    assert held["reached"] and held["seconds"] == hist["time"].iloc[-1] and held["rule"] == "first"
    median = est.time_to_accuracy([0.5], rule="median5")
    assert set(median["rule"]) == {"median5"} and list(median["metric"]) == ["val_accuracy", "accuracy"]


def test_early_stopping_stops_and_restores_the_best_model(digits):
    X, y = digits
    X_val, y_val = X[:300], y[:300]
    # tol 0.3: after the first big drop of the held-out loss no evaluation improves on it enough
    est = DistributedCNN(validation_data=(X_val, y_val), max_epochs=40, early_stopping=True,
                         n_iter_no_change=2, tol=0.3, **FIXED, **SMALL)  # fmt: skip
    est.fit(X[300:], y[300:])
    hist = pd.DataFrame(est.history_)
    trained = hist.iloc[:-1]  # the last row is the restored model
    best, best_at, since = np.inf, None, 0
    for i, row in trained.iterrows():  # sklearn's rule, replayed on the recorded held-out losses
        if row["val_loss"] < best - 0.3:
            best, best_at, since = row["val_loss"], i, 0
        else:
            since += 1
            if since == 2:
                assert i == trained.index[-1], "the fit stopped at the second evaluation without improvement"
    assert since == 2 and est.stopped_by_.startswith("EarlyStopping: val_loss did not improve")
    assert trained["iteration"].iloc[-1] < 40 * len(X[300:]) // 32 / 2
    best_row = trained.loc[best_at]
    assert est.best_iteration_ == best_row["iteration"] == est.n_iter_ < trained["iteration"].iloc[-1]
    assert "restored the best" in hist["event"].iloc[-1]
    assert est.score(X_val, y_val) == pytest.approx(best_row["val_accuracy"], abs=1e-12)
    assert hist["val_accuracy"].iloc[-1] == pytest.approx(best_row["val_accuracy"], abs=1e-12)


def test_a_callback_returning_true_stops_the_fit(digits):
    X, y = digits

    class StopAfterFirstTraining:
        def on_evaluation(self, est, record):
            return record["iteration"] > 0

    est = DistributedCNN(max_epochs=10, callbacks=[StopAfterFirstTraining()], **FIXED, **SMALL)
    est.fit(X, y)
    assert len(est.history_) == 2 and est.history_[1]["iteration"] > 0
    assert est.stopped_by_ == f"callback StopAfterFirstTraining returned True, at iteration {est.n_iter_}"


def test_the_csv_logger_writes_a_row_per_evaluation(digits, tmp_path):
    X, y = digits
    path = tmp_path / "log.csv"
    est = DistributedCNN(validation_fraction=0.2, max_epochs=2, callbacks=[CSVLogger(path)], **FIXED, **SMALL)
    est.fit(X, y)
    logged = pd.read_csv(path)
    assert len(logged) == len(est.history_)
    np.testing.assert_allclose(logged["val_accuracy"], [r["val_accuracy"] for r in est.history_])


@pytest.mark.parametrize("verbose", [0, 1])
def test_the_progress_bar_writes_at_verbose_1_and_nothing_at_verbose_0(digits, capsys, verbose):
    X, y = digits
    DistributedCNN(validation_fraction=0.2, max_epochs=1, verbose=verbose, tuner="grid", **SMALL).fit(X, y)
    out, err = capsys.readouterr()
    if verbose:
        assert "dasknn (simulated):" in err and "/1 epoch" in err  # not a terminal: lines
        assert "phase=start" in err and "val_acc=" in err and "\r" not in err
    else:
        assert out == "" and err == ""


def test_a_given_progress_bar_is_not_doubled(digits, capsys):
    X, y = digits
    DistributedCNN(max_epochs=1, verbose=1, callbacks=[ProgressBar()], **FIXED, **SMALL).fit(X, y)
    lines = capsys.readouterr().err.splitlines()  # not a terminal: a line per evaluation shown
    assert all(line.startswith("dasknn (simulated): ") for line in lines)
    assert len(lines) == len(set(lines)) and lines[-1].startswith("dasknn (simulated): 100%")  # one bar


@pytest.mark.parametrize(
    "params, message",
    [
        ({"validation_fraction": 1.0}, "validation_fraction must be None or a number in"),
        ({"validation_data": "nope"}, "validation_data must be None or a pair"),
        ({"validation_fraction": 0.2, "validation_data": ([], [])}, "not both"),
        ({"selection_size": -1}, "selection_size must be"),
        ({"n_iter_no_change": 0}, "n_iter_no_change must be"),
        ({"tol": -1.0}, "tol must be"),
        ({"callbacks": [object()]}, "has none of the hooks"),
        ({"early_stopping": "yes"}, "early_stopping must be True or False"),
    ],
)
def test_bad_validation_parameters_are_refused_before_any_work(digits, params, message):
    X, y = digits
    with pytest.raises(ValueError, match=message):
        DistributedCNN(max_epochs=1, **{**SMALL, **params}).fit(X, y)


def test_validation_data_goes_through_the_same_gate(digits):
    X, y = digits
    with pytest.raises(ValueError, match="validation_data: .*NaN"):
        bad = X[:50].copy()
        bad[0, 0] = np.nan
        DistributedCNN(validation_data=(bad, y[:50]), max_epochs=1, **SMALL).fit(X, y)
    with pytest.raises(ValueError, match="classes \\[11\\] that y does not have"):
        DistributedCNN(validation_data=(X[:40], [11] + list(y[1:40])), max_epochs=1, **SMALL).fit(X, y)


@pytest.mark.slow
def test_every_plotted_line_segment_joins_two_evaluations_outside_the_search(digits):
    X, y = digits
    est = DistributedCNN(validation_fraction=0.2, tuner="grid", **{**SMALL, "time_budget": 0.05}).fit(X, y)
    hist = pd.DataFrame(est.history_)
    spans = search_spans(est.trace_, est.decisions_)
    assert spans and spans[0][0] == 0.0  # the cold start searches first
    fig = plot_accuracy({"run": hist}, search={"run": spans}, target=0.9)
    evaluated = set(zip(hist["time"].round(9), (hist["val_accuracy"] * 100).round(9), strict=True))
    lines = [ln for ln in fig.axes[0].lines if ln.get_linestyle() not in ("None", "--")]
    assert len(lines) == 1
    x, v = lines[0].get_xdata(), lines[0].get_ydata()
    segments = 0
    for i in range(1, len(x)):
        if np.isnan(x[i]) or np.isnan(x[i - 1]):
            continue
        segments += 1
        for j in (i - 1, i):
            assert (round(x[j], 9), round(v[j], 9)) in evaluated
        assert not any(a < x[i] and b > x[i - 1] for a, b in spans), "a line across a search"
    assert segments >= 2
    assert "held-out accuracy (%" in fig.axes[0].get_ylabel()
    assert any(ln.get_linestyle() == "--" and ln.get_ydata()[0] == 90 for ln in fig.axes[0].lines)
