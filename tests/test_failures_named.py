"""Failures that name their real cause: a full checkpoint folder, damaged checkpoints (non-finite
weights, out-of-range state), SIGTERM and SIGINT, option errors and the fallback warning, each in
one line; and a resume that may change the budget but not the training.

Real components: a real tmpfs of 1 MiB (ENOSPC injected at os.fsync, the file-system boundary,
where a tmpfs cannot be mounted), real checkpoints of real fits, a real subprocess sent signals.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.cli import exits
from dasknn.engine import checkpoint, manifest
from dasknn.estimator import DistributedCNN
from tests.conftest import REPO
from tests.test_bad_input import cli

SIM = ["--dataset", "digits", "--engine", "simulated", "--n-groups", "1", "--lr", "0.01"]
SIM += ["--momentum", "0.9", "--eval-size", "100", "-q"]
MLP = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 2, "time_budget": None}
MLP |= {"eval_size": 200, "n_groups": 2, "learning_rate": 0.1, "momentum": 0.9}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def full_folder(tmp_path, monkeypatch):
    """A folder on a 1 MiB tmpfs (a LeNet checkpoint is 3.6 MB); where mounting is not allowed, a
    folder whose fsyncs fail with ENOSPC (the file system's answer when it is full)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:

        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", fsync)
    yield where
    if mounted.returncode == 0:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_checkpoint_folder_is_a_local_io_failure_naming_the_path(full_folder, tmp_path):
    code, err = cli(
        "train",
        *SIM,
        "--time-budget",
        "2",
        "--checkpoint-dir",
        str(full_folder / "ck"),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == exits.EXIT_LOCAL_IO == 5
    (line,) = lines(err)
    assert "No space left on device" in line and str(full_folder / "ck") in line and "cluster" not in line


def two_checkpoints(tmp_path: Path, digits) -> list[Path]:
    """The checkpoints of a real fit (simulated engine, an MLP on digits, 3 epochs)."""
    DistributedCNN(**MLP, max_epochs=3, checkpoint_dir=tmp_path).fit(*digits)
    found = checkpoint.list_checkpoints(tmp_path)
    assert len(found) >= 2
    return found


def rewrite(path: Path, change) -> None:
    """Change a checkpoint's state.json and arrays (`change(doc, arrays)`), checksum recomputed."""
    doc = json.loads((path / "state.json").read_text())
    with np.load(path / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(doc, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    blob = buf.getvalue()
    (path / "arrays.npz").write_bytes(blob)
    doc["arrays_bytes"], doc["arrays_sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (path / "state.json").write_text(json.dumps(doc))
    manifest.write(path, checkpoint.FILES)  # a forger's recomputed manifest: the schema must hold alone


def test_a_checkpoint_with_non_finite_weights_is_damaged_and_the_older_one_is_used(tmp_path, digits):
    older, newest = two_checkpoints(tmp_path, digits)[-2:]

    def nan(doc, arrays):
        arrays[next(iter(doc["params"].values()))].flat[0] = np.nan

    rewrite(newest, nan)
    with pytest.raises(checkpoint.CheckpointError, match="not finite"):
        checkpoint.load(newest)
    with pytest.warns(UserWarning, match="damaged") as said:
        assert checkpoint.latest(tmp_path).path == older
    assert len(said) == 1 and "\n" not in str(said[0].message)


TAMPERED = {
    "negative iterations_done": lambda doc, arrays: doc.update(iterations_done=-5),
    "huge iterations_done": lambda doc, arrays: doc.update(iterations_done=10**30),
    "huge clock": lambda doc, arrays: doc["extra"]["simulator"].update(clock=1e300),
    "negative clock": lambda doc, arrays: doc["extra"]["simulator"].update(clock=-3.0),
    "RNG state out of range": lambda doc, arrays: doc["extra"]["simulator"]["rng"]["state"].update(
        state=2**200
    ),
    "negative RNG state": lambda doc, arrays: doc["extra"]["simulator"]["rng"]["state"].update(inc=-1),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERED))
def test_out_of_range_checkpoint_state_is_damaged_and_the_older_one_is_used(tmp_path, digits, tamper):
    older, newest = two_checkpoints(tmp_path, digits)[-2:]
    rewrite(newest, TAMPERED[tamper])
    with pytest.raises(checkpoint.CheckpointError, match="out of range"):
        checkpoint.load(newest)
    with pytest.warns(UserWarning, match="damaged"):
        assert checkpoint.latest(tmp_path).path == older


def test_an_option_error_is_one_line_with_a_hint_to_help():
    for argv in (["train", "--frobnicate"], ["train", "--batch-size", "0"], ["nosuch"]):
        code, err = cli(*argv)
        (line,) = lines(err)
        assert code == 2 and "--help" in line, err


@pytest.mark.slow
def test_the_damaged_newest_checkpoint_warning_is_one_line(tmp_path):
    args = [
        *SIM,
        "--time-budget",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--output",
        str(tmp_path / "o"),
    ]
    assert cli("train", *args)[0] in (0, 1)
    newest = checkpoint.list_checkpoints(tmp_path / "ck")[-1]
    (newest / "arrays.npz").write_bytes(b"garbage")
    code, err = cli("train", *args, "--resume")
    assert code in (0, 1), err
    (line,) = lines(err)
    assert line.startswith("dasknn train: warning: ") and "damaged" in line and newest.name in line


def _as_foreground() -> None:
    """The child gets SIGINT as a foreground command does. A suite started as a background job
    (`cmd &` in a script, nohup) passes SIGINT on ignored, and Python then never raises
    KeyboardInterrupt: the child trained on, and the test waited out its timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    "sig, code, word",
    [
        (signal.SIGTERM, 143, "terminated"),
        # the same handler path (`_interrupted`); SIGINT's own exit code is also checked in-process
        pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow),
    ],
)
def test_a_signal_ends_train_in_one_line_leaving_a_resumable_checkpoint(tmp_path, sig, code, word):
    ck = tmp_path / "ck"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    argv = [
        sys.executable,
        "-m",
        "dasknn",
        "train",
        *SIM,
        "--time-budget",
        "100000",
        "--target-accuracy",
        "1",
    ]
    child = subprocess.Popen(
        [*argv, "--checkpoint-dir", str(ck), "--output", str(tmp_path / "o")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=_as_foreground,
    )
    try:
        deadline = time.monotonic() + 240
        while not checkpoint.list_checkpoints(ck) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:  # never leave a training process behind
            child.kill()
            child.communicate()
    assert child.returncode == code, err
    (line,) = lines(err)
    assert line.startswith(f"dasknn train: {word}") and "--resume" in line
    found = checkpoint.latest(ck)
    assert found is not None and found.path.name in line and found.state.iterations_done > 0


def test_a_resume_may_change_the_budget_but_not_the_training(tmp_path, digits):
    X, y = digits
    DistributedCNN(**MLP, max_epochs=2, checkpoint_dir=tmp_path).fit(X, y)
    longer = DistributedCNN(
        **MLP, max_epochs=4, target_accuracy=0.999, callbacks=[], checkpoint_dir=tmp_path, resume=True
    ).fit(X, y)
    whole = DistributedCNN(**MLP, max_epochs=4, target_accuracy=0.999).fit(X, y)
    assert longer.n_iter_ == whole.n_iter_ > 0
    for key, value in whole.state_.params.items():
        np.testing.assert_allclose(longer.state_.params[key], value, rtol=1e-6, atol=1e-7)
    changed = {**MLP, "learning_rate": 0.05, "weight_decay": 0.0}
    with pytest.raises(ValueError, match=r"learning_rate.*weight_decay|weight_decay.*learning_rate") as err:
        DistributedCNN(**changed, max_epochs=6, checkpoint_dir=tmp_path, resume=True).fit(X, y)
    assert "max_epochs: checkpoint" not in str(err.value)  # the budget may differ
