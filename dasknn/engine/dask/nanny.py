"""The nanny of `local_client`'s workers: every worker it starts gets dasknn's BLAS-thread and
malloc settings, the first ones and those a later `cluster.scale(n)` or `cluster.adapt` adds.

distributed reads `distributed.nanny.pre-spawn-environ` while a Nanny is made, lets the driver's
own environment variables win over it, and writes them into the driver's `os.environ` when it
spawns the worker. A worker added once the cluster is up would get whatever the driver has (often
nothing: BLAS then starts a thread per core in every worker, and glibc maps each large temporary
afresh). `TunedNanny` holds the settings itself and puts the driver's environment back once its
spawns are done (they run concurrently: the variables stay set until the last one has started).
"""

from __future__ import annotations

import os

from distributed import Nanny

__all__ = ["TunedNanny"]


class TunedNanny(Nanny):
    """A Nanny whose worker processes start with `pre_spawn_environ` (variable → value) set."""

    spawning = 0  # nannies of this process starting a worker now
    driver_env: dict[str, str | None] = {}  # the driver's values, put back when none is

    def __init__(self, *args, pre_spawn_environ: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tuned = dict(pre_spawn_environ or {})
        self.pre_spawn_env.update(self.tuned)
        self.env.update(self.tuned)

    async def instantiate(self):
        """Start the worker process with the settings; once no nanny of this process is starting
        one, the driver's environment is as it was before the first of them."""
        cls = TunedNanny
        if cls.spawning == 0:
            cls.driver_env = {k: os.environ.get(k) for k in self.tuned}
        cls.spawning += 1
        try:
            return await super().instantiate()
        finally:
            cls.spawning -= 1
            if cls.spawning == 0:
                for k, v in cls.driver_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
