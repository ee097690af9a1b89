"""The CuPy path of every layer gives the numpy path's numbers (run with `-m gpu` on a CUDA machine)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import cupy_available, to_numpy
from dasknn.nn import zoo
from dasknn.nn.layers import LRN, Convolution, Filler, Flatten, InnerProduct, Pooling, ReLU
from dasknn.nn.solver import SGD
from dasknn.nn.train import train_step

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
