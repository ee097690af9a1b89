"""The "auto" tuner as DistributedCNN's default: its prior, tuner= as a name or an object, a fit
resumed mid-ramp, checkpoints of the old default, and the stop on convergence."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.callbacks import Callback
from dasknn.engine import checkpoint
from dasknn.estimator import DistributedCNN
from dasknn.optimizer import AutoPolicy, GridPolicy

COMMON = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 2, "batch_size": 32,
          "time_budget": None, "eval_size": 200}  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def test_auto_is_the_default_and_its_start_names_the_prior(digits):
    X, y = digits
    est = DistributedCNN(**COMMON, max_epochs=2)
    assert est.tuner == "auto"
    est.fit(X, y)
    start = est.decisions_.iloc[0]
    assert (start["phase"], start["action"]) == ("auto", "start")
    assert "Caffe's reference solver values" in start["reason"]  # an mlp has no solver of its own
    assert (start["lr"], start["momentum"]) == (0.01, 0.9)
    assert set(est.decisions_["phase"]) >= {"ramp"}


def test_a_tuner_object_reaches_the_fit_which_never_changes_it(digits):
    X, y = digits
    tuner = GridPolicy(probe_iterations=7, lr_grid=[0.1, 0.01])
    before = copy.deepcopy(vars(tuner))
    est = DistributedCNN(**COMMON, max_epochs=1, tuner=tuner).fit(X, y)
    probes = est.decisions_[est.decisions_["action"] == "probe"]
    assert est.tuner_ == "grid" and len(probes) and (probes["iterations"] == 7).all()
    assert set(probes["lr"]) <= {0.1, 0.01}
    assert est.tuner is tuner and vars(tuner) == before  # the fit ran a clone (its state lives there)
    with pytest.raises(TypeError, match="tuner_options"):  # gone: a tuner object carries its options
        DistributedCNN(**COMMON, tuner_options={"window": 16})
    with pytest.raises(TypeError, match="optimizer"):  # the former name is gone (0.x: no deprecation)
        DistributedCNN(**COMMON, optimizer="grid")


def test_an_auto_fit_stopped_mid_ramp_resumes_exactly(tmp_path, digits):
    X, y = digits
    params = {**COMMON, "max_epochs": 3}
    whole = DistributedCNN(**params, checkpoint_dir=tmp_path / "a").fit(X, y)
    first = checkpoint.list_checkpoints(tmp_path / "a")[0]
    assert checkpoint.load(first).meta["loop"]["phase"] == "ramp"
    (tmp_path / "b").mkdir()
    first.rename(tmp_path / "b" / first.name)  # as if killed right after it
    resumed = DistributedCNN(**params, checkpoint_dir=tmp_path / "b", resume=True).fit(X, y)
    assert resumed.n_iter_ == whole.n_iter_ and resumed.config_ == whole.config_
    for key, value in whole.state_.params.items():
        np.testing.assert_allclose(resumed.state_.params[key], value, rtol=1e-6, atol=1e-7)
    cols = ["phase", "action", "n_groups", "lr", "momentum"]
    assert resumed.decisions_[cols].equals(whole.decisions_[cols])


class KeepEveryCheckpoint(Callback):
    """Copies each checkpoint the fit writes (the fit itself keeps only the newest few)."""

    def __init__(self, source, into):
        self.source, self.into = source, into

    def on_evaluation(self, est, record):
        for path in checkpoint.list_checkpoints(self.source):
            if not (self.into / path.name).exists():
                shutil.copytree(path, self.into / path.name)


def test_an_auto_fit_stopped_mid_span_of_the_plateau_rule_resumes_exactly(tmp_path, digits):
    X, y = digits
    # patience 1: the first span below the expectation drops η, so a drop comes within 20 epochs
    # the weights scored, not their average, whose loss falls on smoothly where the weights stall
    params = {**COMMON, "max_epochs": 20, "validation_fraction": 0.2, "tuner": AutoPolicy(plateau_patience=1),
              "averaging": None}  # fmt: skip
    (tmp_path / "all").mkdir()
    keeper = KeepEveryCheckpoint(tmp_path / "a", tmp_path / "all")
    whole = DistributedCNN(**params, checkpoint_dir=tmp_path / "a", callbacks=[keeper]).fit(X, y)
    drops = whole.decisions_[whole.decisions_["action"] == "plateau"]
    assert len(drops) >= 1
    mid_span = []
    for path in checkpoint.list_checkpoints(tmp_path / "all"):
        loop = checkpoint.load(path).meta["loop"]
        rule = loop.get("plateau") or {}
        if loop["phase"] == "train" and rule.get("reference") and rule["iterations"] and not rule["drops"]:
            mid_span.append(path)  # a reference with its loss level, a span half accumulated, no drop yet
    assert mid_span
    (tmp_path / "b").mkdir()
    shutil.copytree(mid_span[0], tmp_path / "b" / mid_span[0].name)  # as if killed right after it
    resumed = DistributedCNN(**params, checkpoint_dir=tmp_path / "b", resume=True).fit(X, y)
    assert resumed.n_iter_ == whole.n_iter_ and resumed.config_ == whole.config_
    cols = ["phase", "action", "n_groups", "lr", "momentum", "reason"]
    assert resumed.decisions_[cols].equals(whole.decisions_[cols])  # the drops too, with their reasons


def test_a_checkpoint_of_the_old_default_resumes_with_its_tuner_or_gives_a_clear_error(tmp_path, digits):
    X, y = digits
    params = {**COMMON, "max_epochs": 2}
    DistributedCNN(**params, tuner="grid", checkpoint_dir=tmp_path).fit(X, y)
    path = checkpoint.latest(tmp_path).path
    doc = json.loads((path / "state.json").read_text())
    fingerprint = doc["meta"]["params"]
    fingerprint["optimizer"] = fingerprint.pop("tuner")  # as written before tuner= existed
    doc["version"] = 1  # and before checkpoints had a manifest
    (path / "state.json").write_text(json.dumps(doc))
    (path / "manifest.json").unlink()
    with pytest.raises(ValueError, match="predates tuner=.*pass tuner='grid'"):
        DistributedCNN(**params, tuner="online", checkpoint_dir=tmp_path, resume=True).fit(X, y)
    with pytest.warns(UserWarning, match="written before tuner= existed, with its tuner 'grid'"):
        resumed = DistributedCNN(**params, checkpoint_dir=tmp_path, resume=True).fit(X, y)
    assert resumed.tuner_ == "grid" and resumed.n_iter_ > 0


@pytest.mark.slow
def test_a_fit_without_a_target_stops_on_convergence(digits):
    X, y = digits
    est = DistributedCNN(**COMMON, max_epochs=200, validation_fraction=0.2).fit(X, y)
    assert est.stopped_by_.startswith("converged"), est.stopped_by_
    assert est.state_.batches_done < 200 * 45 * 0.8  # well before its epochs ran out
    plateaus = est.decisions_[est.decisions_["action"] == "plateau"]
    assert len(plateaus) >= 2
