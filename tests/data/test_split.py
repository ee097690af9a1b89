"""The three disjoint parts of a training set: training, the optimizer's selection part, validation."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.data.split import split_parts, stratified_take


def labels(counts):
    return np.repeat(np.arange(len(counts)), counts)


def test_the_parts_are_disjoint_cover_every_sample_and_are_stratified():
    y = np.random.default_rng(3).permutation(labels([500, 300, 200]))
    parts = split_parts(y, 0.2, 100, seed=7)
    train, sel, val = parts.train, parts.selection, parts.validation
    assert len(val) == 200 and len(sel) == 80  # a tenth of the 800 left, below the 100 asked
    assert not set(train) & set(sel) and not set(train) & set(val) and not set(sel) & set(val)
    assert np.array_equal(np.sort(np.concatenate([train, sel, val])), np.arange(len(y)))
    assert np.bincount(y[val]).tolist() == [100, 60, 40]
    assert np.bincount(y[sel]).tolist() == [40, 24, 16]
    for part in (train, sel, val):
        assert np.array_equal(part, np.sort(part))


def test_the_parts_are_seeded():
    y = labels([40, 40, 40])
    a, b, c = split_parts(y, 0.25, 10, 1), split_parts(y, 0.25, 10, 1), split_parts(y, 0.25, 10, 2)
    assert np.array_equal(a.validation, b.validation) and np.array_equal(a.selection, b.selection)
    assert not np.array_equal(a.validation, c.validation)


def test_no_fraction_and_no_selection_trains_on_everything():
    y = labels([5, 5])
    parts = split_parts(y, None, 0, 0)
    assert np.array_equal(parts.train, np.arange(10))
    assert not len(parts.validation) and not len(parts.selection)


def test_stratified_take_gives_exactly_n_with_largest_remainders():
    y = labels([7, 2, 1])
    took = stratified_take(y, np.arange(10), 5, np.random.default_rng(0))
    assert len(took) == 5 and np.bincount(y[took], minlength=3).tolist() == [4, 1, 0]


@pytest.mark.parametrize(
    "fraction, message",
    [(1.5, "in \\(0, 1\\)"), (0.01, "leaves 0 for validation"), (0.999, "0 for training")],
)
def test_a_fraction_that_leaves_a_part_empty_is_refused(fraction, message):
    with pytest.raises(ValueError, match=message):
        split_parts(labels([10, 10]), fraction, 0, 0)


def test_take_rows_selects_inside_each_chunk_without_a_shuffle():
    import dask.array as da

    from dasknn.data.chunks import take_rows

    x = np.arange(3000 * 2).reshape(3000, 2)
    X = da.from_array(x, chunks=(256, 2))
    index = np.sort(np.random.default_rng(1).choice(3000, 400, replace=False))
    taken = take_rows(X, index)
    np.testing.assert_array_equal(taken.compute(), x[index])
    layers = {str(k[0] if isinstance(k, tuple) else k).split("-")[0] for k in dict(taken.dask)}
    assert not any("shuffle" in name for name in layers), layers  # no task reads more than its chunk
    assert take_rows(X, np.array([], dtype=int)).shape == (0, 2)
    with pytest.raises(ValueError, match="strictly increasing"):
        take_rows(X, index[::-1])
