"""The install story: pyproject.toml and environment.yml agree; README's commands are what CI runs."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from tests.conftest import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


def pyproject_dependencies() -> dict[str, tuple[str, str]]:
    """{name: (version spec, environment marker or "")} of pyproject.toml's plain dependencies."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]+\])?\s*([^;]*?)\s*(?:;\s*(.*))?", dep)
        name, extras, spec, marker = m.group(1).lower(), m.group(2), m.group(3), m.group(4) or ""
        out[name] = (spec, marker)
        if extras and "distributed" in extras:
            out["distributed"] = (spec, marker)
    return out


def pyproject_requirements() -> dict[str, str]:
    """The dependencies every platform installs (those conda lists by name), with their specs."""
    return {name: spec for name, (spec, marker) in pyproject_dependencies().items() if not marker}


def conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and dep != "pip" and not dep.startswith("python"):
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep)
            out[m.group(1).lower()] = m.group(2)
    return out


def conda_pip_lines() -> list[str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    return [line for dep in env["dependencies"] if isinstance(dep, dict) for line in dep.get("pip", [])]


def test_environment_yml_matches_pyproject():
    assert conda_requirements() == pyproject_requirements()


def test_onednn_is_a_dependency_on_linux_x86_64_and_environment_yml_installs_it():
    spec, marker = pyproject_dependencies()["onednn-cpu-gomp"]
    assert spec == "==2023.2.0"
    assert marker == "platform_system == 'Linux' and platform_machine == 'x86_64'"
    # conda-forge has no GNU-OpenMP oneDNN wheel: environment.yml gets it by pip-installing dasknn
    assert "-e ." in conda_pip_lines()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    commands = re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text())
    install_run, install_test = commands[0], commands[1]
    assert "pip install" in install_run and install_run.endswith("dasknn train")
    assert "pip install" in install_test and "pytest" in install_test
    assert install_test in (REPO / ".ci" / "run").read_text()


def test_cli_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "dasknn", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().startswith("dasknn ")


def test_importing_dasknn_does_not_import_cupy_or_dask_distributed():
    code = (
        "import sys, dasknn.nn.net, dasknn.nn.zoo; print('cupy' in sys.modules, 'distributed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False"]


def test_environment_yml_installs_the_export_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict) and "pip" in dep)
    assert set(extras["export"]) <= set(pip)
    assert set(extras["export"]) <= set(extras["test"]) and any("onnxruntime" in d for d in extras["test"])


def test_the_docs_extra_is_in_the_test_extra_and_environment_yml():
    """The test run builds the site: the README's `.[test]` and environment.yml install its packages."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pip = set(conda_pip_lines())
    names = {re.split(r"[<>=]", dep)[0] for dep in extras["docs"]}
    assert names == {"sphinx", "numpydoc", "myst-parser", "sphinx-argparse"}
    assert set(extras["docs"]) <= set(extras["test"]) and set(extras["docs"]) <= pip
