"""`dasknn train` starts its LocalCluster ahead of the fit (cluster.ClusterAhead): a default client
whose workers have imported what the first computation needs, closed when the block ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed import default_client

from dasknn.cluster import WARM_MODULES, ClusterAhead


def _modules(names):
    import sys

    return [name for name in names if name in sys.modules]


def test_the_cluster_started_ahead_is_the_default_client_with_warm_workers_and_closes():
    assert ClusterAhead.wanted(None, "dask", None)
    with ClusterAhead(n_workers=1) as cluster:
        client = cluster.client()
        assert default_client() is client  # the fit's dask_client then takes it
        assert len(client.scheduler_info()["workers"]) == 1
        assert list(client.run(_modules, WARM_MODULES).values()) == [list(WARM_MODULES)]
        assert not ClusterAhead.wanted(None, "dask", None)  # a default client exists: the fit uses it
        cluster.close_behind()
    assert client.status == "closed"
    with pytest.raises(ValueError):
        default_client()


def _origin() -> dict:
    """A worker's parent process and the environment it was started (exec'd) with."""
    import os
    from pathlib import Path

    started = dict(
        entry.split("=", 1) for entry in Path("/proc/self/environ").read_text().split("\0") if "=" in entry
    )
    return {"parent": os.getppid(), "malloc": started.get("MALLOC_MMAP_THRESHOLD_")}


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_the_workers_come_from_a_fork_server_that_ends_with_the_cluster():
    """The workers are forked from one fork server (which imported `WARM_MODULES` once), a process
    started with the workers' environment, so glibc's malloc read their tuned thresholds; it ends
    once the cluster has closed."""
    import os

    from dasknn.engine.dask.environ import MMAP_THRESHOLD, worker_environ

    keys = [*worker_environ(2, 2), "PYTHONHASHSEED"]
    before = {k: os.environ.get(k) for k in keys}
    with ClusterAhead(n_workers=2) as cluster:
        assert {k: os.environ.get(k) for k in keys} == before  # this process's own, again
        origins = list(cluster.client().run(_origin).values())
        server = origins[0]["parent"]
        assert server != os.getpid() and _alive(server)
        assert origins == [{"parent": server, "malloc": str(MMAP_THRESHOLD)}] * 2
        cluster.close_behind()
    assert not _alive(server)


def test_no_cluster_ahead_where_the_fit_would_not_start_a_local_one():
    assert not ClusterAhead.wanted("tcp://127.0.0.1:8786", "dask", None)
    assert not ClusterAhead.wanted(None, "simulated", None)
    assert not ClusterAhead.wanted(None, "dask", True)  # TLS: the fit's own path


def _children() -> set[int]:
    import multiprocessing

    return {child.pid for child in multiprocessing.active_children()}


def test_a_dataset_that_fails_to_load_closes_the_cluster_started_ahead_and_exits_2(tmp_path):
    """The cluster starts while the data loads: a dataset the loader refuses (a folder with no
    class folders) still ends in the one line and exit 2, with the cluster closed and its worker
    processes gone."""
    from tests.test_bad_input import cli

    (tmp_path / "empty").mkdir()
    before = _children()
    code, err = cli(
        "train", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "empty"), "--n-workers", "1",
        "--output", str(tmp_path / "run"), "-vv",
    )  # fmt: skip
    assert code == 2, err
    assert "starting a LocalCluster of 1 workers ahead of the fit" in err  # it started before the load
    last = err.strip().splitlines()[-1]
    assert last.startswith("dasknn train: error: ") and "empty has no class folders" in last
    with pytest.raises(ValueError):
        default_client()  # the cluster's client closed and is no longer the default
    assert _children() <= before  # its nanny's worker process ended
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a whole run on one worker: 15 s at load 20 on 2 cores
def test_dasknn_train_fits_on_the_cluster_it_started_ahead(tmp_path):
    """One LocalCluster in the command's messages: the fit found the one started ahead as its
    default client and started none of its own; the run folder is complete and the cluster closed."""
    from tests.test_bad_input import cli

    before = _children()
    code, err = cli(
        "train", "--dataset", "digits", "--n-workers", "1", "--n-groups", "1", "--lr", "0.01",
        "--momentum", "0.9", "--max-epochs", "0.1", "--eval-size", "100", "--time-budget", "60",
        "--output", str(tmp_path / "run"), "-vv",
    )  # fmt: skip
    assert code in (0, 1), err
    assert err.count("starting a LocalCluster of 1 workers ahead of the fit") == 1
    assert err.count("started a LocalCluster of 1 workers") == 1, err
    assert "ERROR" not in err
    files = {"history.csv", "report.csv", "trace.csv", "accuracy.png", "run.json", "model"}
    assert files <= {path.name for path in (tmp_path / "run").iterdir()}
    with pytest.raises(ValueError):
        default_client()
    assert _children() <= before


HEAVY = ("dask.array", "pandas", "scipy", "sklearn", "matplotlib", "xarray", "zarr", "torch")
"""What `dasknn train` leaves to its fork server and to after its start: the fork server's own
imports (`WARM_MODULES`) run on another core only once it has started."""

UP_TO_THE_FORK_SERVER = """
import json, os, runpy, sys
from multiprocessing import forkserver

def reached():  # the fork server's start: say what the command had loaded, and end here
    print(json.dumps([name for name in {heavy!r} if name in sys.modules]), flush=True)
    os._exit(0)

forkserver.ensure_running = reached
sys.argv = ["dasknn", "train", "--n-groups", "2", "--lr", "0.03", "--momentum", "0.9", "--output", {out!r}]
runpy.run_module("dasknn", run_name="__main__")
"""


def test_dasknn_train_starts_its_fork_server_before_loading_dask_array_pandas_scipy_or_sklearn(tmp_path):
    """`python -m dasknn train` (the main job's options) reaches the fork server's start having
    imported none of `HEAVY`: those imports would hold the fork server back while the second core
    idles. The process ends there (nothing started, nothing written)."""
    import subprocess
    import sys

    code = UP_TO_THE_FORK_SERVER.format(heavy=HEAVY, out=str(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == ["[]"], done.stdout  # reached, with none loaded
    assert not (tmp_path / "run").exists()
