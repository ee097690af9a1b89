"""A thin ctypes binding to oneDNN's C API (v3.2, the `onednn-cpu-gomp` wheel): the calls dasknn uses.

Written from oneDNN's own headers (include/oneapi/dnnl/dnnl.h, dnnl_types.h, dnnl_common_types.h
at tag v3.2); the enum values below are theirs. Every call that returns a status goes through
`check`, so a failure is one `OneDNNError` naming the call. `library()` loads libdnnl once per
process and raises `OneDNNUnavailable` when it is not installed (dasknn depends on the wheel
on x86-64 Linux; it has no wheels for other platforms).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from importlib import metadata
from pathlib import Path

__all__ = [
    "OneDNNError",
    "OneDNNUnavailable",
    "available",
    "check",
    "dims",
    "engine",
    "library",
    "stream",
    "version",
]

DISTRIBUTION = "onednn-cpu-gomp"
"""The wheel that ships libdnnl.so.3 built for GNU OpenMP (Apache-2.0)."""
WHEEL_VERSION = "2023.2.0"
"""The wheel's version dasknn depends on (oneDNN 3.2)."""
WAIT_POLICY = "PASSIVE"
"""The OpenMP wait policy dasknn sets (`OMP_WAIT_POLICY`, unless the user set one) before libgomp
starts with libdnnl. By default GNU OpenMP's idle threads spin for a while after each parallel
region; between two oneDNN kernels the process runs numpy (OpenBLAS's own threads: the FC layers,
the SGD update) and Python, and a spinning OpenMP thread holds the core they need. On a 2-core
machine, in-process training at 2 threads took 41 ms an iteration for LeNet (batch 64) and 118 ms
for CIFAR-10 quick (batch 100) with the default policy, 20 and 72 ms with PASSIVE, which is about
what one thread of each gives (22 and 68 ms). A Dask worker of one thread has no idle OpenMP
threads, so this changes nothing there."""
LIBRARY_ENV = "DASKNN_ONEDNN_LIBRARY"
"""Environment variable naming the libdnnl.so.3 to load instead of the wheel's (a oneDNN 3.x build
for GNU OpenMP, e.g. a conda environment's); an empty value or a missing file means no oneDNN."""

# dnnl_status_t
SUCCESS = 0
# dnnl_data_type_t
F32 = 3
# dnnl_format_tag_t (plain tags: a, ab, abc, ... ; nchw = oihw = abcd, goihw = abcde)
FORMAT_ANY = 1
TAG_A, TAG_ABCD, TAG_ABCDE = 2, 5, 6
# dnnl_prop_kind_t
FORWARD_TRAINING, FORWARD_INFERENCE = 64, 96
# dnnl_alg_kind_t
CONVOLUTION_DIRECT = 0x1
ELTWISE_RELU = 0x20
ELTWISE_RELU_USE_DST_FOR_BWD = 0x100
POOLING_MAX = 0x1FF
POOLING_AVG_INCLUDE_PADDING = 0x2FF
POOLING_AVG_EXCLUDE_PADDING = 0x3FF
LRN_ACROSS_CHANNELS = 0xAFF
LRN_WITHIN_CHANNEL = 0xBFF
# dnnl_query_t
QUERY_IMPL_INFO_STR = 8
QUERY_SRC_MD, QUERY_DIFF_SRC_MD = 129, 130
QUERY_WEIGHTS_MD, QUERY_DIFF_WEIGHTS_MD = 131, 132
QUERY_DST_MD, QUERY_DIFF_DST_MD = 133, 134
QUERY_WORKSPACE_MD, QUERY_SCRATCHPAD_MD = 135, 136
# dnnl_scratchpad_mode_t
SCRATCHPAD_USER = 1
# dnnl_engine_kind_t, dnnl_stream_flags_t
ENGINE_CPU = 1
STREAM_IN_ORDER = 1
# DNNL_ARG_*
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ARG_WORKSPACE, ARG_SCRATCHPAD = 64, 80
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS, ARG_DIFF_BIAS = 129, 145, 161, 169
ARG_FROM, ARG_TO = ARG_SRC, ARG_DST

