"""Net: shape inference, costs, the conv/FC phase split, parameters, and whole-net gradients."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn import zoo
from dasknn.nn.layers import Convolution, Filler, InnerProduct, Pooling, ReLU
from dasknn.nn.loss import softmax_with_loss
from dasknn.nn.net import Net
from tests.nn.gradcheck import numerical_grad, rel_error


def tiny_net(dtype=np.float64, seed=0):
    g = Filler("gaussian", std=0.3)
    b = Filler("gaussian", std=0.1)
    layers = [
        Convolution("conv1", 3, 3, pad=1, weight_filler=g, bias_filler=b),
        ReLU("relu1"),
        Pooling("pool1", "max", 2, stride=2),
        Convolution("conv2", 4, 2, weight_filler=g, bias_filler=b),
        Pooling("pool2", "ave", 2, stride=1),
        InnerProduct("ip1", 5, weight_filler=g, bias_filler=b),
        ReLU("relu2"),
        InnerProduct("ip2", 3, weight_filler=g, bias_filler=b),
    ]
    return Net(layers, (2, 6, 6), name="tiny", dtype=dtype, seed=seed)


def test_lenet_shapes_and_costs():
    net = zoo.lenet()
    assert net.shapes == [
        ("conv1", (20, 24, 24)),
        ("pool1", (20, 12, 12)),
        ("conv2", (50, 8, 8)),
        ("pool2", (50, 4, 4)),
        ("ip1", (500,)),
        ("relu1", (500,)),
        ("ip2", (10,)),
    ]
    assert net.n_params == 431_080  # Caffe's LeNet: 520 + 25,050 + 400,500 + 5,010
    s = net.summary()
    assert s.loc["conv1", "flops"] == 2 * 20 * 25 * 24 * 24
    assert s.loc["ip1", "param_bytes"] == (800 * 500 + 500) * 4
    assert list(s["phase"]) == ["conv"] * 4 + ["fc"] * 3


def test_caffenet_shapes_and_parameter_count():
    net = zoo.caffenet()
    shapes = dict(net.shapes)
    assert shapes["pool1"] == (96, 27, 27) and shapes["conv2"] == (256, 27, 27)
    assert shapes["pool5"] == (256, 6, 6) and shapes["fc8"] == (1000,)
    assert net.n_params == 60_965_224  # the well-known CaffeNet size (two towers)
    conv, fc = net.split_phases()
    assert conv.layers[-1].name == "pool5" and fc.layers[0].name == "fc6"
    flops = net.summary().groupby("phase")["flops"].sum()
    assert flops["conv"] / flops.sum() > 0.9  # Omnivore §II-B: ~90-95% of FLOPs in the conv phase


def test_split_phases_composes_to_the_full_net_and_shares_parameters():
    net = tiny_net()
    conv, fc = net.split_phases()
    assert [lay.name for lay in fc.layers] == ["ip1", "relu2", "ip2"]
    assert fc.input_shape == conv.output_shape == (4, 1, 1)
    x = np.random.default_rng(0).standard_normal((3, 2, 6, 6))
    full, _ = net.forward(x, train=False)
    mid, _ = conv.forward(x, train=False)
    out, _ = fc.forward(mid, train=False)
    np.testing.assert_array_equal(full, out)
    assert conv.params["conv1.weight"] is net.params["conv1.weight"]
    conv2, fc2 = net.split_phases(at="relu2")
    assert fc2.layers[0].name == "relu2" and conv2.layers[-1].name == "ip1"


def test_whole_net_gradient_matches_finite_differences():
    net = tiny_net()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 6, 6))
    labels = np.array([0, 2, 1, 2])

    def loss():
        logits, _ = net.forward(x, train=False)
        return softmax_with_loss(logits, labels)[0]

    _, _, grads = net.loss_and_grads(x, labels)
    for name, p in net.params.items():
        assert rel_error(grads[name], numerical_grad(loss, p)) < 1e-5, name


def test_params_round_trip_and_errors():
    a, b = tiny_net(seed=1), tiny_net(seed=2)
    assert not np.array_equal(a.params["ip1.weight"], b.params["ip1.weight"])
    b.set_params(a.get_params())
    for k, v in a.params.items():
        np.testing.assert_array_equal(v, b.params[k])
    with pytest.raises(ValueError, match=r"parameter 'ip2.bias': shape \(4,\)"):
        b.set_params({"ip2.bias": np.zeros(4)}, strict=False)
    with pytest.raises(KeyError, match="no parameters"):
        b.set_params({"nope.weight": np.zeros(1)}, strict=False)
    with pytest.raises(ValueError, match=r"expects input of shape \(N, 2, 6, 6\), got \(1, 3, 6, 6\)"):
        a.forward(np.zeros((1, 3, 6, 6)))


def test_same_seed_same_weights_and_float32_default():
    a, b = zoo.lenet(seed=3), zoo.lenet(seed=3)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert a.params["conv1.weight"].dtype == np.float32
    assert a.lr_mult["conv1.bias"] == 2.0


def test_zoo_nets_run_forward_and_backward():
    rng = np.random.default_rng(0)
    for name, shape in [("cifar10_quick", (3, 32, 32)), ("cifar10_full", (3, 32, 32))]:
        net = zoo.get_net(name, num_classes=10)
        x = rng.standard_normal((2, *shape)).astype(np.float32)
        loss, acc, grads = net.loss_and_grads(x, np.array([1, 7]))
        assert np.isfinite(loss) and set(grads) == set(net.params)
        assert loss == pytest.approx(np.log(10), abs=0.05)  # small initial weights: near-uniform scores
    assert zoo.cifar10_full().layer("ip1").decay_mult == {"weight": 250.0, "bias": 0.0}
    with pytest.raises(ValueError, match="unknown net 'vgg'"):
        zoo.get_net("vgg")
