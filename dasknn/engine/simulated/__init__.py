"""The simulated engine: the Engine contract in one process, on a modeled clock.

`engine.py` holds `SimulatedEngine`; `events.py` the discrete-event loop of Omnivore's compute
groups and merged FC server; `strategies.py` the other papers' layouts built on it. Nothing in this
package imports `dasknn.engine.dask` or `distributed` (tests/test_imports.py checks it).
"""

from dasknn.engine.simulated.engine import VARIABILITY, ConvFCTiming, SimulatedEngine
from dasknn.engine.simulated.events import conv_backward_shards, conv_forward_shards, shard_slices

__all__ = [
    "VARIABILITY",
    "ConvFCTiming",
    "SimulatedEngine",
    "conv_backward_shards",
    "conv_forward_shards",
    "shard_slices",
]
