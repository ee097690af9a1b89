"""DistributedCNN with data streamed from a zarr store and augmented on the workers: it trains to
its accuracy, resumes to the same model, honours a prototxt's crop and mirror, and refuses what
cannot stream before any work."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dasknn.data import load
from dasknn.data.augment import Augment
from dasknn.engine import checkpoint
from dasknn.engine.dask.runs import STREAM_FRACTION, data_mode
from dasknn.estimator import DistributedCNN
from tests.nn.test_prototxt_augment import lenet_with_crop

FIXED = {"n_groups": 1, "learning_rate": 0.01, "momentum": 0.9}


@pytest.fixture(scope="module")
def digits():
    return load("digits", size=28)


@pytest.fixture(scope="module")
def zarr_digits(digits, tmp_path_factory):
    """The digits as uint8 pixels in a zarr store (chunks of 256), read back lazily, and labels."""
    X, y = digits
    path = str(tmp_path_factory.mktemp("fit") / "digits.zarr")
    da.to_zarr((X * 255).round().astype(np.uint8).rechunk((256, 1, 28, 28)), path)
    return da.from_zarr(path), y.compute()


def test_streamed_uint8_digits_train_to_95_percent_with_shifts(zarr_digits):
    X, y = zarr_digits
    scaled = X.astype(np.float32) / 255  # what the workers read: uint8 chunks, scaled after the read
    est = DistributedCNN(
        engine="dask", n_workers=2, time_budget=None, max_epochs=10, data="stream", augment="shift",
        validation_fraction=0.2, target_accuracy=0.95, **FIXED,
    )  # fmt: skip
    est.fit(scaled, y)
    assert est.data_ == "stream" and est.augment_ == Augment(shift=2)
    assert est.stopped_by_.startswith("target_accuracy"), est.stopped_by_  # reached within 10 epochs
    assert est.history_[-1]["val_accuracy"] >= 0.95
    assert est.score(scaled, y) >= 0.93


def test_a_resumed_augmented_fit_sees_the_uninterrupted_fits_batches(digits, tmp_path):
    X, y = digits
    params = dict(
        engine="simulated", n_workers=2, time_budget=None, max_epochs=2, augment="shift", eval_size=200,
        shuffle_window=3, **FIXED,
    )  # fmt: skip
    whole = DistributedCNN(**params, checkpoint_dir=tmp_path / "a").fit(X, y)
    first = checkpoint.list_checkpoints(tmp_path / "a")[0]
    assert checkpoint.load(first).state.iterations_done < whole.n_iter_
    (tmp_path / "b").mkdir()
    first.rename(tmp_path / "b" / first.name)  # as if killed after its first epoch
    resumed = DistributedCNN(**params, checkpoint_dir=tmp_path / "b", resume=True).fit(X, y)
    assert resumed.n_iter_ == whole.n_iter_
    for key, value in whole.state_.params.items():
        np.testing.assert_allclose(resumed.state_.params[key], value, rtol=1e-6, atol=1e-7)
    unaugmented = DistributedCNN(**{**params, "augment": None}).fit(X, y)
    assert any(
        not np.allclose(unaugmented.state_.params[k], v, atol=1e-4) for k, v in whole.state_.params.items()
    )  # the shifts changed what was trained on
    with pytest.raises(ValueError, match="other parameters .*augment"):
        DistributedCNN(**{**params, "augment": None}, checkpoint_dir=tmp_path / "b", resume=True).fit(X, y)


def test_a_prototxt_crop_and_mirror_train_on_crops_and_predict_on_centre_crops(
    digits, tmp_path, caffe_models
):
    X, y = digits
    path = tmp_path / "lenet_crop.prototxt"
    path.write_text(lenet_with_crop(caffe_models, "crop_size: 24 mirror: true", "crop_size: 24"))
    est = DistributedCNN(
        net=str(path), engine="simulated", n_workers=2, time_budget=None, max_epochs=4, eval_size=300,
        **FIXED,
    )  # fmt: skip
    est.fit(X, y)
    assert est.augment_ == Augment(crop_size=24, mirror=True)
    assert est.net_.input_shape == (1, 24, 24)
    assert est.predict(X[:10]).shape == (10,)  # 28×28 in, centre-cropped to 24×24
    assert est.score(X, y) >= 0.8


def test_auto_streams_only_what_does_not_fit():
    gb = 2**30
    assert data_mode("auto", 1 * gb, 4 * gb) == "persist"
    assert data_mode("auto", int(STREAM_FRACTION * 4 * gb) + 1, 4 * gb) == "stream"
    assert data_mode("auto", 100 * gb, None) == "persist"  # workers without a memory limit
    assert data_mode("stream", 1, 4 * gb) == "stream" and data_mode("persist", 100 * gb, gb) == "persist"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"data": "disk"}, "data must be one of"),
        ({"data": "stream", "engine": "simulated"}, "data='stream' needs engine='dask'"),
        ({"data": "stream", "strategy": "sma"}, "data='stream' runs on Omnivore's merged map"),
        ({"augment": "shift", "physical_map": "unmerged"}, "augment='shift' runs on Omnivore's merged map"),
        ({"augment": "rotate"}, "augment must be None, 'shift'"),
        ({"shuffle_window": 0}, "shuffle_window: shuffle window must be an integer >= 1"),
        ({"augment": {"crop_size": 40}}, "crop_size 40 is larger than the 28×28 images of X"),
    ],
)
def test_bad_streaming_options_are_named_before_any_work(params, message, digits):
    X, y = digits
    with pytest.raises(ValueError, match=message):
        DistributedCNN(**{"time_budget": None, "max_epochs": 1, **FIXED, **params}).fit(X[:128], y[:128])
