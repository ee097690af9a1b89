"""How DistributedCNN's training data reaches the workers: persisted or streamed, and augmented.

Two decisions of a fit, each a small function of the parameters it names and what it measured:
`choose_data` (persist X on the workers, or let each group's lead worker stream its batches from
X's source: `engine.dask.runs.data_mode` on X's size and the workers' memory limits) and
`resolve_augment` (the given augmentation, or a `.prototxt` net's transform_param crop/mirror).
"""

from __future__ import annotations

import math
import os
from typing import Any

from dasknn.data.augment import Augment, as_augment

__all__ = ["choose_data", "merged", "resolve_augment"]


def merged(strategy: Any, physical_map: str) -> bool:
    """Omnivore's merged map: the layout whose groups stream and augment their batches."""
    return strategy == "omnivore" and physical_map == "merged"


def resolve_augment(augment: Any, net: Any, engine: str, strategy: Any, physical_map: str) -> Augment | None:
    """The fit's augmentation: `augment`, or with None a `.prototxt` net's crop_size and mirror;
    a prototxt that crops or mirrors on a layout that cannot is a ValueError (before any cluster)."""
    augment = as_augment(augment)
    spec = os.fspath(net) if isinstance(net, os.PathLike) else net
    if augment is None and isinstance(spec, str) and spec.endswith(".prototxt"):
        from dasknn.nn.prototxt import read_augment

        found = read_augment(spec)
        augment = Augment(**found) if found else None
        if augment is not None and engine == "dask" and not merged(strategy, physical_map):
            raise ValueError(
                f"net {spec!r} crops or mirrors (transform_param), which runs on Omnivore's merged "
                f"map on the Dask engine, not with strategy={strategy!r}, "
                f"physical_map={physical_map!r}"
            )
    return augment


def choose_data(data: str, is_merged: bool, engine: Any, client: Any, X: Any) -> str:
    """'persist' or 'stream' for the fit (`data`; "auto" from X's float32 size against the
    workers' memory limits), set on the Dask engine; the simulator and the layouts other than
    Omnivore's merged map (`is_merged` False) hold X in memory ('persist')."""
    if client is None:
        return "persist"
    from dasknn.engine.dask.runs import data_mode, total_memory_limit

    requested = data if is_merged else "persist"  # the other layouts read persisted chunks
    limit = total_memory_limit(client) if requested == "auto" else None
    engine.data = data_mode(requested, int(X.shape[0]) * int(math.prod(X.shape[1:])) * 4, limit)
    return engine.data
