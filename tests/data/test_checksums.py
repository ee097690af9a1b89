"""The MD5s datasets/README.md publishes for MNIST and CIFAR-10 are checked when the files load:
a file that is not the official one is warned about by default and refused with verify=True."""

from __future__ import annotations

import hashlib
import re
import warnings

import pytest

from dasknn.data import FormatError, formats, load
from tests.conftest import REPO
from tests.data.files import write_cifar10, write_mnist


def test_the_checksums_checked_are_the_ones_the_readme_documents():
    readme = (REPO / "datasets" / "README.md").read_text()
    documented = set(re.findall(r"`([0-9a-f]{32})`", readme))
    checked = set(formats.OFFICIAL_MD5.values())
    assert len(checked) == 10  # 4 MNIST .gz files, 6 CIFAR-10 python batches
    assert checked <= documented


def test_an_unofficial_mnist_file_is_warned_about_and_refused_with_verify(tmp_path):
    write_mnist(tmp_path)
    with pytest.warns(UserWarning, match=r"train-images-idx3-ubyte\.gz is not the official MNIST file"):
        load("mnist", path=tmp_path)
    with pytest.raises(FormatError, match=r"train-images-idx3-ubyte\.gz: MD5 [0-9a-f]{32}, not the official"):
        load("mnist", path=tmp_path, verify=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        X, _ = load("mnist", path=tmp_path, verify=False)
    assert X.shape == (30, 1, 28, 28)


def test_a_file_with_the_official_checksum_loads_with_verify(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    for stem in formats.MNIST_STEMS["train"]:
        digest = hashlib.md5((tmp_path / f"{stem}.gz").read_bytes()).hexdigest()
        monkeypatch.setitem(formats.OFFICIAL_MD5, f"{stem}.gz", digest)  # as if these were official
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        X, _ = load("mnist", path=tmp_path, verify=True)
    assert X.shape == (30, 1, 28, 28)
    write_mnist(tmp_path, gz=False)  # raw files: the published MD5s are of the .gz
    for stem in formats.MNIST_STEMS["train"]:
        (tmp_path / f"{stem}.gz").unlink()
    with pytest.raises(FormatError, match="published MD5s are of the .gz files"):
        load("mnist", path=tmp_path, verify=True)


def test_cifar10_python_batches_are_checked(tmp_path):
    write_cifar10(tmp_path, "python")
    with pytest.warns(UserWarning, match="data_batch_1 is not the official CIFAR-10 file"):
        load("cifar10", path=tmp_path)
    with pytest.raises(FormatError, match="test_batch: MD5"):
        load("cifar10", path=tmp_path, split="test", verify=True)
