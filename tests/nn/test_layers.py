"""Each layer's forward against an independent loop reference, and its backward against finite
differences in float64 (relative error < 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn.layers import LRN, Convolution, Dropout, Filler, Flatten, InnerProduct, Pooling, ReLU
from dasknn.nn.loss import accuracy, softmax, softmax_with_loss
from dasknn.nn.pooling import pool_output_size
from tests.nn.gradcheck import check_layer, numerical_grad, rel_error

G = Filler("gaussian", std=0.5)


def build(layer, in_shape, seed=0):
    layer.setup(in_shape)
    layer.init_params(np.random.default_rng(seed), np.float64)
    for k, v in layer.params.items():  # non-zero biases so their gradients are exercised
        if k == "bias":
            layer.params[k] = np.random.default_rng(seed + 1).standard_normal(v.shape)
    return layer


def away_from_zero(rng, shape):
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 0.05, 0.1, x)


@pytest.mark.parametrize(
    "kernel, stride, pad, group",
    [(3, 1, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), (1, 0), 1), (5, 1, 2, 1), (3, 1, 1, 2), (1, 1, 0, 1)],
)
def test_convolution_gradients(kernel, stride, pad, group):
    rng = np.random.default_rng(0)
    layer = build(
        Convolution("c", 4, kernel, stride=stride, pad=pad, group=group, weight_filler=G), (4, 6, 7)
    )
    check_layer(layer, rng.standard_normal((2, 4, 6, 7)), rng)


def test_convolution_output_shape_and_bias():
    layer = build(Convolution("c", 96, 11, stride=4, weight_filler=G), (3, 227, 227))
    assert layer.out_shape == (96, 55, 55)
    layer = build(Convolution("c", 3, 3, pad=1, weight_filler=Filler("constant", value=0.0)), (2, 5, 5))
    y, _ = layer.forward(np.ones((1, 2, 5, 5)))
    np.testing.assert_allclose(y, np.broadcast_to(layer.params["bias"].reshape(1, 3, 1, 1), y.shape))


def test_grouped_convolution_equals_two_independent_convolutions():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 6, 6))
    grouped = build(Convolution("g", 6, 3, group=2, weight_filler=G), (4, 6, 6))
    y, _ = grouped.forward(x)
    for i in range(2):
        half = build(Convolution("h", 3, 3, weight_filler=G), (2, 6, 6))
        half.params = {
            "weight": grouped.params["weight"][3 * i : 3 * i + 3],
            "bias": grouped.params["bias"][3 * i : 3 * i + 3],
        }
        yi, _ = half.forward(x[:, 2 * i : 2 * i + 2])
        np.testing.assert_allclose(y[:, 3 * i : 3 * i + 3], yi, rtol=1e-12)


def test_inner_product_gradients_on_image_input():
    rng = np.random.default_rng(2)
    layer = build(InnerProduct("ip", 5, weight_filler=G), (2, 3, 3))
    check_layer(layer, rng.standard_normal((4, 2, 3, 3)), rng)
    assert layer.params["weight"].shape == (5, 18)


@pytest.mark.parametrize("slope", [0.0, 0.1])
def test_relu_gradients(slope):
    rng = np.random.default_rng(3)
    check_layer(build(ReLU("r", slope), (3, 4, 4)), away_from_zero(rng, (2, 3, 4, 4)), rng)


def test_flatten_round_trip():
    rng = np.random.default_rng(4)
    check_layer(build(Flatten("f"), (2, 3, 4)), rng.standard_normal((3, 2, 3, 4)), rng)


def reference_pool(x, method, k, s, p):
    """Caffe's pooling written as loops over output positions (clipped windows, AVE divisor)."""
    n, c, h, w = x.shape
    oh, ow = pool_output_size(h, k, s, p), pool_output_size(w, k, s, p)
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s - p, j * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs:he, ws:we]
            y[:, :, i, j] = win.max(axis=(2, 3)) if method == "max" else win.sum(axis=(2, 3)) / size
    return y


@pytest.mark.parametrize("method", ["max", "ave"])
@pytest.mark.parametrize(
    "k, s, p, hw", [(2, 2, 0, 8), (3, 2, 0, 8), (3, 2, 1, 7), (3, 3, 1, 10), (2, 1, 0, 5)]
)
def test_pooling_matches_caffe_reference_and_gradients(method, k, s, p, hw):
    rng = np.random.default_rng(5)
    layer = build(Pooling("p", method, k, stride=s, pad=p), (3, hw, hw))
    x = rng.standard_normal((2, 3, hw, hw))
    y, _ = layer.forward(x)
    np.testing.assert_allclose(y, reference_pool(x, method, k, s, p), rtol=1e-12)
    check_layer(layer, x, rng)