MAX_NDIMS = 12
Dims = ctypes.c_int64 * MAX_NDIMS
Handle = ctypes.c_void_p


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: one (argument id, memory) pair of `dnnl_primitive_execute`."""

    _fields_ = [("arg", ctypes.c_int), ("memory", Handle)]


class Version(ctypes.Structure):
    """dnnl_version_t."""

    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
        ("cpu_runtime", ctypes.c_uint),
        ("gpu_runtime", ctypes.c_uint),
    ]


class OneDNNUnavailable(ImportError):
    """oneDNN's library is not installed (or does not load) in this environment."""


class OneDNNError(RuntimeError):
    """A oneDNN call returned a failure status."""


_P, _I, _U, _F, _S = Handle, ctypes.c_int, ctypes.c_uint, ctypes.c_float, ctypes.c_size_t
_PP, _D = ctypes.POINTER(Handle), ctypes.c_int64
_DP = ctypes.POINTER(ctypes.c_int64)
_SIGNATURES: dict[str, tuple[type | None, list]] = {
    "dnnl_engine_create": (_I, [_PP, _I, _S]),
    "dnnl_stream_create": (_I, [_PP, _P, _U]),
    "dnnl_version": (ctypes.POINTER(Version), []),
    "dnnl_status2str": (ctypes.c_char_p, [_I]),
    "dnnl_memory_desc_create_with_tag": (_I, [_PP, _I, _DP, _I, _I]),
    "dnnl_memory_desc_destroy": (_I, [_P]),
    "dnnl_memory_desc_equal": (_I, [_P, _P]),
    "dnnl_memory_desc_get_size": (_S, [_P]),
    "dnnl_memory_create": (_I, [_PP, _P, _P, _P]),
    "dnnl_memory_destroy": (_I, [_P]),
    "dnnl_primitive_attr_create": (_I, [_PP]),
    "dnnl_primitive_attr_set_scratchpad_mode": (_I, [_P, _I]),
    "dnnl_primitive_desc_query": (_I, [_P, _I, _I, _P]),
    "dnnl_primitive_desc_query_md": (_P, [_P, _I, _I]),
    "dnnl_primitive_desc_destroy": (_I, [_P]),
    "dnnl_primitive_create": (_I, [_PP, _P]),
    "dnnl_primitive_execute": (_I, [_P, _P, _I, ctypes.POINTER(ExecArg)]),
    "dnnl_reorder_primitive_desc_create": (_I, [_PP, _P, _P, _P, _P, _P]),
    "dnnl_convolution_forward_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _I, _P, _P, _P, _P, _DP, _DP, _DP, _DP, _P],
    ),
    "dnnl_convolution_backward_data_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _P, _P, _P, _DP, _DP, _DP, _DP, _P, _P],
    ),
    "dnnl_convolution_backward_weights_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _P, _P, _P, _P, _DP, _DP, _DP, _DP, _P, _P],
    ),
    "dnnl_eltwise_forward_primitive_desc_create": (_I, [_PP, _P, _I, _I, _P, _P, _F, _F, _P]),
    "dnnl_eltwise_backward_primitive_desc_create": (_I, [_PP, _P, _I, _P, _P, _P, _F, _F, _P, _P]),
    "dnnl_pooling_forward_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _I, _P, _P, _DP, _DP, _DP, _DP, _DP, _P],
    ),
    "dnnl_pooling_backward_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _P, _P, _DP, _DP, _DP, _DP, _DP, _P, _P],
    ),
    "dnnl_inner_product_forward_primitive_desc_create": (_I, [_PP, _P, _I, _P, _P, _P, _P, _P]),
    "dnnl_inner_product_backward_data_primitive_desc_create": (_I, [_PP, _P, _P, _P, _P, _P, _P]),
    "dnnl_inner_product_backward_weights_primitive_desc_create": (
        _I,
        [_PP, _P, _P, _P, _P, _P, _P, _P],
    ),
    "dnnl_lrn_forward_primitive_desc_create": (_I, [_PP, _P, _I, _I, _P, _P, _D, _F, _F, _F, _P]),
    "dnnl_lrn_backward_primitive_desc_create": (
        _I,
        [_PP, _P, _I, _P, _P, _P, _D, _F, _F, _F, _P, _P],
    ),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_engine: Handle | None = None
