"""check_X_y / check_X: one ValueError per kind of bad input, naming it; good input comes back as dask."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dasknn.data import check_X, check_X_y


def _good(n=10, dtype=np.float32):
    rng = np.random.default_rng(0)
    return rng.random((n, 1, 4, 4)).astype(dtype), rng.integers(0, 3, n)


def test_2d_input_is_rejected_with_a_reshape_hint():
    with pytest.raises(
        ValueError, match=r"X must be 4-D .* is 2-D with shape \(5, 784\); reshape .*-1, 1, 28, 28"
    ):
        check_X_y(np.zeros((5, 784)), np.zeros(5, int))
    with pytest.raises(ValueError, match="is 3-D"):
        check_X(np.zeros((5, 28, 28)))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_nan_and_inf_are_counted():
    X, y = _good()
    X[0, 0, 0, :3] = np.nan
    X[5, 0, 1, 1] = np.inf
    with pytest.raises(ValueError, match="X contains 3 NaN and 1 inf values"):
        check_X_y(X, y)
    with pytest.raises(ValueError, match="X contains 3 NaN and 1 inf values"):
        check_X(da.from_array(X, chunks=(3, 1, 4, 4)))
    big = np.full((2, 1, 1, 1), 1e300)
    with pytest.raises(ValueError, match="X contains 0 NaN and 2 inf values \\(as float32\\)"):
        check_X(big)
    assert check_X(X, check_finite=False).shape == X.shape


def test_label_length_mismatch():
    X, y = _good()
    with pytest.raises(ValueError, match="X has 10 samples but y has 9 labels"):
        check_X_y(X, y[:9])


def test_fewer_samples_than_one_batch():
    X, y = _good(n=10)
    with pytest.raises(ValueError, match="X has 10 samples, fewer than one batch of batch_size=64"):
        check_X_y(X, y, batch_size=64)
    Xc, _ = check_X_y(X, y, batch_size=10)
    assert Xc.shape[0] == 10
    assert check_X(X, batch_size=64).shape[0] == 10, "predict takes fewer samples than a batch"


def test_float_labels_must_be_whole_numbers():
    X, _ = _good(n=6)
    with pytest.raises(ValueError, match="y contains 2 non-integer labels"):
        check_X_y(X, np.array([0, 1, 2.5, 1, np.nan, 0]))
    _, y = check_X_y(X, np.array([0.0, 1.0, 2.0, 1.0, 0.0, 2.0]))
    assert y.dtype == np.int64 and y.compute().tolist() == [0, 1, 2, 1, 0, 2]
    with pytest.raises(ValueError, match="y has dtype <U1; labels must be integer class indices"):
        check_X_y(X, np.array(list("abcabc")))
    with pytest.raises(ValueError, match=r"y must be 1-D .* shape \(6, 1\)"):
        check_X_y(X, np.zeros((6, 1), int))


def test_chunking_along_a_non_sample_axis():
    X = da.zeros((8, 3, 4, 4), chunks=(4, 1, 4, 2))
    with pytest.raises(
        ValueError,
        match=r"chunked along samples only.*channels \(axis 1, 3 chunks\), width \(axis 3, 2 chunks\)",
    ):
        check_X(X)


def test_other_bad_inputs_name_their_problem():
    with pytest.raises(ValueError, match="X has dtype complex128"):
        check_X(np.zeros((2, 1, 2, 2), complex))
    with pytest.raises(ValueError, match="X has 0 samples"):
        check_X(np.zeros((0, 1, 2, 2)))
    with pytest.raises(ValueError, match="height axis is empty"):
        check_X(np.zeros((2, 1, 0, 2)))
    X = da.zeros((8, 1, 2, 2), chunks=4)
    X = X[X[:, 0, 0, 0] == 0]
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        check_X(X)


def test_values_are_checked_in_one_compute_of_reductions():
    computes = []
    X = da.random.default_rng(0).random((2000, 3, 8, 8), chunks=(250, 3, 8, 8)).astype(np.float32)
    y = da.arange(2000, chunks=500).astype(np.float64)
    with Callback(start=lambda dsk: computes.append(dsk)):
        Xc, yc = check_X_y(X, y, batch_size=64)
    assert len(computes) == 1
    assert yc.chunks == (Xc.chunks[0],) and Xc.dtype == np.float32 and isinstance(Xc, da.Array)


_dtypes = st.sampled_from(["uint8", "int16", "int32", "int64", "float16", "float32", "float64", "bool"])


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    shape=st.tuples(st.integers(1, 12), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5)),
    dtype=_dtypes,
    as_dask=st.booleans(),
)
def test_valid_inputs_come_back_as_float32_dask_with_same_values(data, shape, dtype, as_dask):
    elements = st.floats(-1e3, 1e3, width=16) if dtype.startswith("float") else None
    X = data.draw(hnp.arrays(dtype, shape, elements=elements))
    y = data.draw(hnp.arrays("int64", shape[0], elements=st.integers(0, 9)))
    batch_size = data.draw(st.integers(1, shape[0]))
    if as_dask:
        chunk = data.draw(st.integers(1, shape[0]))
        X_in, y_in = da.from_array(X, chunks=(chunk, -1, -1, -1)), da.from_array(y, chunks=max(1, chunk - 1))
    else:
        X_in, y_in = X, y
    Xc, yc = check_X_y(X_in, y_in, batch_size=batch_size)
    assert isinstance(Xc, da.Array) and Xc.dtype == np.float32 and yc.dtype == np.int64
    assert all(len(c) == 1 for c in Xc.chunks[1:]) and yc.chunks[0] == Xc.chunks[0]
    np.testing.assert_array_equal(Xc.compute(), X.astype(np.float32))
    np.testing.assert_array_equal(yc.compute(), y)


@settings(max_examples=30, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=6, max_side=4).filter(lambda s: len(s) != 4), dtype=_dtypes
)
def test_any_other_ndim_is_rejected(shape, dtype):
    with pytest.raises(ValueError, match=f"X must be 4-D .* is {len(shape)}-D"):
        check_X(np.zeros(shape, dtype=dtype))
