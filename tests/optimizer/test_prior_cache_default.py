"""The "auto" tuner's prior cache: off unless a fit asks for it, and then in the user's cache folder.

These tests lift the suite's `DASKNN_PRIOR_CACHE=off` and point `$XDG_CACHE_HOME` and `$HOME` at a
temporary folder, so they see the defaults a user gets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.estimator import DistributedCNN
from dasknn.optimizer.prior import CACHE_FILE, cache_home, default_cache_path

COMMON = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 2, "batch_size": 32,
          "time_budget": None, "eval_size": 200, "max_epochs": 1}  # fmt: skip
COLUMNS = ["phase", "action", "n_groups", "lr", "momentum", "score", "reason"]


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DASKNN_PRIOR_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


def test_the_cache_lives_in_the_users_cache_folder(user_home, monkeypatch):
    assert cache_home() == user_home / "home" / ".cache" / "dasknn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(user_home / "xdg"))
    assert default_cache_path() == user_home / "xdg" / "dasknn" / CACHE_FILE
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as the XDG rule says
    assert cache_home() == user_home / "home" / ".cache" / "dasknn"
    monkeypatch.setenv("DASKNN_PRIOR_CACHE", "off")
    assert default_cache_path() is None


def test_a_default_fit_neither_reads_nor_writes_a_cache_and_repeats_its_decisions(user_home, digits):
    X, y = digits
    a = DistributedCNN(**COMMON).fit(X, y)
    b = DistributedCNN(**COMMON).fit(X, y)
    assert a.decisions_[COLUMNS].equals(b.decisions_[COLUMNS])
    assert "the last successful fit" not in b.decisions_.iloc[0]["reason"]
    assert [p for p in user_home.rglob("*") if p.is_file()] == []  # nothing written in the user's folders
    from dasknn.data import data_home

    assert not (data_home() / CACHE_FILE).exists()  # nor in the data home (a source checkout's datasets/)


def test_prior_cache_true_remembers_a_fit_for_the_next_in_the_cache_folder(user_home, digits):
    X, y = digits
    # two epochs: a fit that ends by its budget mid-ramp has found no η worth remembering
    first = DistributedCNN(**{**COMMON, "max_epochs": 2}, prior_cache=True).fit(X, y)
    path = user_home / "home" / ".cache" / "dasknn" / CACHE_FILE
    assert path.is_file()
    second = DistributedCNN(**{**COMMON, "max_epochs": 2}, prior_cache=True).fit(X, y)
    start = second.decisions_.iloc[0]
    assert "the last successful fit" in start["reason"] and str(path) in start["reason"]
    entry = next(iter(json.loads(path.read_text()).values()))
    assert (start["n_groups"], start["lr"], start["momentum"]) == (
        entry["n_groups"],
        entry["lr"],
        entry["momentum"],
    )
    assert first.decisions_.iloc[0]["reason"].startswith("prior: smallest g")  # the first one started cold
    assert "ramp" not in set(second.decisions_["phase"])  # a cached start skips the ramp
