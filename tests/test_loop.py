"""The one training loop and its policies (docs/architecture.md, "The loop and its policies").

Structure, read with `ast`: no policy calls the engine, and divergence is judged and rolled back in
one place. Behaviour: the simulated engine is deterministic, so a fit run twice makes the same
decisions and ends with the same weights, for each policy, also through a rollback.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

import dasknn
from dasknn.estimator import DistributedCNN

PACKAGE = Path(dasknn.__file__).parent


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            yield node


def _is_engine(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine"
    )


def test_no_module_under_optimizer_calls_the_engine():
    modules = sorted((PACKAGE / "optimizer").glob("*.py"))
    assert len(modules) >= 8
    runs = [
        f"{path.name}:{call.lineno}"
        for path in modules
        for call in _calls(path)
        if isinstance(call.func, ast.Attribute) and call.func.attr == "run" and _is_engine(call.func.value)
    ]
    assert runs == [], f"policies call engine.run: {runs}"
    # the loop does: the check would see a call written the way the loop writes it
    loop_runs = [
        c for c in _calls(PACKAGE / "fitting.py")
        if isinstance(c.func, ast.Attribute) and c.func.attr == "run" and _is_engine(c.func.value)
    ]  # fmt: skip
    assert len(loop_runs) == 1


def test_there_is_one_divergence_handler():
    """Only the loop catches an engine's FloatingPointError, checks a run's weights and gives up."""
    found: dict[str, list[str]] = {"except FloatingPointError": [], "healthy": [], "in a row": []}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "checkpoint.py":  # defines `healthy`
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        name = str(path.relative_to(PACKAGE))
        for node in ast.walk(tree):
            caught = isinstance(node, ast.ExceptHandler) and node.type is not None
            if caught and "FloatingPointError" in ast.unparse(node.type):
                found["except FloatingPointError"].append(name)
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("healthy"):
                found["healthy"].append(name)
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "times in a row" in node.value
            ):
                found["in a row"].append(name)
    assert found == {key: ["fitting.py"] for key in found}


COMMON = {
    "net": "mlp",
    "input_shape": "flat",
    "engine": "simulated",
    "simulated_gflops": 10.0,
    "n_workers": 4,
    "batch_size": 32,
    "time_budget": None,
    "eval_size": 200,
}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"n_groups": 2, "learning_rate": 50.0, "momentum": 0.9, "max_epochs": 2}, id="fixed"),
        pytest.param({"max_epochs": 8, "poison_row": 1500}, id="grid"),
        pytest.param(
            {"optimizer": "online", "max_epochs": 3, "optimizer_options": {"initial_lr": 1000.0}}, id="online"
        ),
    ],
)  # fmt: skip
def test_each_policy_rolls_back_and_runs_the_same_twice(digits, params):
    """A fit that diverges and rolls back, twice: the same history, decisions and weights (the
    simulated engine reads no wall clock). Compared within a machine, so no float drift enters."""
    X, y = digits
    params = dict(params)
    row = params.pop("poison_row", None)
    if row is not None:
        X = X.copy()
        X[row] *= np.float32(3e37)  # a sample whose batch overflows: the train run that meets it diverges
    a, b = (DistributedCNN(**COMMON, **params).fit(X, y) for _ in range(2))
    actions = set(a.decisions_["action"])
    assert actions & {"rollback", "diverged"}, actions
    assert (a.trace_["phase"] == "rolled_back").any()
    cols = ["phase", "action", "n_groups", "lr", "momentum", "score", "iterations", "chosen"]
    assert a.decisions_[cols].equals(b.decisions_[cols])
    keys = ["time", "iteration", "epoch", "loss", "accuracy", "phase"]
    assert [[h[k] for k in keys] for h in a.history_] == [[h[k] for k in keys] for h in b.history_]
    for key, value in a.state_.params.items():
        np.testing.assert_array_equal(b.state_.params[key], value)
    assert a.config_ == b.config_
