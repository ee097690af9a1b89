"""IDX and CIFAR-10 files written in the test load back exactly; broken files raise clear errors."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest

from dasknn.data import FormatError, load
from dasknn.data.formats import parse_cifar10_binary, parse_cifar10_python, read_idx

from .files import (
    cifar_batch,
    cifar_binary_bytes,
    cifar_python_bytes,
    idx_bytes,
    write_cifar10,
    write_idx,
    write_mnist,
)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_every_type_code(tmp_path, dtype, suffix):
    rng = np.random.default_rng(1)
    array = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    path = write_idx(tmp_path / f"a.idx{suffix}", array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


def test_idx_gzip_is_detected_by_content_not_name(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "no-extension"
    path.write_bytes(gzip.compress(idx_bytes(array)))
    np.testing.assert_array_equal(read_idx(path), array)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (
            lambda b: b[:-1],
            "truncated: the header says shape (2, 3, 4) of uint8 = 24 data bytes, the file has 23",
        ),
        (lambda b: b + b"\x00\x00", "2 unexpected bytes after the data"),
        (lambda b: b[:10], "truncated IDX header"),
        (lambda b: b[:3], "too short for an IDX magic number"),
        (lambda b: b"\x01" + b[1:], "not an IDX file"),
        (lambda b: b[:2] + b"\x07" + b[3:], "unknown IDX data type code 0x07"),
        (lambda b: b[:3] + b"\x00" + b[4:], "declares 0 dimensions"),
    ],
)
def test_broken_idx_raises_format_error_naming_the_problem(tmp_path, mangle, message):
    path = tmp_path / "broken-idx3-ubyte"
    path.write_bytes(mangle(idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))))
    with pytest.raises(FormatError, match="broken-idx3-ubyte") as err:
        read_idx(path)
    assert message in str(err.value)


def test_truncated_and_corrupt_gzip_raise_format_error(tmp_path):
    packed = gzip.compress(idx_bytes(np.arange(1000, dtype=np.uint8)))
    (tmp_path / "cut.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(FormatError, match="corrupt or truncated gzip"):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "bad.gz").write_bytes(packed[:10] + bytes(len(packed) - 10))
    with pytest.raises(FormatError, match="corrupt or truncated gzip"):
        read_idx(tmp_path / "bad.gz")


@pytest.mark.parametrize("gz", [True, False])
def test_load_mnist_reads_idx_files_exactly(tmp_path, gz):
    written = write_mnist(tmp_path / "mnist", gz=gz)
    for split, (images, labels) in written.items():
        X, y = load("mnist", path=tmp_path / "mnist", split=split, raw=True, batch_size=4)
        assert X.dtype == np.float32 and y.dtype == np.int64
        np.testing.assert_array_equal(X.compute(), images[:, None].astype(np.float32))
        np.testing.assert_array_equal(y.compute(), labels)
        Xs, _ = load("mnist", path=tmp_path / "mnist", split=split, batch_size=4)
        np.testing.assert_allclose(Xs.compute(), images[:, None] / np.float32(255), rtol=1e-7)


def test_mnist_with_truncated_images_never_returns_an_array(tmp_path):
    write_mnist(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FormatError, match="truncated"):
        load("mnist", path=tmp_path)


def test_mnist_image_and_label_counts_must_agree(tmp_path):
    write_mnist(tmp_path, gz=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(7, dtype=np.uint8))
    with pytest.raises(FormatError, match="has 30 images but train-labels-idx1-ubyte has 7 labels"):
        load("mnist", path=tmp_path)


def test_mnist_labels_file_swapped_for_images_is_rejected(tmp_path):
    write_mnist(tmp_path, gz=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros((30, 28, 28), dtype=np.uint8))
    with pytest.raises(FormatError, match="expected 1-D uint8 labels"):
        load("mnist", path=tmp_path)


def test_mnist_missing_files_and_bad_split_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load("mnist", path=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz"):
        load("mnist", path=tmp_path)
    write_mnist(tmp_path)
    with pytest.raises(ValueError, match=r"unknown split 'val'; valid: \['test', 'train'\]"):
        load("mnist", path=tmp_path, split="val")


@pytest.mark.parametrize("fmt", ["python", "binary"])
def test_load_cifar10_reads_both_formats_exactly(tmp_path, fmt):
    written = write_cifar10(tmp_path, fmt)
    for split, (images, labels) in written.items():
        X, y = load("cifar10", path=tmp_path, split=split, raw=True, batch_size=4, format=fmt)
        assert X.shape == (20 if split == "train" else 4, 3, 32, 32)
        np.testing.assert_array_equal(X.compute(), images.astype(np.float32))
        np.testing.assert_array_equal(y.compute(), labels)
    X, _ = load("cifar10", path=tmp_path / f"cifar-10-batches-{'py' if fmt == 'python' else 'bin'}")
    assert X.shape == (20, 3, 32, 32) and float(X.max().compute()) <= 1.0


def test_cifar10_pixel_layout_is_rgb_planes_of_row_major_images():
    data = np.zeros((1, 3072), dtype=np.uint8)
    data[0, 1024 + 32 * 5 + 7] = 200  # green plane, row 5, column 7
    images, labels = parse_cifar10_binary(cifar_binary_bytes(data, np.array([3])))
    assert images[0, 1, 5, 7] == 200 and images.sum() == 200 and labels.tolist() == [3]
    images, _ = parse_cifar10_python(cifar_python_bytes(data, np.array([3])))
    assert images[0, 1, 5, 7] == 200 and images.sum() == 200


def test_cifar10_binary_size_not_a_whole_number_of_records():
    data, labels = cifar_batch(3, np.random.default_rng(0))
    buf = cifar_binary_bytes(data, labels)
    with pytest.raises(FormatError, match="9218 bytes is not a positive multiple of 3073"):
        parse_cifar10_binary(buf[:-1], source="data_batch_1.bin")
    with pytest.raises(FormatError, match="not a positive multiple"):
        parse_cifar10_binary(b"")


def test_cifar10_labels_outside_0_to_9_are_rejected():
    data, _ = cifar_batch(2, np.random.default_rng(0))
    with pytest.raises(FormatError, match=r"labels outside 0..9 \(min 0, max 12\)"):
        parse_cifar10_binary(cifar_binary_bytes(data, np.array([0, 12])))
    with pytest.raises(FormatError, match="labels outside 0..9"):
        parse_cifar10_python(cifar_python_bytes(data, np.array([0, 12])))


def test_cifar10_python_batch_errors_are_named():
    data, labels = cifar_batch(2, np.random.default_rng(0))
    good = cifar_python_bytes(data, labels)
    with pytest.raises(FormatError, match="truncated or not a pickle"):
        parse_cifar10_python(good[: len(good) // 2])
    with pytest.raises(FormatError, match=r"lacks keys \['labels'\]"):
        parse_cifar10_python(pickle.dumps({b"data": data}, protocol=2))
    with pytest.raises(FormatError, match=r"'data' must be uint8 of shape \(n, 3072\)"):
        parse_cifar10_python(pickle.dumps({"data": data[:, :100], "labels": [1, 2]}, protocol=2))
    with pytest.raises(FormatError, match="'labels' must be 2 integers"):
        parse_cifar10_python(pickle.dumps({"data": data, "labels": [1]}, protocol=2))


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_cifar10_python_refuses_pickles_that_would_run_code():
    with pytest.raises(FormatError, match=r"refusing to unpickle (__builtin__|builtins)\.print"):
        parse_cifar10_python(pickle.dumps({"data": _Exploit()}, protocol=2))


def test_cifar10_missing_batches_and_unextracted_archive(tmp_path):
    written_dir = tmp_path / "full"
    write_cifar10(written_dir, "binary")
    (written_dir / "cifar-10-batches-bin" / "data_batch_3.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['data_batch_3.bin'\]"):
        load("cifar10", path=written_dir)
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="extract cifar-10-python.tar.gz"):
        load("cifar10", path=tmp_path / "archive")
    with pytest.raises(
        ValueError, match=r"unknown CIFAR-10 format 'hdf5'; valid: \['auto', 'binary', 'python'\]"
    ):
        load("cifar10", path=written_dir, format="hdf5")
