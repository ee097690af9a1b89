"""ProgressBar: the fraction of the fit's budgets done, and output that suits a terminal or a log."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.callbacks import ProgressBar
from dasknn.estimator import DistributedCNN

QUICK = {"net": "mlp", "input_shape": "flat", "engine": "simulated", "n_workers": 1, "batch_size": 32}
FIXED = {"n_groups": 1, "learning_rate": 0.1, "momentum": 0.9, "eval_size": 100}


class Terminal(io.StringIO):
    """A string that says it is a terminal, as stderr in a shell does."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.data / 16).astype(np.float32), d.target


def _drawn(text: str) -> list[str]:
    """Each state of the bar as drawn: tqdm redraws with carriage returns, logs with newlines."""
    return [s.strip() for s in re.split(r"[\r\n]", text) if s.strip()]


def _evaluations(bar: ProgressBar, est, n: int, seconds: float, epochs: float) -> None:
    bar.on_fit_begin(est)
    for i in range(n + 1):
        row = {"time": seconds * i / n, "epoch": epochs * i / n, "loss": 2.0 - i / n, "accuracy": i / n}
        bar.on_evaluation(est, {**row, "phase": "train"})
    bar.on_fit_end(est)


def test_the_bar_ends_full_when_max_epochs_ends_a_fit_before_its_time_budget():
    out = Terminal()
    est = SimpleNamespace(time_budget=60.0, max_epochs=2, engine="dask")
    _evaluations(ProgressBar(file=out), est, n=4, seconds=3.6, epochs=2)  # 6% of the time budget
    last = _drawn(out.getvalue())[-1]
    assert last.startswith("dasknn: 100%|") and "2.0/2 epoch, 3.6/60 s" in last
    assert out.getvalue().endswith("\n")  # closed
    out = Terminal()  # a target reached early: the true fraction, the larger of the two
    _evaluations(ProgressBar(file=out), est, n=4, seconds=30.0, epochs=0.5)
    assert _drawn(out.getvalue())[-1].startswith("dasknn:  50%|")


def test_on_a_terminal_each_evaluation_is_drawn_once():
    out = Terminal()
    _evaluations(ProgressBar(file=out), SimpleNamespace(time_budget=None, max_epochs=4, engine="dask"),
                 n=8, seconds=1.0, epochs=4)  # fmt: skip
    drawn = [d for d in _drawn(out.getvalue()) if "loss=" in d]
    assert drawn and len(drawn) <= 9 + 1  # at most once each, the last again as the bar closes
    for d in drawn:  # each with its own position, never the last evaluation's postfix at a new one
        i = round((2.0 - float(re.search(r"loss=([0-9.]+)", d).group(1))) * 8)
        assert f" {4 * i / 8:.1f}/4 epoch" in d, d
    assert "loss=1.000" in drawn[-1] and "4.0/4 epoch" in drawn[-1]


def test_with_output_redirected_a_fit_writes_a_line_per_evaluation_at_most_every_interval(digits):
    X, y = digits
    out = io.StringIO()  # not a terminal
    started = time.monotonic()
    est = DistributedCNN(time_budget=None, max_epochs=3, callbacks=[ProgressBar(file=out)], **QUICK, **FIXED)
    est.fit(X, y)
    wall = time.monotonic() - started
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == len(set(lines))  # no evaluation twice
    assert 1 <= len(lines) <= 2 + wall / ProgressBar.LOG_INTERVAL < len(est.history_)
    assert lines[-1].startswith("dasknn (simulated): 100% 3.0/3 epoch [")
    assert f"loss={est.history_[-1]['loss']:.3f}" in lines[-1]
