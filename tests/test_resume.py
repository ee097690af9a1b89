"""Resume (issue #8): a fit killed after a checkpoint, resumed, ends where the uninterrupted fit ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint
from dasknn.estimator import DistributedCNN

KNOBS = {"n_groups": 2, "learning_rate": 0.1, "momentum": 0.9}
COMMON = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "n_workers": 2,
    "time_budget": None,
    "eval_size": 200,
}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def _assert_same_model(a: DistributedCNN, b: DistributedCNN) -> None:
    assert a.n_iter_ == b.n_iter_ and a.state_.batches_done == b.state_.batches_done
    for key, value in a.state_.params.items():
        np.testing.assert_allclose(b.state_.params[key], value, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b.state_.momentum[key], a.state_.momentum[key], rtol=1e-6, atol=1e-7)
    assert [h["iteration"] for h in a.history_] == [h["iteration"] for h in b.history_]


CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from sklearn.datasets import load_digits
    from dasknn.estimator import DistributedCNN
    d = load_digits()
    DistributedCNN(**json.loads(sys.argv[1])).fit(d.data.astype(np.float32) / 16, d.target)
    print("finished", flush=True)
    """
)


def test_a_fit_killed_after_a_checkpoint_resumes_to_the_uninterrupted_model(tmp_path, digits):
    X, y = digits
    params = {**COMMON, **KNOBS, "max_epochs": 25, "checkpoint_dir": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(params)], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not checkpoint.list_checkpoints(tmp_path) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL, "the fit ended before it could be killed"
    killed_at = checkpoint.latest(tmp_path)
    assert killed_at is not None and not killed_at.meta["loop"]["finished"]
    assert killed_at.state.iterations_done < 25 * 28

    resumed = DistributedCNN(**{**params, "resume": True}).fit(X, y)
    whole = DistributedCNN(**{**COMMON, **KNOBS, "max_epochs": 25}).fit(X, y)
    _assert_same_model(whole, resumed)
    assert resumed.history_[0]["event"] == "start" and len(resumed.trace_) == len(whole.trace_)
    np.testing.assert_array_equal(resumed.predict(X), whole.predict(X))
    assert resumed.score(X, y) >= 0.95


def test_the_optimizer_resumes_from_its_epoch_checkpoint_exactly(tmp_path, digits):
    X, y = digits
    params = {**COMMON, "n_workers": 4, "batch_size": 32, "max_epochs": 12, "tuner": "grid"}
    whole = DistributedCNN(**params, checkpoint_dir=tmp_path / "a").fit(X, y)
    first = checkpoint.list_checkpoints(tmp_path / "a")[0]
    ck = checkpoint.load(first)
    assert ck.meta["loop"]["kind"] == "auto" and ck.meta["loop"]["phase"] == "cold_start"
    assert ck.meta["loop"]["config"]["n_groups"] == whole.config_.n_groups  # the g it goes on with
    (tmp_path / "b").mkdir()
    first.rename(tmp_path / "b" / first.name)  # as if killed right after the cold start's epoch
    resumed = DistributedCNN(**params, checkpoint_dir=tmp_path / "b", resume=True).fit(X, y)
    _assert_same_model(whole, resumed)
    assert resumed.config_ == whole.config_
    cols = ["phase", "action", "n_groups", "lr", "momentum", "score"]
    assert resumed.decisions_[cols].equals(whole.decisions_[cols])


def test_save_on_request_warm_start_and_a_finished_resume(tmp_path, digits):
    X, y = digits
    params = {**COMMON, **KNOBS, "max_epochs": 2}
    est = DistributedCNN(**params).fit(X, y)
    path = est.save_checkpoint(tmp_path)
    assert checkpoint.latest(tmp_path).path == path
    again = DistributedCNN(**params, checkpoint_dir=tmp_path, resume=True).fit(X, y)  # already finished
    _assert_same_model(est, again)
    more = DistributedCNN(**params, checkpoint_dir=tmp_path, warm_start=True).fit(X, y)  # a new budget
    assert more.n_iter_ == est.n_iter_ + 56 and more.state_.batches_done == est.state_.batches_done + 56


def test_resume_and_checkpoint_dir_bad_input(tmp_path, digits):
    X, y = digits
    params = {**COMMON, **KNOBS, "max_epochs": 1}
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        DistributedCNN(**params, resume=True).fit(X, y)
    with pytest.raises(ValueError, match="checkpoint_dir must be None or a path"):
        DistributedCNN(**params, checkpoint_dir=3).fit(X, y)
    DistributedCNN(**params, checkpoint_dir=tmp_path).fit(X, y)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        DistributedCNN(**params, checkpoint_dir=tmp_path).fit(X, y)
    with pytest.raises(ValueError, match=r"other parameters \(batch_size"):
        DistributedCNN(**{**params, "batch_size": 32}, checkpoint_dir=tmp_path, resume=True).fit(X, y)
    with pytest.raises(ValueError, match="classes"):
        DistributedCNN(**params, checkpoint_dir=tmp_path, resume=True).fit(X, y + 20)


def test_partial_fit_trains_one_epoch_per_call_and_keeps_the_classes(digits):
    X, y = digits
    est = DistributedCNN(**COMMON, **KNOBS)
    with pytest.raises(ValueError, match="differs"):
        est.partial_fit(X, y, classes=np.arange(12)).partial_fit(X, y, classes=np.arange(10))
    est = DistributedCNN(**COMMON, **KNOBS)
    est.partial_fit(X[:900], y[:900], classes=np.arange(10))
    assert est.n_iter_ == 900 // 64 and list(est.classes_) == list(range(10))
    for _ in range(5):
        est.partial_fit(X, y)
    assert est.n_iter_ == 900 // 64 + 5 * (1797 // 64)
    iterations = [h["iteration"] for h in est.history_]
    assert iterations == sorted(iterations) and len(est.trace_) == est.n_iter_
    assert est.score(X, y) >= 0.9
    with pytest.raises(ValueError, match="did not see"):
        est.partial_fit(X, y + 10)
    auto = DistributedCNN(**COMMON).partial_fit(X, y)  # "auto" knobs: Omnivore's cold-start values
    assert (auto.config_.n_groups, auto.config_.lr, auto.config_.momentum) == (1, 0.01, 0.9)


def test_the_train_command_checkpoints_and_resumes(tmp_path):
    import pandas as pd

    from dasknn.cli import main

    args = ["train", "--net", "mlp", "--dataset", "digits", "--engine", "simulated", "--n-groups", "1",
            "--lr", "0.05", "--momentum", "0.9", "--max-epochs", "2", "--eval-size", "200",
            "--checkpoint-dir", str(tmp_path / "ck"), "-q"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "a")]) in (0, 1)
    # 20% of digits held out by default: 1,438 training samples, 22 batches of 64 an epoch
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "ck")] == [
        f"ckpt-{i:012d}" for i in (22, 44)
    ]
    assert main([*args, "--output", str(tmp_path / "b")]) == 2  # a fresh fit there: refused
    assert main([*args, "--resume", "--output", str(tmp_path / "c")]) in (0, 1)
    first, resumed = (pd.read_csv(tmp_path / d / "history.csv") for d in ("a", "c"))
    pd.testing.assert_frame_equal(first.drop(columns="wall_time"), resumed.drop(columns="wall_time"))
