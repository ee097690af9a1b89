"""Every listed experiment exists, follows experiments/common.py's interface, and has its own test."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from dasknn.cli import main as dasknn_main
from experiments import EXPERIMENTS

HERE = Path(__file__).resolve().parent


def test_eleven_experiments_are_listed():
    assert len(EXPERIMENTS) == 11 and len(set(EXPERIMENTS)) == 11


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_follows_the_interface(name):
    module = importlib.import_module(f"experiments.{name}")
    assert module.NAME == name
    assert module.MIRRORS and module.VARIABLES
    assert callable(module.run) and callable(module.main)
    doc = module.__doc__ or ""
    assert "Fig" in doc or "Table" in doc or "Eq" in doc or "appendix" in doc, "say what it mirrors"
    assert (HERE / f"test_{name}.py").is_file(), f"{name} has no tiny-setting test"


def test_cli_lists_the_experiments(capsys):
    assert dasknn_main(["experiment", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS)


def test_cli_rejects_an_unknown_experiment(capsys):
    assert dasknn_main(["experiment", "no_such_thing"]) == 2
    assert "unknown experiment 'no_such_thing'" in capsys.readouterr().err
