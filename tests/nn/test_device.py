"""DeviceNet, one copy of a net on a device shared by threads: it computes what the net computes,
loads each weights object once, and a backward after another forward's weights still uses its own."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dasknn.backend import device_scope, get_xp, to_device_packed, to_numpy_packed
from dasknn.nn import zoo
from dasknn.nn.device import DeviceNet
from dasknn.nn.layers import Dropout


def test_device_net_gives_the_net_s_activations_and_gradients():
    net = zoo.lenet(seed=0)
    conv, _ = net.split_phases()
    rng = np.random.default_rng(0)
    x = rng.random((8, 1, 28, 28), dtype=np.float32)
    w_a = conv.get_params()
    w_b = {k: v + np.float32(0.01) for k, v in w_a.items()}
    dev = DeviceNet(conv, "cpu")
    acts_a, caches_a = dev.forward(w_a, x, None)
    acts_b, _ = dev.forward(w_b, x, None)  # another thread's forward loads other weights ...
    dacts = rng.standard_normal(acts_a.shape).astype(np.float32)
    grads_a = dev.backward(w_a, caches_a, dacts)  # ... and this backward reloads its own
    ref = conv.copy()
    ref.set_params(w_a)
    want_acts, caches = ref.forward(x)
    _, want = ref.backward(dacts, caches)
    np.testing.assert_array_equal(acts_a, want_acts)
    assert not np.array_equal(acts_b, acts_a)
    for k, g in want.items():
        np.testing.assert_allclose(grads_a[k], g, rtol=1e-6, atol=1e-7, err_msg=k)
    for k, v in w_a.items():  # the caller's arrays are never aliased
        assert not np.shares_memory(dev.net.params[k], v)


def test_threads_sharing_one_device_net_compute_like_separate_nets():
    conv, _ = zoo.lenet(seed=0).split_phases()
    dev = DeviceNet(conv, "cpu")
    rng = np.random.default_rng(1)
    xs = [rng.random((4, 1, 28, 28), dtype=np.float32) for _ in range(4)]
    ws = [{k: v * np.float32(1 + i / 10) for k, v in conv.get_params().items()} for i in range(4)]
    out: dict[int, dict] = {}

    def work(i):
        for _ in range(5):
            acts, caches = dev.forward(ws[i], xs[i], None)
            out[i] = dev.backward(ws[i], caches, np.ones_like(acts))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        ref = conv.copy()
        ref.set_params(ws[i])
        acts, caches = ref.forward(xs[i])
        _, want = ref.backward(np.ones_like(acts), caches)
        for k, g in want.items():
            np.testing.assert_allclose(out[i][k], g, rtol=1e-5, atol=1e-6, err_msg=k)


def test_training_dropout_without_a_generator_is_a_clear_error():
    layer = Dropout("drop7", 0.5)
    layer.setup((10,))
    with pytest.raises(ValueError, match="layer 'drop7' draws random numbers in training: pass rng="):
        layer.forward(np.ones((2, 10), dtype=np.float32), train=True)
    y, _ = layer.forward(np.ones((2, 10), dtype=np.float32), train=False)  # test mode draws nothing
    assert (y == 1).all()


def test_dropout_masks_come_from_the_generator_alone():
    layer = Dropout("d", 0.3)
    layer.setup((50,))
    x = np.ones((20, 50), dtype=np.float32)
    y1, _ = layer.forward(x, rng=np.random.default_rng(5))
    y2, _ = layer.forward(x, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(y1, y2)
    keep = np.random.default_rng(5).random(x.shape, dtype=np.float32) >= np.float32(0.3)
    np.testing.assert_array_equal(y1 != 0, keep)


def test_packed_transfers_round_trip_as_views_of_one_buffer():
    arrays = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "a.bias": np.ones(2, np.float64)}
    dev = to_device_packed(arrays, np, np.float32)
    assert all(v.dtype == np.float32 for v in dev.values()) and dev["a.weight"].base is dev["a.bias"].base
    assert not np.shares_memory(dev["a.weight"], arrays["a.weight"])
    back = to_numpy_packed(dev)
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)
    assert to_numpy_packed({}) == {}


def test_device_names():
    with device_scope("cpu") as xp:
        assert xp is np
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        get_xp("tpu")
    with pytest.raises(ValueError, match="unknown device 'gpu:x'"):
        get_xp("gpu:x")
