"""Net and solver files are checked against Caffe's schema: a misspelled field is refused, with
its layer, its line and the closest known field, before anything is built."""

from pathlib import Path

import pytest

from dasknn.nn.prototxt import PrototxtError, read_net, read_net_and_solver, read_solver
from tests.conftest import caffe_models_dir

MODELS = caffe_models_dir() or Path("absent")
pytestmark = pytest.mark.skipif(
    caffe_models_dir() is None, reason="Caffe model files not found: set DASKNN_CAFFE_MODELS"
)


def _misspell(path: Path, line_no: int, right: str, wrong: str, tmp_path: Path) -> Path:
    """A copy of `path` (in tmp_path, same name) with `right` written `wrong` on line `line_no`."""
    lines = path.read_text().split("\n")
    assert right in lines[line_no - 1], (path.name, line_no, lines[line_no - 1])
    lines[line_no - 1] = lines[line_no - 1].replace(right, wrong, 1)
    out = tmp_path / path.name
    out.write_text("\n".join(lines))
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in MODELS.glob("*.prototxt")))
def test_every_shared_caffe_file_passes_the_schema(name):
    path = MODELS / name
    if "solver" in name:
        assert read_solver(path)["base_lr"] > 0
    else:
        shape = None if name == "lenet.prototxt" else (3, 32, 32) if "cifar" in name else (1, 28, 28)
        shape = (3, 224, 224) if "googlenet" in name else shape
        assert read_net(path, input_shape=shape).layers


@pytest.mark.parametrize(
    "name, line, right, wrong, expected",
    [
        (
            "lenet_train_test.prototxt",
            50,
            "stride",
            "strde",
            "layer 'conv1' convolution_param: unknown field 'strde' .*did you mean 'stride'",
        ),
        (
            "lenet_train_test.prototxt",
            85,
            "weight_filler",
            "weight_filer",
            "layer 'conv2' convolution_param: unknown field 'weight_filer' .*did you mean 'weight_filler'",
        ),
        (
            "lenet_train_test.prototxt",
            116,
            "num_output",
            "num_ouput",
            "layer 'ip1' inner_product_param: unknown field 'num_ouput' .*did you mean 'num_output'",
        ),
        (
            "bvlc_googlenet_train_val.prototxt",
            758,
            "bias_filler",
            "bias_filer",
            "layer "
            "'inception_4a/5x5' convolution_param: unknown field 'bias_filer' .*did you mean 'bias_filler'",
        ),
    ],
)
def test_misspelled_field_in_a_real_net_is_refused_with_its_layer_and_line(
    name, line, right, wrong, expected, tmp_path
):
    path = _misspell(MODELS / name, line, right, wrong, tmp_path)
    with pytest.raises(PrototxtError, match=f"line {line}:.*{expected}") as info:
        read_net(path, input_shape=(3, 224, 224) if "googlenet" in name else (1, 28, 28))
    assert info.value.line == line and str(path) in str(info.value)


@pytest.mark.parametrize(
    "name, line, right, wrong, expected",
    [
        ("cifar10_quick_solver.prototxt", 12, "base_lr", "base_lrr", "did you mean 'base_lr'"),
        ("lenet_solver.prototxt", 11, "momentum", "momentun", "did you mean 'momentum'"),
    ],
)
def test_misspelled_field_in_a_real_solver_is_refused_with_its_line(
    name, line, right, wrong, expected, tmp_path
):
    net = "cifar10_quick_train_test.prototxt" if "cifar" in name else "lenet_train_test.prototxt"
    (tmp_path / net).write_text((MODELS / net).read_text())
    path = _misspell(MODELS / name, line, right, wrong, tmp_path)
    with pytest.raises(PrototxtError, match=f"line {line}:.*solver: unknown field '{wrong}'.*{expected}"):
        read_net_and_solver(path, input_shape=(3, 32, 32) if "cifar" in name else (1, 28, 28))


NET = """name: "n"
layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 1 dim: 1 dim: 8 dim: 8 }} }} }}
layer {{ name: "c" type: "Convolution" bottom: "data" top: "c"
  {body} }}
"""


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "num_output: 2 convolution_param { kernel_size: 3 }",
            "line 4:.*layer 'c': unknown field 'num_output' .*is a field of ConvolutionParameter",
        ),
        (
            "convolution_param { num_output: 2 kernel_size: 3 weight_filler: 'xavier' }",
            "line 4:.*layer 'c' convolution_param: field 'weight_filler' is a block",
        ),
        (
            "convolution_param { num_output: 2 kernel_size: 3 engine: CUDA }",
            "line 4:.*convolution_param: field 'engine' must be one of DEFAULT, CAFFE, CUDNN, got 'CUDA'",
        ),
        (
            "convolution_param { num_output: 2 kernel_size: 3 group: 1 group: 1 }",
            "line 4:.*convolution_param: field 'group' is given 2 times",
        ),
        (
            "convolution_param { num_output: 2 kernel_size: 3 frobnicate: 1 }",
            "unknown field 'frobnicate' \\(ConvolutionParameter has no such field\\)$",
        ),
    ],
)
def test_schema_errors_name_the_problem(body, expected):
    with pytest.raises(PrototxtError, match=expected):
        read_net(NET.format(body=body))


def test_a_solver_field_inside_an_inline_net_is_checked():
    text = 'lr_policy: "fixed" net_param { layer { name: "x" type: "ReLU" relu_param { slope: 0 } } }'
    with pytest.raises(PrototxtError, match="solver net_param layer 'x' relu_param: unknown field 'slope'"):
        read_solver(text)
