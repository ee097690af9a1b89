"""Array modules per device (numpy or cupy), device descriptions and FLOPS calibration.

The bottom layer of dasknn. Every layer function takes its array module from its inputs with
`array_module(x)`, so one code path serves CPU workers (numpy) and GPU workers (cupy). CuPy is
imported lazily: dasknn imports and works on machines without it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "array_module",
    "blas_threads",
    "cpu_cores",
    "cupy_available",
    "describe_device",
    "device_info",
    "device_scope",
    "get_xp",
    "sgemm_gflops",
    "to_device",
    "to_device_packed",
    "to_numpy",
    "to_numpy_packed",
    "transfer_counts",
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


def _gpu_index(device: str) -> int | None:
    """The index in 'gpu:N' (None for a bare 'gpu'/'cuda'); a ValueError for any other name."""
    kind, _, index = device.partition(":")
    if kind not in ("gpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(f"unknown device {device!r}; expected 'cpu', 'gpu' or 'gpu:N'")
    return int(index) if index else None


def get_xp(device: str = "cpu") -> ModuleType:
    """The array module for a device name: 'cpu' → numpy, 'gpu', 'gpu:N' or 'cuda' → cupy."""
    device = device.lower()
    if device == "cpu":
        return np
    _gpu_index(device)
    if not cupy_available():
        raise RuntimeError(
            "device='gpu' needs CuPy and a CUDA GPU; install with `pip install dasknn[gpu]` "
            "on a machine with an NVIDIA driver"
        )
    return _cupy()


@contextlib.contextmanager
def device_scope(device: str = "cpu") -> Iterator[ModuleType]:
    """Make `device` the current one in this thread while the block runs; yields its array module.

    'gpu:N' selects CUDA device N modulo the devices this process sees, so several GPU workers of a
    host spread over its GPUs, and a worker whose CUDA_VISIBLE_DEVICES names one GPU uses that one.
    CuPy's current device is per thread, and dask runs tasks and actor calls on several threads:
    each computation enters the scope itself. 'cpu' and a bare 'gpu' change nothing.
    """
    xp = get_xp(device)
    index = None if xp is np else _gpu_index(device.lower())
    if index is None:
        yield xp
        return
    with xp.cuda.Device(index % xp.cuda.runtime.getDeviceCount()):
        yield xp


class _TransferCounter:
    """Host↔device copies and bytes made by `to_device`/`to_numpy` in this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("to_device", "to_device_bytes", "to_host", "to_host_bytes"), 0)

    def add(self, direction: str, nbytes: int) -> None:
        with self._lock:
            self._counts[direction] += 1
            self._counts[f"{direction}_bytes"] += int(nbytes)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


_TRANSFERS = _TransferCounter()


def transfer_counts() -> dict[str, int]:
    """Copies and bytes `to_device`/`to_numpy` made in this process so far: {"to_device",
    "to_device_bytes", "to_host", "to_host_bytes"}.

    On a GPU these are real PCIe copies. With numpy they count what would cross on a GPU worker:
    every `to_device` of a host array and every `to_numpy`, though numpy copies nothing there. The
    difference of two readings around some work is that work's traffic (other threads' included).
    """
    return _TRANSFERS.snapshot()


def _pinned_empty(shape, dtype) -> np.ndarray:
    """A numpy array in page-locked memory from CuPy's pinned pool (DMA copies, no staging)."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy array from a numpy or cupy array; from the GPU, one synchronous copy into pinned memory."""
    xp = array_module(x)
    if xp is np:
        out = np.asarray(x)
    else:
        out = xp.asnumpy(xp.ascontiguousarray(x), out=_pinned_empty(x.shape, x.dtype))
    _TRANSFERS.add("to_host", out.nbytes)
    return out


def to_device(x: Any, xp: ModuleType) -> Any:
    """`x` as an array of module `xp` (no copy when it is already there)."""
    if xp is np:
        return to_numpy(x) if array_module(x) is not np else _counted_host(np.asarray(x))
    if isinstance(x, xp.ndarray):
        return x
    x = np.asarray(x)
    _TRANSFERS.add("to_device", x.nbytes)
    return xp.array(x, copy=True, blocking=True)


