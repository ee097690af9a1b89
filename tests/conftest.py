"""Shared fixtures: the Caffe model files beside the repo, and GPU availability."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
