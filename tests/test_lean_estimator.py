"""The estimator's helpers take what they need, not the estimator (skorch's components, dask-ml's
searches): read with `ast`, no function outside estimator.py has a parameter that is the estimator,
except the few whose job is the estimator itself, each listed with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import dasknn

PACKAGE = Path(dasknn.__file__).parent
TAKES_THE_ESTIMATOR = {
    (
        "callbacks.py",
        "on_*",
    ): "the callback contract: a hook gets the estimator, as Keras' and skorch's get the model",
    ("callbacks.py", "stop_requests"): "calls the hooks, which get the estimator (the contract above)",
    ("saving.py", "save"): "writes the estimator's fitted attributes to a folder, as pickle would",
    ("saving.py", "_fitted_values"): "save's fitted attributes of the estimator, or of its fit in progress",
    ("cli/report.py", "write_run"): "the command reports a fitted estimator as a user reads it",
    ("cli/report.py", "_save_model"): "the command saves the fitted estimator as a user does",
}


def _is_estimator(arg: ast.arg) -> bool:
    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
    return arg.arg in ("est", "estimator") or "DistributedCNN" in annotation


def _allowed(name: str, function: str) -> bool:
    return (name, function) in TAKES_THE_ESTIMATOR or (
        (name, "on_*") in TAKES_THE_ESTIMATOR and function.startswith("on_")
    )


def test_no_function_outside_the_estimator_takes_the_estimator():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name == "estimator.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(_is_estimator(a) for a in args):
                    function = getattr(node, "name", "<lambda>")
                    if not _allowed(name, function):
                        found.append(f"{name}:{node.lineno} {function}")
    assert found == [], "helpers that take the estimator (pass them what they need): " + ", ".join(found)
    assert len(TAKES_THE_ESTIMATOR) <= 7


def test_the_cluster_lifecycle_and_the_data_parts_live_outside_the_estimator():
    source = (PACKAGE / "estimator.py").read_text()
    tree = ast.parse(source)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    moved = {
        "_connect",
        "_in_daemon_process",
        "_scheduler_answers",
        "_in_dask_task",
        "_announce",
        "_train_part",
    }
    assert not defined & moved
    import dasknn.cluster as cluster
    from dasknn.data.split import Carved, carve

    assert callable(cluster.dask_client) and callable(carve) and Carved.__dataclass_fields__
