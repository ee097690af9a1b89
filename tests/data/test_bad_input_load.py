"""Bad input to `dasknn.data.load` and `check_X_y` is refused with an error naming it (issue #8).

Property-based: random dataset names, option names and values, missing paths, and real MNIST/CIFAR-10
files (written by tests/data/files.py) with random byte edits. A corrupt file may only ever raise
`FormatError`; an edit that leaves a valid file must load with consistent shapes.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dasknn.data import DATASETS, FormatError, check_X_y, load

from .files import write_cifar10, write_mnist

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_COMMON = {"batch_size", "raw", "from_store"}
_text = st.text(max_size=6)
_junk = st.one_of(_text, st.none(), st.lists(st.integers(), max_size=2), st.floats())


@pytest.fixture(scope="module")
def sources():
    """A tiny MNIST folder (gzipped IDX) and a CIFAR-10 python tree, written once."""
    root = Path(tempfile.mkdtemp(prefix="dasknn-bad-input-"))
    write_mnist(root / "mnist", n_train=20, n_test=8)
    write_cifar10(root / "cifar10", "python", per_batch=2)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@PROPERTY
@given(name=st.one_of(_text.filter(lambda s: s not in DATASETS), st.integers(), st.none(), st.lists(_text)))
def test_an_unknown_dataset_name_lists_the_valid_ones(name):
    with pytest.raises(ValueError, match="unknown dataset .*; valid: .*'digits'"):
        load(name)


@PROPERTY
@given(batch_size=st.one_of(st.integers(max_value=0), st.booleans(), _junk))
def test_a_bad_batch_size_is_named(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        load("digits", batch_size=batch_size)


@PROPERTY
@given(
    name=st.sampled_from(sorted(DATASETS)),
    option=st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
)
def test_an_unknown_option_is_named_with_the_valid_ones(name, option):
    if option in DATASETS[name].options or option in _COMMON:
        option += "_x"
    with pytest.raises(ValueError, match=rf"unknown option\(s\) \['{option}'\] for dataset '{name}'"):
        load(name, **{option: 1})


def _not_int_in(low, high):
    return st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1), st.booleans(), _junk)


BAD_VALUES = {  # (dataset, option): values it must refuse, naming the option
    ("digits", "size"): _not_int_in(8, 256),
    ("digits", "raw"): st.one_of(st.integers(), _text, st.none()),
    ("digits", "from_store"): st.one_of(st.integers(), _text),
    ("synthetic", "n_samples"): st.one_of(st.integers(max_value=0), st.booleans(), _junk),
    ("synthetic", "n_classes"): st.one_of(st.integers(max_value=0), st.booleans(), _junk),
    ("synthetic", "seed"): st.one_of(st.integers(max_value=-1), st.booleans(), _junk),
    ("synthetic", "noise"): st.one_of(
        st.floats().filter(lambda v: not (0 <= v < math.inf)), st.booleans(), _text, st.none()
    ),
    ("synthetic", "shape"): st.one_of(
        st.integers(),
        _text,
        st.none(),
        st.tuples(st.integers(1, 4), st.integers(1, 4)),
        st.tuples(st.integers(-3, 0), st.integers(1, 4), st.integers(1, 4)),
        st.tuples(st.floats(1, 4), st.integers(1, 4), st.integers(1, 4)),
    ),  # fmt: skip
    ("mnist", "split"): st.one_of(
        _text.filter(lambda s: s not in ("train", "test")), st.integers(), st.none()
    ),
    ("mnist", "path"): st.one_of(st.integers(), st.floats(), st.lists(_text, min_size=1)),
    ("cifar10", "format"): st.one_of(
        _text.filter(lambda s: s not in ("auto", "python", "binary")), st.none()
    ),
    ("cifar10", "split"): st.one_of(_text.filter(lambda s: s not in ("train", "test")), st.lists(_text)),
}
MESSAGES = {"raw": "raw must be", "from_store": "from_store must be", "format": "CIFAR-10 format"}


@PROPERTY
@given(st.sampled_from(sorted(BAD_VALUES)).flatmap(lambda k: st.tuples(st.just(k), BAD_VALUES[k])))
def test_a_bad_option_value_is_named_before_anything_is_read(sources, case):
    (name, option), value = case
    base = {"mnist": {"path": sources / "mnist"}, "cifar10": {"path": sources / "cifar10"}}.get(name, {})
    options = {**base, option: value}
    if option in _COMMON:
        options = {**base, "from_store": False, option: value}
    with pytest.raises(ValueError) as info:
        load(name, **options)
    assert MESSAGES.get(option, option) in str(info.value), str(info.value)


@PROPERTY
@given(
    name=st.sampled_from(["mnist", "cifar10", "imagefolder", "zarr"]),
    missing=st.from_regex(r"[A-Za-z0-9_.-]{1,16}", fullmatch=True),
)
def test_a_path_that_does_not_exist_is_named(sources, name, missing):
    path = sources / "absent" / missing
    with pytest.raises(FileNotFoundError) as info:
        load(name, path=path)
    assert str(path) in str(info.value)


def _mutate(buf: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(buf)
    for op, at, byte in edits:
        at %= len(out) + 1
        if op == 0:
            out[at:at] = bytes([byte])
        elif op == 1:
            del out[at : at + 1]
        else:
            out[at : at + 1] = bytes([byte])
    return bytes(out)


_edits = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=6
)
_header_edits = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 255)), min_size=1, max_size=3
)


@settings(PROPERTY, max_examples=80)
@given(
    kind=st.sampled_from(["mnist-images", "mnist-labels", "mnist-raw", "cifar-python", "cifar-binary"]),
    edits=st.one_of(_edits, _header_edits),
)
def test_a_corrupt_file_raises_only_format_error(kind, edits):
    with tempfile.TemporaryDirectory(prefix="dasknn-corrupt-") as tmp:
        root = Path(tmp)
        if kind.startswith("mnist"):
            write_mnist(root, n_train=6, n_test=2, gz=kind != "mnist-raw")
            stem = "labels-idx1" if kind == "mnist-labels" else "images-idx3"
            victim = next(root.glob(f"train-{stem}-ubyte*"))
            name, shape = "mnist", (1, 28, 28)
        else:
            fmt = kind.split("-")[1]
            write_cifar10(root, fmt, per_batch=2)
            victim = next(root.glob("cifar-10-batches-*/data_batch_3*"))
            name, shape = "cifar10", (3, 32, 32)
        victim.write_bytes(_mutate(victim.read_bytes(), edits))
        try:
            X, y = load(name, path=root)
        except FormatError as err:
            assert victim.name in str(err), str(err)
            return
        assert X.shape[1:] == shape and X.shape[0] == y.shape[0] > 0


# -- check_X_y directly -------------------------------------------------------------------------
@PROPERTY
@given(data=st.data(), n=st.integers(2, 30), as_dask=st.booleans())
def test_check_X_y_counts_the_labels_that_are_not_whole_numbers(data, n, as_dask):
    X = np.zeros((n, 1, 2, 2), np.float32)
    y = np.arange(n, dtype=np.float64) % 3
    positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    y[positions] = data.draw(
        st.lists(
            st.one_of(st.sampled_from([math.nan, -math.inf]), st.floats(-9, 9).filter(lambda v: v % 1)),
            min_size=len(positions), max_size=len(positions),
        )
    )  # fmt: skip
    if as_dask:
        y = da.from_array(y, chunks=data.draw(st.integers(1, n)))
    with pytest.raises(ValueError, match=f"y contains {len(positions)} non-integer labels"):
        check_X_y(X, y)


@PROPERTY
@given(dtype=st.sampled_from(["U2", "S2", "complex64", "datetime64[s]", "O"]), as_dask=st.booleans())
def test_check_X_y_refuses_labels_that_are_not_numbers(dtype, as_dask):
    y = np.zeros(6, dtype)
    if as_dask:
        y = da.from_array(y, chunks=3)
    with pytest.raises(ValueError, match=re.escape(f"y has dtype {y.dtype}; labels must be integer class")):
        check_X_y(np.zeros((6, 1, 2, 2)), y)


@PROPERTY
@given(batch_size=st.one_of(st.integers(max_value=0), st.booleans(), _junk).filter(lambda b: b is not None))
def test_check_X_y_names_a_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        check_X_y(np.zeros((6, 1, 2, 2)), np.zeros(6, int), batch_size=batch_size)
