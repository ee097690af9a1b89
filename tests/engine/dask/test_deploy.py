"""A real deployment on loopback: `dask scheduler` and three `dask worker` processes started as a user
types them (one with `--resources FC=1`), DaskEngine driven through `Client(scheduler_file=...)`.

Checks what the README's "Deploying on a cluster" promises: the merged FC server lands on the FC
worker and that worker does no conv work, each compute group runs on one of the other workers, the
loss goes down, and a second client on the same scheduler can run again from where the first ended.
Every process is started in its own session and terminated in the fixture's teardown with bounded
waits; every wait in the test has an explicit timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dask.utils import key_split

from dasknn.data import load
from dasknn.engine.dask import DaskEngine, cluster_workers
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

REPO = Path(__file__).resolve().parents[2]
N_WORKERS = 3
STARTUP_TIMEOUT = 45.0
STOP_TIMEOUT = 10.0
RUN_TIMEOUT = 20.0
ITERATIONS = 48
CFG = RunConfig(n_groups=2, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)


def dask_command() -> list[str]:
    """The `dask` command of this interpreter (beside sys.executable, else on PATH, else `-m dask`)."""
    beside = Path(sys.executable).with_name("dask")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    on_path = shutil.which("dask")
    if on_path is not None:
        return [on_path]
    return [sys.executable, "-m", "dask"]


def read_scheduler_file(path: Path, timeout: float) -> dict:
    """The scheduler file's JSON once the scheduler has written it completely (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
            continue
        if "address" in info:
            return info
    raise TimeoutError(f"the scheduler wrote no {path} within {timeout:.0f} s")


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group we started, then SIGKILL whatever is left after STOP_TIMEOUT."""
    for p in reversed(procs):  # workers first, then the scheduler
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=STOP_TIMEOUT)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """`dask scheduler` on 127.0.0.1 and 3 single-threaded `dask worker`s, the first with FC=1.

    Yields (scheduler_file, logs directory). Workers get OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 and
    the repository on PYTHONPATH, so they import the dasknn under test.
    """
    tmp = tmp_path_factory.mktemp("deploy")
    scheduler_file = tmp / "s.json"
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    dask = dask_command()
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> None:
        with open(tmp / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
            procs.append(
                subprocess.Popen(
                    [*dask, *args],
                    cwd=tmp,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: the nanny and its worker stop together
                )
            )

    try:
        start(
            "scheduler",
            ["scheduler", "--host", "127.0.0.1", "--port", "0"]
            + ["--scheduler-file", str(scheduler_file), "--no-dashboard"],
        )
        read_scheduler_file(scheduler_file, STARTUP_TIMEOUT)
        for i in range(N_WORKERS):
            start(
                f"worker{i}",
                ["worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--nworkers", "1"]
                + ["--no-dashboard", "--host", "127.0.0.1", "--death-timeout", "30"]
                + ["--local-directory", str(tmp / f"worker{i}")]
                + (["--resources", "FC=1"] if i == 0 else []),
            )
        yield scheduler_file, tmp
    finally:
        stop(procs)


def connect(scheduler_file: Path):
    """A Client on the deployment once all its workers are up (bounded wait)."""
    from distributed import Client

    client = Client(scheduler_file=str(scheduler_file), timeout=STARTUP_TIMEOUT)
    try:
        client.wait_for_workers(N_WORKERS, timeout=STARTUP_TIMEOUT)
    except BaseException:
        client.close(timeout=STOP_TIMEOUT)
        raise
    return client


def logs(tmp: Path) -> str:
    """The tail of every process's log, for a failure message."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(tmp.glob("*.log"))
    )


