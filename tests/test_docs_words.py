"""The code and docs speak of the project, not of when it was written: no "fourth session" wording."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

SESSION_WORDS = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|this|last|previous)[\s-]+session", re.IGNORECASE
)
SCANNED = ("dasknn", "docs", "experiments", "README.md")
SUFFIXES = {".py", ".md", ".txt", ".toml", ".yml"}
SKIPPED_DIRS = {"results", "__pycache__"}


def text_files() -> list[Path]:
    """The text files of the package, the docs and the experiments (not their generated results)."""
    files = []
    for name in SCANNED:
        root = REPO / name
        if root.is_file():
            files.append(root)
            continue
        for path in root.rglob("*"):
            rel = path.relative_to(root).parts
            if path.is_file() and path.suffix in SUFFIXES and not SKIPPED_DIRS.intersection(rel):
                files.append(path)
    return files


def session_wording(text: str) -> list[str]:
    """Each place in `text` that dates itself by a work session (a line break inside the words included)."""
    hits = SESSION_WORDS.finditer(text)
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in hits]


def test_pattern_finds_session_wording() -> None:
    """The pattern catches the phrasings that date a text, and leaves the code's own session objects alone."""
    assert session_wording("measured in the fourth session\nat the end of the Fifth session")
    assert session_wording("a fifth-session rerun")
    assert session_wording("nothing changed in this\nsession") == ["line 1: 'this\\nsession'"]
    assert session_wording("session = dict(resume_from.meta)\nan onnxruntime InferenceSession") == []


def test_no_session_wording_in_code_and_docs() -> None:
    """No file of dasknn/, docs/, experiments/ or README.md speaks of a first/.../last session."""
    files = text_files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    texts = {str(p.relative_to(REPO)): p.read_text(errors="replace") for p in files}
    found = {name: hits for name, text in texts.items() if (hits := session_wording(text))}
    assert not found, f"session wording (say the date or the commit instead): {found}"


OPTIMIZER = re.compile(r"\boptimizers?\b", re.IGNORECASE)
PACKAGE_NAME = re.compile(
    r"dasknn\.optimizer\b|\boptimizer/|\boptimizer\.\w|[`'\"]optimizer[`'\"=]|\boptimizer=|"
    r"Omnivore's\s+optimizer|\*\*optimizer\*\*"
)
"""The forms in which "optimizer" may appear: the package (`dasknn.optimizer`, `optimizer/`,
`optimizer.grid`), a former parameter's name as data (`optimizer`, optimizer=), the paper's own
phrase "Omnivore's optimizer", and the glossary's entry."""


def optimizer_words(text: str) -> list[str]:
    """Each place in `text` that says "optimizer" for a tuner, the loop's policy or the solver."""
    allowed = [m.span() for m in PACKAGE_NAME.finditer(text)]
    return [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {text[max(0, m.start() - 30) : m.end() + 10]!r}"
        for m in OPTIMIZER.finditer(text)
        if not any(a <= m.start() < b for a, b in allowed)
    ]


def test_the_optimizer_rule_finds_a_tuner_called_an_optimizer() -> None:
    assert optimizer_words('"auto" lets the optimizer choose; the optimizers\' runs')
    assert optimizer_words("`dasknn.optimizer.grid`, `optimizer/auto.py`, `optimizer` read as `tuner`") == []
    assert optimizer_words("'grid' is Omnivore's optimizer (Algorithm 1); optimizer_class(name)") == []


def test_the_user_picks_a_tuner_not_an_optimizer() -> None:
    """The glossary's rule (docs/architecture.md, Glossary): "optimizer" names the package only,
    in the command's help, README.md, docs/ and the package's code outside `optimizer/`."""
    from dasknn.cli import build_parser

    parser = build_parser()
    helps = {"dasknn --help": parser.format_help()}
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        helps[f"dasknn {name} --help"] = sub.format_help()
    texts = {**helps, "README.md": (REPO / "README.md").read_text()}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "docs").rglob("*.md"))})
    package = REPO / "dasknn"
    texts.update(
        {
            str(p.relative_to(REPO)): p.read_text()
            for p in sorted(package.rglob("*.py"))
            if "optimizer" not in p.relative_to(package).parts
        }
    )
    found = {name: hits for name, text in texts.items() if (hits := optimizer_words(text))}
    assert not found, f"say tuner (what the user picks), policy or solver: {found}"
