"""Where layers get random numbers: from the seeded numpy Generator the caller passes, on every device.

Every random draw of a layer in training (Dropout's mask today) goes through this module. The draw
is made on the host from the caller's `np.random.Generator` and copied to the layer's device, so a
CuPy net draws exactly the masks a numpy net draws from the same generator, and a run is
reproducible from its seed. Who derives the generators (one per iteration and shard in the engines,
docs/architecture.md "Arrays and devices") is the caller's business; a layer never makes its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dasknn.backend import array_module, to_device

__all__ = ["bernoulli", "require_rng"]


def require_rng(rng: np.random.Generator | None, layer: str) -> np.random.Generator:
    """`rng` itself; a ValueError when a layer that draws in training was given none."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            f"layer {layer!r} draws random numbers in training: pass rng=, a seeded "
            f"numpy.random.Generator, to forward (got {type(rng).__name__})"
        )
    return rng


def bernoulli(rng: np.random.Generator | None, shape: tuple[int, ...], p_drop: float, like: Any, layer: str):
    """A boolean keep-mask, True with probability 1 − `p_drop`, on the device of `like`.

    Drawn on the host as `rng.random(shape, float32) >= p_drop` and copied as one byte per unit.
    """
    u = require_rng(rng, layer).random(shape, dtype=np.float32)
    return to_device(u >= np.float32(p_drop), array_module(like))
