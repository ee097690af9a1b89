"""The package's imports go one way: no circle between modules, and no path from the simulator to Dask.

The imports are read with `ast`, not run: every `import` and `from ... import` at any depth (inside
functions and methods too), relative ones resolved, those under `if TYPE_CHECKING:` left out (they
never run). docs/architecture.md "Layers": each layer imports only those below it, and
`engine/simulated/` reaches neither `dasknn.engine.dask` nor `distributed`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import dasknn

PACKAGE_DIR = Path(dasknn.__file__).parent


@dataclass
class Imports:
    """What one module imports: modules of the package, and top-level names of other packages."""

    internal: set[str] = field(default_factory=set)
    external: set[str] = field(default_factory=set)
    #: the internal ones that run when the module itself is imported (not inside a function)
    at_import: set[str] = field(default_factory=set)


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name → file, for every .py file of the package (a package's is its __init__)."""
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, known: set[str]) -> None:
        self.name, self.known = name, known
        self.package = name if is_package else name.rpartition(".")[0]
        self.found = Imports()
        self.depth = 0  # > 0 inside a function body

    def _add(self, module: str) -> None:
        top = self.name.partition(".")[0]
        if module == top or module.startswith(top + "."):
            while module not in self.known and "." in module:
                module = module.rpartition(".")[0]
            if module in self.known and module != self.name:
                self.found.internal.add(module)
                if self.depth == 0:
                    self.found.at_import.add(module)
        else:
            self.found.external.add(module.partition(".")[0])

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _visit_function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            self._add(sub if sub in self.known else module)


def import_graph(package_dir: Path) -> dict[str, Imports]:
    """Every module of the package → what it imports (the rules in this file's docstring)."""
    modules = package_modules(package_dir)
    graph = {}
    for name, path in modules.items():
        collector = _Collector(name, path.name == "__init__.py", set(modules))
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        graph[name] = collector.found
    return graph


