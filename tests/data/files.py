"""Writers of real dataset files for the tests, independent of the parsers under test."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

IDX_CODES = {"uint8": 0x08, "int8": 0x09, "int16": 0x0B, "int32": 0x0C, "float32": 0x0D, "float64": 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of `array`: 00 00, type code, ndim, big-endian dims, big-endian data."""
    array = np.asarray(array)
    header = bytes([0, 0, IDX_CODES[array.dtype.name], array.ndim])
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write `array` as an IDX file, gzipped when the name ends in .gz."""
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_mnist(directory: Path, n_train: int = 30, n_test: int = 12, gz: bool = True, seed: int = 0):
    """A tiny MNIST-layout folder; returns {split: (images uint8 (n, 28, 28), labels uint8 (n,))}."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", labels)
        out[split] = (images, labels)
    return out


def cifar_batch(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n random CIFAR-10 rows (n, 3072) uint8 and labels (n,) in 0..9."""
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), rng.integers(0, 10, size=n)


def cifar_python_bytes(data: np.ndarray, labels: np.ndarray) -> bytes:
    """A CIFAR-10 python batch as the official files hold it: a protocol-2 pickle with bytes keys."""
    batch = {
        b"batch_label": b"testing batch",
        b"labels": [int(v) for v in labels],
        b"data": data,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    return pickle.dumps(batch, protocol=2)


def cifar_binary_bytes(data: np.ndarray, labels: np.ndarray) -> bytes:
    """A CIFAR-10 binary batch: per image one label byte then its 3072 pixel bytes."""
    records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], data], axis=1)
    return records.tobytes()


def write_cifar10(directory: Path, fmt: str, per_batch: int = 4, seed: int = 0):
    """A tiny CIFAR-10 tree in `fmt` ("python" or "binary"); returns {split: (images (n,3,32,32), labels)}."""
    rng = np.random.default_rng(seed)
    folder = directory / ("cifar-10-batches-py" if fmt == "python" else "cifar-10-batches-bin")
    folder.mkdir(parents=True, exist_ok=True)
    encode = cifar_python_bytes if fmt == "python" else cifar_binary_bytes
    suffix = "" if fmt == "python" else ".bin"
    splits = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    out = {}
    for split, names in splits.items():
        parts = []
        for name in names:
            data, labels = cifar_batch(per_batch, rng)
            (folder / (name + suffix)).write_bytes(encode(data, labels))
            parts.append((data, labels))
        images = np.concatenate([p[0] for p in parts]).reshape(-1, 3, 32, 32)
        out[split] = (images, np.concatenate([p[1] for p in parts]))
    return out
