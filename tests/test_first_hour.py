"""Smaller points a new user meets: the plot leaves the notebook's backend alone, predict on a dask
array sends the net once (not the estimator), and the device is described in words."""

from __future__ import annotations

import contextlib
import io

import cloudpickle
import matplotlib
import numpy as np
import pytest

from dasknn.cli import main
from dasknn.data import load
from dasknn.estimator import DistributedCNN
from dasknn.reports import plot_accuracy

QUICK = {"engine": "simulated", "n_workers": 1, "time_budget": None, "eval_size": 100, "n_groups": 1}
QUICK.update(learning_rate=0.01, momentum=0.9, max_epochs=0.1)


@pytest.fixture(scope="module")
def digits():
    return load("digits", size=28, batch_size=64)


def test_plotting_to_a_file_leaves_the_backend_alone(tmp_path):
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands for a notebook's inline backend: anything but Agg
    try:
        history = [
            {"time": t, "accuracy": a, "iteration": i} for i, (t, a) in enumerate([(0, 0.1), (5, 0.8)])
        ]
        fig = plot_accuracy({"run": history}, tmp_path / "accuracy.png")
        assert matplotlib.get_backend() == "svg"
        assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
        assert fig.axes[0].get_ylabel().startswith("training accuracy")
    finally:
        matplotlib.use(before)


def test_predict_on_a_dask_array_sends_the_net_once(digits):
    X, y = digits
    est = DistributedCNN(net="lenet", **QUICK).fit(X, y)
    net_bytes = sum(p.nbytes for p in est.net_.params.values())

    def task_bytes(lazy) -> int:  # what the scheduler sends, task by task
        return sum(len(cloudpickle.dumps(task)) for task in dict(lazy.__dask_graph__()).values())

    for lazy in (est.predict(X), est.predict_proba(X)):
        assert len(lazy.__dask_graph__()) > 2 * X.numblocks[0]  # several chunks, each its own tasks
        added = task_bytes(lazy) - task_bytes(X)  # beyond X's own graph (digits' source pixels)
        assert added < 1.2 * net_bytes + 100_000, (added, net_bytes)
    np.testing.assert_array_equal(est.predict(X).compute(), est.predict(X.compute()))


def test_info_and_the_train_header_describe_the_device_in_words(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):  # train's header is logged
        assert main(["info"]) == 0
        main(["train", "--dataset", "digits", "--engine", "simulated", "--n-workers", "1", "--n-groups", "1",
              "--lr", "0.01", "--momentum", "0.9", "--max-epochs", "0.1", "--eval-size", "100",
              "--output", str(tmp_path / "run")])  # fmt: skip
    lines = [line.removeprefix("[dasknn] ") for line in out.getvalue().splitlines()]
    lines = [line for line in lines if line.startswith(("cpu:", "device:"))]
    assert len(lines) == 2, out.getvalue()
    for line in lines:
        assert "{" not in line and "'" not in line and "cores" in line, line