@pytest.mark.slow
def test_deployed_cluster_places_fc_on_the_fc_worker_and_trains_from_two_clients(deployment):
    from distributed import get_task_stream

    scheduler_file, tmp = deployment
    X, y = load("digits", size=28, batch_size=64)
    net = zoo.lenet(seed=0)
    budget = Budget(seconds=60, iterations=ITERATIONS)
    try:
        client = connect(scheduler_file)
    except TimeoutError:
        pytest.fail(f"the deployment did not come up within {STARTUP_TIMEOUT:.0f} s\n{logs(tmp)}")
    try:
        workers = cluster_workers(client)
        assert len(workers) == N_WORKERS and all(w["nthreads"] == 1 for w in workers.values())
        fc_workers = [a for a, w in workers.items() if w.get("resources", {}).get("FC", 0) > 0]
        assert len(fc_workers) == 1, workers
        fc_worker = fc_workers[0]
        conv_workers = sorted(set(workers) - {fc_worker})

        engine = DaskEngine(client, timeout=RUN_TIMEOUT, poll=0.5)
        with get_task_stream(client=client) as stream:
            first = engine.run(net, X, y, CFG, budget)
        placement = engine.placement_

        # the placement the engine chose
        assert placement.fc_worker == fc_worker
        assert sorted(w for g in placement.groups for w in g) == conv_workers
        assert all(len(g) == 1 for g in placement.groups) and placement.conv_server_worker in conv_workers
        # where the scheduler actually ran things, independently of the placement
        ran = {}
        for task in stream.data:
            ran.setdefault(key_split(task["key"]), []).append(task["worker"])
        assert ran["FCServer"] == [fc_worker], ran
        assert ran["ConvModelServer"] == [placement.conv_server_worker], ran
        assert sorted(ran["group_loop"]) == conv_workers, ran
        assert all(fc_worker not in ran.get(name, []) for name in ("group_loop", "conv_forward")), ran
        # the Trace: both groups, all iterations, and the loss went down
        trace = first.trace
        assert len(trace) == ITERATIONS and trace.attrs["engine"] == "dask"
        assert trace.groupby("group").size().to_dict() == {0: ITERATIONS // 2, 1: ITERATIONS // 2}
        assert sorted(trace["version_written"]) == list(range(1, ITERATIONS + 1))
        assert (trace["staleness"] >= 0).all() and trace["staleness"].max() >= 1  # the groups overlapped
        head, tail = trace["loss"].iloc[:8].mean(), trace["loss"].iloc[-8:].mean()
        assert tail < 0.5 * head, (head, tail)
        assert np.isfinite(trace["loss"]).all()
    finally:
        client.close(timeout=STOP_TIMEOUT)

    # a second, independent client on the same scheduler continues the run, as one group of both
    # conv workers: the lead's shard in its loop, the other's on a ShardServer actor there
    second_client = connect(scheduler_file)
    try:
        assert sorted(cluster_workers(second_client)) == sorted(workers)
        engine2 = DaskEngine(second_client, timeout=RUN_TIMEOUT, poll=0.5)
        with get_task_stream(client=second_client) as stream2:
            second = engine2.run(
                net, X, y, CFG.with_(n_groups=1), Budget(seconds=60, iterations=16), start=first.state
            )
    finally:
        second_client.close(timeout=STOP_TIMEOUT)
    assert engine2.placement_.fc_worker == fc_worker
    (group,) = engine2.placement_.groups
    assert sorted(group) == conv_workers
    ran2 = {}
    for task in stream2.data:
        ran2.setdefault(key_split(task["key"]), []).append(task["worker"])
    assert ran2["group_loop"] == [group[0]] and ran2["ShardServer"] == [group[1]], ran2
    assert sorted(second.trace["iteration"]) == list(range(ITERATIONS + 1, ITERATIONS + 17))
    assert second.state.iterations_done == ITERATIONS + 16
    assert second.trace["loss"].mean() < head


def test_dasknn_train_runs_on_the_deployment_with_scheduler(deployment, tmp_path):
    """The README's cluster form of the main job: `dasknn train --scheduler tcp://...` trains on
    the deployed workers (not on a LocalCluster of its own) and writes its report."""
    import pandas as pd

    scheduler_file, tmp = deployment
    address = read_scheduler_file(scheduler_file, STARTUP_TIMEOUT)["address"]
    out_dir = tmp_path / "run"
    before = executed(scheduler_file)
    out = subprocess.run(
        [sys.executable, "-m", "dasknn", "train", "--scheduler", address, "--dataset", "digits"]
        + ["--n-groups", "1", "--lr", "0.01", "--momentum", "0.9", "--target-accuracy", "0.9"]
        + ["--time-budget", "60", "--eval-size", "300", "--output", str(out_dir), "-q"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{logs(tmp)}"
    report = pd.read_csv(out_dir / "report.csv")
    assert bool(report.loc[report["threshold"] == 0.9, "reached"].iloc[0])
    trace = pd.read_csv(out_dir / "trace.csv")
    assert set(trace["group"]) == {0} and len(trace) > 0
    after = executed(scheduler_file)
    # the deployed workers ran the training's tasks (not a LocalCluster of the CLI's own)
    assert sum(after.values()) > sum(before.values()) and sorted(after) == sorted(before), (before, after)


def executed(scheduler_file: Path) -> dict[str, int]:
    """worker → how many tasks it has executed, read from the deployment's workers."""
    client = connect(scheduler_file)
    try:
        return client.run(lambda dask_worker: dask_worker.state.executed_count)
    finally:
        client.close(timeout=STOP_TIMEOUT)
