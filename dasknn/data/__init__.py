"""Datasets as dask arrays: loaders, zarr conversion, shuffled batches, Caffe-style transforms, validation.

Every dataset is (X, y): X float32 (n, C, H, W), y int64 (n,), dask arrays chunked along samples
only, each chunk a whole number of batches. This is the layer of dasknn that knows dask arrays;
`nn/` below it sees only the numpy (or cupy) batches computed from them.

The names below are imported on first use (PEP 562): a worker that unpickles one task function of
`dasknn.data.chunks` loads that module, not the loaders, formats and zarr stores beside it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batching import compute_batch, epoch_indices, iterate_batches, n_batches
    from .formats import FormatError
    from .registry import DATASETS, DatasetSpec, convert, load, store_path
    from .store import data_home
    from .transform import Transform
    from .validation import check_X, check_X_y

_WHERE = {
    "compute_batch": "batching",
    "epoch_indices": "batching",
    "iterate_batches": "batching",
    "n_batches": "batching",
    "FormatError": "formats",
    "DATASETS": "registry",
    "DatasetSpec": "registry",
    "convert": "registry",
    "load": "registry",
    "store_path": "registry",
    "data_home": "store",
    "Transform": "transform",
    "check_X": "validation",
    "check_X_y": "validation",
}

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "FormatError",
    "Transform",
    "check_X",
    "check_X_y",
    "compute_batch",
    "convert",
    "data_home",
    "epoch_indices",
    "iterate_batches",
    "load",
    "n_batches",
    "store_path",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:  # a submodule, e.g. `dasknn.data.store` after `import dasknn.data`
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
