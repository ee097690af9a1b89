"""Many fits in one process on one client leave nothing behind on the scheduler: its task count
after each fit falls back to what it was after the first few (experiments/bench_many_fits.py
measures the driver's memory over 50 fits)."""

from __future__ import annotations

import gc
import time

import pytest

from dasknn.engine.dask import local_client

FITS, SETTLED_AFTER = 30, 3


def _tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _settled_tasks(client, at_most: int, seconds: float = 30.0) -> int:
    """The scheduler's task count once it is at most `at_most`, else the count after `seconds`
    (a bound for a leak, not a timing: the scheduler lets a fit's keys go shortly after it)."""
    deadline = time.monotonic() + seconds
    count = client.run_on_scheduler(_tasks)
    while count > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
        count = client.run_on_scheduler(_tasks)
    return count


@pytest.mark.slow
def test_thirty_fits_on_one_client_leave_the_schedulers_task_count_flat(digits):
    from dasknn.estimator import DistributedCNN

    X, y = digits
    counts, futures = [], []
    with local_client(n_workers=2) as client:
        for i in range(FITS):
            est = DistributedCNN(net="lenet", time_budget=2.0, eval_size=100, random_state=i).fit(X, y)
            assert est.n_iter_ > 0
            del est
            gc.collect()
            flat = counts[SETTLED_AFTER - 1] if len(counts) >= SETTLED_AFTER else 10**9
            counts.append(_settled_tasks(client, flat))
            futures.append(len(client.futures))
    assert all(c <= counts[SETTLED_AFTER - 1] for c in counts[SETTLED_AFTER:]), counts
    assert max(futures) == 0, futures  # no future of a fit outlives it on the client
