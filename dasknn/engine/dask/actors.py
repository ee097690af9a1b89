"""How the Dask engine places its stateful pieces: pinned tasks and actors on a named worker.

The servers (`engine.servers`), the groups' `ShardServer`s and SMA's `AverageModel` are plain
classes; the engine makes each a dask actor on the worker the placement gives it, and runs the
tasks that read a worker's data or cache on that worker only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["submit_actor", "submit_pinned"]


def submit_pinned(client, fn, *args: Any, worker: str, **options: Any):
    """`fn(*args)` as a task that runs on `worker` only (its data, cache or state live there) and is
    never shared with an equal call (pure=False); returns its future."""
    return client.submit(fn, *args, workers=[worker], allow_other_workers=False, pure=False, **options)


def submit_actor(client, cls, *args: Any, worker: str):
    """A dask actor of `cls(*args)` pinned to `worker` (never moved elsewhere); returns its future."""
    return submit_pinned(client, cls, *args, worker=worker, actor=True)
