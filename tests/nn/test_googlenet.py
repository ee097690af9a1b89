"""GoogLeNet (Szegedy et al. 2015) from Caffe's bvlc_googlenet train_val.prototxt: its parameter
count and FLOPs against values derived here from the paper's Table 1 shapes, one forward + backward
at batch 2 on 224×224 input, its solver, and what the phase split does with its auxiliary heads."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest

from dasknn.nn.prototxt import read_net, read_net_and_solver
from dasknn.tradeoff.hardware import phase_costs

# Inception modules (Table 1): name, input channels, size, #1×1, #3×3 reduce, #3×3, #5×5 reduce,
# #5×5, pool proj
INCEPTION = [
    ("3a", 192, 28, 64, 96, 128, 16, 32, 32),
    ("3b", 256, 28, 128, 128, 192, 32, 96, 64),
    ("4a", 480, 14, 192, 96, 208, 16, 48, 64),
    ("4b", 512, 14, 160, 112, 224, 24, 64, 64),
    ("4c", 512, 14, 128, 128, 256, 24, 64, 64),
    ("4d", 512, 14, 112, 144, 288, 32, 64, 64),
    ("4e", 528, 14, 256, 160, 320, 32, 128, 128),
    ("5a", 832, 7, 256, 160, 320, 32, 128, 128),
    ("5b", 832, 7, 384, 192, 384, 48, 128, 128),
]


def conv(c_in, c_out, k, size):
    """(parameters with bias, forward FLOPs per image) of a k×k convolution with a size×size output."""
    return c_out * c_in * k * k + c_out, 2 * c_out * c_in * k * k * size * size


def fc(n_in, n_out):
    return n_out * n_in + n_out, 2 * n_out * n_in


def by_hand():
    """Weighted layers of GoogLeNet with its two auxiliary heads, from the layer shapes alone."""
    layers = [conv(3, 64, 7, 112), conv(64, 64, 1, 56), conv(64, 192, 3, 56)]
    for _, c, s, n1, r3, n3, r5, n5, pp in INCEPTION:
        layers += [conv(c, n1, 1, s), conv(c, r3, 1, s), conv(r3, n3, 3, s)]
        layers += [conv(c, r5, 1, s), conv(r5, n5, 5, s), conv(c, pp, 1, s)]
    for c in (512, 528):  # loss1 after 4a, loss2 after 4d: 5×5/3 average pool to 4×4, 1×1 conv to 128
        layers += [conv(c, 128, 1, 4), fc(128 * 4 * 4, 1024), fc(1024, 1000)]
    layers.append(fc(1024, 1000))  # loss3/classifier
    return sum(p for p, _ in layers), sum(f for _, f in layers)


@pytest.fixture(scope="module")
def googlenet():
    from tests.conftest import caffe_models_dir

    path = caffe_models_dir()
    if path is None:
        pytest.skip("Caffe model files not found")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # crop_size and mirror are read (`read_augment`), not warned about
        return read_net(path / "bvlc_googlenet_train_val.prototxt", input_shape=(3, 224, 224))


def test_googlenet_parameters_and_flops_match_the_layer_shapes(googlenet):
    params, flops = by_hand()
    assert params == 13_378_280
    assert googlenet.n_params == params
    s = googlenet.summary()
    weighted = s[s["type"].isin(["Convolution", "InnerProduct"])]
    assert int(weighted["flops"].sum()) == flops
    assert len(weighted) == 3 + 6 * 9 + 3 * 2 + 1
    assert dict(googlenet.loss_weights) == {
        "loss3/classifier": 1.0,
        "loss1/classifier": 0.3,
        "loss2/classifier": 0.3,
    }


def test_googlenet_forward_and_backward_at_batch_2(googlenet):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    out = googlenet.train_step(x, np.array([3, 999]), rng=np.random.default_rng(1))
    assert np.isfinite(out["loss"]) and out["loss"] > out["main_loss"] > 0
    assert set(out["grads"]) == set(googlenet.params)
    assert all(np.isfinite(g).all() for g in out["grads"].values())
    assert out["grads"]["conv1/7x7_s2.weight"].shape == (64, 3, 7, 7)
    assert np.abs(out["grads"]["loss1/fc.weight"]).sum() > 0  # the auxiliary heads are trained too


def test_googlenet_phase_split_puts_the_auxiliary_classifiers_on_the_fc_server(googlenet):
    conv, fc = googlenet.split_phases()
    assert fc.layers[0].name == "loss3/classifier"
    assert {lr.name for lr in fc.layers} == {
        "loss3/classifier",
        *(f"loss{i}/{n}" for i in (1, 2) for n in ("fc", "relu_fc", "drop_fc", "classifier")),
    }
    # 4×4×128 from each auxiliary head and 1024 from the main path cross the split
    assert conv.output_shape == fc.input_shape == (2 * 2048 + 1024,)
    costs = phase_costs(googlenet, 32)
    assert costs["split_activation_bytes"] == 32 * 4 * (2 * 2048 + 1024)
    aux = 2048 * 1024 + 1024 + 1024 * 1000 + 1000  # loss{1,2}/fc and loss{1,2}/classifier
    assert costs["fc_model_bytes"] == 4 * (2 * aux + 1024 * 1000 + 1000)
    assert costs["conv_model_bytes"] == 4 * googlenet.n_params - costs["fc_model_bytes"]


def test_googlenet_solver_reads_with_its_net(caffe_models, tmp_path):
    shutil.copy(caffe_models / "bvlc_googlenet_quick_solver.prototxt", tmp_path / "solver.prototxt")
    shutil.copy(caffe_models / "bvlc_googlenet_train_val.prototxt", tmp_path / "train_val.prototxt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net, solver = read_net_and_solver(tmp_path / "solver.prototxt", input_shape=(3, 224, 224))
    assert (solver["lr_policy"], solver["power"], solver["max_iter"]) == ("poly", 0.5, 2_400_000)
    assert solver["weight_decay"] == pytest.approx(0.0002)
    assert net.name == "GoogleNet" and len(net.loss_weights) == 3
