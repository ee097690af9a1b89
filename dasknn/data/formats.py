"""Parsers of the file formats that MNIST and CIFAR-10 ship in: IDX, and CIFAR-10's python and binary batches.

Each parser checks the bytes against the format before it trusts them: a truncated, padded or
corrupt file raises `FormatError` naming the file and what is wrong, never returns a garbage array.
Files with a published MD5 (`OFFICIAL_MD5`) are also checked against it (`check_official`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import pickle
import struct
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CIFAR10_BINARY_RECORD",
    "FormatError",
    "IDX_DTYPES",
    "OFFICIAL_MD5",
    "check_official",
    "find_mnist_files",
    "parse_cifar10_binary",
    "parse_cifar10_python",
    "parse_idx",
    "read_bytes",
    "read_cifar10",
    "read_idx",
    "read_mnist",
]


class FormatError(ValueError):
    """A data file whose bytes do not match its format (truncated, corrupt, or another format)."""


IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
"""IDX data-type codes (third byte of the magic number) → numpy dtype, big-endian as the format says."""

_GZIP_MAGIC = b"\x1f\x8b"


OFFICIAL_MD5: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
"""The published MD5 of each official file (datasets/README.md): MNIST's four .gz files as its page
lists them, CIFAR-10's extracted python batches. Raw MNIST files and CIFAR-10's binary batches have
none (only their archives do)."""

_UNPUBLISHED = {
    "MNIST": "the published MD5s are of the .gz files; keep them gzipped to verify",
    "CIFAR-10": "MD5s are published for the python batches only (the binary ones: their archive's)",
}


def check_official(path: Path, buf: bytes, dataset: str, verify: bool | None) -> None:
    """Compare the file's bytes `buf` with its published MD5 (`OFFICIAL_MD5`, by file name).

    `verify`: None warns when they differ (another dataset in the same layout, such as Fashion-MNIST,
    loads the same way); True raises FormatError when they differ or the file has no published MD5;
    False checks nothing.
    """
    if verify is False:
        return
    expected = OFFICIAL_MD5.get(path.name)
    if expected is None:
        if verify:
            raise FormatError(f"{path}: cannot verify: {_UNPUBLISHED[dataset]}")
        return
    got = hashlib.md5(buf).hexdigest()
    if got == expected:
        return
    if verify:
        raise FormatError(
            f"{path}: MD5 {got}, not the official {dataset} file's {expected}: a damaged or different "
            "download (verify=False loads another dataset in this layout)"
        )
    warnings.warn(
        f"{path.name} is not the official {dataset} file: MD5 {got}, published {expected}. Another "
        f"dataset in {dataset}'s layout loads the same way; for a damaged download the checks of its "
        "format may not be enough. verify=True refuses such files, verify=False skips this check",
        UserWarning,
        stacklevel=5,
    )


def _gunzip(buf: bytes, path: Path) -> bytes:
    """`buf` gunzipped when it starts with the gzip magic number (whatever the file's name)."""
    if buf[:2] != _GZIP_MAGIC:
        return buf
    try:
        return gzip.decompress(buf)
    except (OSError, EOFError, zlib.error) as err:
        raise FormatError(f"{path}: corrupt or truncated gzip data ({err})") from err


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a file, gunzipped when it starts with the gzip magic number (whatever its name)."""
    path = Path(path)
    return _gunzip(path.read_bytes(), path)


def parse_idx(buf: bytes, source: str = "<bytes>") -> np.ndarray:
    """The array in an IDX buffer, after checking its magic number, type code, dimensions and size.

    IDX (LeCun's MNIST format): two zero bytes, a type code (0x08 ubyte … 0x0E double), the number
    of dimensions, one big-endian uint32 per dimension, then the data, big-endian, row-major. The
    data must be exactly as long as the dimensions say. Multi-byte values come back in native order.
    """
    if len(buf) < 4:
        raise FormatError(f"{source}: {len(buf)} bytes is too short for an IDX magic number (4 bytes)")
    if buf[:2] != b"\x00\x00":
        raise FormatError(
            f"{source}: not an IDX file: the magic number starts with {buf[:2].hex(' ')} instead of 00 00"
        )
    code, ndim = buf[2], buf[3]
    if code not in IDX_DTYPES:
        valid = ", ".join(f"0x{c:02x}" for c in IDX_DTYPES)
        raise FormatError(f"{source}: unknown IDX data type code 0x{code:02x}; valid codes: {valid}")
    if ndim == 0:
        raise FormatError(f"{source}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise FormatError(
            f"{source}: truncated IDX header: {ndim} dimensions need {header} bytes, file has {len(buf)}"
        )
    dims = struct.unpack(f">{ndim}I", buf[4:header])
    dtype = np.dtype(IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    got = len(buf) - header
    if got != expected:
        what = "truncated" if got < expected else f"{got - expected} unexpected bytes after the data"
        raise FormatError(
            f"{source}: {what}: the header says shape {dims} of {dtype.name} = {expected} data bytes, "
            f"the file has {got}"
        )
    arr = np.frombuffer(buf, dtype=dtype, count=math.prod(dims), offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | Path) -> np.ndarray:
    """The array in an IDX file, raw or gzipped (see `parse_idx`)."""
    return parse_idx(read_bytes(path), source=str(path))


MNIST_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory}: neither {stem} nor {stem}.gz found")


def find_mnist_files(directory: str | Path, split: str) -> tuple[Path, Path]:
    """The images and labels IDX files of an MNIST split in `directory` (raw or .gz)."""
    directory = Path(directory)
    if not isinstance(split, str) or split not in MNIST_STEMS:
        raise ValueError(f"unknown split {split!r}; valid: {sorted(MNIST_STEMS)}")
    if not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise FileNotFoundError(
            f"MNIST directory {directory} {what}; put the IDX files "
            f"({', '.join(s + '[.gz]' for pair in MNIST_STEMS.values() for s in pair)}) there "
            "or pass path=..."
        )
    images, labels = MNIST_STEMS[split]
    return _find(directory, images), _find(directory, labels)


def _read_mnist_file(path: Path, verify: bool | None) -> np.ndarray:
    buf = path.read_bytes()
    check_official(path, buf, "MNIST", verify)
    return parse_idx(_gunzip(buf, path), source=str(path))


def read_mnist(
    directory: str | Path, split: str = "train", verify: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, h, w) uint8 and labels (n,) uint8 of an MNIST-format split, checked to agree.

    Any IDX pair of the MNIST layout works (Fashion-MNIST ships the same file names); `verify` as in
    `check_official` (.gz files against MNIST's published MD5s).
    """
    image_path, label_path = find_mnist_files(directory, split)
    images, labels = _read_mnist_file(image_path, verify), _read_mnist_file(label_path, verify)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise FormatError(
            f"{image_path}: expected 3-D uint8 images (n, height, width); "
            f"got {images.ndim}-D {images.dtype} of shape {images.shape}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise FormatError(
            f"{label_path}: expected 1-D uint8 labels; "
            f"got {labels.ndim}-D {labels.dtype} of shape {labels.shape}"
        )
    if len(images) != len(labels):
        raise FormatError(
            f"{image_path.name} has {len(images)} images but {label_path.name} has {len(labels)} labels"
        )
    return images, labels


CIFAR10_BINARY_RECORD = 1 + 3 * 32 * 32
"""Bytes per image in CIFAR-10's binary batches: one label byte, then 1024 R, 1024 G, 1024 B bytes."""

_CIFAR10_CLASSES = 10


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds only numpy arrays, dicts, lists and strings.

    A pickle can run arbitrary code when loaded; a CIFAR-10 batch needs nothing beyond numpy's array
    reconstruction, so everything else is refused.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise FormatError(
            f"refusing to unpickle {module}.{name}: a CIFAR-10 batch holds only arrays and lists"
        )


def _check_cifar10_labels(labels: np.ndarray, source: str) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= _CIFAR10_CLASSES):
        raise FormatError(
            f"{source}: labels outside 0..9 (min {labels.min()}, max {labels.max()}): not a CIFAR-10 batch"
        )


def parse_cifar10_python(buf: bytes, source: str = "<bytes>") -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) uint8 and labels (n,) int64 of one CIFAR-10 python (pickle) batch.

    The batch is a pickled dict with `data` (n × 3072 uint8, each row 1024 R, 1024 G, 1024 B values
    of a row-major 32×32 image) and `labels` (n ints in 0..9); keys may be bytes (Python 2 pickles)
    or str. Loaded with an unpickler that builds nothing but arrays (see `_ArrayUnpickler`).
    """
    try:
        batch = _ArrayUnpickler(io.BytesIO(buf), encoding="bytes").load()
    except FormatError as err:
        raise FormatError(f"{source}: {err}") from err
    except Exception as err:  # a corrupt pickle can fail in any opcode (even asking for 2**60 bytes)
        raise FormatError(f"{source}: truncated or not a pickle ({type(err).__name__}: {err})") from err
    if not isinstance(batch, dict):
        raise FormatError(f"{source}: expected a pickled dict, got {type(batch).__name__}")
    batch = {k.decode("utf-8", "replace") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = {"data", "labels"} - set(batch)
    if missing:
        raise FormatError(
            f"{source}: CIFAR-10 batch lacks keys {sorted(missing)}; has {sorted(map(str, batch))}"
        )
    try:
        data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    except (ValueError, TypeError) as err:  # ragged lists, objects numpy cannot hold
        raise FormatError(f"{source}: 'data' and 'labels' must be arrays ({err})") from err
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR10_BINARY_RECORD - 1:
        raise FormatError(f"{source}: 'data' must be uint8 of shape (n, 3072); got {data.dtype} {data.shape}")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0] or labels.dtype.kind not in "iu":
        raise FormatError(
            f"{source}: 'labels' must be {data.shape[0]} integers, one per image; "
            f"got {labels.dtype} {labels.shape}"
        )
    _check_cifar10_labels(labels, source)
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def parse_cifar10_binary(buf: bytes, source: str = "<bytes>") -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) uint8 and labels (n,) int64 of one CIFAR-10 binary batch.

    The batch is n records of 3073 bytes: a label byte (0..9), then the 3072 pixel bytes laid out
    as in the python batches. A size that is not a whole number of records is an error.
    """
    if not buf or len(buf) % CIFAR10_BINARY_RECORD:
        raise FormatError(
            f"{source}: size {len(buf)} bytes is not a positive multiple of {CIFAR10_BINARY_RECORD} "
            "(1 label byte + 3072 pixel bytes per image): truncated or not a CIFAR-10 binary batch"
        )
    records = np.frombuffer(buf, dtype=np.uint8).reshape(-1, CIFAR10_BINARY_RECORD)
    labels = records[:, 0].astype(np.int64)
    _check_cifar10_labels(labels, source)
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


