"""The random streams of a run, derived from its seed: every engine draws the same numbers.

A run's randomness is its seed and nothing else (docs/architecture.md "Arrays and devices"): each use
has its own stream, and a stream that belongs to one iteration is keyed by that iteration's global
batch, so it does not depend on which group, worker, thread or device computes it, nor on the
order in which groups run. Layers receive the generator (`dasknn.nn.randomness`); they never make one.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CONV_STREAM", "shard_rng"]

CONV_STREAM = 4
"""The stream of the conv-phase forward (its Dropout layers), one generator per (batch, shard)."""


def shard_rng(seed: int, batch: int, shard: int) -> np.random.Generator:
    """The generator of shard `shard`'s conv forward on global batch `batch` of a run seeded `seed`.

    Shard i of k draws its own masks, so the k shards of a group need no shared state and two runs
    with the same seed, batch size and shards draw the same masks on any device (Omnivore §III-A:
    the k workers of a group each compute one shard of the batch)."""
    return np.random.default_rng([int(seed), CONV_STREAM, int(batch), int(shard)])
