"""Workers that join, leave or are lost under a fit show in `decisions_` (a "cluster" row each),
in the history's event note and on the progress bar (docs/architecture.md, "Elastic clusters")."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dasknn.callbacks import ProgressBar
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import RunConfig, TrainState, make_trace, worker_changes
from dasknn.fitting import Evaluator, Loop
from dasknn.optimizer.fixed import FixedKnobs
from tests.planted import small_net


def test_worker_changes_read_both_engines_records_in_time_order():
    dask = make_trace([], "dask", worker_events=[
        {"time": 4.0, "joined": ["tcp://b"], "left": ["tcp://a"], "n_workers": 2},
    ], recoveries=[{"time": 1.5, "worker": "tcp://c", "n_workers": 1}])  # fmt: skip
    assert worker_changes(dask) == [
        {"time": 1.5, "action": "lost", "workers": "tcp://c", "n_workers": 1},
        {"time": 4.0, "action": "join", "workers": "tcp://b", "n_workers": 2},
        {"time": 4.0, "action": "leave", "workers": "tcp://a", "n_workers": 2},
    ]
    simulated = make_trace([], "simulated", worker_events=[
        {"time": 10.0, "n_workers": 32, "n_workers_before": 8},
        {"time": 20.0, "n_workers": 4, "n_workers_before": 32},
    ])  # fmt: skip
    assert [(c["action"], c["workers"], c["n_workers"]) for c in worker_changes(simulated)] == [
        ("join", "24 workers", 32),
        ("leave", "28 workers", 4),
    ]
    assert worker_changes(make_trace([], "dask")) == []


class Terminal(io.StringIO):
    """A string that says it is a terminal: the bar is drawn as on a shell's stderr."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def elastic_fit():
    """A fixed-knob fit on the simulator while the cluster goes 8 -> 32 -> 4 workers, with a
    progress bar drawn on a string."""
    from dasknn.data import load
    from dasknn.tradeoff.hardware import HEModel

    X, y = (np.asarray(a) for a in load("digits", size=8, batch_size=32))
    engine = SimulatedEngine(
        HEModel(T_cc=0.8, T_nc=0.05, t_fc=0.005, n_workers=8), verbose=0,
        worker_schedule=((0, 8), (3, 32), (6, 4)),
    )  # fmt: skip
    out = Terminal()
    bar, est = ProgressBar(file=out), SimpleNamespace(time_budget=8.0, engine="simulated")
    changes = []

    def notify(hook: str, info: dict) -> bool:
        if hook == "on_evaluation":
            return bar.on_evaluation(est, info["row"])
        if hook == "on_cluster_change":
            changes.append(info)
        return bool(getattr(bar, hook)(est, info)) if hasattr(bar, hook) else False

    net = small_net()
    loop = Loop(engine, net, X, y, batch_size=32, time_budget=8.0, evaluate=Evaluator(net),
                n_classes=10,
                notify=notify)  # fmt: skip
    bar.on_fit_begin(est)
    policy = FixedKnobs(RunConfig(n_groups=4, lr=0.05, momentum=0.9, batch_size=32), 8.0, None)
    policy.run_seconds = 1.0  # runs of 1 simulated s: the changes fall inside runs
    result = loop.run(policy, TrainState.from_net(net))
    bar.on_fit_end(est)
    return result, changes, out.getvalue()


def test_joins_and_leaves_are_cluster_rows_of_the_decisions(elastic_fit):
    result, _, _ = elastic_fit
    d = result.decisions
    rows = d[d["phase"] == "cluster"]
    assert rows[["action", "workers", "n_workers"]].values.tolist() == [
        ["join", "24 workers", 32],
        ["leave", "28 workers", 4],
    ]
    # on the fit's clock: inside the run it happened in, where that run's rows put the
    # simulator's 3 s and 6 s (the first row at or after the change starts there)
    trace = result.trace
    for row in rows.itertuples():
        run = trace[trace["run"] == row.run]
        assert run["t_start"].min() <= row.time <= run["t_end"].max()
        assert "joined" in row.reason or "left" in row.reason
        assert row.time == pytest.approx(run.loc[run["n_workers"] == row.n_workers, "t_start"].min())


def test_the_history_notes_and_the_callbacks_hear_each_change(elastic_fit):
    result, changes, _ = elastic_fit
    assert [(c["action"], c["n_workers"]) for c in changes] == [("join", 32), ("leave", 4)]
    events = [h.get("event", "") for h in result.history]
    assert sum("join: 24 workers joined: 32 workers" in e for e in events) == 1
    assert sum("leave: 28 workers left" in e for e in events) == 1


def test_the_progress_bar_shows_each_change_and_the_workers_now(elastic_fit):
    result, _, drawn = elastic_fit
    times = result.decisions.loc[result.decisions["phase"] == "cluster", "time"]
    what = ("24 workers joined; 32", "28 workers left; 4")
    joined, left = (f"t={t:.1f}: worker {w}" for t, w in zip(times, what, strict=True))
    assert f"{joined} workers\n" in drawn and f"{left} workers\n" in drawn
    assert "workers=32, joined 24 workers" in drawn and "workers=4, left 28 workers" in drawn
    assert drawn.rstrip().rsplit("\r", 1)[-1].endswith("workers=4]")  # the bar as it was left


def test_a_run_without_changes_adds_no_cluster_row():
    trace = pd.DataFrame()
    trace.attrs.update(worker_events=[], recoveries=[])
    assert worker_changes(trace) == []
