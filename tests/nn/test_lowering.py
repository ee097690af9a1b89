"""Tests of dasknn.nn.lowering: the three CcT lowerings against a direct convolution, forward and backward."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import dasknn.nn.lowering as lowering_module
from dasknn.nn.lowering import (
    LOWERINGS,
    PARTITION_BYTES,
    TYPE1_MAX_D_OVER_O,
    TYPE3_MIN_D_OVER_O,
    choose_lowering,
    conv_backward,
    conv_direct,
    conv_forward,
    conv_output_size,
    default_bp,
    dx_by_convolution,
    largest_bp,
    lowered_bytes,
)

# (N, C, O, H, W, KH, KW, stride, pad): each lowering must agree with conv_direct on all of them.
CASES = {
    "nonsquare-kernel": (4, 2, 3, 6, 5, 3, 2, 1, 0),
    "stride2-pad1": (4, 2, 3, 7, 7, 3, 3, 2, 1),
    "C1-O1-mixed-stride-pad": (4, 1, 1, 5, 6, 2, 3, (2, 1), (1, 2)),
    "k5-pad2": (4, 3, 2, 5, 5, 5, 5, 1, 2),
    "stride3-unused-rows": (4, 2, 2, 8, 8, 3, 3, 3, 0),
    "1x1": (4, 2, 3, 4, 4, 1, 1, 1, 0),
    "pad-wider-than-needed": (4, 2, 2, 3, 4, 2, 2, 2, 2),
    "C8-slab-col2im": (4, 8, 3, 6, 5, 3, 3, 1, 1),
    "C8-slab-col2im-stride2": (4, 9, 2, 7, 6, 3, 2, 2, (0, 1)),
}


@functools.cache
def _case(name: str):
    """Inputs, upstream gradient and exact reference (y, dx, dw) for one case, in float64.

    The convolution is linear in x and in w, so its Jacobians are conv_direct of the basis vectors
    (a finite difference with step 1 is exact for a linear map); the reference gradients are those
    Jacobians contracted with dy.
    """
    n, c, o, h, w_, kh, kw, stride, pad = CASES[name]
    rng = np.random.default_rng(list(CASES).index(name))
    x = rng.standard_normal((n, c, h, w_))
    w = rng.standard_normal((o, c, kh, kw))
    y = conv_direct(x, w, stride, pad)
    dy = rng.standard_normal(y.shape)
    jac_x = conv_direct(np.eye(c * h * w_).reshape(-1, c, h, w_), w, stride, pad)  # (CHW, O, OH, OW)
    dx = np.einsum("iopq,nopq->ni", jac_x, dy).reshape(x.shape)
    jac_w = np.stack([conv_direct(x, e.reshape(w.shape), stride, pad) for e in np.eye(w.size)])
    dw = np.einsum("jnopq,nopq->j", jac_w, dy).reshape(w.shape)
    return x, w, stride, pad, dy, y, dx, dw


def test_conv_direct_matches_hand_computed_values():
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    w = np.array([[[[1.0, 0.0], [0.0, -1.0]]]])  # y[r, c] = x[r, c] - x[r + 1, c + 1] = -5
    np.testing.assert_array_equal(conv_direct(x, w), np.full((1, 1, 3, 3), -5.0))
    np.testing.assert_array_equal(conv_direct(x, w, stride=2), np.full((1, 1, 2, 2), -5.0))
    padded = conv_direct(x, w, pad=1)  # corners see one input each: -x[0, 0] and x[3, 3]
    assert padded.shape == (1, 1, 5, 5)
    assert padded[0, 0, 0, 0] == 0.0 and padded[0, 0, 4, 4] == 15.0 and padded[0, 0, 2, 2] == -5.0


@pytest.mark.parametrize("n, k, s, p, expected", [(227, 11, 4, 0, 55), (27, 5, 1, 2, 27), (7, 3, 2, 1, 4)])
def test_conv_output_size(n, k, s, p, expected):
    assert conv_output_size(n, k, s, p) == expected


@pytest.mark.parametrize("bp", [1, 3, None])
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", list(CASES))
def test_lowering_forward_and_backward_match_direct_convolution(name, lowering, bp):
    x, w, stride, pad, dy, y_ref, dx_ref, dw_ref = _case(name)
    y, cache = conv_forward(x, w, stride, pad, lowering=lowering, bp=bp)
    dx, dw = conv_backward(dy, cache)
    assert y.dtype == dx.dtype == dw.dtype == np.float64
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_backward_twice_and_without_dx_gives_the_same_dw(lowering):
    x, w, stride, pad, dy, *_ = _case("stride2-pad1")
    _, cache = conv_forward(x, w, stride, pad, lowering=lowering)
    dx1, dw1 = conv_backward(dy, cache)
    dx2, dw2 = conv_backward(dy, cache, need_dx=False)
    assert dx2 is None
    np.testing.assert_array_equal(dw1, dw2)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_float32_agrees_with_float64(lowering):
    x, w, stride, pad, dy, y_ref, dx_ref, dw_ref = _case("k5-pad2")
    f32 = np.float32
    y, cache = conv_forward(x.astype(f32), w.astype(f32), stride, pad, lowering=lowering, bp=3)
    dx, dw = conv_backward(dy.astype(f32), cache)
    assert y.dtype == dx.dtype == dw.dtype == f32
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("bp", [1, 3, 4])
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", ["stride2-pad1", "C1-O1-mixed-stride-pad"])
def test_lowered_bytes_matches_the_buffers_forward_allocates(name, lowering, bp):
    x, w, stride, pad, *_ = _case(name)
    _, cache = conv_forward(x, w, stride, pad, lowering=lowering, bp=bp)
    expected = lowered_bytes(x.shape[1:], w.shape, stride, pad, bp, lowering, itemsize=8)
    assert cache.lowered_nbytes == expected
    if lowering != "type3" and bp == x.shape[0]:  # D̂ of the whole batch, kept for dW
        assert cache.lowered.nbytes == expected - (lowering == "type2") * bp * 8 * (
            cache.geometry.hu * cache.geometry.ow * cache.geometry.kh * cache.geometry.o
        )


def test_lowered_bytes_of_caffenet_conv2_follows_the_cct_sizes():
    # m = 27, k = 5, d = 96, o = 256, padded extent n = 31: Type 1 m²k²d, Type 2 n·m(kd + ko),
    # Type 3 n²(d + k²o), per image and float32.
    args = ((96, 27, 27), (256, 96, 5, 5), 1, 2)
    assert lowered_bytes(*args, bp=1, lowering="type1") == 27 * 27 * 25 * 96 * 4 == 6_998_400
    assert lowered_bytes(*args, bp=64, lowering="type1") == 64 * 6_998_400
    assert lowered_bytes(*args, bp=1, lowering="type2") == 31 * 27 * (5 * 96 + 5 * 256) * 4
    assert lowered_bytes(*args, bp=1, lowering="type3") == 31 * 31 * (96 + 25 * 256) * 4
    assert lowered_bytes(*args, bp=2, lowering="type1", itemsize=8) == 4 * 6_998_400


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_largest_bp_fits_the_budget_and_grows_with_it(lowering):
    args = ((96, 27, 27), (256, 96, 5, 5), 1, 2)
    per_image = lowered_bytes(*args, bp=1, lowering=lowering)
    assert largest_bp(*args, 64, 5 * per_image, lowering) == 5
    assert largest_bp(*args, 64, 5 * per_image - 1, lowering) == 4
    assert largest_bp(*args, 64, 0, lowering) == 1  # one image is the least a GEMM can take
    assert largest_bp(*args, 64, 10**15, lowering) == 64
    budgets = np.linspace(0, 80 * per_image, 57).astype(np.int64)
    bps = [largest_bp(*args, 64, int(b), lowering) for b in budgets]
    assert bps == sorted(bps) and bps[-1] == 64
    for b, bp in zip(budgets, bps, strict=True):
        assert bp == 1 or lowered_bytes(*args, bp=bp, lowering=lowering) <= b


@pytest.mark.parametrize(
    "c, o, stride, expected",
    [
        (3, 96, 4, "type1"),  # CaffeNet conv1
        (96, 256, 1, "type1"),  # conv2, d/o = 0.375
        (384, 256, 1, "type1"),  # conv5, d/o = 1.5
        (512, 256, 1, "type1"),  # d/o = 2, the last Type 1
        (1024, 256, 1, "type2"),  # d/o = 4
        (256, 32, 1, "type2"),  # d/o = 8
        (256, 16, 1, "type3"),  # d/o = 16, the first Type 3
        (1024, 16, 1, "type3"),  # d/o = 64
        (1024, 16, 2, "type1"),  # strided: only Type 1 computes the strided outputs alone
    ],
)
def test_choose_lowering_follows_the_d_over_o_rule(c, o, stride, expected):
    assert (TYPE1_MAX_D_OVER_O, TYPE3_MIN_D_OVER_O) == (2.0, 16.0)
    assert choose_lowering((64, c, 13, 13), (o, c, 3, 3), stride, 1) == expected


def test_choose_lowering_moves_from_type1_to_type3_as_d_over_o_grows():
    order = {name: i for i, name in enumerate(LOWERINGS)}
    channels = [2**i for i in range(13)]  # d/o from 1/4096 to 4096 at d·o = 4096
    ranks = [order[choose_lowering((8, c, 13, 13), (4096 // c, c, 3, 3), 1, 1)] for c in channels]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 2


def test_auto_runs_the_chosen_lowering():
    x, w, stride, pad, *_ = _case("k5-pad2")
    _, cache = conv_forward(x, w, stride, pad)
    assert cache.lowering == choose_lowering(x.shape, w.shape, stride, pad)
    assert cache.bp == x.shape[0]


@pytest.mark.parametrize(
    "x_shape, w_shape, kwargs, match",
    [
        ((2, 3, 8, 8), (4, 2, 3, 3), {}, "channels"),
        ((2, 3, 4, 4), (4, 3, 7, 3), {"pad": 1}, "larger than the padded input"),
        ((2, 3, 8, 8), (4, 3, 3, 3), {"lowering": "type4"}, "lowering must be one of"),
        ((2, 3, 8, 8), (4, 3, 3, 3), {"bp": 0}, "bp must be >= 1"),
        ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": 0}, "stride"),
        ((2, 3, 8, 8), (4, 3, 3, 3), {"pad": -1}, "pad"),
        ((3, 8, 8), (4, 3, 3, 3), {}, r"\(N, C, H, W\)"),
    ],
)
def test_bad_arguments_raise_value_error(x_shape, w_shape, kwargs, match):
    with pytest.raises(ValueError, match=match):
        conv_forward(np.zeros(x_shape), np.zeros(w_shape), **kwargs)


def test_backward_rejects_a_gradient_of_the_wrong_shape():
    _, cache = conv_forward(np.zeros((2, 3, 8, 8)), np.zeros((4, 3, 3, 3)))
    with pytest.raises(ValueError, match="forward output"):
        conv_backward(np.zeros((2, 4, 5, 5)), cache)


def test_bp_larger_than_the_batch_means_the_whole_batch():
    x, w, stride, pad, _, y_ref, *_ = _case("1x1")
    y, cache = conv_forward(x, w, stride, pad, bp=100)
    assert cache.bp == x.shape[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", list(CASES))
def test_lowering_on_cupy_matches_numpy(name, lowering):
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device")
    x, w, stride, pad, dy, y_ref, dx_ref, dw_ref = _case(name)
    for dtype, rtol in ((np.float64, 1e-5), (np.float32, 1e-4)):
        y, cache = conv_forward(cp.asarray(x, dtype), cp.asarray(w, dtype), stride, pad, lowering, bp=3)
        dx, dw = conv_backward(cp.asarray(dy, dtype), cache)
        assert isinstance(y, cp.ndarray) and isinstance(dx, cp.ndarray) and isinstance(dw, cp.ndarray)
        for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
            np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=rtol, atol=rtol * np.abs(ref).max())


def test_default_bp_keeps_a_partition_within_the_budget_on_the_cpu_and_takes_the_batch_on_a_gpu():
    args = ((128, 32, 16, 16), (32, 32, 5, 5), 1, 2)  # CIFAR-10 quick conv2
    per_image = lowered_bytes((32, 16, 16), (32, 32, 5, 5), 1, 2, bp=1)
    bp = default_bp(*args)
    assert bp == PARTITION_BYTES // per_image and 1 <= bp < 128
    assert lowered_bytes((32, 16, 16), (32, 32, 5, 5), 1, 2, bp=bp) <= PARTITION_BYTES
    assert default_bp(*args, itemsize=8) == PARTITION_BYTES // (2 * per_image)
    assert default_bp(*args, device="gpu") == 128
    assert default_bp((4, 2, 6, 6), (3, 2, 3, 3)) == 4  # small layers: the whole batch
    assert default_bp((2, 96, 227, 227), (96, 96, 11, 11), 1, 0) == 1  # one image over the budget


def test_partitions_of_the_default_bp_match_the_direct_convolution(monkeypatch):
    x, w, stride, pad, dy, y_ref, dx_ref, dw_ref = _case("C8-slab-col2im")
    per_image = lowered_bytes(x.shape[1:], w.shape, stride, pad, 1, itemsize=8)
    monkeypatch.setattr(lowering_module, "PARTITION_BYTES", 3 * per_image)
    y, cache = conv_forward(x, w, stride, pad, lowering="type1")
    dx, dw = conv_backward(dy, cache)
    assert cache.bp == 3 and cache.lowered is None  # 4 images: partitions of 3 and 1
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_bias_is_added_to_each_output_channel(lowering):
    x, w, stride, pad, _, y_ref, *_ = _case("stride2-pad1")
    bias = np.array([0.5, -2.0, 3.0])
    y, _ = conv_forward(x, w, stride, pad, lowering=lowering, bp=3, bias=bias)
    np.testing.assert_allclose(y, y_ref + bias.reshape(1, -1, 1, 1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="one per output channel"):
        conv_forward(x, w, stride, pad, bias=np.zeros(4))


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, pad, expected",
    [
        ((128, 32, 16, 16), (32, 32, 5, 5), 1, 2, True),  # CIFAR-10 quick conv2: "same", 32 channels
        ((64, 20, 12, 12), (50, 20, 5, 5), 1, 0, False),  # LeNet conv2: pad 0, dx has more rows than dy
        ((128, 3, 32, 32), (32, 3, 5, 5), 1, 2, False),  # first layer: too few input channels
        ((64, 96, 27, 27), (256, 96, 5, 5), 2, 2, False),  # strided
        ((64, 256, 13, 13), (384, 256, 3, 3), 1, 1, True),  # CaffeNet conv3
    ],
)
def test_dx_by_convolution_for_same_stride1_convolutions_with_enough_channels(
    x_shape, w_shape, stride, pad, expected
):
    assert dx_by_convolution(x_shape, w_shape, stride, pad) is expected


def test_dx_as_a_convolution_equals_col2im(monkeypatch):
    x, w, stride, pad, dy, _, dx_ref, dw_ref = _case("C8-slab-col2im")
    assert dx_by_convolution(x.shape, w.shape, stride, pad)
    by_convolution = conv_backward(dy, conv_forward(x, w, stride, pad, lowering="type1")[1])
    monkeypatch.setattr(lowering_module, "DX_CONV_MIN_CHANNELS", 10**9)
    by_col2im = conv_backward(dy, conv_forward(x, w, stride, pad, lowering="type1")[1])
    for got, ref in zip(by_convolution + by_col2im, (dx_ref, dw_ref, dx_ref, dw_ref), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-12)
