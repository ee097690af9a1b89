"""No deprecation shims in a 0.x package (the README: names change with no deprecation period).

Importing every module of dasknn and building a DistributedCNN with its defaults warns no
DeprecationWarning or FutureWarning from dasknn: neither one that dasknn issues (attributed to its
own code or, through `stacklevel`, to its caller) nor one from a deprecated API of a dependency
that dasknn calls. And no code of the package names DeprecationWarning at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dasknn

PACKAGE_DIR = Path(dasknn.__file__).parent

# Run in a fresh interpreter: a module warns only the first time it is imported. A warning is
# dasknn's when the code that issued it is in the package (whatever caller its `stacklevel` names),
# or when it is attributed to the package (a dependency's deprecated API that dasknn calls).
SCRIPT = """
import importlib, json, pkgutil, traceback, warnings
from pathlib import Path

import dasknn

package = Path(dasknn.__file__).parent.resolve()


def in_package(filename):
    try:
        return Path(filename).resolve().is_relative_to(package)
    except (OSError, ValueError):
        return False


found = []


def record(message, category, filename, lineno, file=None, line=None):
    frames = [f for f in traceback.extract_stack()[:-1] if f.filename != warnings.__file__]
    issuer = frames[-1]
    if issubclass(category, (DeprecationWarning, FutureWarning)) and (
        in_package(issuer.filename) or in_package(filename)
    ):
        found.append(f"{category.__name__} from {issuer.filename}:{issuer.lineno}: {message}")


imported, absent = ["dasknn"], []
with warnings.catch_warnings():
    warnings.simplefilter("always")
    warnings.showwarning = record
    for info in pkgutil.walk_packages(dasknn.__path__, "dasknn."):
        if info.name.endswith("__main__"):  # runs the command line
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as err:  # an optional dependency not installed here
            if err.name.startswith("dasknn"):
                raise
            absent.append(info.name)
            continue
        imported.append(info.name)
    from sklearn.base import clone

    from dasknn import DistributedCNN
    from dasknn.estimator_params import check_params

    est = clone(DistributedCNN())
    check_params(est.get_params(deep=False))
print(json.dumps({"imported": imported, "absent": absent, "found": found}))
"""


def test_importing_every_module_and_a_default_estimator_warn_no_deprecation_from_dasknn():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["found"] == []
    modules = {p for p in PACKAGE_DIR.rglob("*.py") if p.name != "__main__.py"}
    assert len(result["imported"]) + len(result["absent"]) == len(modules)
    assert {"dasknn.estimator", "dasknn.optimizer.online", "dasknn.engine.dask.driver"} <= set(
        result["imported"]
    )


def test_no_code_of_the_package_names_a_deprecation_warning():
    named = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{n}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "DeprecationWarning" in line or "FutureWarning" in line
    ]
    assert named == []
