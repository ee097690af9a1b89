"""`dasknn train` failing the way clusters fail, with real processes: a closed port, a TLS scheduler
without credentials, killed workers, a killed scheduler. Each ends with one line on stderr naming
the failure, the documented exit code, and no traceback (`--debug` adds it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dasknn.cli.exits import EXIT_BAD_INPUT, EXIT_CLUSTER_FAILURE
from tests.conftest import REPO
from tests.engine.dask.test_deploy import STARTUP_TIMEOUT, dask_command, read_scheduler_file, stop
from tests.test_bad_input import cli  # the in-process run: exit status and stderr

HANG = 300  # seconds: only catches a hang
WINDOW = 120  # seconds: the killed-scheduler test's reconnection window (--connect-timeout)
TRACEBACK = "Traceback (most recent call last)"
FIXED = ["--dataset", "digits", "--n-groups", "2", "--lr", "0.01", "--momentum", "0.9", "--eval-size", "300"]


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )


def dasknn(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dasknn", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=HANG,
    )


def last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_port_is_a_cluster_failure_named_in_one_line(tmp_path):
    port = closed_port()
    address = f"tcp://127.0.0.1:{port}"
    out = dasknn(
        "train", *FIXED, "--scheduler", address, "--connect-timeout", "2", "--output", str(tmp_path), "-q"
    )
    line = last_line(out.stderr)
    assert out.returncode == EXIT_CLUSTER_FAILURE, out.stderr
    assert line.startswith("dasknn train: cluster failure: cannot reach the scheduler at " + address), line
    assert "within 2s" in line and "dask scheduler" in line
    assert TRACEBACK not in out.stderr
    # --debug adds the traceback (checked in this process: the exit is the same without a second interpreter)
    code, err = cli("train", *FIXED, "--scheduler", address, "--connect-timeout", "1", "-q", "--debug")
    assert code == EXIT_CLUSTER_FAILURE and TRACEBACK in err
    assert last_line(err).startswith("dasknn train: cluster failure: cannot reach the scheduler")


def test_a_tls_scheduler_without_credentials_is_bad_input_before_any_work(tmp_path):
    out = dasknn("train", *FIXED, "--scheduler", f"tls://127.0.0.1:{closed_port()}", "-q")
    line = last_line(out.stderr)
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert "speaks TLS but no TLS credentials are given" in line and "--tls-ca-file" in line, line
    assert TRACEBACK not in out.stderr
    half = dasknn("train", *FIXED, "--tls-ca-file", __file__, "-q")
    assert half.returncode == EXIT_BAD_INPUT
    assert last_line(half.stderr).endswith("TLS needs all three of --tls-ca-file, --tls-cert and --tls-key")


@pytest.fixture
def deployment(tmp_path):
    """`dask scheduler` and two single-threaded `dask worker`s on loopback, each in its own session.

    Yields (scheduler address, {name: process}); every process is stopped at the end."""
    scheduler_file = tmp_path / "s.json"
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, args: list[str]) -> None:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [*dask_command(), *args], cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    try:
        start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                            "--scheduler-file", str(scheduler_file)])  # fmt: skip
        address = read_scheduler_file(scheduler_file, STARTUP_TIMEOUT)["address"]
        for i in range(2):
            start(f"worker{i}", ["worker", address, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                                 "--host", "127.0.0.1", "--death-timeout", "20",
                                 "--local-directory", str(tmp_path / f"worker{i}")])  # fmt: skip
        yield address, procs
    finally:
        stop(list(procs.values()))


def train_until_first_checkpoint(address: str, tmp_path: Path, *extra: str) -> subprocess.Popen:
    """`dasknn train` on the deployment (with `extra` flags), returned once it has written its first
    checkpoint (an epoch done: the kill follows the run's own progress, not a guessed delay)."""
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dasknn", "train", *FIXED, "--scheduler", address, "--time-budget", "600",
         "--target-accuracy", "1.0", "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "out"), "-q",
         *extra],
        cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + HANG
    while not (ckpt.is_dir() and any(ckpt.glob("ckpt-*"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run ended or hung before its first checkpoint:\n{proc.communicate()[1]}")
        time.sleep(0.1)
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, str, float]:
    """(exit code, stderr, seconds to exit) of a run whose cluster was just broken."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"dasknn train hung after the failure:\n{proc.communicate()[1]}")
    return proc.returncode, err, time.monotonic() - t0


# In the default run: the driver's error on a lost worker (test_driver's
# test_losing_a_worker_raises_a_clear_error_within_bounded_time) and the CLI's one-line cluster
# failure (test_a_closed_port_is_a_cluster_failure_named_in_one_line).
@pytest.mark.slow
def test_killed_workers_are_a_cluster_failure_named_in_one_line(deployment, tmp_path):
    address, procs = deployment
    proc = train_until_first_checkpoint(address, tmp_path)
    for name in ("worker0", "worker1"):
        os.killpg(procs[name].pid, signal.SIGKILL)  # the machines are gone: nanny and worker
    code, err, _ = finish(proc)
    line = last_line(err)
    assert code == EXIT_CLUSTER_FAILURE, err
    assert line.startswith("dasknn train: cluster failure: worker tcp://127.0.0.1:"), line
    assert "no worker is left" in line and "--resume" in line
    assert TRACEBACK not in err


# In the default run: the watch that closes a client when its scheduler is lost
# (test_a_call_to_a_lost_scheduler_fails_at_once_not_after_the_reconnection_window, below).
@pytest.mark.slow
def test_a_killed_scheduler_is_a_cluster_failure_naming_it_within_bounded_time(deployment, tmp_path):
    """Named at once, not after the client's reconnection window (`--connect-timeout`, dask's
    distributed.comm.timeouts.connect: 30 s by default), which a dask call would wait out. The
    window is set to 120 s here, so that the bound below (half of it) tells the two apart with
    room for a busy machine: named in 1-11 s on this 2-core one, against 120 s and more."""
    address, procs = deployment
    proc = train_until_first_checkpoint(address, tmp_path, "--connect-timeout", str(WINDOW))
    os.killpg(procs["scheduler"].pid, signal.SIGKILL)
    code, err, seconds = finish(proc)
    line = last_line(err)
    assert code == EXIT_CLUSTER_FAILURE, err
    assert line.startswith(f"dasknn train: cluster failure: lost the scheduler at {address}"), line
    assert "resume" in line
    assert TRACEBACK not in err
    assert seconds < WINDOW / 2, (
        f"{seconds:.0f} s to notice the lost scheduler (reconnection window {WINDOW} s)"
    )


def test_a_call_to_a_lost_scheduler_fails_at_once_not_after_the_reconnection_window(deployment):
    """A call that opens a connection to the scheduler (here its identity) retries for the whole
    reconnection window once the scheduler is gone; a client dasknn connected is closed as soon as it
    loses its scheduler (`closed_on_loss`), which ends such a call. Without that, this call takes
    WINDOW seconds and ends in a connect timeout; with it, the call ends because the watch closed the
    client (what is asserted first), and the time bound, half the window, only tells the two apart."""
    import dask

    from dasknn.cluster import closed_on_loss, connect, scheduler_lost

    address, procs = deployment
    with dask.config.set({"distributed.comm.timeouts.connect": f"{WINDOW}s"}):
        client = connect(address, None)
        try:
            with closed_on_loss(client):
                assert client.status == "running"
                os.killpg(procs["scheduler"].pid, signal.SIGKILL)
                procs["scheduler"].wait(timeout=HANG)
                t0 = time.monotonic()
                with pytest.raises(Exception) as failed:
                    client.sync(client.scheduler.identity)
                seconds = time.monotonic() - t0
                closed_by_the_watch = client.status in ("closing", "closed")
        finally:
            client.close(timeout=10)
    assert closed_by_the_watch and "Timed out trying to connect" not in str(failed.value), failed.value
    assert seconds < WINDOW / 2, f"{seconds:.0f} s for a call to the lost scheduler"
    assert str(scheduler_lost(client, failed.value)).startswith(f"lost the scheduler at {address} ")
