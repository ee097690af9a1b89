"""No class over 400 lines and no function over 80 (STYLE: a sign to split by concept), but for the
few named below, each with its reason. Lines are counted with `ast`, from the `def`/`class` line to
the last line of the body, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dasknn

PACKAGE_DIR = Path(dasknn.__file__).parent
MAX_CLASS, MAX_FUNCTION = 400, 80

EXCEPTIONS = {
    "dasknn.nn.net.Net": "Caffe's Net: one graph of layers and blobs with its forward, backward, phase "
    "split and parameter access, which every engine and the optimizer share; its methods are short",
    "dasknn.nn.prototxt.read_net": "one pass over a NetParameter's layers in file order, in Caffe's own "
    "order of rules (include/exclude, data layer, blobs, loss heads); split, the order would be lost",
    "dasknn.estimator.DistributedCNN.__init__": "scikit-learn's contract: every parameter named in the "
    "signature and stored as given, two lines each; the table of parameters (estimator_params.PARAMS) "
    "describes them and test_params_table keeps the two equal",
}
"""At most three, each with its reason."""


def sizes(package_dir: Path = PACKAGE_DIR) -> dict[str, tuple[str, int]]:
    """Dotted name of every class and function of the package → (kind, lines)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        module = ".".join(parts).removesuffix(".__init__")

        def visit(node, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    kind = "class" if isinstance(child, ast.ClassDef) else "function"
                    out[name] = (kind, child.end_lineno - child.lineno + 1)
                    visit(child, name)

        visit(ast.parse(path.read_text()), module)
    return out


def over_limits(found: dict[str, tuple[str, int]]) -> dict[str, int]:
    limit = {"class": MAX_CLASS, "function": MAX_FUNCTION}
    return {name: n for name, (kind, n) in found.items() if n > limit[kind]}


def test_the_exceptions_are_few_and_named():
    found = sizes()
    assert len(EXCEPTIONS) <= 3
    assert all(name in found and reason for name, reason in EXCEPTIONS.items())


def test_no_class_over_400_lines_and_no_function_over_80():
    over = {name: n for name, n in over_limits(sizes()).items() if name not in EXCEPTIONS}
    assert over == {}, "over the limits: " + ", ".join(f"{k} ({v} lines)" for k, v in sorted(over.items()))


def test_the_count_sees_a_planted_long_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION))  # 80 lines after the def
    (pkg / "m.py").write_text(f"class C:\n    def f(self):\n{body}")
    assert over_limits(sizes(pkg)) == {"pkg.m.C.f": MAX_FUNCTION + 1}
