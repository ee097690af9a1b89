"""`local_client`'s workers, the first ones and those `cluster.scale` adds later, start with the
same BLAS-thread and malloc settings and dask diagnostics (`engine.dask.nanny.TunedNanny`), and
the driver's own environment and dask config are left as they were; as workers join and leave,
every worker's BLAS threads follow cores // workers (`engine.dask.nanny.SharedCores`)."""

from __future__ import annotations

import os
import time

import pytest

from dasknn.engine.dask import local_client
from dasknn.engine.dask.driver import QUIET_DIAGNOSTICS
from dasknn.engine.dask.nanny import SharedCores, TunedNanny, share_cores

KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_")  # fmt: skip


def _settings() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in KEYS}


def _diagnostics(dask_worker) -> dict:
    import dask

    return {
        "profiler": "profile" in dask_worker.periodic_callbacks,
        "tick": dask.config.get("distributed.admin.tick.interval"),
    }


def test_a_nanny_hands_its_worker_the_quiet_diagnostics_and_leaves_the_driver_config_alone():
    import dask

    driver = dask.config.get("distributed.admin.tick.interval")
    nanny = TunedNanny("tcp://127.0.0.1:1", worker_config=QUIET_DIAGNOSTICS)  # made, never started
    assert nanny.config["distributed"]["worker"]["profile"]["enabled"] is False
    assert nanny.config["distributed"]["admin"]["event-loop"] == dask.config.get(
        "distributed.admin.event-loop"
    )
    assert dask.config.get("distributed.admin.tick.interval") == driver
    assert dask.config.get("distributed.worker.profile.enabled") is True


@pytest.mark.slow
def test_a_worker_added_by_scale_gets_the_settings_of_the_first(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the driver's own value: neither the workers' nor lost
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    driver = _settings()
    with local_client(n_workers=2) as client:
        first = client.run(_settings)
        client.cluster.scale(3)
        client.wait_for_workers(3, timeout=60)
        every = client.run(_settings)
        diagnostics = client.run(_diagnostics)
        assert _settings() == driver
    assert set(map(str, diagnostics.values())) == {str({"profiler": False, "tick": "1s"})}
    (added,) = set(every) - set(first)  # three workers answered, one of them new
    (one,) = {tuple(sorted(s.items())) for s in first.values()}
    assert every[added] == dict(one)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert every[added]["OPENBLAS_NUM_THREADS"] == str(max(1, cores // 2))
    assert every[added]["MALLOC_TRIM_THRESHOLD_"] == str(64 * 2**20)


def _threads() -> int:
    from threadpoolctl import threadpool_info

    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def _settled(client, threads: int) -> dict[str, int]:
    """Every worker's BLAS threads, once all have `threads` (the plugin sets them when the scheduler
    adds or removes a worker); bounded, so a plugin that never does fails the test."""
    deadline = time.monotonic() + 30
    while True:
        now = client.run(_threads)
        if set(now.values()) == {threads} or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


@pytest.mark.slow  # a scaled worker's settings: test_a_worker_added_by_scale_gets_the_settings_of_the_first
def test_workers_share_the_cores_as_the_cluster_grows_and_shrinks():
    from distributed import Client, LocalCluster

    cores = 4  # planted: the counts below do not depend on this machine's cores
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        share_cores(client, cores)
        (first,) = client.run(_threads)
        assert _settled(client, 4) == {first: 4}
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        two = _settled(client, 2)
        assert sorted(two.values()) == [2, 2], two
        (added,) = set(two) - {first}
        client.retire_workers([added])
        assert _settled(client, 4) == {first: 4}


def _shared_cores(dask_scheduler) -> int | None:
    plugin = dask_scheduler.plugins.get(SharedCores.name)
    return None if plugin is None else plugin.cores


def test_local_client_shares_the_machines_cores():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with local_client(n_workers=1) as client:
        assert client.run_on_scheduler(_shared_cores) == cores
    with local_client(n_workers=1, processes=False) as client:  # the workers are the driver's threads
        assert client.run_on_scheduler(_shared_cores) is None
