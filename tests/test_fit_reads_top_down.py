"""State is shared through methods, not through free functions that take the object: no
module-level function's first parameter is annotated with a class of its own module (that class, or
that class or None), but for the few named below, each with its reason (STYLE: split along a seam,
"never by moving methods out as functions that take the object"). A function of a collection of
objects, or of a union with other types, is a function of values, not a method moved out."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dasknn"

AUTO = "auto's rules are being rebuilt"
ALLOWED = {
    **{
        f"dasknn.optimizer.auto.{name}": AUTO
        for name in (
            "new_plateau",
            "observe_plateau",
            "adjust_momentum",
            "regroup_on_change",
            "worker_count",
            "at_workers",
            "groups_and_model",
            "prior_cache",
            "start_prior",
            "remember",
            "start_range",
            "range_run",
            "watched_run",
            "observe_range",
            "restarted",
            "spike_rule",
            "keep_level",
        )
    },
    "dasknn.nn.export": "one emitter per Caffe layer type, looked up by type in `EMITTERS`; the graph is "
    "what each writes to",
    "dasknn.nn.lowering": "Caffe con Troll's lowering as pure functions of arrays and a conv's geometry "
    "(STYLE: math in pure functions)",
    "dasknn.nn.onednn.memory": "oneDNN buffers and reorders between two layouts, cached by the pair; a "
    "layout is a value",
    "dasknn.engine.dask.replicas.learner_loop": "a Dask task: a worker runs it, handed its spec",
    "dasknn.engine.dask.replicas._learn": "the task's body, on the worker",
    "dasknn.engine.dask.kept": "what a driver keeps between runs may be nothing: taken or let go as None "
    "or a Kept",
    "dasknn.data.store._from_store": "the dask array over a store's array (what `da.from_array` reads)",
    "dasknn.data.registry._options": "a registry entry's options filled in from the user's words",
}
"""Dotted names (a function, or a whole module) → why their functions take their module's object."""


def _class_annotation(annotation: ast.expr | None, classes: set[str]) -> str | None:
    """The module's class named by `annotation` (`C`, `"C"`, `C | None`), else None."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) != 1:
            return None
        annotation = rest[0]
    if isinstance(annotation, ast.Name) and annotation.id in classes:
        return annotation.id
    return None


def functions_taking_their_modules_object(package: Path) -> dict[str, str]:
    """Dotted name of each module-level function whose first parameter is annotated with a class of
    its module → that class."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.posonlyargs + node.args.args
            cls = _class_annotation(args[0].annotation, classes) if args else None
            if cls is not None:
                found[f"{module}.{node.name}"] = cls
    return found


def _allowed(name: str) -> bool:
    return any(name == key or name.startswith(key + ".") for key in ALLOWED)


@pytest.fixture(scope="module")
def found() -> dict[str, str]:
    return functions_taking_their_modules_object(PACKAGE)


def test_no_function_takes_its_modules_object_but_the_listed(found):
    assert {n: c for n, c in found.items() if not _allowed(n)} == {}


def test_each_listed_exception_is_still_needed(found):
    """An entry whose functions became methods leaves the list."""
    stale = [key for key in ALLOWED if not any(n == key or n.startswith(key + ".") for n in found)]
    assert stale == []


def test_the_rule_finds_a_method_moved_out(tmp_path):
    """The scan sees a function over its module's class, as `C`, `"C"` or `C | None`, and not a
    function of a collection or of a union with other types."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "class C:\n    pass\n\n"
        "def moved(c: C, n: int):\n    pass\n\n"
        "def quoted(c: 'C'):\n    pass\n\n"
        "def maybe(c: C | None):\n    pass\n\n"
        "def many(cs: list[C]):\n    pass\n\n"
        "def either(x: float | C):\n    pass\n\n"
        "def other(x: int, c: C):\n    pass\n"
    )
    assert functions_taking_their_modules_object(pkg) == {
        "pkg.m.moved": "C",
        "pkg.m.quoted": "C",
        "pkg.m.maybe": "C",
    }


def test_the_fit_is_set_up_by_its_settings_methods_in_its_order():
    """The fit's steps over its settings are FitSettings' methods, written in the order a fit
    takes them: plan, build (engine, callbacks, loop, policy), finish."""
    import inspect

    from dasknn.estimator_fit import FitSettings

    source = inspect.getsource(FitSettings)
    order = ["plan", "engine_for", "fit_callbacks", "build_loop", "policy", "ended", "tradeoff"]
    positions = [source.index(f"    def {step}(") for step in order]
    assert positions == sorted(positions)
