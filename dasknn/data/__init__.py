"""Datasets as dask arrays: loaders, zarr conversion, shuffled batches, Caffe-style transforms, validation.

Every dataset is (X, y): X float32 (n, C, H, W), y int64 (n,), dask arrays chunked along samples
only, each chunk a whole number of batches. This is the layer of dasknn that knows dask arrays;
`nn/` below it sees only the numpy (or cupy) batches computed from them.
"""

from .batching import compute_batch, epoch_indices, iterate_batches, n_batches
from .formats import FormatError
from .registry import DATASETS, DatasetSpec, convert, load, store_path
from .store import data_home
from .transform import Transform
from .validation import check_X, check_X_y

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
