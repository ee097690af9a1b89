"""Counting the requests a dask server answers: how many messages one iteration of a group costs.

Every request another process makes of a worker (an actor call, a gather of its data, a client's
`run`) or of the scheduler arrives as one message to one of the server's `handlers`.
`count_requests` wraps each handler of a worker or scheduler process, once, so that it counts its
calls by operation, an actor call by its server's method ("actor_execute:push"); `request_counts`
reads the counts. Run both through `client.run` (workers) or `client.run_on_scheduler`. A call
made inside the worker that holds the actor (`tasks._call` finds the server there) sends nothing
and is not counted.
"""

from __future__ import annotations

import functools
from collections import Counter

__all__ = ["TIME_DRIVEN", "count_requests", "request_counts"]

TIME_DRIVEN = ("actor_execute:progress", "actor_execute:drain")
"""Requests sent by the clock, not by iterations: a group's stop check (every
`tasks.STOP_CHECK_SECONDS`) and the driver's poll of the conv model server's log."""

_COUNTS = "_dasknn_requests"


def count_requests(dask_worker=None, dask_scheduler=None) -> int:
    """Start counting the requests this worker (or scheduler) answers; returns its handlers counted.
    Installing twice keeps the first counter (and its counts)."""
    server = dask_worker if dask_worker is not None else dask_scheduler
    if getattr(server, _COUNTS, None) is None:
        counts: Counter = Counter()
        setattr(server, _COUNTS, counts)
        for op, handler in list(server.handlers.items()):
            server.handlers[op] = _counted(op, handler, counts)
    return len(server.handlers)


def request_counts(dask_worker=None, dask_scheduler=None) -> dict[str, int]:
    """The requests counted since `count_requests`, by operation ({} when it was not installed)."""
    server = dask_worker if dask_worker is not None else dask_scheduler
    return dict(getattr(server, _COUNTS, None) or {})


def _counted(op: str, handler, counts: Counter):
    """`handler` counting its calls in `counts` (its signature kept: dask reads it to know whether
    to pass the comm)."""

    @functools.wraps(handler)
    def counted(*args, **kwargs):
        name = f"{op}:{kwargs['function']}" if op == "actor_execute" and "function" in kwargs else op
        counts[name] += 1
        return handler(*args, **kwargs)

    return counted
