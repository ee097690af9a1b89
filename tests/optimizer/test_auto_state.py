"""The "auto" tuner's typed state: a checkpoint written before it was typed resumes as that
version resumed it, and a session of another shape is refused by name.

tests/fixtures/42af8b4-auto-checkpoint holds the first checkpoint of experiments/pin_loop.py's
"auto" case (the digits MLP on the simulated engine, 8 epochs) written at 42af8b4, when the state
was a dict, and what 42af8b4's own resume of it ended with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine.trace import RunConfig
from dasknn.estimator import DistributedCNN
from dasknn.optimizer.auto_state import AutoState
from experiments.pin_loop import COMMON

FIXTURE = Path(__file__).parents[1] / "fixtures" / "42af8b4-auto-checkpoint"


def test_a_checkpoint_of_the_dict_state_resumes_as_it_did_then(tmp_path):
    d = load_digits()
    X, y = d.data.astype(np.float32) / 16, d.target
    shutil.copytree(FIXTURE, tmp_path / "c", ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((FIXTURE / "expected.json").read_text())
    est = DistributedCNN(
        **COMMON, max_epochs=8, max_wall_time=None, checkpoint_dir=tmp_path / "c", resume=True
    )
    est.fit(X, y)
    assert [int(h["iteration"]) for h in est.history_] == expected["iterations"]
    assert list(est.decisions_["action"]) == expected["actions"]
    assert est.n_iter_ == expected["n_iter"]
    assert est.score(X, y) == pytest.approx(expected["score"], abs=0.01)
    assert np.mean(est.predict(X) == np.asarray(expected["predict"])) >= 0.99


def test_the_state_goes_to_json_and_back_and_a_foreign_one_is_refused_by_name():
    state = AutoState("train", RunConfig(2, 0.04, 0.9), 0.9, None, None, 0.04, rejected={"lr*2": 1})
    session = json.loads(json.dumps(state.to_dict()))
    assert session["kind"] == "auto" and AutoState.from_dict(session) == state
    with pytest.raises(
        ValueError, match=r"has fields \['segment'\] that this version's AutoState does not know"
    ):
        AutoState.from_dict({**session, "segment": 3})
    with pytest.raises(ValueError, match=r"lacks the fields \['phase'\]"):
        AutoState.from_dict({k: v for k, v in session.items() if k != "phase"})
    with pytest.raises(ValueError, match='not the "auto" tuner\'s'):
        AutoState.from_dict({**session, "optimizer": "online"})
    with pytest.raises(ValueError, match="phase 'cold'"):
        AutoState.from_dict({**session, "phase": "cold"})


def test_a_session_written_before_the_batch_level_and_the_ramps_beat_rate_resumes_with_neither():
    from dasknn.optimizer.ramp import LrRamp

    ramp = LrRamp(0.01, window=16).to_dict()
    del ramp["beat_lr"]  # a ramp state as written before the field existed
    state = AutoState("ramp", RunConfig(1, 0.01, 0.9), 0.9, ramp, None, 0.01, eval_loss=0.5, batch_level=1.5)
    session = json.loads(json.dumps(state.to_dict()))
    del session["batch_level"]
    old = AutoState.from_dict(session)
    assert old.batch_level is None and old.eval_loss == 0.5
    assert np.isnan(LrRamp.from_dict(old.ramp).beat_lr)  # the blow-up margin alone, as it was
