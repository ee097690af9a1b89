"""What the driver sends to the workers (the conv-phase template, the stream source) on a cluster
whose workers come and go (docs/architecture.md, "Elastic clusters").

dask's `client.scatter(value, broadcast=True)` lists the running workers when it starts, sends the
value to one of them, then copies it to every worker of that list. A worker retired in between is
still named by the copy (`Scheduler.replicate` looks each one up: KeyError with its address), and
a retirement under way makes the copy wait for it (both hold the scheduler's replica lock), so a
worker whose retirement a fit's plugin held until the fit moved off it (`elastic.ElasticPlugin`)
is gone by the time the copy names it. `ship` does the scatter and the copy as two steps, each
naming only the workers usable at that moment (running, and not announced as leaving:
`elastic.usable_now`), and does a step again on the workers left when a worker left during it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dasknn.engine.dask import elastic
from dasknn.engine.dask.recovery import is_worker_loss

logger = logging.getLogger(__name__)

ATTEMPTS = 5
"""Tries of one step (the scatter, or the copy to every worker) before its error is the caller's:
each try names the workers usable then, so only a worker leaving during every try exhausts them."""


def ship(client, value: Any, *, broadcast: bool = False, installed: bool = True):
    """`value` scattered to a usable worker and, with `broadcast`, copied to every usable worker;
    its Future. `installed`: whether `ElasticPlugin` is (it names the workers being retired).

    A worker that leaves during either step is named no more: the step is done again on the
    workers usable then. "No valid workers found" when none is left (the caller's loss path reads it).
    """
    future = _attempt(client, installed, lambda workers: client.scatter(value, workers=workers, hash=False))
    if broadcast:
        _attempt(client, installed, lambda workers: client.replicate([future], workers=workers))
    return future


def _attempt(client, installed: bool, step: Callable[[list[str]], Any]) -> Any:
    """`step(workers)` on the usable workers, again on those usable then when one of them left."""
    for _ in range(ATTEMPTS - 1):
        workers = _usable(client, installed)
        try:
            return step(workers)
        except Exception as err:
            if not left_during(err, workers):
                raise
            logger.info("a worker left while data was sent to %s (%r): sent again", workers, err)
    return step(_usable(client, installed))


def _usable(client, installed: bool) -> list[str]:
    workers = sorted(elastic.usable_now(client, installed))
    if not workers:
        raise ValueError("No valid workers found: every worker of the cluster has left or is leaving")
    return workers


def left_during(err: BaseException, workers: list[str]) -> bool:
    """Whether `err`, raised by a scatter or copy to `workers`, says one of them left during it: the
    scheduler's KeyError naming a worker it no longer has, a lost connection to it, or no worker
    left to send to."""
    if isinstance(err, KeyError):
        return bool(err.args) and err.args[0] in workers
    return is_worker_loss(err) or isinstance(err, OSError) or "no valid workers" in str(err).lower()
