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
from dasknn.optimizer import AutoPolicy, OnlinePolicy
from experiments.pin_loop import COMMON  # the digits MLP fit the pins use

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


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data.astype(np.float32) / 16, d.target


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"n_groups": 2, "learning_rate": 50.0, "momentum": 0.9, "max_epochs": 2}, id="fixed"),
        pytest.param({"tuner": "grid", "max_epochs": 8, "poison_row": 1500}, id="grid"),
        pytest.param(
            {"max_epochs": 2, "tuner": AutoPolicy(solver={"base_lr": 20.0, "momentum": 0.9})}, id="auto"
        ),
        pytest.param(
            {"tuner": OnlinePolicy(initial_lr=1000.0), "max_epochs": 3}, id="online"
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


def _last_chosen(decisions) -> tuple:
    chosen = decisions[decisions["chosen"].astype(bool)]
    row = chosen.iloc[-1]
    return int(row["n_groups"]), float(row["lr"]), float(row["momentum"])


@pytest.mark.parametrize("budget", [0.004, 0.012, 0.02, 0.05])
def test_config_and_decisions_agree_when_the_budget_ends_mid_search(digits, budget):
    """config_ is the last decision that set the training config, wherever the time budget ends:
    in the cold start's rates, in its g ladder (the model is a probe's, at its g, not yet at the
    initial g Algorithm 1 would go on with), or after an epoch. partial_fit goes on with it."""
    X, y = digits
    est = DistributedCNN(**{**COMMON, "time_budget": budget}).fit(X, y)
    c = est.config_
    assert (c.n_groups, c.lr, c.momentum) == _last_chosen(est.decisions_)
    stop = est.decisions_[est.decisions_["action"] == "stop"].iloc[-1]
    assert (int(stop["n_groups"]), float(stop["lr"])) == (c.n_groups, c.lr)
    est.set_params(time_budget=None, max_epochs=0.5).partial_fit(X, y)
    assert est.config_ == c and est.trace_.attrs["n_groups"] == c.n_groups
    assert set(est.trace_[est.trace_["run"] == est.trace_["run"].max()]["lr"]) == {c.lr}


def test_the_budget_ending_in_the_g_ladder_keeps_the_g_the_model_trained_at(digits):
    """The case of a6dbd31: the cold start chose g (choose_groups, chosen) and the budget ended
    before any run at the initial g; config_ said the initial g, and partial_fit continued there."""
    X, y = digits
    est = DistributedCNN(**{**COMMON, "time_budget": 0.0235, "tuner": "grid"}).fit(X, y)
    actions = list(est.decisions_["action"])
    assert "choose_groups" in actions and "initial_groups" in actions
    initial = int(est.decisions_.loc[est.decisions_["action"] == "initial_groups", "n_groups"].iloc[0])
    picked = int(est.decisions_.loc[est.decisions_["action"] == "choose_groups", "n_groups"].iloc[0])
    assert picked != initial  # the disagreement this pins: g = 2 chosen, 4 the initial g
    assert est.config_.n_groups == picked