def test_pooling_output_sizes_round_up_like_caffe():
    assert pool_output_size(32, 3, 2, 0) == 16  # cifar10_quick pool1: ceil(29/2) + 1
    assert pool_output_size(24, 2, 2, 0) == 12  # LeNet pool1
    assert pool_output_size(55, 3, 2, 0) == 27  # CaffeNet pool1
    assert pool_output_size(13, 3, 2, 0) == 6  # CaffeNet pool5
    assert pool_output_size(6, 3, 2, 1) == 4
    assert pool_output_size(5, 2, 2, 1) == 3  # the 4th window would start in the pad: dropped
    layer = build(Pooling("g", "ave", global_pooling=True), (4, 5, 5))
    assert layer.out_shape == (4, 1, 1)


def reference_lrn(x, n, alpha, beta, k, region):
    out = np.empty_like(x)
    half = (n - 1) // 2
    _, c, h, w = x.shape
    for ci in range(c):
        if region == "across_channels":
            lo, hi = max(0, ci - half), min(c, ci + half + 1)
            scale = k + alpha / n * (x[:, lo:hi] ** 2).sum(axis=1)
            out[:, ci] = x[:, ci] * scale**-beta
        else:
            for i in range(h):
                for j in range(w):
                    win = x[:, ci, max(0, i - half) : i + half + 1, max(0, j - half) : j + half + 1]
                    scale = 1 + alpha / n**2 * (win**2).sum(axis=(1, 2))
                    out[:, ci, i, j] = x[:, ci, i, j] * scale**-beta
    return out


@pytest.mark.parametrize("region", ["across_channels", "within_channel"])
def test_lrn_matches_caffe_formula_and_gradients(region):
    rng = np.random.default_rng(6)
    layer = build(LRN("n", local_size=3, alpha=0.8, beta=0.75, k=2.0, norm_region=region), (5, 4, 4))
    x = rng.standard_normal((2, 5, 4, 4))
    y, _ = layer.forward(x)
    np.testing.assert_allclose(y, reference_lrn(x, 3, 0.8, 0.75, 2.0, region), rtol=1e-12)
    check_layer(layer, x, rng)


def test_dropout_scales_in_training_and_is_identity_in_test():
    layer = build(Dropout("d", 0.25), (1000,))
    x = np.ones((50, 1000))
    y, mask = layer.forward(x, train=True, rng=np.random.default_rng(0))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    dx, _ = layer.backward(np.full_like(x, 2.0), mask)
    np.testing.assert_allclose(dx, 2.0 * mask)
    y_test, _ = layer.forward(x, train=False)
    assert y_test is x


def test_softmax_with_loss_value_and_gradient():
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((6, 4))
    labels = np.array([0, 3, 1, 1, 2, 0])
    loss, dlogits = softmax_with_loss(logits, labels)
    p = softmax(logits)
    assert loss == pytest.approx(-np.log(p[np.arange(6), labels]).mean(), rel=1e-12)
    numeric = numerical_grad(lambda: softmax_with_loss(logits, labels)[0], logits)
    assert rel_error(dlogits, numeric) < 1e-7
    assert accuracy(np.eye(4)[[0, 1, 1, 2]], np.array([0, 1, 2, 2])) == 0.75


def test_fillers_follow_caffe():
    rng = np.random.default_rng(0)
    w = Filler("xavier").fill((50, 20, 5, 5), rng)
    bound = np.sqrt(3 / (20 * 25))
    assert w.dtype == np.float32 and np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    g = Filler("gaussian", std=0.01).fill((500, 800), rng)
    assert g.std() == pytest.approx(0.01, rel=0.01)
    assert (Filler("constant", value=1.0).fill((3,), rng) == 1).all()
    same = (
        Filler("xavier").fill((4, 3), np.random.default_rng(5)),
        Filler("xavier").fill((4, 3), np.random.default_rng(5)),
    )
    np.testing.assert_array_equal(*same)
    with pytest.raises(ValueError, match="unknown filler type 'bogus'"):
        Filler("bogus")


