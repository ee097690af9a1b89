"""Checkpoints written by a6dbd31 (before the one loop) still resume, and go on as that commit did.

tests/fixtures/a6dbd31-checkpoints holds, for a fixed-knob fit and an Algorithm 1 fit of the digits
MLP on the simulated engine, the first checkpoint a6dbd31 wrote (written by
experiments/pin_loop.py's cases at that commit) and what a6dbd31's own resume of it ended with.
Compared with tolerances no float drift crosses (other CPUs, other BLAS): the same iterations
evaluated, the same decisions, the same accuracy and nearly all the same predictions; the losses
the checkpoint carried within 1e-3 (a changed loop would move them by far more, or change the
iterations). The rows after the resume keep their names, but their training figures are no longer
a scoring of training samples: each is the running mean of the batch losses of the run that led
to it (`dasknn.fitting.training_scores`), so those are compared with the trace, not with a6dbd31.
Fixed knobs evaluate every kept run by default (their bounded evaluations, `eval_share`, and run
sizing, `boundary_share`, are options), so the same iterations are evaluated as at a6dbd31.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.estimator import DistributedCNN
from experiments.pin_loop import COMMON  # the digits MLP fit the pins use

FIXTURES = Path(__file__).parent / "fixtures" / "a6dbd31-checkpoints"
CASES = {
    "fixed": {"n_groups": 2, "learning_rate": 0.1, "momentum": 0.9, "max_epochs": 3},
    "grid": {"max_epochs": 8},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_of_a6dbd31_resumes_as_a6dbd31_resumed_it(tmp_path, name):
    d = load_digits()
    X, y = d.data.astype(np.float32) / 16, d.target
    directory = tmp_path / name
    shutil.copytree(FIXTURES / name, directory, ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    est = DistributedCNN(**COMMON, **CASES[name], checkpoint_dir=directory, resume=True).fit(X, y)
    assert [int(h["iteration"]) for h in est.history_] == expected["iterations"]
    resumed_at = int(next((FIXTURES / name).glob("ckpt-*")).name.split("-")[1])
    carried = [i for i, h in enumerate(est.history_) if h["iteration"] <= resumed_at]
    np.testing.assert_allclose(
        [est.history_[i]["loss"] for i in carried], [expected["loss"][i] for i in carried], rtol=1e-3
    )
    run_means = est.trace_.groupby("run")["loss"].mean().to_numpy()
    after = [h["loss"] for h in est.history_[len(carried) :]]
    assert len(after) == {"fixed": 2, "grid": 0}[name]  # the grid fit's checkpoint was its last step
    assert all(np.isclose(run_means, loss, rtol=1e-12).any() for loss in after)
    actions = list(est.decisions_["action"]) if len(est.decisions_) else []
    assert actions == expected["actions"]
    assert est.n_iter_ == expected["n_iter"]
    assert est.score(X, y) == pytest.approx(expected["score"], abs=0.01)
    assert np.mean(est.predict(X) == np.asarray(expected["predict"])) >= 0.99
