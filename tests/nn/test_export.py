"""ONNX export of a Net (dasknn.nn.export): onnxruntime runs each exported graph and its logits and
probabilities match dasknn's own forward, layer type by layer type, on every shared Caffe file
after a few SGD steps, at input sizes where Caffe's rounded-up pooling matters; each refusal names
its layer and reason.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from dasknn.data.augment import Augment
from dasknn.nn import zoo
from dasknn.nn.export import INPUT, LOGITS, PROBABILITIES, REFUSED, ExportError, net_to_onnx
from dasknn.nn.layers import LRN, Convolution, Dropout, Flatten, InnerProduct, Pooling, ReLU
from dasknn.nn.loss import softmax
from dasknn.nn.merge import Concat, Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale, Softmax
from dasknn.nn.prototxt import read_net
from dasknn.nn.solver import SGD
from dasknn.nn.train import train_step
from tests.conftest import caffe_models_dir

ort = pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4
"""Largest difference allowed between onnxruntime's and dasknn's probabilities, and between their
logits relative to the logits' largest magnitude (at least 1)."""


def run_onnx(model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    logits, proba = session.run([LOGITS, PROBABILITIES], {INPUT: x})
    return logits, proba


def assert_same_as_dasknn(net: Net, x: np.ndarray) -> None:
    """onnxruntime's logits and probabilities of `net`'s graph on `x` are dasknn's, within TOLERANCE."""
    logits, proba = run_onnx(net_to_onnx(net), x)
    expected, _ = net.forward(x, train=False)
    expected = expected.reshape(len(x), -1)
    assert logits.shape == proba.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(logits - expected).max() <= TOLERANCE * scale
    assert np.abs(proba - softmax(expected)).max() <= TOLERANCE


def rounded_up_pools(net: Net) -> list[str]:
    """The pooling layers whose output Caffe's rounding up makes larger than rounding down."""
    return [
        layer.name
        for layer in net.layers
        if isinstance(layer, Pooling)
        and any(
            (n + 2 * p - k) % s
            for n, k, s, p in zip(layer.in_shape[1:], layer.kernel_size, layer.stride, layer.pad, strict=True)
        )
    ]


def with_statistics(net: Net, seed: int = 0) -> Net:
    """`net` with its weights moved off their fillers and BatchNorm statistics of a trained net."""
    rng = np.random.default_rng(seed)
    params = {}
    for key, value in net.get_params().items():
        if key.endswith(".scale_factor"):
            params[key] = np.array([4.0], np.float32)
        elif key.endswith(".variance"):
            params[key] = rng.uniform(1.0, 8.0, value.shape).astype(np.float32)
        elif key.endswith(".mean"):
            params[key] = rng.normal(0.0, 1.0, value.shape).astype(np.float32)
        else:
            params[key] = (value + rng.normal(0.0, 0.1, value.shape)).astype(np.float32)
    net.set_params(params)
    return net


def images(shape, n: int = 3, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.0, (n, *shape)).astype(np.float32)


# -- layer by layer, on small planted nets ------------------------------------------------------


@pytest.mark.parametrize("pool", ["max", "ave"])
@pytest.mark.parametrize(
    ("size", "kernel", "stride", "pad"),
    [(7, 3, 2, 0), (8, 3, 2, 0), (7, 3, 2, 1), (8, 3, 2, 1), (9, 2, 2, 1), (10, 3, 3, 2), (11, 5, 3, 2)],
)
def test_pooling_matches_caffe_rounding_and_divisor(pool, size, kernel, stride, pad):
    layers = [
        Convolution("conv", 3, 1),
        Pooling("pool", pool, kernel, stride=stride, pad=pad),
        InnerProduct("ip", 4),
    ]
    net = with_statistics(Net(layers, (2, size, size)))
    assert_same_as_dasknn(net, images((2, size, size)))


def test_global_average_pooling():
    net = with_statistics(
        Net([Pooling("pool", "ave", global_pooling=True), InnerProduct("ip", 3)], (4, 5, 7))
    )
    assert_same_as_dasknn(net, images((4, 5, 7)))


@pytest.mark.parametrize("region", ["across_channels", "within_channel"])
def test_lrn_in_both_regions(region):
    lrn = LRN("norm", local_size=3, alpha=0.5, beta=0.75, k=2.0, norm_region=region)
    net = with_statistics(Net([Convolution("conv", 6, 3, pad=1), lrn, InnerProduct("ip", 3)], (2, 7, 7)))
    assert_same_as_dasknn(net, 3 * images((2, 7, 7)))


def test_grouped_convolution_leaky_relu_dropout_flatten_and_softmax():
    layers = [
        Convolution("conv1", 6, 3, stride=2, pad=1),
        ReLU("leaky", negative_slope=0.1),
        Convolution("conv2", 4, 3, pad=1, group=2, bias_term=False),
        Dropout("drop", 0.5),
        Flatten("flat"),
        InnerProduct("ip1", 8, bias_term=False),
        Softmax("soft"),
        InnerProduct("ip2", 3),
    ]
    net = with_statistics(Net(layers, (2, 9, 9)))
    assert_same_as_dasknn(net, images((2, 9, 9)))


@pytest.mark.parametrize(
    "eltwise",
    [
        Eltwise("join", "sum"),
        Eltwise("join", "sum", coeff=(0.5, -2.0)),
        Eltwise("join", "prod"),
        Eltwise("join", "max"),
    ],
    ids=["sum", "sum-coeff", "prod", "max"],
)
def test_eltwise_and_concat_branches(eltwise):
    entries = [
        (Convolution("a", 4, 3, pad=1), "data", "a"),
        (Convolution("b", 4, 1), "data", "b"),
        (eltwise, ["a", "b"], "joined"),
        (Concat("cat"), ["joined", "a"], "cat"),
        (InnerProduct("ip", 3), "cat", "ip"),
    ]
    net = with_statistics(Net(entries, (3, 5, 5)))
    assert_same_as_dasknn(net, images((3, 5, 5)))


def test_batch_norm_uses_the_running_statistics_and_scale_its_bias():
    entries = [
        (Convolution("conv", 4, 3, bias_term=False), "data", "conv"),
        (BatchNorm("conv/bn"), "conv", "conv"),
        (Scale("conv/scale"), "conv", "conv"),
        (InnerProduct("ip1", 6), "conv", "ip1"),
        (BatchNorm("ip1/bn", use_global_stats=True), "ip1", "ip1"),
        (Scale("ip1/scale", bias_term=False), "ip1", "ip1"),
        (InnerProduct("ip2", 3), "ip1", "ip2"),
    ]
    net = with_statistics(Net(entries, (2, 6, 6)))
    assert_same_as_dasknn(net, images((2, 6, 6)))
    # a BatchNorm that never saw a batch (scale factor 0) normalises with zero statistics, as dasknn
    net.set_params({"conv/bn.scale_factor": np.zeros(1, np.float32)}, strict=False)
    assert_same_as_dasknn(net, images((2, 6, 6)))


def test_the_graph_takes_rows_of_features_and_names_its_classes():
    net = with_statistics(Net([Convolution("conv", 5, 1), ReLU("relu"), InnerProduct("ip", 3)], (12, 1, 1)))
    model = net_to_onnx(net, rows=(12, 1, 1), classes=np.array(["cat", "dog", "eel"]))
    x = images((12, 1, 1), n=4)
    logits, proba = run_onnx(model, x.reshape(4, 12))
    expected, _ = net.forward(x, train=False)
    assert (
        np.abs(logits - expected).max() <= TOLERANCE and np.abs(proba - softmax(expected)).max() <= TOLERANCE
    )
    assert json.loads({p.key: p.value for p in model.metadata_props}["classes"]) == ["cat", "dog", "eel"]
    with pytest.raises(ValueError, match=r"rows of shape \(13, 1, 1\) do not make"):
        net_to_onnx(net, rows=(13, 1, 1))


def test_blobs_named_as_the_graph_input_and_outputs_are_renamed():
    entries = [
        (Convolution("conv", 3, 3), "input", "logits"),
        (ReLU("relu"), "logits", "logits"),
        (InnerProduct("ip", 3), "logits", "probabilities"),
    ]
    net = with_statistics(Net(entries, (2, 5, 5), input_blob="input"))
    assert_same_as_dasknn(net, images((2, 5, 5)))


@pytest.mark.parametrize("rows", [None, (2, 11, 10)])
def test_the_graph_cuts_images_at_their_centre_as_augment_test(rows):
    layers = [Convolution("conv", 3, 3), Pooling("pool", "max", 3, stride=2), InnerProduct("ip", 3)]
    net = with_statistics(Net(layers, (2, 7, 7)))
    model = net_to_onnx(net, rows=rows, crop=True)
    for h, w in [(11, 10), (7, 7), (12, 9)] if rows is None else [(11, 10)]:
        x = images((2, h, w), n=3)
        logits, proba = run_onnx(model, x if rows is None else x.reshape(3, -1))
        expected, _ = net.forward(Augment(crop_size=7).test(x), train=False)
        assert (
            np.abs(logits - expected).max() <= TOLERANCE
            and np.abs(proba - softmax(expected)).max() <= TOLERANCE
        )


# -- refusals -----------------------------------------------------------------------------------


class _Doubled(ReLU):
    """A layer type of a user's own (a ReLU whose forward doubles): its maths is not ReLU's."""

    def forward(self, x, train=True, rng=None):
        y, cache = super().forward(x, train, rng)
        return 2 * y, cache


def _split_phases() -> tuple[Net, Net]:
    entries = [
        (Convolution("conv1", 4, 3), "data", "conv1"),
        (Convolution("conv2", 4, 3), "conv1", "conv2"),
        (InnerProduct("aux", 3), "conv1", "aux"),
        (InnerProduct("main", 3), "conv2", "main"),
    ]
    return Net(entries, (2, 9, 9), loss_weights={"aux": 0.3}).split_phases()


REFUSED_CASES = {
    "BatchNorm with use_global_stats=False": (
        lambda: Net([BatchNorm("bn", use_global_stats=False), InnerProduct("ip", 3)], (2, 4, 4)),
        "'bn'",
    ),
    "a phase of a split net": (lambda: _split_phases()[1], "'net/fc'"),
    "a layer type of its own": (
        lambda: Net([_Doubled("doubled"), InnerProduct("ip", 3)], (2, 4, 4)),
        "'doubled'",
    ),
}
"""Each entry of REFUSED with a net it refuses and the name its message must give."""


def test_every_refusal_is_planted_here():
    assert set(REFUSED_CASES) == set(REFUSED)


@pytest.mark.parametrize("case", sorted(REFUSED_CASES))
def test_a_refusal_names_the_layer_and_the_reason(case):
    build, name = REFUSED_CASES[case]
    with pytest.raises(ExportError) as refused:
        net_to_onnx(build())
    assert name in str(refused.value) and REFUSED[case] in str(refused.value)


def test_a_conv_phase_is_refused_and_a_chain_s_fc_phase_exported():
    with pytest.raises(ExportError, match="'net/conv'.*conv phase outputs the features"):
        net_to_onnx(_split_phases()[0])
    net = with_statistics(
        Net([Convolution("conv", 3, 3), InnerProduct("ip1", 5), InnerProduct("ip2", 3)], (2, 6, 6))
    )
    fc = net.split_phases()[1]  # features (3, 4, 4) -> class scores
    assert fc.inputs == [("conv", (3, 4, 4))]
    assert_same_as_dasknn(fc, images((3, 4, 4)))


def test_without_onnx_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    net = Net([InnerProduct("ip", 3)], (2, 1, 1))
    with pytest.raises(ImportError, match=r'pip install "dasknn\[export\]"'):
        net_to_onnx(net)


# -- the shared Caffe files and CaffeNet, after SGD steps ----------------------------------------------

CAFFE_FILES = {
    "lenet.prototxt": (1, 29, 29),
    "lenet_train_test.prototxt": (1, 29, 29),
    "cifar10_quick_train_test.prototxt": (3, 33, 33),
    "bvlc_googlenet_train_val.prototxt": (3, 223, 223),
}
"""Every net file of the shared Caffe models, at the input size it is exported at: odd sizes, where
its pooling layers round up (GoogLeNet's smallest input is 223: its last pooling window is 7×7)."""

REFUSED_FILES: dict[str, str] = {}
"""The Caffe files export refuses, with the reason: none."""


def test_every_shared_caffe_net_file_is_exported_here():
    where = caffe_models_dir()
    if where is None:
        pytest.skip("Caffe model files not found")
    files = {p.name for p in where.glob("*.prototxt") if "solver" not in p.name}
    assert files == set(CAFFE_FILES)


@pytest.mark.parametrize("name", sorted(CAFFE_FILES))
def test_a_caffe_file_trained_a_few_steps_round_trips(caffe_models, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transform_param fields dasknn does not apply
        net = read_net(caffe_models / name, input_shape=CAFFE_FILES[name])
    assert rounded_up_pools(net)
    if name in REFUSED_FILES:
        with pytest.raises(ExportError, match=REFUSED_FILES[name]):
            net_to_onnx(net)
        return
    assert_trained_net_round_trips(net, steps=1 if "googlenet" in name else 2)


def assert_trained_net_round_trips(net: Net, steps: int = 2) -> None:
    """`net` after `steps` SGD steps (batches of 2 random images) round trips (every parameter
    moved), compared on 2 other images."""
    rng = np.random.default_rng(0)
    solver = SGD(base_lr=0.01, momentum=0.9, lr_mult=net.lr_mult, decay_mult=net.decay_mult)
    before = net.get_params()
    for _ in range(steps):
        x = rng.uniform(0.0, 1.0, (2, *net.input_shape)).astype(np.float32)
        train_step(net, solver, x, rng.integers(0, net.num_classes, 2), rng=rng)
    moved = [k for k, v in net.get_params().items() if not np.array_equal(v, before[k])]
    assert len(moved) == len(before)
    assert_same_as_dasknn(net, rng.uniform(0.0, 1.0, (2, *net.input_shape)).astype(np.float32))


def test_caffenet_trained_one_step_round_trips():
    """CaffeNet (LRN across channels, two-tower groups, dropout) at 63×63, where pool1 rounds up;
    tests/test_export.py fits it with the estimator under -m slow."""
    net = zoo.caffenet((3, 63, 63), num_classes=3)
    assert rounded_up_pools(net) == ["pool1"]
    assert_trained_net_round_trips(net, steps=1)
