"""The worker's iteration is written once (`engine.dask.iteration.run_iteration`); only the
transport varies (docs/architecture.md, "One iteration's data flow").

Read with `ast`: in the Dask engine's modules, only the models of `iteration.py` pull and push, only
`run_iteration` calls the FC server's step, and no per-transport iteration function is left in
`tasks.py` or `unmerged.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dasknn.engine.dask as dask_engine

DASK_DIR = Path(dask_engine.__file__).parent


def _server_calls(path: Path) -> dict[str, set[str]]:
    """Server method → the (class.)functions of the module that call it through `_call(actor, method)`."""
    found: dict[str, set[str]] = {}

    def visit(node, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{where}.{child.name}" if where else child.name
            if (
                isinstance(child, ast.Call)
                and getattr(child.func, "id", getattr(child.func, "attr", "")) == "_call"
            ):
                method = child.args[1] if len(child.args) > 1 else None
                if isinstance(method, ast.Constant) and isinstance(method.value, str):
                    found.setdefault(method.value, set()).add(where)
            visit(child, name)

    visit(ast.parse(path.read_text()), "")
    return found


def _functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_per_transport_iteration_functions_remain():
    for module in ("tasks.py", "unmerged.py"):
        names = [n for n in _functions(DASK_DIR / module) if "iteration" in n]
        assert names == [], f"{module} still has {names}"
    assert [n for n in _functions(DASK_DIR / "iteration.py") if n.endswith("iteration")] == ["run_iteration"]


def test_only_the_iteration_pulls_pushes_and_steps_the_fc_server():
    where: dict[str, set[str]] = {}
    for path in sorted(DASK_DIR.glob("*.py")):
        for method, functions in _server_calls(path).items():
            where.setdefault(method, set()).update(f"{path.name}:{f}" for f in functions)
    assert where["pull"] == {"iteration.py:ConvModel.pull", "iteration.py:ConvAndFCModels.pull"}
    assert where["push"] == {"iteration.py:ConvAndFCModels.push"}
    assert where["push_pull"] == {"iteration.py:ConvModel.push"}  # the merged map's push and next pull
    assert where["step"] == {"iteration.py:run_iteration"}