CIFAR10_LAYOUTS = {
    "python": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        parse_cifar10_python,
    ),
    "binary": (
        "cifar-10-batches-bin",
        [f"data_batch_{i}.bin" for i in range(1, 6)],
        ["test_batch.bin"],
        parse_cifar10_binary,
    ),
}


def _cifar10_folder(directory: Path, fmt: str) -> Path | None:
    folder, train, _, _ = CIFAR10_LAYOUTS[fmt]
    for candidate in (directory, directory / folder):
        if (candidate / train[0]).is_file():
            return candidate
    return None


def read_cifar10(
    directory: str | Path, split: str = "train", fmt: str = "auto", verify: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) uint8 and labels (n,) int64 of a CIFAR-10 split, in file order.

    `directory` holds `cifar-10-batches-py/` or `cifar-10-batches-bin/` (as the official archives
    extract), or is one of those folders. `fmt="auto"` takes the python batches when both exist.
    The train split is data_batch_1..5 (50,000 images), the test split test_batch (10,000).
    `verify` as in `check_official` (the python batches against their published MD5s).
    """
    directory = Path(directory)
    if not isinstance(split, str) or split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; valid: ['test', 'train']")
    if not isinstance(fmt, str) or fmt not in ("auto", *CIFAR10_LAYOUTS):
        raise ValueError(f"unknown CIFAR-10 format {fmt!r}; valid: ['auto', 'binary', 'python']")
    formats = ["python", "binary"] if fmt == "auto" else [fmt]
    for name in formats:
        folder = _cifar10_folder(directory, name)
        if folder is not None:
            break
    else:
        archives = sorted(p.name for p in directory.glob("cifar-10-*.tar.gz")) if directory.is_dir() else []
        hint = f"; extract {archives[0]} there first (tar xzf)" if archives else ""
        raise FileNotFoundError(
            f"no CIFAR-10 batches in {directory}: expected cifar-10-batches-py/data_batch_1..5 and "
            f"test_batch, or cifar-10-batches-bin/data_batch_1..5.bin and test_batch.bin{hint}"
        )
    _, train, test, parse = CIFAR10_LAYOUTS[name]
    names = train if split == "train" else test
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: CIFAR-10 {split} split lacks {missing}")
    parts = []
    for n in names:
        buf = (folder / n).read_bytes()
        check_official(folder / n, buf, "CIFAR-10", verify)
        parts.append(parse(buf, source=str(folder / n)))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