def test_bad_layer_options_are_named():
    with pytest.raises(ValueError, match="unknown lowering 'type9'"):
        Convolution("c", 4, 3, lowering="type9")
    with pytest.raises(ValueError, match="not divisible by group"):
        Convolution("c", 5, 3, group=2)
    with pytest.raises(ValueError, match="kernel 7x7 larger than padded input 5x5"):
        Convolution("c", 2, 7).setup((1, 5, 5))
    with pytest.raises(ValueError, match="unknown pool 'median'"):
        Pooling("p", "median", 2)
    with pytest.raises(ValueError, match="along the width .2., the last of 2 windows .* pools nothing"):
        Pooling("p", "max", 1, stride=2).setup((1, 3, 2))  # Caffe would pool an empty window
    assert Pooling("p", "max", 1, stride=2).setup((1, 3, 3)) == (1, 2, 2)  # kernel < stride, all in
    with pytest.raises(ValueError, match="local_size must be a positive odd"):
        LRN("n", local_size=4)


def test_max_pooling_gradient_goes_to_the_first_maximum_of_each_window_like_caffe():
    layer = build(Pooling("p", "max", 2, stride=1), (1, 2, 3))
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]])  # ties: the first in window order wins
    y, cache = layer.forward(x)
    np.testing.assert_array_equal(y, [[[[1.0, 1.0]]]])
    dx, _ = layer.backward(np.array([[[[10.0, 100.0]]]]), cache)
    np.testing.assert_array_equal(dx, [[[[10.0, 100.0, 0.0], [0.0, 0.0, 0.0]]]])


@pytest.mark.parametrize("kernel,stride", [((3, 3), (2, 2)), ((2, 3), (2, 1)), ((3, 2), (1, 3))])
def test_separable_window_max_sum_and_scatter_equal_a_loop_over_windows(kernel, stride):
    from dasknn.nn.pooling import window_reduce, window_scatter

    rng = np.random.default_rng(5)
    (kh, kw), (sh, sw) = kernel, stride
    xpad = rng.standard_normal((2, 3, 9, 10))
    oh, ow = (9 - kh) // sh + 1, (10 - kw) // sw + 1
    g = rng.standard_normal((2, 3, oh, ow))
    want_max, want_sum = np.empty((2, 3, oh, ow)), np.empty((2, 3, oh, ow))
    want_scatter = np.zeros_like(xpad)
    for p, q in np.ndindex(oh, ow):
        window = xpad[:, :, p * sh : p * sh + kh, q * sw : q * sw + kw]
        want_max[:, :, p, q], want_sum[:, :, p, q] = window.max(axis=(2, 3)), window.sum(axis=(2, 3))
        want_scatter[:, :, p * sh : p * sh + kh, q * sw : q * sw + kw] += g[:, :, p, q, None, None]
    np.testing.assert_array_equal(window_reduce(xpad, kernel, stride, (oh, ow), np.maximum), want_max)
    np.testing.assert_allclose(window_reduce(xpad, kernel, stride, (oh, ow), np.add), want_sum, rtol=1e-12)
    np.testing.assert_allclose(window_scatter(g, xpad.shape, kernel, stride), want_scatter, rtol=1e-12)


def test_first_max_offsets_and_their_scatter_equal_a_loop_over_windows():
    from dasknn.nn.pooling import _windows, first_max_offsets, scatter_to_windows

    rng = np.random.default_rng(3)
    xpad = rng.integers(0, 3, (2, 3, 7, 9)).astype(np.float32)  # many ties
    kh, kw, sh, sw, oh, ow = 3, 2, 2, 3, 3, 3  # overlapping rows, a column left out
    windows = list(_windows(xpad, kh, kw, sh, sw, oh, ow))
    y = np.max([xpad[sl] for _, sl in windows], axis=0)
    offsets = first_max_offsets(xpad, y, windows)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    want = np.zeros_like(xpad)
    for n, c, p, q in np.ndindex(y.shape):
        window = xpad[n, c, p * sh : p * sh + kh, q * sw : q * sw + kw].ravel()
        first = int(np.flatnonzero(window == y[n, c, p, q])[0])
        assert offsets[n, c, p, q] == first
        want[n, c, p * sh + first // kw, q * sw + first % kw] += dy[n, c, p, q]
    got = scatter_to_windows(dy, offsets, xpad.shape, (kh, kw), (sh, sw))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
