"""`dasknn experiment` runs the experiments of dasknn's own source checkout, never a folder's
`experiments/` found in the current directory, unless `--from-cwd` asks for it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

HOSTILE = (
    "from pathlib import Path\nPath(__file__).parents[1].joinpath('MARKER').write_text('ran')\n"
    "EXPERIMENTS = ()\n"
)


def dasknn(cwd, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "dasknn", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_experiment_list_ignores_an_experiments_folder_in_the_current_directory(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "__init__.py").write_text(HOSTILE)
    (tmp_path / "experiments" / "common.py").write_text("")
    done = dasknn(tmp_path, "experiment", "list")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "MARKER").exists()
    assert "batched_lowering" in done.stdout  # the checkout's own list
    asked = dasknn(tmp_path, "experiment", "--from-cwd", "list")
    assert asked.returncode == 0 and (tmp_path / "MARKER").read_text() == "ran", asked.stderr
