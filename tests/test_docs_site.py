"""The documentation site builds with no warning, and the user guide's Python blocks run as written."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"

# Sphinx's notices to extension authors (MyST calls an API that Sphinx 11 will drop): not ours to act on
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning:myst_parser.*")


def toctree_pages(caption: str) -> list[str]:
    """The pages of docs/index.md's toctree with this caption, in order."""
    index = (DOCS / "index.md").read_text()
    pattern = rf"```{{toctree}}\n(?::[^\n]*\n)*?:caption: {re.escape(caption)}\n(.*?)```"
    match = re.search(pattern, index, re.S)
    assert match, f"docs/index.md has no toctree captioned {caption!r}"
    return [line.strip() for line in match.group(1).splitlines() if line.strip() and not line.startswith(":")]


def python_blocks(page: str) -> list[str]:
    """The fenced ```python blocks of a page (a block shown but not run is a ```{code-block} python)."""
    return re.findall(r"^```python\n(.*?)^```", (DOCS / f"{page}.md").read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built once into a temporary folder, as `sphinx-build -W` builds it (a warning fails
    the build). In this process: the modules autodoc imports are mostly imported already."""
    from sphinx.cmd.build import build_main

    out = tmp_path_factory.mktemp("site")
    warnings = out / "warnings.txt"
    args = ["-W", "--keep-going", "-q", "-w", str(warnings), "-b", "html", "-d", str(out / "doctrees")]
    status = build_main([*args, str(DOCS), str(out / "html")])
    text = warnings.read_text() if warnings.exists() else ""
    assert status == 0 and text.strip() == "", text[-6000:]
    return out / "html"


def test_the_site_builds_with_every_page(site):
    """Every guide and API page is there, and the architecture page is one of them."""
    for caption in ("User guide", "API reference", "About"):
        for page in toctree_pages(caption):
            assert (site / f"{page}.html").is_file(), page
    assert "architecture" in toctree_pages("About")


def test_the_cli_page_is_read_from_the_parser(site):
    """Every command and every option of `dasknn train` is on the page, as the parser has them."""
    from dasknn.cli import build_parser

    page = (site / "guide" / "cli.html").read_text()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert set(commands) >= {"train", "predict", "export", "experiment", "info", "summary"}
    for name, parser in commands.items():
        assert f">{name}<" in page or f"dasknn {name}" in page, name
        for action in parser._actions:
            for option in action.option_strings:
                assert option in page, f"dasknn {name} {option}"


def test_the_api_pages_render_the_numpydoc_sections(site):
    """DistributedCNN's page has its parameters, attributes and examples, and each documented
    public class has its own entry."""
    page = (site / "api" / "estimator.html").read_text()
    for section in ("Parameters", "Attributes", "Examples", "Returns"):
        assert f">{section}<" in page, section
    assert "time_budget" in page and "history_" in page
    callbacks = (site / "api" / "callbacks.html").read_text()
    for name in ("EarlyStopping", "ModelCheckpoint", "ProgressBar", "CSVLogger"):
        assert f'id="dasknn.callbacks.{name}"' in callbacks, name


def test_the_user_guide_runs(tmp_path, monkeypatch):
    """The guide's Python blocks, page after page in the toctree's order, in one namespace (a page
    goes on from the objects the pages before it made, as a reader does)."""
    import matplotlib

    matplotlib.use("Agg")  # no window from plt.show()
    pages = toctree_pages("User guide")
    blocks = [(page, block) for page in pages for block in python_blocks(page)]
    assert {"guide/python", "guide/saving"} <= {page for page, _ in blocks}
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for page, block in blocks:
        exec(compile(block, f"docs/{page}.md", "exec"), namespace)
    assert (tmp_path / "lenet-digits" / "model.json").is_file()
    assert (tmp_path / "lenet-digits.onnx").is_file()


def documented() -> list[tuple[str, str, list[str]]]:
    """(directive, dotted name, members) of each object the API pages document."""
    found = []
    for page in sorted((DOCS / "api").glob("*.rst")):
        text = page.read_text()
        pattern = r"^\.\. auto(\w+):: ([\w.]+)\n((?:   :[^\n]*\n)*)"
        for kind, name, options in re.findall(pattern, text, re.M):
            members = re.search(r":members: (.*)", options)
            found.append((kind, name, members.group(1).split(", ") if members else []))
    return found


def resolve(name: str):
    import importlib

    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_public_docstrings_have_examples_that_run(tmp_path, monkeypatch):
    """Each class and function of the API pages has an Examples section, and every example not
    marked `doctest: +SKIP` runs and prints what its docstring says."""
    import doctest

    objects = [(name, resolve(name)) for kind, name, _ in documented() if kind in ("class", "function")]
    names = dict(objects).keys()
    assert {"dasknn.DistributedCNN", "dasknn.callbacks.ModelCheckpoint", "dasknn.data.load"} <= names
    lacking = [name for name, obj in objects if "Examples\n" not in (obj.__doc__ or "")]
    assert not lacking, f"no Examples section: {lacking}"
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    finder = doctest.DocTestFinder(recurse=False)
    report: list[str] = []
    for name, obj in objects:
        for test in finder.find(obj, name, globs={}):
            runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).failed == 0, "".join(report)


def test_the_exit_codes_page_has_every_code_of_the_cli():
    """Each exit code the command line declares (an `EXIT_...` number of its source) has its row on
    the page, and no other code does."""
    sources = [REPO / "dasknn" / "cli.py", *sorted((REPO / "dasknn" / "cli").glob("*.py"))]
    text = "".join(path.read_text() for path in sources if path.is_file())
    codes = {int(code) for code in re.findall(r"^EXIT_\w+ = (\d+)", text, re.M)}
    assert {0, 1, 2, 3, 130} <= codes
    page = (DOCS / "guide" / "exit-codes.md").read_text()
    assert {int(code) for code in re.findall(r"^\| (\d+) \|", page, re.M)} == codes
