"""Reading graph nets from prototxt: a deploy file with the old `input:`/`input_dim:` header and an
Inception-style Concat, a residual block with BatchNorm/Scale/Eltwise, weighted loss heads."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn.merge import Concat, Eltwise
from dasknn.nn.normalization import BatchNorm, Scale
from dasknn.nn.prototxt import read_net
from dasknn.nn.textformat import PrototxtError

AT = "^line [0-9]+:[0-9]+: "  # where a layer's error is written in the file

DEPLOY = """
name: "mini_inception"
input: "data"
input_dim: 10
input_dim: 3
input_dim: 8
input_dim: 8
layer { name: "a" type: "Convolution" bottom: "data" top: "a"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "b" type: "Convolution" bottom: "data" top: "b"
        convolution_param { num_output: 2 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu_b" type: "ReLU" bottom: "b" top: "b" }
layer { name: "p" type: "Pooling" bottom: "data" top: "p"
        pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" bottom: "p" top: "cat" }
layer { name: "gap" type: "Pooling" bottom: "cat" top: "gap"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "gap" top: "fc"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

RESIDUAL = """
name: "mini_resnet"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "msra" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
        param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 }
        batch_norm_param { moving_average_fraction: 0.9 } }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "sum" type: "Eltwise" bottom: "conv" bottom: "data" top: "sum"
        eltwise_param { operation: SUM coeff: 1 coeff: -1 } }
layer { name: "relu" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "aux" type: "InnerProduct" bottom: "conv" top: "aux" inner_product_param { num_output: 3 } }
layer { name: "aux_loss" type: "SoftmaxWithLoss" bottom: "aux" bottom: "label" top: "aux_loss"
        loss_weight: 0.25 }
layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "fc" bottom: "label" top: "acc" }
"""


def test_deploy_file_with_input_dim_header_and_concat():
    net = read_net(DEPLOY)
    assert net.input_shape == (3, 8, 8) and net.name == "mini_inception"
    assert isinstance(net.layer("cat"), Concat) and net.layer("cat").out_shape == (4 + 2 + 3, 8, 8)
    assert net.layer("gap").out_shape == (9, 1, 1) and net.output_shape == (5,)
    assert net.bottoms[net.layers.index(net.layer("cat"))] == ["a", "b@relu_b", "p"]
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(net.predict_proba(x).sum(axis=1), 1, rtol=1e-6)


def test_residual_prototxt_with_batchnorm_scale_eltwise_and_two_losses():
    net = read_net(RESIDUAL)
    bn, scale, eltwise = net.layer("bn"), net.layer("scale"), net.layer("sum")
    assert isinstance(bn, BatchNorm) and bn.moving_average_fraction == 0.9 and bn.use_global_stats is None
    assert isinstance(scale, Scale) and scale.bias_term
    assert isinstance(eltwise, Eltwise) and eltwise.coeff == (1.0, -1.0)
    assert net.loss_weights == {"fc": 1.0, "aux": 0.25}
    assert net.layers[-1].name == "fc" and set(net.statistics) == {
        "bn.mean",
        "bn.variance",
        "bn.scale_factor",
    }
    conv, fc = net.split_phases()
    assert [lr.name for lr in fc.layers] == ["fc", "aux"]
    rng = np.random.default_rng(1)
    out = net.train_step(rng.standard_normal((4, 2, 6, 6)).astype(np.float32), np.array([0, 1, 2, 0]))
    assert out["loss"] > out["main_loss"] > 0


def test_graph_prototxt_errors_name_the_layer():
    bad_bottom = DEPLOY.replace('bottom: "p" top: "cat"', 'bottom: "q" top: "cat"')
    with pytest.raises(PrototxtError, match=AT + "layer 'cat': needs bottoms written by earlier layers"):
        read_net(bad_bottom)
    bad_bn = RESIDUAL.replace("param { lr_mult: 0 } param", "param { lr_mult: 1 } param")
    with pytest.raises(PrototxtError, match=AT + "layer 'bn': BatchNorm's blobs are statistics"):
        read_net(bad_bn)
    reads_label = RESIDUAL.replace('bottom: "sum" top: "fc"', 'bottom: "label" top: "fc"')
    with pytest.raises(PrototxtError, match=AT + "layer 'fc': needs bottoms .* got bottom \\['label'\\]"):
        read_net(reads_label)
    after_loss = RESIDUAL.replace(
        'layer { name: "acc"',
        'layer { name: "late" type: "ReLU" bottom: "aux" top: "aux" }\nlayer { name: "acc"',
    )
    with pytest.raises(PrototxtError, match=AT + "layer 'late': comes after the loss \\(layer 'aux_loss'\\)"):
        read_net(after_loss)
    with pytest.raises(PrototxtError, match="concat_param: only axis 1"):
        read_net(DEPLOY.replace('top: "cat" }', 'top: "cat" concat_param { axis: 2 } }'))
