"""A run that succeeds prints no ERROR and no dask warning: its LocalCluster closes in an order that
leaves nothing to send to a closing worker, and a script whose top level starts a cluster (which
each spawned worker process would run again) gets one line saying what to add."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dasknn.cluster import unguarded
from tests.conftest import REPO

SCRIPT = """\
import sys
from dasknn.data import load
from dasknn.estimator import DistributedCNN


def data():
    return load("digits", size=28)


X, y = data()
est = DistributedCNN(
    engine="dask", n_workers=1, time_budget=None, max_epochs=0.1, n_groups=1, learning_rate=0.01,
    momentum=0.9, eval_size=100, verbose=0,
)
est.fit(X, y)
print("fitted", est.n_iter_)
if __name__ == "__main__":
    print("main")
"""


def _run(args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_top_level_code_is_told_from_code_under_the_main_guard():
    assert unguarded(SCRIPT, 15)  # est.fit(X, y)
    assert unguarded(SCRIPT, 11)  # a statement that spans lines
    assert not unguarded(SCRIPT, 18)  # under `if __name__ == "__main__":`
    reversed_guard = 'if "__main__" == __name__:\n    fit()\n'
    assert not unguarded(reversed_guard, 2)
    assert unguarded('if __name__ == "other":\n    fit()\n', 2)
    assert not unguarded("def broken(:\n", 1)  # unreadable source: no claim


def test_a_script_that_fits_at_its_top_level_gets_one_line_and_no_traceback(tmp_path):
    """Each worker process of a spawned LocalCluster imports the main script again: the fit would
    start a cluster in every one of them (hundreds of lines of nanny tracebacks). The fit says
    what to add and runs its workers as threads."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = _run([sys.executable, str(script)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "fitted" in out.stdout and "main" in out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert 'put that code under `if __name__ == "__main__":`' in lines[0] and "line 15" in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # 30 s on 2 cores (the default run checks one worker's: test_cli.py)
def test_dasknn_train_on_a_local_cluster_prints_no_error_and_no_dask_warning(tmp_path):
    """Two workers: the cluster's close removes them one at a time, and nothing the scheduler
    sends may reach the one still closing."""
    command = [
        sys.executable, "-m", "dasknn", "train", "--dataset", "digits", "--time-budget", "3",
        "--n-groups", "1", "--lr", "0.01", "--momentum", "0.9", "--n-workers", "2",
        "--eval-size", "200", "--output", str(tmp_path / "run"), "-q",
    ]  # fmt: skip
    out = _run(command, tmp_path)
    assert out.returncode in (0, 1), out.stderr  # 1: the budget ran out before the target
    assert (tmp_path / "run" / "history.csv").is_file()
    noise = [line for line in out.stderr.splitlines() if "ERROR" in line or "WARNING" in line]
    assert not noise, out.stderr
    assert "run_spec" not in out.stderr and "Traceback" not in out.stderr
