"""The environment `local_client`'s worker processes start with: cores // workers BLAS/OpenMP
threads, glibc's malloc thresholds, and the hash seed dask's nanny gives its workers. A module of
its own, importing nothing heavy, so that `dasknn train` can start the fork server its workers
come from before it imports dask (`cluster.ClusterAhead`)."""

from __future__ import annotations

__all__ = ["HASH_SEED", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "local_workers", "worker_environ"]

MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 64 * 2**20
"""glibc's mmap and trim thresholds of a tuned worker (`local_client(tune_malloc=True)`)."""

HASH_SEED = "6640"
"""PYTHONHASHSEED of every worker process: the value dask's nanny sets where none is set."""


def local_workers(n_workers: int | None, cores: int) -> int:
    """The worker processes of a LocalCluster on `cores` cores: `n_workers`, default one per core,
    at most 4."""
    return n_workers or max(1, min(cores, 4))


def worker_environ(n_workers: int, cores: int, tune_malloc: bool = True) -> dict[str, str]:
    """Variable → value for each of `n_workers` worker processes sharing `cores` cores."""
    blas = str(max(1, cores // n_workers))
    env = {k: blas for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    if tune_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        env["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD)
    return env
