"""Array modules per device (numpy or cupy), device descriptions and FLOPS calibration.

The bottom layer of dasknn. Every layer function takes its array module from its inputs with
`array_module(x)`, so one code path serves CPU workers (numpy) and GPU workers (cupy). CuPy is
imported lazily: dasknn imports and works on machines without it.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "array_module",
    "cupy_available",
    "device_info",
    "get_xp",
    "sgemm_gflops",
    "to_numpy",
    "to_device",
]


def _cupy() -> ModuleType | None:
    """The cupy module if it is already imported or importable with a GPU, else None."""
    if "cupy" not in sys.modules:
        try:
            import cupy  # noqa: F401
        except Exception:
            return None
    return sys.modules.get("cupy")


@functools.lru_cache(maxsize=1)
def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def array_module(x: Any) -> ModuleType:
    """numpy or cupy, whichever owns `x` (cupy is never imported for a numpy array)."""
    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(x, cp.ndarray):
        return cp
    return np


def get_xp(device: str = "cpu") -> ModuleType:
    """The array module for a device name: 'cpu' → numpy, 'gpu'/'cuda' → cupy."""
    device = device.lower()
    if device == "cpu":
        return np
    if device in ("gpu", "cuda"):
        if not cupy_available():
            raise RuntimeError(
                "device='gpu' needs CuPy and a CUDA GPU; install with `pip install dasknn[gpu]` "
                "on a machine with an NVIDIA driver"
            )
        return _cupy()
    raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'gpu'")


def to_numpy(x: Any) -> np.ndarray:
    """A numpy array from a numpy or cupy array (copies from the GPU)."""
    if array_module(x) is np:
        return np.asarray(x)
    return x.get()


def to_device(x: Any, xp: ModuleType) -> Any:
    """`x` as an array of module `xp` (no copy when it is already there)."""
    if xp is np:
        return to_numpy(x)
    return xp.asarray(x)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def device_info(device: str = "cpu") -> dict[str, Any]:
    """A description of this process's device: kind, model, cores (CPU) or name and memory (GPU)."""
    if device == "cpu":
        return {
            "kind": "cpu",
            "model": _cpu_model(),
            "cores": _cpu_cores(),
            "machine": platform.machine(),
            "numpy": np.__version__,
        }
    cp = get_xp(device)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    return {
        "kind": "gpu",
        "model": name.decode() if isinstance(name, bytes) else str(name),
        "memory_bytes": int(props["totalGlobalMem"]),
        "multiprocessors": int(props["multiProcessorCount"]),
        "cupy": cp.__version__,
    }


def _sync(xp: ModuleType) -> None:
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


_GFLOPS_CACHE: dict[tuple[str, int], float] = {}


def sgemm_gflops(device: str = "cpu", n: int = 1024, min_time: float = 0.3) -> float:
    """Measured single-precision GEMM speed of this device in GFLOP/s, cached per process.

    The FLOPS calibration of Omnivore §III-A: each device is a black box with a speed, and work is
    shared in proportion to it. Takes the best of repeated n×n×n products (2n³ FLOPs each).
    """
    key = (device, n)
    if key in _GFLOPS_CACHE:
        return _GFLOPS_CACHE[key]
    xp = get_xp(device)
    rng = np.random.default_rng(0)
    a = to_device(rng.standard_normal((n, n), dtype=np.float32), xp)
    b = to_device(rng.standard_normal((n, n), dtype=np.float32), xp)
    out = xp.empty((n, n), dtype=xp.float32)
    xp.matmul(a, b, out=out)  # warm-up: thread pools, cuBLAS handles
    _sync(xp)
    best = float("inf")
    spent = 0.0
    reps = 0
    while spent < min_time or reps < 3:
        t0 = time.perf_counter()
        xp.matmul(a, b, out=out)
        _sync(xp)
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        reps += 1
    gflops = 2.0 * n**3 / best / 1e9
    _GFLOPS_CACHE[key] = gflops
    return gflops
