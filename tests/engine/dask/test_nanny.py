"""`local_client`'s workers, the first ones and those `cluster.scale` adds later, start with the
same BLAS-thread and malloc settings (`engine.dask.nanny.TunedNanny`), and the driver's own
environment is left as it was."""

from __future__ import annotations

import os

from dasknn.engine.dask import local_client

KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_")  # fmt: skip


def _settings() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in KEYS}


def test_a_worker_added_by_scale_gets_the_settings_of_the_first(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the driver's own value: neither the workers' nor lost
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    driver = _settings()
    with local_client(n_workers=2) as client:
        first = client.run(_settings)
        client.cluster.scale(3)
        client.wait_for_workers(3, timeout=60)
        every = client.run(_settings)
        assert _settings() == driver
    (added,) = set(every) - set(first)  # three workers answered, one of them new
    (one,) = {tuple(sorted(s.items())) for s in first.values()}
    assert every[added] == dict(one)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert every[added]["OPENBLAS_NUM_THREADS"] == str(max(1, cores // 2))
    assert every[added]["MALLOC_TRIM_THRESHOLD_"] == str(64 * 2**20)
