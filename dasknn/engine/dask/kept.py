"""The servers a Dask-engine run leaves running for the next run (no restart between runs).

A fit is many short runs (the tuner's windows, trials, training runs) that differ in η, µ or g.
η and µ travel with every push and FC step, so a run that ends normally hands its actors
(`segment.Servers`), the workers' cached copies of the net (its run id) and the scattered
conv-phase template to the next run of the same net, which starts on them when the conv model and
FC servers' workers are still in its placement (docs/architecture.md, "The loop and its policies").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dasknn.engine.dask.placement import Placement
from dasknn.engine.dask.runs import forget_on_workers
from dasknn.engine.dask.segment import Servers
from dasknn.engine.trace import RunConfig
from dasknn.nn.net import Net

__all__ = ["Kept", "knobs_of", "release_kept", "take_kept"]


class Kept(NamedTuple):
    """What a run left running, and what a next run must share to start on it: the same net
    object, client and `knobs_of` its config (the servers' weight decay and seed, the batch size
    the net was split for); with them the run id, the conv and FC phases and the template."""

    servers: Servers
    net: Net
    client: Any
    knobs: tuple
    run_id: str
    conv_net: Net
    fc_net: Net
    template: Any


def knobs_of(config: RunConfig) -> tuple:
    """The part of a run's configuration its servers were built for (η, µ and g are not)."""
    return (config.weight_decay, config.seed, config.batch_size)


def take_kept(kept: Kept | None, client, net: Net, config: RunConfig, placement: Placement) -> Kept | None:
    """`kept` when a run of `net` with `config` on `placement` may start on it, else None (and
    `kept` let go)."""
    if kept is None:
        return None
    if (
        kept.client is client
        and kept.net is net
        and kept.knobs == knobs_of(config)
        and kept.servers.conv_worker == placement.conv_server_worker
        and kept.servers.fc_worker == placement.fc_worker
        and all(f.status == "finished" for f in kept.servers.futures())
    ):
        return kept
    release_kept(kept)
    return None


def release_kept(kept: Kept | None) -> None:
    """Let the kept actors and the workers' cached nets go (nothing when the cluster is gone)."""
    if kept is None:
        return
    try:
        kept.client.cancel([f for f in kept.servers.futures() if f is not None])
        forget_on_workers(kept.client, kept.run_id)
    except Exception:  # the cluster is gone: nothing of the run is left there
        pass
