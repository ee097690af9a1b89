"""The README's "From Python" section runs as written: its code blocks, in order, in one namespace."""

from __future__ import annotations

import re

from tests.conftest import REPO


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of the README section whose heading is `section`."""
    text = (REPO / "README.md").read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, f"README has no section '## {section}'"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.S | re.M)


def test_the_from_python_section_runs(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")  # no window from plt.show(); the section's own code does not pick a backend
    blocks = python_blocks("From Python")
    assert len(blocks) >= 3
    code = "\n".join(blocks)
    steps = ("fit(", "pd.DataFrame(est.history_)", ".plot(", ".save(", "DistributedCNN.load(", "predict(")
    assert all(step in code for step in steps), [step for step in steps if step not in code]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert (tmp_path / "lenet-digits").is_dir()
