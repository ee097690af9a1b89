"""Shared fixtures: the Caffe model files beside the repo, GPU availability, a CPU hog."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dasknn.nn.onednn.capi import WAIT_POLICY

os.environ.setdefault("DASKNN_PRIOR_CACHE", "off")  # a fit must not start from an earlier test's fit
# the OpenMP wait policy dasknn sets when it loads oneDNN, set before collection: the PyTorch
# cross-checks import torch then, whose libgomp oneDNN would share
os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)

REPO = Path(__file__).resolve().parents[1]


def caffe_models_dir() -> Path | None:
    """../shared/caffe-models (present in CI), or $DASKNN_CAFFE_MODELS."""
    env = os.environ.get("DASKNN_CAFFE_MODELS")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "caffe-models")
    for path in candidates:
        if (path / "lenet_train_test.prototxt").is_file():
            return path
    return None


@pytest.fixture
def caffe_models() -> Path:
    path = caffe_models_dir()
    if path is None:
        pytest.skip("Caffe model files not found: set DASKNN_CAFFE_MODELS or clone with ../shared beside")
    return path


@contextlib.contextmanager
def cpu_hogs(n: int = 1) -> Iterator[list[subprocess.Popen]]:
    """`n` real CPU-bound processes (`while True: pass`) running for the duration, killed at the end."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
