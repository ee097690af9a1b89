"""A prototxt's transform_param crop_size and mirror become the workers' augmentation."""

from __future__ import annotations

import warnings

import pytest

from dasknn.nn.prototxt import read_augment, read_net


def lenet_with_crop(caffe_models, train: str, test: str) -> str:
    """lenet_train_test.prototxt with `train` / `test` added to its TRAIN / TEST transform_param."""
    head, between, tail = (caffe_models / "lenet_train_test.prototxt").read_text().split("scale: 0.00390625")
    return f"{head}scale: 0.00390625 {train}{between}scale: 0.00390625 {test}{tail}"


def test_crop_and_mirror_are_read_per_phase_without_a_warning(caffe_models):
    text = lenet_with_crop(caffe_models, "crop_size: 24 mirror: true", "crop_size: 24")
    assert read_augment(text) == {"crop_size": 24, "mirror": True}
    assert read_augment(text, phase="TEST") == {"crop_size": 24, "mirror": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # crop_size and mirror are no longer ignored
        net = read_net(text, input_shape=(1, 24, 24))
    assert net.input_shape == (1, 24, 24)


def test_a_net_without_crop_or_mirror_has_no_augmentation(caffe_models):
    assert read_augment(caffe_models / "lenet_train_test.prototxt") is None
    with pytest.raises(ValueError, match="phase must be 'TRAIN' or 'TEST'"):
        read_augment(caffe_models / "lenet_train_test.prototxt", phase="VAL")
