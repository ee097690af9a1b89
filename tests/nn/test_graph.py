"""Graph nets: the new layers (Concat, Eltwise, BatchNorm, Scale, Softmax) and small graphs checked
against finite differences in float64, in-place blobs, several weighted losses, the phase split on
a graph, and BatchNorm's running statistics through the solver."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn.layers import Convolution, Filler, InnerProduct, Pooling, ReLU
from dasknn.nn.merge import Concat, Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale, Softmax
from dasknn.nn.solver import SGD
from tests.nn.gradcheck import check_layer, numerical_grad, rel_error

G = Filler("gaussian", std=0.5)


def check_multi(layer, xs, rng, tol=1e-5):
    """Finite differences of L = Σ y·dy against a multi-input layer's backward, for every input."""
    layer.setup([x.shape[1:] for x in xs])
    y, cache = layer.forward(xs)
    dy = rng.standard_normal(y.shape)
    dxs, _ = layer.backward(dy, cache)
    for x, dx in zip(xs, dxs, strict=True):
        num = numerical_grad(lambda: float((layer.forward(xs)[0] * dy).sum()), x)
        assert rel_error(dx, num) < tol


def test_concat_forward_and_gradients():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, c, 3, 4)) for c in (1, 3, 2)]
    layer = Concat("cat")
    check_multi(layer, xs, rng)
    assert layer.out_shape == (6, 3, 4)
    np.testing.assert_array_equal(layer.forward(xs)[0][:, 1:4], xs[1])
    with pytest.raises(ValueError, match="differ only in channels"):
        Concat("bad").setup([(1, 3, 4), (1, 3, 5)])


@pytest.mark.parametrize(
    "operation, coeff", [("sum", ()), ("sum", (1.0, -0.5, 2.0)), ("prod", ()), ("max", ())]
)
def test_eltwise_forward_and_gradients(operation, coeff):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 3, 4, 4)) for _ in range(3)]
    layer = Eltwise("e", operation, coeff)
    check_multi(layer, xs, rng)
    expected = {
        "sum": sum(c * x for c, x in zip(coeff or (1, 1, 1), xs, strict=True)),
        "prod": xs[0] * xs[1] * xs[2],
        "max": np.maximum(np.maximum(xs[0], xs[1]), xs[2]),
    }[operation]
    np.testing.assert_allclose(layer.forward(xs)[0], expected)


def test_eltwise_checks_its_inputs():
    with pytest.raises(ValueError, match="equal-shaped"):
        Eltwise("e").setup([(2, 3, 3), (3, 3, 3)])
    with pytest.raises(ValueError, match="2 coeff for 3 inputs"):
        Eltwise("e", coeff=(1, 2)).setup([(2, 3, 3)] * 3)
    with pytest.raises(ValueError, match="'sum' only"):
        Eltwise("e", "max", coeff=(1, 2))


def bn_layer(shape, global_stats=None):
    layer = BatchNorm("bn", use_global_stats=global_stats)
    layer.setup(shape)
    layer.init_params(None, np.float64)
    return layer