_failure: OneDNNUnavailable | None = None
_local = threading.local()


def _library_path() -> str | None:
    """$DASKNN_ONEDNN_LIBRARY if set, else libdnnl.so.3 of the installed wheel (its RECORD lists
    it), else the loader's search path."""
    if LIBRARY_ENV in os.environ:
        return os.environ[LIBRARY_ENV] or None
    try:
        files = metadata.files(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if Path(f).name == "libdnnl.so.3":
            return str(Path(f.locate()).resolve())
    return ctypes.util.find_library("dnnl")


def _loaded() -> bool:
    """Load libdnnl once per process; whether it loaded (a failure is remembered in `_failure`)."""
    global _failure
    if _lib is None and _failure is None:
        with _lock:
            if _lib is None and _failure is None:
                try:
                    _load()
                except OneDNNUnavailable as err:  # its text only: a traceback keeps the caller's frames
                    _failure = OneDNNUnavailable(str(err))
    return _lib is not None


def library() -> ctypes.CDLL:
    """The loaded libdnnl with typed functions (loaded once per process; a failure is remembered,
    so every later call raises a `OneDNNUnavailable` with the same text at once).

    Each call raises a new exception: raising one stored instance again would chain every caller's
    frames onto its traceback, and with them every array a forward pass handed down (a leak of
    gigabytes a minute when a fit runs on lowering because the library is missing)."""
    if not _loaded():
        raise OneDNNUnavailable(str(_failure)) from None
    return _lib


def _load() -> None:
    global _lib, _engine
    path = _library_path()
    if path is None or not os.path.exists(path) and os.sep in path:
        env = os.environ.get(LIBRARY_ENV)
        where = f"{LIBRARY_ENV}={env!r}" if env is not None else f"no {DISTRIBUTION} wheel"
        hint = f"pip install {DISTRIBUTION}=={WHEEL_VERSION}"
        raise OneDNNUnavailable(f"oneDNN is not installed ({where}); {hint}")
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)  # read once, when libgomp starts with libdnnl
    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise OneDNNUnavailable(f"oneDNN at {path} does not load: {err}") from err
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    v = lib.dnnl_version().contents
    if v.major != 3:
        raise OneDNNUnavailable(f"oneDNN {v.major}.{v.minor} at {path}; dasknn's binding needs 3.x")
    engine_ = Handle()
    status = lib.dnnl_engine_create(ctypes.byref(engine_), ENGINE_CPU, 0)
    if status != SUCCESS:
        raise OneDNNUnavailable(f"oneDNN's CPU engine cannot be created (status {status})")
    _engine, _lib = engine_, lib


def available() -> bool:
    """True when oneDNN's library loads here (asked on every layer's forward: it raises nothing)."""
    return _loaded()


def check(status: int, what: str) -> None:
    """Raise one `OneDNNError` line for a failed call."""
    if status != SUCCESS:
        text = library().dnnl_status2str(status)
        raise OneDNNError(f"oneDNN {what} failed: {text.decode() if text else status}")


def engine() -> Handle:
    """The process's CPU engine."""
    library()
    return _engine


def stream() -> Handle:
    """This thread's in-order CPU stream (a stream is used by one thread at a time)."""
    s = getattr(_local, "stream", None)
    if s is None:
        s = Handle()
        check(library().dnnl_stream_create(ctypes.byref(s), engine(), STREAM_IN_ORDER), "stream_create")
        _local.stream = s
    return s


def version() -> str:
    """oneDNN's version as "major.minor.patch"."""
    v = library().dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def dims(values) -> Dims:
    """A dnnl_dims_t holding `values` (the rest zero)."""
    out = Dims()
    for i, v in enumerate(values):
        out[i] = int(v)
    return out
