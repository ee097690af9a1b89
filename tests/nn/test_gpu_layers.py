"""The CuPy path of every layer gives the numpy path's numbers, dropout masks, evaluation on numpy
labels, restored momentum, a device net's transfers and the FC server included (run with `-m gpu`
on a CUDA machine)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import cupy_available, to_numpy, transfer_counts
from dasknn.engine.servers import FCServer
from dasknn.nn import zoo
from dasknn.nn.device import DeviceNet
from dasknn.nn.layers import LRN, Convolution, Dropout, Filler, Flatten, InnerProduct, Pooling, ReLU
from dasknn.nn.solver import SGD
from dasknn.nn.train import evaluate, train_arrays, train_step

pytestmark = pytest.mark.gpu

G = Filler("gaussian", std=0.5)
LAYERS = [
    (lambda: Convolution("c", 4, 3, stride=2, pad=1, weight_filler=G, bias_filler=G), (3, 9, 9)),
    (lambda: Convolution("g", 6, 3, pad=1, group=2, weight_filler=G, bias_filler=G), (4, 7, 7)),
    (lambda: Convolution("t2", 5, 3, lowering="type2", weight_filler=G), (8, 7, 7)),
    (lambda: Convolution("t3", 2, 3, lowering="type3", weight_filler=G), (16, 7, 7)),
    (lambda: Pooling("m", "max", 3, stride=2, pad=1), (3, 9, 9)),
    (lambda: Pooling("a", "ave", 3, stride=2), (3, 9, 9)),
    (lambda: ReLU("r", 0.1), (3, 5, 5)),
    (lambda: LRN("n", 3, 0.5, 0.75, 2.0), (6, 5, 5)),
    (lambda: LRN("w", 3, 0.5, 0.75, norm_region="within_channel"), (4, 5, 5)),
    (lambda: InnerProduct("ip", 7, weight_filler=G, bias_filler=G), (3, 4, 4)),
    (lambda: Flatten("f"), (3, 4, 4)),
]


@pytest.fixture(scope="module")
def cp():
    if not cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    import cupy

    return cupy


@pytest.mark.parametrize("make, shape", LAYERS, ids=[str(i) for i in range(len(LAYERS))])
def test_layer_on_gpu_matches_cpu(cp, make, shape):
    rng = np.random.default_rng(0)
    cpu, gpu = make(), make()
    for layer in (cpu, gpu):
        layer.setup(shape)
        layer.init_params(np.random.default_rng(1), np.float64)
    gpu.params = {k: cp.asarray(v) for k, v in gpu.params.items()}
    x = rng.standard_normal((4, *shape))
    y, cache = cpu.forward(x)
    dy = rng.standard_normal(y.shape)
    dx, grads = cpu.backward(dy, cache)
    yg, cache_g = gpu.forward(cp.asarray(x))
    dxg, grads_g = gpu.backward(cp.asarray(dy), cache_g)
    np.testing.assert_allclose(to_numpy(yg), y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(to_numpy(dxg), dx, rtol=1e-9, atol=1e-12)
    for k, g in grads.items():
        np.testing.assert_allclose(to_numpy(grads_g[k]), g, rtol=1e-9, atol=1e-12)


def test_lenet_trains_on_gpu_like_on_cpu(cp):
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 32)
    cpu, gpu = zoo.lenet(seed=0), zoo.lenet(seed=0).to(cp)
    s_cpu, s_gpu = SGD.for_net(cpu, base_lr=0.01, momentum=0.9), SGD.for_net(gpu, base_lr=0.01, momentum=0.9)
    for _ in range(5):
        loss_cpu, _ = train_step(cpu, s_cpu, x, y)
        loss_gpu, _ = train_step(gpu, s_gpu, cp.asarray(x), cp.asarray(y))
        assert loss_gpu == pytest.approx(loss_cpu, rel=1e-3)
    for k, v in cpu.params.items():
        np.testing.assert_allclose(to_numpy(gpu.params[k]), v, rtol=1e-3, atol=1e-5)


def test_dropout_on_gpu_draws_the_cpu_masks_from_the_same_generator(cp):
    layer = Dropout("d", 0.4)
    layer.setup((6, 5, 5))
    x = np.random.default_rng(0).standard_normal((8, 6, 5, 5)).astype(np.float32)
    y, mask = layer.forward(x, train=True, rng=np.random.default_rng(9))
    yg, mask_g = layer.forward(cp.asarray(x), train=True, rng=np.random.default_rng(9))
    assert isinstance(yg, cp.ndarray) and isinstance(mask_g, cp.ndarray)
    np.testing.assert_array_equal(to_numpy(yg), y)
    dx, _ = layer.backward(np.ones_like(x), mask)
    dxg, _ = layer.backward(cp.ones_like(yg), mask_g)
    np.testing.assert_array_equal(to_numpy(dxg), dx)


def test_evaluate_and_train_arrays_take_numpy_data_on_a_cupy_net(cp):
    rng = np.random.default_rng(0)
    X = rng.random((40, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 40)
    cpu, gpu = zoo.lenet(seed=0), zoo.lenet(seed=0).to(cp)
    loss, acc = evaluate(cpu, X, y, batch_size=16)
    loss_g, acc_g = evaluate(gpu, X, y, batch_size=16)  # numpy labels meet CuPy logits
    assert loss_g == pytest.approx(loss, rel=1e-4) and acc_g == acc
    s_cpu, s_gpu = SGD.for_net(cpu, base_lr=0.01, momentum=0.9), SGD.for_net(gpu, base_lr=0.01, momentum=0.9)
    h = train_arrays(cpu, s_cpu, X, y, batch_size=8, iterations=4)
    h_g = train_arrays(gpu, s_gpu, X, y, batch_size=8, iterations=4)
    assert [r["loss"] for r in h_g] == pytest.approx([r["loss"] for r in h], rel=1e-3)


def test_load_state_dict_puts_momentum_on_the_net_s_device(cp):
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 16)
    cpu = zoo.lenet(seed=0)
    s_cpu = SGD.for_net(cpu, base_lr=0.01, momentum=0.9)
    train_step(cpu, s_cpu, x, y)
    gpu = zoo.lenet(seed=0).to(cp)
    gpu.set_params(cpu.get_params())
    s_gpu = SGD.for_net(gpu, base_lr=0.01, momentum=0.9)
    s_gpu.load_state_dict(s_cpu.state_dict(), like=gpu.params)
    assert all(isinstance(v, cp.ndarray) for v in s_gpu.history.values())
    train_step(cpu, s_cpu, x, y)
    train_step(gpu, s_gpu, cp.asarray(x), cp.asarray(y))  # raised on mixed arrays before
    for k, v in cpu.params.items():
        np.testing.assert_allclose(to_numpy(gpu.params[k]), v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_a_gpu_device_net_computes_and_moves_what_the_numpy_one_does(cp):
    conv, _ = zoo.lenet(seed=0).split_phases()
    weights = conv.get_params()
    x = np.random.default_rng(0).random((16, 1, 28, 28), dtype=np.float32)
    results, moved = [], []
    for device in ("cpu", "gpu:0"):
        dev = DeviceNet(conv, device)
        before = transfer_counts()
        acts, caches = dev.forward(weights, x, None)
        grads = dev.backward(weights, caches, np.ones_like(acts))
        after = transfer_counts()
        moved.append({k: after[k] - before[k] for k in after})
        assert isinstance(acts, np.ndarray) and all(isinstance(g, np.ndarray) for g in grads.values())
        results.append((acts, grads))
    assert moved[0] == moved[1]  # numpy counts exactly the copies the GPU makes
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-4, atol=1e-5)
    for k, g in results[0][1].items():
        np.testing.assert_allclose(results[1][1][k], g, rtol=1e-3, atol=1e-4, err_msg=k)


def test_the_fc_server_on_a_gpu_computes_with_cupy_and_saves_numpy(cp):
    _, fc = zoo.lenet(seed=0).split_phases()
    rng = np.random.default_rng(0)
    acts = rng.random((16, *fc.input_shape), dtype=np.float32)
    labels = rng.integers(0, 10, 16)
    cpu, gpu = FCServer(fc.copy(), 5e-4, 0), FCServer(fc.copy(), 5e-4, 0, device="gpu:0")
    assert all(isinstance(v, cp.ndarray) for v in gpu.net.params.values())
    for _ in range(3):
        out, out_g = cpu.step(acts, labels, 0.01, 0.9), gpu.step(acts, labels, 0.01, 0.9)
        assert isinstance(out_g["dacts"], np.ndarray)
        np.testing.assert_allclose(out_g["dacts"], out["dacts"], rtol=1e-3, atol=1e-6)
        assert out_g["loss"] == pytest.approx(out["loss"], rel=1e-4)
    state = gpu.get_state()
    assert all(isinstance(v, np.ndarray) for v in state["params"].values())
    assert all(isinstance(v, np.ndarray) for v in state["solver"]["history"].values())
    again = FCServer(fc.copy(), 5e-4, 0, device="gpu:0")
    again.set_state(state)  # momentum back on the device: the next step must not mix modules
    assert all(isinstance(v, cp.ndarray) for v in again.solver.history.values())
    np.testing.assert_allclose(
        again.step(acts, labels, 0.01, 0.9)["dacts"],
        cpu.step(acts, labels, 0.01, 0.9)["dacts"],
        rtol=1e-3,
        atol=1e-6,
    )
    proba = gpu.predict_proba(acts)
    assert isinstance(proba, np.ndarray) and proba.shape == (16, 10)


def test_numpy_labels_meet_cupy_logits_in_the_loss_and_accuracy(cp):
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 16)
    cpu, gpu = zoo.lenet(seed=0), zoo.lenet(seed=0).to(cp)
    loss, acc, grads = cpu.loss_and_grads(x, y)
    loss_g, acc_g, grads_g = gpu.loss_and_grads(cp.asarray(x), y)  # labels stay numpy
    assert loss_g == pytest.approx(loss, rel=1e-4) and acc_g == acc
    for k, g in grads.items():
        np.testing.assert_allclose(to_numpy(grads_g[k]), g, rtol=1e-3, atol=1e-5, err_msg=k)