def _counted_host(x: np.ndarray) -> np.ndarray:
    """A host array bound for numpy's "device": counted as the copy a GPU worker would make."""
    _TRANSFERS.add("to_device", x.nbytes)
    return x


def to_device_packed(arrays: Mapping[str, Any], xp: ModuleType, dtype=np.float32) -> dict[str, Any]:
    """Host arrays as `dtype` views of ONE buffer of module `xp`: one copy to the device for all.

    The arrays are packed into a fresh host buffer (page-locked when `xp` is cupy), which crosses
    once; the views never alias the caller's arrays.
    """
    sizes = [int(np.prod(np.shape(a))) for a in arrays.values()]
    host = (np.empty if xp is np else _pinned_empty)(sum(sizes), dtype)
    start = 0
    for a, n in zip(arrays.values(), sizes, strict=True):
        host[start : start + n] = np.asarray(a).ravel()
        start += n
    flat = to_device(host, xp)
    return _views(flat, arrays, sizes)


def to_numpy_packed(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Arrays of one module as numpy views of ONE host buffer: packed on their device, one copy back."""
    if not arrays:
        return {}
    xp = array_module(next(iter(arrays.values())))
    sizes = [int(a.size) for a in arrays.values()]
    flat = to_numpy(xp.concatenate([a.ravel() for a in arrays.values()]))
    return _views(flat, arrays, sizes)


def _views(flat, arrays: Mapping[str, Any], sizes: list[int]) -> dict[str, Any]:
    out, start = {}, 0
    for (key, a), n in zip(arrays.items(), sizes, strict=True):
        out[key] = flat[start : start + n].reshape(np.shape(a))
        start += n
    return out


def blas_threads(n: int | None = 1):
    """A context in which BLAS and OpenMP pools use at most n threads (None: this process's cores).

    In-process training (the simulator, benchmarks) runs in one Python process beside whatever else
    the machine runs; OpenBLAS threads that spin for a core another process holds slow a step
    several times over, so these paths choose their thread count instead of inheriting one. Dask
    workers are limited to one BLAS thread each by the cluster setup instead.
    """
    from threadpoolctl import threadpool_limits

    limit = cpu_cores() if n is None else int(n)
    if limit < 1:
        raise ValueError(f"BLAS threads must be >= 1; got {n}")
    return threadpool_limits(limits=limit)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def device_info(device: str = "cpu") -> dict[str, Any]:
    """A description of this process's device: kind, model, cores (CPU) or name and memory (GPU)."""
    if device.lower() == "cpu":
        return {
            "kind": "cpu",
            "model": _cpu_model(),
            "cores": cpu_cores(),
            "machine": platform.machine(),
            "numpy": np.__version__,
        }
    with device_scope(device) as cp:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    return {
        "device_id": int(dev.id),
        "kind": "gpu",
        "model": name.decode() if isinstance(name, bytes) else str(name),
        "memory_bytes": int(props["totalGlobalMem"]),
        "multiprocessors": int(props["multiProcessorCount"]),
        "cupy": cp.__version__,
    }


def describe_device(device: str = "cpu") -> str:
    """`device_info` in words, for a terminal: "AMD EPYC, 2 cores, x86_64, numpy 2.4.6"."""
    info = device_info(device)
    if info["kind"] == "cpu":
        return f"{info['model']}, {info['cores']} cores, {info['machine']}, numpy {info['numpy']}"
    return (
        f"{info['model']} (device {info['device_id']}), {info['memory_bytes'] / 2**30:.1f} GiB, "
        f"{info['multiprocessors']} multiprocessors, CuPy {info['cupy']}"
    )


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
    if key not in _GFLOPS_CACHE:
        with device_scope(device) as xp:
            _GFLOPS_CACHE[key] = _measure_gflops(xp, n, min_time)
    return _GFLOPS_CACHE[key]


def _measure_gflops(xp: ModuleType, n: int, min_time: float) -> float:
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
    return 2.0 * n**3 / best / 1e9
