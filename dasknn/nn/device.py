"""`DeviceNet`: one copy of a net on one device, fed and read back with the fewest host↔device copies.

docs/architecture.md "Arrays and devices", Omnivore §III-A (a device is a black box that computes): a
worker keeps one device copy of the conv-phase net per run, whatever its number of threads. One
iteration of a shard then moves, and nothing else: the weights once (one packed buffer, skipped
when the same weights are loaded already), the input images once, each dropout mask once (drawn on
the host from the seeded generator), the activations back once, d(activations) in once and the
gradients back once (one packed buffer). `backend.transfer_counts()` counts exactly these.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dasknn.backend import device_scope, to_device, to_device_packed, to_numpy, to_numpy_packed
from dasknn.nn.net import Net

__all__ = ["DeviceNet"]


class DeviceNet:
    """A private copy of `net` on `device` ('cpu', 'gpu' or 'gpu:N'), safe to share among threads.

    `forward(weights, x, rng)` loads the host weights (once per weights object), runs the forward
    in training mode and returns (host activations, caches); `backward(weights, caches, dacts)`
    returns the host gradients from those caches. Calls hold one lock: two threads' shards take
    turns on the one copy, and a backward reloads its forward's weights only if another forward
    loaded others in between (the caches hold the lowered weights the convolutions need).
    """

    def __init__(self, net: Net, device: str = "cpu") -> None:
        self.device = device
        self._lock = threading.RLock()
        self._loaded: Any = None  # the host weights dict the device params came from
        with device_scope(device) as xp:
            self.xp = xp
            self.net = net.copy().to(xp)

    def load(self, weights: dict[str, np.ndarray]) -> None:
        """Make `weights` (host arrays) the device params: one packed copy, none if loaded already."""
        if weights is self._loaded:
            return
        self.net.set_params(to_device_packed(weights, self.xp, self.net.dtype), copy=False)
        self._loaded = weights

    def forward(self, weights: dict[str, np.ndarray], x, rng: np.random.Generator | None):
        """(host activations, caches) of a training forward of host images `x`."""
        with self._lock, device_scope(self.device):
            self.load(weights)
            acts, caches = self.net.forward(to_device(x, self.xp), train=True, rng=rng)
            return to_numpy(acts), caches

    def backward(self, weights: dict[str, np.ndarray], caches, dacts) -> dict[str, np.ndarray]:
        """Host gradients (views of one buffer) for host d(activations) `dacts`."""
        with self._lock, device_scope(self.device):
            self.load(weights)
            _, grads = self.net.backward(to_device(dacts, self.xp), caches)
            return to_numpy_packed(grads)

    def loss_and_grads(self, weights, x, labels, rng: np.random.Generator | None):
        """(loss, accuracy, host gradients) of the whole net on host images and labels."""
        with self._lock, device_scope(self.device):
            self.load(weights)
            loss, acc, grads = self.net.loss_and_grads(
                to_device(x, self.xp), to_device(np.asarray(labels), self.xp), rng=rng
            )
            return loss, acc, to_numpy_packed(grads)
