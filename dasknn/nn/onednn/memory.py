"""oneDNN memory for dasknn's layers: layouts, the `Blocked` activation, reorders and execution.

A `Layout` is one oneDNN memory descriptor of float32 values (plain NCHW / OIHW, or a blocked
format such as nChw16c that a primitive chose through `format_tag_any`). Layouts are interned: two
equal descriptors are one `Layout` object, so "is it already in the layout this primitive wants"
is an identity test. Activations between two oneDNN layers stay `Blocked` (a float32 buffer plus
its layout); a reorder happens only where a layout changes, and `reorder_counts()` counts them by
kind: "entry" (plain → blocked), "exit" (blocked → plain), "between" (blocked → blocked) and
"weights" (parameters and their gradients). Execution follows the worker's thread setting: each
call runs with as many OpenMP threads as the BLAS pool has (`threads`).
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from typing import Any

import numpy as np

from dasknn.nn.onednn import capi

__all__ = [
    "Blocked",
    "Layout",
    "add",
    "as_buffer",
    "empty",
    "execute",
    "plain",
    "plain_layout",
    "reorder_counts",
    "threads",
]

_ALIGN = 64
_lock = threading.RLock()
_layouts: dict[tuple[int, ...], list[Layout]] = {}
_reorders: dict[tuple[int, int, int], Any] = {}
_counts: Counter = Counter()


class Layout:
    """One interned memory descriptor: its logical dims, its size in values, whether it is plain."""

    def __init__(self, md: capi.Handle, dims: tuple[int, ...], is_plain: bool, owner: Any = None) -> None:
        self.md = md
        self.dims = dims
        self.size = capi.library().dnnl_memory_desc_get_size(md) // 4
        self.is_plain = is_plain
        self._owner = owner  # the primitive descriptor whose query returned md keeps it alive

    def __repr__(self) -> str:
        return f"Layout({self.dims}, {'plain' if self.is_plain else 'blocked'})"


def _intern(md: capi.Handle, dims: tuple[int, ...], is_plain: bool, owner: Any) -> Layout:
    lib = capi.library()
    with _lock:
        for layout in _layouts.setdefault(dims, []):
            if lib.dnnl_memory_desc_equal(layout.md, md):
                return layout
        layout = Layout(md, dims, is_plain, owner)
        _layouts[dims].append(layout)
        return layout


def plain_layout(dims: tuple[int, ...]) -> Layout:
    """The row-major layout of `dims` (NCHW for activations, OIHW / GOIHW for weights)."""
    dims = tuple(int(d) for d in dims)
    with _lock:
        for layout in _layouts.get(dims, []):
            if layout.is_plain:
                return layout
        md = capi.Handle()
        capi.check(
            capi.library().dnnl_memory_desc_create_with_tag(
                ctypes.byref(md), len(dims), capi.dims(dims), capi.F32, capi.TAG_A + len(dims) - 1
            ),
            "memory_desc_create_with_tag",
        )
        return _intern(md, dims, True, None)


def queried_layout(pd: capi.Handle, query: int, dims: tuple[int, ...], owner: Any) -> Layout | None:
    """The layout a primitive descriptor chose for one of its arguments (None if it has none)."""
    md = capi.library().dnnl_primitive_desc_query_md(pd, query, 0)
    if not md:
        return None
    layout = plain_layout(dims)
    if capi.library().dnnl_memory_desc_equal(layout.md, md):
        return layout
    return _intern(capi.Handle(md), tuple(dims), False, owner)


def empty(layout: Layout) -> np.ndarray:
    """A 64-byte aligned float32 buffer for `layout` (oneDNN's kernels prefer aligned rows)."""
    raw = np.empty(layout.size * 4 + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + layout.size * 4].view(np.float32)


class Blocked:
    """An activation (N, C, H, W) held in a oneDNN layout between two oneDNN layers.

    Only oneDNN layers read it; `plain` turns it into an ndarray (one counted "exit" reorder), and
    pickling does the same, so a cache that leaves the process holds ordinary arrays."""

    __slots__ = ("data", "layout")

    def __init__(self, data: np.ndarray, layout: Layout) -> None:
        self.data = data
        self.layout = layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.dims

    @property
    def ndim(self) -> int:
        return len(self.layout.dims)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __reduce__(self):
        return (np.asarray, (plain(self),))


def wrap(data: np.ndarray, layout: Layout):
    """A primitive's output: an ndarray when its layout is plain, else `Blocked`."""
    if layout.is_plain:
        return data.reshape(layout.dims)
    return Blocked(data, layout)


def _reorder(src: Layout, dst: Layout):
    key = (id(src), id(dst), threads())  # created with the thread count it runs with (`kernels.kernel`)
    prim = _reorders.get(key)
    if prim is None:
        lib, eng = capi.library(), capi.engine()
        pd = capi.Handle()
        capi.check(
            lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src.md, eng, dst.md, eng, None),
            "reorder_primitive_desc_create",
        )
        prim = capi.Handle()
        capi.check(lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive_create (reorder)")
        with _lock:
            _reorders[key] = prim = _reorders.get(key, prim)
    return prim


def reorder(data: np.ndarray, src: Layout, dst: Layout, kind: str) -> np.ndarray:
    """`data` in layout `src` copied into a new buffer in layout `dst`, counted as `kind`."""
    out = empty(dst)
    execute(_reorder(src, dst), {capi.ARG_FROM: (src, data), capi.ARG_TO: (dst, out)})
    with _lock:
        _counts[kind] += 1
    return out


def _kind(src: Layout, dst: Layout) -> str:
    if src.is_plain:
        return "entry"
    return "exit" if dst.is_plain else "between"


def as_buffer(x, layout: Layout, weights: bool = False) -> np.ndarray:
    """The values of `x` (ndarray or `Blocked`) as a float32 buffer in `layout`, reordering only if
    `x` is in another layout."""
    if isinstance(x, Blocked):
        if x.layout is layout:
            return x.data
        return reorder(x.data, x.layout, layout, "weights" if weights else _kind(x.layout, layout))
    x = np.ascontiguousarray(x, dtype=np.float32)
    if layout.is_plain:
        return x.reshape(-1)
    src = plain_layout(layout.dims)
    return reorder(x.reshape(-1), src, layout, "weights" if weights else "entry")


def plain(x, weights: bool = False):
    """`x` as an ndarray: a `Blocked` activation reordered to NCHW, anything else unchanged."""
    if not isinstance(x, Blocked):
        return x
    dst = plain_layout(x.layout.dims)
    return reorder(x.data, x.layout, dst, "weights" if weights else "exit").reshape(x.layout.dims)


def reorder_counts() -> dict[str, int]:
    """Reorders run in this process so far, by kind (see the module docstring)."""
    with _lock:
        return {k: _counts[k] for k in ("entry", "exit", "between", "weights")}


class _ThreadSetting:
    """The worker's thread count (the BLAS pool's, which dasknn's `blas_threads` and the dask
    engine's `set_blas_threads` set) applied to OpenMP in the calling thread before each call."""

    def __init__(self) -> None:
        from threadpoolctl import ThreadpoolController

        blas = ThreadpoolController().select(user_api="blas").lib_controllers
        self._blas = blas[0] if blas else None
        gomp = ctypes.CDLL("libgomp.so.1")
        self._get, self._set = gomp.omp_get_max_threads, gomp.omp_set_num_threads
        self._get.restype, self._set.argtypes = ctypes.c_int, [ctypes.c_int]

    def wanted(self) -> int:
        if self._blas is not None:
            return max(1, int(self._blas.get_num_threads()))
        return max(1, self._get())

    def apply(self) -> int:
        n = self.wanted()
        if self._get() != n:
            self._set(n)
        return n


_threads: _ThreadSetting | None = None


def threads() -> int:
    """OpenMP threads oneDNN runs with in this thread (the worker's BLAS thread count)."""
    global _threads
    if _threads is None:
        _threads = _ThreadSetting()
    return _threads.apply()


def execute(prim, args: dict[int, tuple[Layout, np.ndarray]]) -> None:
    """Run one primitive on this thread's stream: {argument id: (layout, buffer)}."""
    lib, eng = capi.library(), capi.engine()
    threads()
    mems, exec_args = [], (capi.ExecArg * len(args))()
    try:
        for i, (arg, (layout, buf)) in enumerate(args.items()):
            mem = capi.Handle()
            capi.check(
                lib.dnnl_memory_create(ctypes.byref(mem), layout.md, eng, capi.Handle(buf.ctypes.data)),
                "memory_create",
            )
            mems.append(mem)
            exec_args[i].arg, exec_args[i].memory = arg, mem
        capi.check(lib.dnnl_primitive_execute(prim, capi.stream(), len(args), exec_args), "primitive_execute")
    finally:
        for mem in mems:
            lib.dnnl_memory_destroy(mem)


def add(a, b):
    """a + b for two gradients of one blob (Caffe's Split): in their layout when both share one."""
    if isinstance(a, Blocked) and isinstance(b, Blocked) and a.layout is b.layout:
        return Blocked(a.data + b.data, a.layout)
    return plain(a) + plain(b)
