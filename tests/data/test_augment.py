"""Augmentation on tiny arrays: crops, mirrors and shifts put each pixel where they say, and a
batch's draws are a function of (seed, batch) only."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dasknn.data.augment import (
    Augment,
    as_augment,
    augment_rng,
    centre_crop,
    random_crop,
    random_mirror,
    random_shift,
)


def images(n=4, c=2, h=5, w=5, dtype=np.uint8):
    return np.arange(n * c * h * w).reshape(n, c, h, w).astype(dtype)


def test_random_crop_cuts_each_image_at_its_own_drawn_offset():
    x = images()
    out = random_crop(x, 3, np.random.default_rng(1))
    draws = np.random.default_rng(1)
    oy, ox = draws.integers(0, 3, size=4), draws.integers(0, 3, size=4)
    assert out.shape == (4, 2, 3, 3) and out.dtype == np.uint8
    for i in range(4):
        np.testing.assert_array_equal(out[i], x[i, :, oy[i] : oy[i] + 3, ox[i] : ox[i] + 3])
    assert len({(a, b) for a, b in zip(oy, ox, strict=True)}) > 1  # the offsets differ between images


def test_centre_crop_is_caffes_test_offset_on_numpy_and_dask():
    x = images(h=6, w=5)
    out = centre_crop(x, 3)
    np.testing.assert_array_equal(out, x[:, :, 1:4, 1:4])
    lazy = centre_crop(da.from_array(x, chunks=(2, 2, 6, 5)), 3)
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), out)
    with pytest.raises(ValueError, match="crop_size 7 is larger than the 6×5 images"):
        centre_crop(x, 7)


def test_random_mirror_flips_left_right_the_images_drawn():
    x = images(n=8)
    out = random_mirror(x, np.random.default_rng(3))
    flips = np.random.default_rng(3).integers(0, 2, size=8).astype(bool)
    assert 0 < flips.sum() < 8
    for i in range(8):
        np.testing.assert_array_equal(out[i], x[i, :, :, ::-1] if flips[i] else x[i])


def test_random_shift_moves_each_image_and_pads_with_zeros():
    x = np.zeros((1, 1, 5, 5), dtype=np.uint8)
    x[0, 0, 2, 2] = 9  # one bright pixel at the centre
    for seed in range(10):
        out = random_shift(x, 2, np.random.default_rng(seed))
        draws = np.random.default_rng(seed)
        oy, ox = int(draws.integers(0, 5, size=1)[0]), int(draws.integers(0, 5, size=1)[0])
        dy, dx = 2 - oy, 2 - ox  # the image moves by (shift − offset)
        expected = np.zeros_like(x)
        expected[0, 0, 2 + dy, 2 + dx] = 9
        np.testing.assert_array_equal(out, expected)
    edge = np.full((1, 1, 3, 4), 7, dtype=np.uint8)
    moved = random_shift(edge, 1, np.random.default_rng(0))
    assert moved.shape == edge.shape and set(np.unique(moved)) <= {0, 7}


def test_the_same_seed_and_batch_give_the_same_augmented_batch():
    x = images(n=16, h=8, w=8)
    aug = Augment(crop_size=6, mirror=True)
    np.testing.assert_array_equal(aug.train(x, 5, 12), aug.train(x, 5, 12))
    assert not np.array_equal(aug.train(x, 5, 12), aug.train(x, 5, 13))
    assert not np.array_equal(aug.train(x, 5, 12), aug.train(x, 6, 12))
    shift = Augment(shift=2)
    np.testing.assert_array_equal(shift.train(x, 0, 3), shift.train(x.copy(), 0, 3))
    assert np.array_equal(augment_rng(1, 2).integers(0, 100, 5), augment_rng(1, 2).integers(0, 100, 5))


def test_augment_shapes_and_test_view():
    aug = Augment(crop_size=3, mirror=True)
    assert aug.sample_shape((2, 5, 5)) == (2, 3, 3)
    assert Augment(shift=2).sample_shape((1, 28, 28)) == (1, 28, 28)
    x = images()
    np.testing.assert_array_equal(aug.test(x), x[:, :, 1:4, 1:4])
    assert Augment(shift=1).test(x) is x
    with pytest.raises(ValueError, match="crop_size 6 is larger than the 5×5 images of X"):
        Augment(crop_size=6).sample_shape((2, 5, 5))


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("shift", Augment(shift=2)),
        ("crop_mirror:227", Augment(crop_size=227, mirror=True)),
        ({"crop_size": 24}, Augment(crop_size=24)),
        (Augment(mirror=True), Augment(mirror=True)),
    ],
)
def test_as_augment_reads_the_estimators_forms(value, expected):
    assert as_augment(value) == expected


@pytest.mark.parametrize(
    "value, message",
    [
        ("flip", "augment must be None, 'shift'"),
        ("crop_mirror:x", "augment must be None, 'shift'"),
        ({"crop": 3}, "augment: .*unexpected keyword"),
        ({"shift": -1}, "shift must be an integer >= 0"),
        ({"crop_size": 0}, "crop_size must be None or an integer >= 1"),
        ({"mirror": "yes"}, "mirror must be True or False"),
    ],
)
def test_bad_augment_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        as_augment(value)


def test_a_shard_of_a_batch_gets_its_rows_of_the_whole_batchs_augmentation():
    from dasknn.data.augment import Augment

    x = np.arange(10 * 3 * 12 * 12, dtype=np.float32).reshape(10, 3, 12, 12)
    aug = Augment(crop_size=8, mirror=True, shift=1)
    whole = aug.train(x, 5, 17)
    for lo, hi in ((0, 4), (4, 10), (3, 7)):
        np.testing.assert_array_equal(aug.train(x[lo:hi], 5, 17, (lo, hi, 10)), whole[lo:hi])
    with pytest.raises(ValueError, match="do not match"):
        aug.train(x[:4], 5, 17, (0, 5, 10))