def test_batchnorm_gradients_in_training_and_with_global_stats():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 2, 3)) * 2 + 1
    layer = bn_layer((3, 2, 3))
    y, cache = layer.forward(x)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, rtol=1e-3)
    dy = rng.standard_normal(y.shape)
    dx, stats = layer.backward(dy, cache)
    assert rel_error(dx, numerical_grad(lambda: float((layer.forward(x)[0] * dy).sum()), x)) < 1e-5
    m = 4 * 2 * 3
    np.testing.assert_allclose(stats["mean"], 4 * x.mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(stats["variance"], 4 * x.var(axis=(0, 2, 3)) * m / (m - 1))
    np.testing.assert_allclose(stats["scale_factor"], [4])
    fixed = bn_layer((3, 2, 3), global_stats=True)
    fixed.params = {
        "mean": np.array([1.0, 2, 3]),
        "variance": np.array([4.0, 1, 9]),
        "scale_factor": np.ones(1) * 2,
    }
    y, cache = fixed.forward(x)
    np.testing.assert_allclose(y[:, 2], (x[:, 2] - 1.5) / np.sqrt(4.5 + 1e-5))
    dx, stats = fixed.backward(dy, cache)
    assert stats == {}
    assert rel_error(dx, numerical_grad(lambda: float((fixed.forward(x)[0] * dy).sum()), x)) < 1e-5


def test_batchnorm_running_statistics_follow_caffe():
    """Caffe's rule: blob ← fraction·blob + batch contribution; running mean = mean / scale_factor.
    Two equal batches give Caffe's estimate whatever the batch size."""
    rng = np.random.default_rng(3)
    net = Net(
        [BatchNorm("bn", moving_average_fraction=0.5), Pooling("p", "ave", global_pooling=True)],
        (2, 3, 3),
        dtype=np.float64,
    )
    solver = SGD.for_net(net)
    batches = [rng.standard_normal((5, 2, 3, 3)) + i for i in range(2)]
    for xb in batches:
        _, caches = net.forward(xb)
        _, grads = net.backward(np.ones((5, 2, 1, 1)), caches)
        solver.step(net.params, grads, lr=0.1, momentum=0.9)
    means = [xb.mean(axis=(0, 2, 3)) for xb in batches]
    caffe_mean = (0.5 * means[0] + means[1]) / (0.5 + 1)
    p = net.params
    np.testing.assert_allclose(p["bn.mean"] / p["bn.scale_factor"], caffe_mean)
    y, _ = net.forward(batches[1], train=False)  # test mode: the running statistics
    layer = net.layer("bn")
    assert layer.forward(batches[1], train=False)[0].mean() != pytest.approx(0, abs=1e-3)
    assert y.shape == (5, 2, 1, 1)


def test_scale_and_softmax_gradients():
    rng = np.random.default_rng(4)
    scale = Scale("s", filler=G, bias_filler=G)
    scale.setup((3, 2, 2))
    scale.init_params(rng, np.float64)
    check_layer(scale, rng.standard_normal((2, 3, 2, 2)), rng)
    soft = Softmax("prob")
    soft.setup((5,))
    x = rng.standard_normal((3, 5))
    check_layer(soft, x, rng)
    np.testing.assert_allclose(soft.forward(x)[0].sum(axis=1), 1)


# -- small graphs ---------------------------------------------------------------------------------
def conv(name, n, k=3, pad=1):
    return Convolution(name, n, k, pad=pad, weight_filler=G, bias_filler=G)


def ip(name, n):
    return InnerProduct(name, n, weight_filler=G, bias_filler=G)


def concat_graph():
    """Inception-like: two branches of different widths joined by Concat."""
    return [
        (conv("a", 2, 1, 0), "data", "a"),
        (conv("b", 3), "data", "b"),
        (ReLU("relu_b"), "b", "b"),
        (Concat("cat"), ["a", "b"], "cat"),
        (ip("fc", 4), "cat", "fc"),
    ]


def eltwise_graph():
    """Residual-like: a two-conv residual and a projected shortcut summed with coefficients, then
    BatchNorm + Scale."""
    return [
        (conv("c1", 3), "data", "c1"),
        (ReLU("r1"), "c1", "c1"),
        (conv("c2", 3), "c1", "c2"),
        (conv("proj", 3, 1, 0), "data", "proj"),
        (Eltwise("sum", "sum", (1.0, 0.5)), ["c2", "proj"], "sum"),
        (BatchNorm("bn"), "sum", "sum"),
        (Scale("scale", filler=G, bias_filler=G), "sum", "sum"),
        (Eltwise("prod", "prod"), ["sum", "c1"], "prod"),
        (ip("fc", 4), "prod", "fc"),
    ]


def shared_blob_graph():
    """One blob ('c') read by two layers; their gradients must add up."""
    return [
        (conv("c", 2), "data", "c"),
        (ip("fc1", 4), "c", "s1"),
        (Pooling("pool", "max", 2, stride=2), "c", "pool"),
        (ip("fc2", 4), "pool", "s2"),
        (Eltwise("max", "max"), ["s1", "s2"], "out"),
    ]


def two_losses_graph():
    """An auxiliary head (weight 0.3) leaving before the main head, as GoogLeNet's."""
    return [
        (conv("c", 2), "data", "c"),
        (ReLU("relu"), "c", "c"),
        (ip("aux", 4), "c", "aux"),
        (conv("c2", 2), "c", "c2"),
        (ip("main", 4), "c2", "main"),
    ]


GRAPHS = {
    "concat": (concat_graph, {}),
    "eltwise": (eltwise_graph, {}),
    "shared": (shared_blob_graph, {}),
    "two_losses": (two_losses_graph, {"aux": 0.3}),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_graph_gradients(graph):
    build, weights = GRAPHS[graph]
    net = Net(build(), (2, 4, 4), dtype=np.float64, seed=1, loss_weights=weights)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([0, 3, 1])
    out = net.train_step(x, y, need_dx=True)

    def loss():
        return net.train_step(x, y)["loss"]

    assert rel_error(out["dx"], numerical_grad(loss, x)) < 1e-5
    for key, p in net.params.items():
        if key not in net.statistics:
            num = numerical_grad(loss, p)  # a bias that BatchNorm cancels has gradient 0
            assert (
                rel_error(out["grads"][key], num) < 1e-5
                or abs(num).max() < 1e-8 > abs(out["grads"][key]).max()
            ), key


def test_two_losses_weighted_total_and_main_loss():
    net = Net(two_losses_graph(), (2, 4, 4), dtype=np.float64, loss_weights={"aux": 0.3})
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([0, 3, 1])
    heads, _ = net.forward_heads(x)
    out = net.loss(heads, y)
    from dasknn.nn.loss import softmax_with_loss

    main, aux = softmax_with_loss(heads["main"], y)[0], softmax_with_loss(heads["aux"], y)[0]
    assert out["main_loss"] == pytest.approx(main)
    assert out["loss"] == pytest.approx(main + 0.3 * aux)
    assert list(net.loss_weights) == ["main", "aux"]
    np.testing.assert_array_equal(net.forward(x)[0], heads["main"])


def test_in_place_layers_match_explicit_blobs():
    """ReLU written in place on 'c' makes later readers of 'c' see the rectified blob (Caffe)."""
    in_place = Net(
        [(conv("c", 2), "data", "c"), (ReLU("r"), "c", "c"), (ip("fc", 3), "c", "fc")], (1, 3, 3), seed=2
    )
    chain = Net([conv("c", 2), ReLU("r"), ip("fc", 3)], (1, 3, 3), seed=2)
    x = np.random.default_rng(0).standard_normal((2, 1, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(in_place.forward(x)[0], chain.forward(x)[0])
    assert chain.is_chain and in_place.is_chain
    assert chain.architecture() == in_place.architecture()


def test_graph_errors_name_the_problem():
    with pytest.raises(ValueError, match="reads \\['nowhere'\\]"):
        Net([(ip("fc", 2), "nowhere", "fc")], (1, 2, 2))
    with pytest.raises(ValueError, match="never used"):
        Net(two_losses_graph(), (2, 4, 4))
    with pytest.raises(ValueError, match="reads one blob"):
        Net([(conv("a", 1), "data", "a"), (ip("fc", 2), ["a", "data"], "fc")], (1, 3, 3))
    with pytest.raises(ValueError, match="loss head 'aux' gives 4 scores, the main head 'main' 3"):
        Net(two_losses_graph()[:-1] + [(ip("main", 3), "c2", "main")], (2, 4, 4), loss_weights={"aux": 1})
    with pytest.raises(ValueError, match="not on the main path"):
        Net(two_losses_graph(), (2, 4, 4), loss_weights={"aux": 0.3}).split_phases(at="aux")


def test_phase_split_sends_auxiliary_heads_to_the_fc_server():
    """The aux head's InnerProduct is in the FC phase; both crossing blobs travel packed, and the
    two phases together compute exactly what the whole net computes."""
    net = Net(two_losses_graph(), (2, 4, 4), dtype=np.float64, loss_weights={"aux": 0.3})
    conv, fc = net.split_phases()
    assert [lr.name for lr in conv.layers] == ["c", "relu", "c2"]
    assert [lr.name for lr in fc.layers] == ["main", "aux"]  # the split layer first
    assert conv.output_shape == (2 * 16 + 2 * 16,) and fc.input_shape == conv.output_shape
    s = net.summary()
    assert list(s.index[s["to_fc"]]) == ["relu", "c2"] and list(s["phase"]) == [
        "conv",
        "conv",
        "fc",
        "conv",
        "fc",
    ]
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([0, 3, 1])
    whole = net.train_step(x, y, need_dx=True)
    acts, caches = conv.forward(x)
    top = fc.train_step(acts, y, need_dx=True)
    dx, grads = conv.backward(top["dx"], caches, need_dx=True)
    assert top["loss"] == pytest.approx(whole["loss"]) and top["main_loss"] == pytest.approx(
        whole["main_loss"]
    )
    np.testing.assert_allclose(dx, whole["dx"])
    for key, g in {**grads, **top["grads"]}.items():
        np.testing.assert_allclose(g, whole["grads"][key], err_msg=key)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_every_split_point_computes_what_the_whole_net_computes(graph):
    """Whatever main-path layer the FC phase starts at (first InnerProduct, RALP's choice, or any
    other), conv phase + FC phase give the whole net's loss, input gradient and parameter gradients."""
    build, weights = GRAPHS[graph]
    net = Net(build(), (2, 4, 4), dtype=np.float64, seed=3, loss_weights=weights)
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([2, 0, 1])
    whole = net.train_step(x, y, need_dx=True)
    for i in sorted(net.main_path())[1:]:
        conv, fc = net.split_phases(at=net.layers[i].name)
        assert fc.layers[0].name == net.layers[i].name
        acts, caches = conv.forward(x)
        top = fc.train_step(acts, y, need_dx=True)
        dx, grads = conv.backward(top["dx"], caches, need_dx=True)
        assert top["loss"] == pytest.approx(whole["loss"])
        np.testing.assert_allclose(dx, whole["dx"], atol=1e-12)
        assert {**grads, **top["grads"]}.keys() == whole["grads"].keys()
