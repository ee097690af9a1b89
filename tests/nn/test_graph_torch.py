"""A residual block and an Inception module against PyTorch, forward and backward, in float64 on
random inputs (opt-in: `-m bench`, skipped without torch)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn.layers import Convolution, Filler, InnerProduct, Pooling, ReLU
from dasknn.nn.merge import Concat
from dasknn.nn.net import Net
from dasknn.nn.zoo import residual_block

pytestmark = pytest.mark.bench
torch = pytest.importorskip("torch")
F = torch.nn.functional


def randomise(net, seed):
    """Random values for every learned parameter (BatchNorm's statistics stay Caffe's zeros)."""
    rng = np.random.default_rng(seed)
    net.set_params(
        {
            k: rng.standard_normal(v.shape) * 0.3 if k not in net.statistics else v
            for k, v in net.params.items()
        }
    )
    return {k: torch.tensor(v, requires_grad=k not in net.statistics) for k, v in net.params.items()}


def compare(net, reference, x, labels, seed=1):
    """Our train_step against PyTorch's autograd of the same function: loss, dx and every gradient."""
    p = randomise(net, seed)
    ours = net.train_step(x, labels, need_dx=True)
    xt = torch.tensor(x, requires_grad=True)
    loss = F.cross_entropy(reference(xt, p), torch.tensor(labels))
    loss.backward()
    assert ours["loss"] == pytest.approx(loss.item(), rel=1e-10)
    np.testing.assert_allclose(ours["dx"], xt.grad.numpy(), rtol=1e-7, atol=1e-12)
    for key, t in p.items():
        if t.requires_grad:
            np.testing.assert_allclose(ours["grads"][key], t.grad.numpy(), rtol=1e-7, atol=1e-12, err_msg=key)


def bn(x, p, name):
    """Caffe's BatchNorm (batch statistics, biased variance) + Scale with bias, in PyTorch."""
    y = F.batch_norm(x, None, None, training=True, eps=1e-5)
    return y * p[f"{name}/scale.weight"].view(1, -1, 1, 1) + p[f"{name}/scale.bias"].view(1, -1, 1, 1)


def test_residual_block_matches_pytorch():
    entries, top = residual_block("res", "data", 3, 4, stride=2)
    net = Net([*entries, (InnerProduct("fc", 5), top, "fc")], (3, 6, 6), dtype=np.float64)

    def reference(x, p):
        h = F.relu(bn(F.conv2d(x, p["res/conv1.weight"], stride=2, padding=1), p, "res/conv1"))
        h = bn(F.conv2d(h, p["res/conv2.weight"], padding=1), p, "res/conv2")
        s = bn(F.conv2d(x, p["res/proj.weight"], stride=2), p, "res/proj")
        y = F.relu(h + s)
        return y.flatten(1) @ p["fc.weight"].T + p["fc.bias"]

    rng = np.random.default_rng(0)
    compare(net, reference, rng.standard_normal((4, 3, 6, 6)), np.array([0, 4, 2, 1]))


def test_inception_module_matches_pytorch():
    g = Filler("gaussian", std=0.3)

    def conv(name, n, k, bottom):
        return (Convolution(name, n, k, pad=k // 2, weight_filler=g), bottom, name)

    entries = [
        conv("1x1", 2, 1, "data"),
        conv("3x3_reduce", 2, 1, "data"),
        (ReLU("relu_3x3_reduce"), "3x3_reduce", "3x3_reduce"),
        conv("3x3", 3, 3, "3x3_reduce"),
        conv("5x5_reduce", 1, 1, "data"),
        conv("5x5", 2, 5, "5x5_reduce"),
        (Pooling("pool", "max", 3, stride=1, pad=1), "data", "pool"),
        conv("pool_proj", 2, 1, "pool"),
        (Concat("output"), ["1x1", "3x3", "5x5", "pool_proj"], "output"),
        (ReLU("relu"), "output", "output"),
        (InnerProduct("fc", 4), "output", "fc"),
    ]
    net = Net(entries, (3, 5, 5), dtype=np.float64)

    def reference(x, p):
        def c(name, h, k):
            return F.conv2d(h, p[f"{name}.weight"], p[f"{name}.bias"], padding=k // 2)

        branches = [
            c("1x1", x, 1),
            c("3x3", F.relu(c("3x3_reduce", x, 1)), 3),
            c("5x5", c("5x5_reduce", x, 1), 5),
            c("pool_proj", F.max_pool2d(x, 3, stride=1, padding=1), 1),
        ]
        y = F.relu(torch.cat(branches, dim=1))
        return y.flatten(1) @ p["fc.weight"].T + p["fc.bias"]

    rng = np.random.default_rng(1)
    compare(net, reference, rng.standard_normal((3, 3, 5, 5)), np.array([3, 0, 1]))