def import_cycles(graph: dict[str, Imports]) -> list[list[str]]:
    """Import circles [a, b, ..., a]: the shortest through each module that is on one (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v].internal):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles, seen = [], set()
    for group in groups:
        for start in sorted(group):  # the shortest circle through each module of the group
            parent = _breadth_first(graph, [start], within=group)
            last = min((m for m in group if start in graph[m].internal), key=lambda m: len(_trail(parent, m)))
            cycle = _trail(parent, last)
            turn = cycle.index(min(cycle))
            key = tuple(cycle[turn:] + cycle[:turn])
            if key not in seen:
                seen.add(key)
                cycles.append([*key, key[0]])
    return cycles


def _breadth_first(graph: dict[str, Imports], starts: list[str], within: set[str]) -> dict[str, str | None]:
    """Each module reachable from `starts` inside `within` → the module it was first reached from."""
    parent: dict[str, str | None] = dict.fromkeys(starts)
    queue = deque(starts)
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v].internal & within):
            if w not in parent:
                parent[w] = v
                queue.append(w)
    return parent


def _trail(parent: dict, end) -> list:
    """The path from a start of a breadth-first search to `end`."""
    path = [end]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]


def path_to_forbidden(
    graph: dict[str, Imports], start: str, modules: str, external: set[str]
) -> list[str] | None:
    """An import path from package `start` to a module under `modules` or to an `external` package.

    Importing a module also runs its packages' __init__ (their module-level imports): those count.
    Returns the path (ending with the external package's name where that is what it reaches), or
    None when there is none.
    """

    def ancestors(m: str) -> list[str]:
        parts = m.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if p in graph]

    # a state is (module, whole): whole=False when only its module-level code runs (as a package
    # that a submodule's import passes through), True when any of its functions may run
    starts = [(m, True) for m in graph if m == start or m.startswith(start + ".")]
    parent: dict[tuple[str, bool], tuple[str, bool] | None] = dict.fromkeys(starts)
    queue = deque(starts)
    while queue:
        state = queue.popleft()
        m, whole = state
        reached = graph[m].external & external if whole else set()
        if m == modules or m.startswith(modules + ".") or reached:
            return [s[0] for s in _trail(parent, state)] + sorted(reached)[:1]
        targets = sorted(graph[m].internal if whole else graph[m].at_import)
        following = [(t, True) for t in targets] + [(a, False) for t in [m, *targets] for a in ancestors(t)]
        for nxt in following:
            if nxt not in parent and (nxt[0], True) not in parent:
                parent[nxt] = state
                queue.append(nxt)
    return None


# -- the package ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, Imports]:
    return import_graph(PACKAGE_DIR)


def test_the_walk_sees_imports_inside_functions_and_skips_type_checking(graph):
    # the driver dispatches to the unmerged runner at module level; the simulator's event loop
    # names its engine only for type checking
    assert "dasknn.engine.dask.unmerged" in graph["dasknn.engine.dask.driver"].internal
    assert "distributed" in graph["dasknn.engine.dask.runs"].external  # imported inside functions
    assert "dasknn.engine.simulated.engine" not in graph["dasknn.engine.simulated.events"].internal
    assert len(graph) > 50


def test_no_import_circle_between_modules(graph):
    cycles = import_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_simulator_reaches_no_dask_code(graph):
    path = path_to_forbidden(graph, "dasknn.engine.simulated", "dasknn.engine.dask", {"distributed"})
    assert path is None, "the simulator reaches Dask code: " + " -> ".join(path)


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("dasknn.nn", "dasknn.data"),
        ("dasknn.nn", "dasknn.engine"),
        ("dasknn.data", "dasknn.engine"),
        ("dasknn.engine", "dasknn.tradeoff"),
        ("dasknn.engine", "dasknn.optimizer"),
        ("dasknn.engine", "dasknn.fitting"),
        ("dasknn.engine", "dasknn.estimator"),
        ("dasknn.tradeoff", "dasknn.optimizer"),
        ("dasknn.optimizer", "dasknn.engine.dask"),
        ("dasknn.fitting", "dasknn.optimizer"),  # the loop knows its policies only by their Protocol
        ("dasknn.fitting", "dasknn.estimator"),
        ("dasknn.estimator", "dasknn.cli"),
    ],
)
def test_a_layer_does_not_import_the_layers_above_it(graph, lower, upper):
    path = path_to_forbidden(graph, lower, upper, set())
    assert path is None, f"{lower} reaches {upper}: " + " -> ".join(path)


def test_the_nn_layer_knows_nothing_of_dask(graph):
    path = path_to_forbidden(graph, "dasknn.nn", "dasknn.engine", {"dask", "distributed"})
    assert path is None, " -> ".join(path)


# -- what `from dasknn import DistributedCNN` runs ---------------------------------------------

DEFERRED = (
    "dask",
    "distributed",
    "xarray",
    "matplotlib",
    "torch",
    "dasknn.cluster",
    "dasknn.engine.dask",
    "dasknn.engine.simulated",
    "dasknn.optimizer",
    "dasknn.nn.net",
    "dasknn.nn.layers",
    "dasknn.nn.onednn",
)
"""Imported at first use, not by `from dasknn import DistributedCNN` (its import time is mostly
sklearn.base's, which brings numpy, scipy and pandas with it)."""


def test_importing_the_estimator_leaves_dask_the_engines_and_the_kernels_for_later():
    # a fresh interpreter: this process has imported everything already
    probe = (
        "import json, sys\n"
        "from sklearn.base import BaseEstimator\n"
        "from dasknn import DistributedCNN\n"
        "est = DistributedCNN(n_groups=2)\n"
        "est.get_params()\n"
        "assert isinstance(est, BaseEstimator)\n"
        f"print(json.dumps([m for m in {list(DEFERRED)!r} if m in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_DIR.parent)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


# -- the walk itself, on planted packages --------------------------------------------------------


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under tmp_path with the given files (relative paths → source)."""
    for rel, source in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for folder in {p.parent for p in (tmp_path / "pkg").rglob("*.py")}:
        (folder / "__init__.py").touch()
    return tmp_path / "pkg"


def test_a_circle_through_a_function_level_import_is_reported(tmp_path):
    pkg = _plant(
        tmp_path,
        {
            "a.py": "from pkg.b import helper\n",
            "b.py": "def helper():\n    from pkg import a\n    return a\n",
            "c.py": "import pkg.a\n",
        },
    )
    assert import_cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_relative_imports_resolve_and_type_checking_imports_do_not_count(tmp_path):
    pkg = _plant(
        tmp_path,
        {
            "sub/x.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from pkg.sub.y import Y
                else:
                    from ..z import Z
                class X:
                    def f(self):
                        from . import y
                        return y
            """,
            "sub/y.py": "from .x import X\n",
            "z.py": "Z = 1\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.sub.x"].internal == {"pkg.sub.y", "pkg.z"}
    assert graph["pkg.sub.x"].at_import == {"pkg.z"}
    assert import_cycles(graph) == [["pkg.sub.x", "pkg.sub.y", "pkg.sub.x"]]


def test_a_planted_path_from_the_simulator_to_dask_is_reported(tmp_path):
    pkg = _plant(
        tmp_path,
        {
            "engine/simulated/loop.py": "def run():\n    from pkg.engine import helpers\n",
            "engine/helpers.py": "def wait():\n    from distributed import wait\n",
            "engine/dask/driver.py": "import distributed\n",
        },
    )
    graph = import_graph(pkg)
    assert path_to_forbidden(graph, "pkg.engine.simulated", "pkg.engine.dask", {"distributed"}) == [
        "pkg.engine.simulated.loop",
        "pkg.engine.helpers",
        "distributed",
    ]
    assert path_to_forbidden(graph, "pkg.engine.simulated", "pkg.engine.dask", set()) is None


def test_a_package_init_on_the_way_counts_with_its_module_level_imports(tmp_path):
    pkg = _plant(
        tmp_path,
        {
            "engine/simulated/loop.py": "from pkg.engine.trace import Trace\n",
            "engine/trace.py": "Trace = dict\n",
            "engine/dask/driver.py": "Engine = object\n",
            "__init__.py": "def __getattr__(name):\n    from pkg.engine.dask import driver\n",
        },
    )
    graph = import_graph(pkg)
    # the top package's import runs only when an attribute is asked for: not a path
    assert path_to_forbidden(graph, "pkg.engine.simulated", "pkg.engine.dask", set()) is None
    (pkg / "engine" / "__init__.py").write_text("from pkg.engine.dask.driver import Engine\n")
    path = path_to_forbidden(import_graph(pkg), "pkg.engine.simulated", "pkg.engine.dask", set())
    assert path == ["pkg.engine.simulated", "pkg.engine", "pkg.engine.dask.driver"]
