"""Fits that share one dask client never hand the scheduler a key it already holds under another
task: dask warns 'Detected different `run_spec`' for that, and it can deadlock."""

from __future__ import annotations

import gc
import logging

from dasknn.data import load
from dasknn.engine.dask import local_client
from dasknn.estimator import DistributedCNN


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_fits_sharing_a_client_submit_no_key_twice_with_another_task():
    """The first fit's data may still be held when the second starts (its release waits for the
    garbage collector, held off here so that the overlap is certain, not a matter of timing)."""
    X, y = load("digits", size=28, batch_size=64)
    common = {"engine": "dask", "time_budget": None, "max_epochs": 0.2, "n_groups": 1, "eval_size": 200}
    common.update(learning_rate=0.01, momentum=0.9)
    records, scheduler_log = _Records(), logging.getLogger("distributed.scheduler")
    scheduler_log.addHandler(records)
    gc.disable()
    try:
        with local_client(n_workers=2, threads_per_worker=1):
            fitted = [DistributedCNN(**{**common, **extra}).fit(X, y) for extra in ({}, {"random_state": 1})]
    finally:
        gc.enable()
        scheduler_log.removeHandler(records)
    assert [e.n_iter_ > 0 for e in fitted] == [True, True]
    collisions = [m for m in records.messages if "run_spec" in m]
    assert not collisions, collisions[0]
