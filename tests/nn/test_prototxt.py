"""Reading Caffe prototxt: the text-format parser, solver settings, and nets built from layers."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dasknn.data import Transform
from dasknn.nn import zoo
from dasknn.nn.layers import Filler
from dasknn.nn.prototxt import read_net, read_net_and_solver, read_solver
from dasknn.nn.textformat import MAX_DEPTH, PrototxtError, get_one, parse_prototxt

AT = "^line [0-9]+:[0-9]+: "  # where a layer's error is written in the file

LENET_CHAIN = ["conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"]


INPUT = (
    'name: "t"\nlayer { name: "d" type: "Input" top: "data" '
    "input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }\n"
)


def net_text(*layers: str, head: str = INPUT) -> str:
    """A small net: by default an Input layer of shape (3, 8, 8), then `layers` (`layer { ... }` bodies)."""
    return head + "".join(f"layer {{ {body} }}\n" for body in layers)


def layer(name: str, ltype: str, bottom: str = "data", top: str | None = None, extra: str = "") -> str:
    """The body of a `layer { ... }` block."""
    return f'name: "{name}" type: "{ltype}" bottom: "{bottom}" top: "{top or name}" {extra}'


# -- parser ---------------------------------------------------------------------------------------
def test_parse_lenet_train_test_keeps_repeated_fields_in_order(caffe_models):
    net = parse_prototxt((caffe_models / "lenet_train_test.prototxt").read_text())
    assert net["name"] == ["LeNet"]
    data = [layer for layer in net["layer"] if layer["type"] == ["Data"]]
    assert len(data) == 2
    assert [d["include"][0]["phase"] for d in data] == [["TRAIN"], ["TEST"]]
    assert data[0]["top"] == ["data", "label"]
    assert data[0]["transform_param"][0]["scale"] == [0.00390625]
    assert data[1]["data_param"][0]["batch_size"] == [100]
    conv1 = net["layer"][2]
    assert [p["lr_mult"] for p in conv1["param"]] == [[1], [2]]
    assert conv1["convolution_param"][0]["weight_filler"][0]["type"] == ["xavier"]


def test_parse_types_each_scalar():
    msg = parse_prototxt(
        "i: 42 n: -7 h: 0x1F o: 017 f: 1e-4 g: -.5 d: 1. s: 2.5f\n"
        "p: inf q: -inf r: nan b: true c: false e: MAX\n"
        's1: "dq" s2: \'sq\' s3: "a\\tb\\n\\"\\\'\\\\" s4: "\\101\\x42\\u00e9" s5: "ab" \'cd\'\n'
    )
    one = {k: get_one(msg, k) for k in msg}
    assert one["i"] == 42 and type(one["i"]) is int and one["n"] == -7
    assert one["h"] == 31 and one["o"] == 15
    assert one["f"] == 1e-4 and one["g"] == -0.5 and one["d"] == 1.0 and one["s"] == 2.5
    assert type(one["d"]) is float
    assert one["p"] == math.inf and one["q"] == -math.inf and math.isnan(one["r"])
    assert one["b"] is True and one["c"] is False and one["e"] == "MAX"
    assert [one[f"s{i}"] for i in range(1, 6)] == ["dq", "sq", "a\tb\n\"'\\", "ABé", "abcd"]


def test_parse_message_forms_comments_separators_and_lists():
    msg = parse_prototxt(
        "# a comment\n"
        "a { x: 1 } a: { x: 2; } a < x: 3 >,  # trailing comment\n"
        "b: [1, 2.5, FOO] b: 4; c: []\n"
        "d { e { f { g: 'deep' } } }"
    )
    assert msg["a"] == [{"x": [1]}, {"x": [2]}, {"x": [3]}]
    assert msg["b"] == [1, 2.5, "FOO", 4] and msg["c"] == []
    assert msg["d"][0]["e"][0]["f"][0]["g"] == ["deep"]
    assert parse_prototxt("") == {} and parse_prototxt("  # only a comment\n") == {}


def test_get_one_defaults_and_rejects_repeats():
    msg = parse_prototxt("a: 1 b: 2 b: 3")
    assert get_one(msg, "a") == 1 and get_one(msg, "zzz", 5) == 5
    with pytest.raises(PrototxtError, match="field 'b' is given 2 times"):
        get_one(msg, "b")


@pytest.mark.parametrize(
    "text, position, message",
    [
        ("a {\n  b: 1\n", "line 1:3", "'{' opened here is never closed"),
        ("a: 1\n}", "line 2:1", "unexpected '}'"),
        ("a {\n  b 1\n}", "line 2:5", "expected ':' or '{' after field 'b'"),
        ('a: 1\nb: "x\\q"', "line 2:4", r"unknown escape \\q"),
        ("a: 'open\n'", "line 1:4", "unterminated string"),
        ("a: 1.2.3", "line 1:4", "malformed number"),
        ("a: 09", "line 1:4", "invalid octal number 09"),
        ("  : 1", "line 1:3", "expected a field name"),
        ("a: }", "line 1:4", "expected a value"),
        ("a: -foo", "line 1:4", "'-' must precede a number"),
        ("a { b: 1 >", "line 1:10", "unexpected '>', expected '}'"),
        ("a: [1 2]", "line 1:7", "expected ',' or ']'"),
        ("a: 1 @", "line 1:6", "unexpected character '@'"),
        ("a: '\\xff'", "line 1:4", "not valid UTF-8"),
    ],
)
def test_parse_errors_give_line_and_column(text, position, message):
    with pytest.raises(PrototxtError, match=message) as info:
        parse_prototxt(text)
    assert str(info.value).startswith(position)
    line, column = (int(n) for n in position.split()[1].split(":"))
    assert (info.value.line, info.value.column) == (line, column)


def test_parse_error_names_the_file(tmp_path):
    path = tmp_path / "bad_solver.prototxt"
    path.write_text("base_lr: 0.1\nlr_policy: 'fixed\n")
    with pytest.raises(PrototxtError, match=r"bad_solver.prototxt, line 2:12: unterminated string$"):
        read_solver(path)


def test_parse_guards_nesting_depth():
    assert parse_prototxt("a {" * MAX_DEPTH + "}" * MAX_DEPTH)["a"]
    with pytest.raises(PrototxtError, match=f"nested deeper than {MAX_DEPTH}"):
        parse_prototxt("a {" * (MAX_DEPTH + 1) + "}" * (MAX_DEPTH + 1))
    with pytest.raises(PrototxtError, match="nested deeper"):
        parse_prototxt("a {" * 100_000)


FRAGMENTS = [
    "layer",
    "name",
    " ",
    "\n",
    "{",
    "}",
    "<",
    ">",
    "[",
    "]",
    ":",
    ",",
    ";",
    "#",
    '"',
    "'",
    "\\",
    "\\x",
    "\\u00",
    "\\U0011",
    "\\777",
    "1",
    "0x",
    "09",
    "-",
    ".",
    "e",
    "1e-4",
    "-.5",
    "inf",
    "nan",
    "true",
    "MAX",
    "é",
    "\x00",
    "\ud800",
    "\t",
]
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)))
def test_parse_random_text_raises_only_prototxt_error(text):
    for read in (parse_prototxt, read_solver, read_net):
        try:
            read(text + "\n")  # two lines: always text, never a path
        except PrototxtError:
            pass


def mutate(text: str, edits: list[tuple[str, int, str]]) -> str:
    for op, at, fragment in edits:
        at %= len(text) + 1
        text = {
            "insert": text[:at] + fragment + text[at:],
            "delete": text[:at] + text[at + 1 :],
            "replace": text[:at] + fragment + text[at + 1 :],
        }[op]
    return text


def edits(fragments: list[str], max_size: int) -> st.SearchStrategy:
    op = st.sampled_from(["insert", "delete", "replace"])
    edit = st.tuples(op, st.integers(0, 10_000), st.sampled_from(fragments))
    return st.lists(edit, min_size=1, max_size=max_size)


MODEL_FILES = [
    "lenet_train_test",
    "lenet",
    "lenet_solver",
    "cifar10_quick_train_test",
    "cifar10_quick_solver",
]


@FUZZ
@given(name=st.sampled_from(MODEL_FILES), changes=edits(FRAGMENTS, 6))
def test_parse_mutated_caffe_files_raises_only_prototxt_error(caffe_models, name, changes):
    text = mutate((caffe_models / f"{name}.prototxt").read_text(), changes)
    try:
        parse_prototxt(text)
    except PrototxtError:
        pass


NO_DIGITS = [f for f in FRAGMENTS if not any(c.isdigit() for c in f)] + ["STOCHASTIC", "AVE", "dilation: 2"]


@settings(FUZZ, max_examples=60)
@given(name=st.sampled_from(MODEL_FILES), changes=edits(NO_DIGITS, 3))
def test_read_mutated_caffe_files_raises_only_prototxt_error(caffe_models, name, changes):
    """No digits are inserted, so a mutated net stays small enough to build."""
    text = mutate((caffe_models / f"{name}.prototxt").read_text(), changes)
    try:
        if name.endswith("solver"):
            read_solver(text)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            read_net(text, input_shape=(1, 28, 28) if "lenet" in name else (3, 32, 32))
    except PrototxtError:
        pass


# -- solver ---------------------------------------------------------------------------------------
def test_read_solver_lenet_values_and_types(caffe_models):
    solver = read_solver(caffe_models / "lenet_solver.prototxt")
    assert solver["net"] == "examples/mnist/lenet_train_test.prototxt"
    assert solver["base_lr"] == 0.01 and solver["lr_policy"] == "inv"
    assert solver["gamma"] == 1e-4 and solver["power"] == 0.75
    assert solver["momentum"] == 0.9 and solver["weight_decay"] == 5e-4
    assert solver["max_iter"] == 10000 and type(solver["max_iter"]) is int
    assert solver["test_iter"] == [100] and solver["test_interval"] == 500 and solver["display"] == 100
    assert solver["snapshot"] == 5000 and solver["snapshot_prefix"] == "examples/mnist/lenet"
    assert solver["solver_mode"] == "GPU" and solver["type"] == "SGD"


def test_read_solver_cifar10_quick(caffe_models):
    solver = read_solver(str(caffe_models / "cifar10_quick_solver.prototxt"))
    assert (solver["base_lr"], solver["momentum"], solver["weight_decay"]) == (0.001, 0.9, 0.004)
    assert solver["lr_policy"] == "fixed" and solver["max_iter"] == 4000 and solver["snapshot"] == 4000
    assert type(solver["base_lr"]) is float and solver["gamma"] == 0.0


def test_read_solver_fills_caffe_defaults():
    solver = read_solver('lr_policy: "fixed"')
    assert solver["base_lr"] == 0.0 and solver["momentum"] == 0.0 and solver["weight_decay"] == 0.0
    assert solver["gamma"] == 0.0 and solver["power"] == 0.0 and solver["stepsize"] == 0
    assert solver["stepvalue"] == [] and solver["test_iter"] == [] and solver["iter_size"] == 1
    assert solver["clip_gradients"] == -1.0 and solver["random_seed"] == -1
    assert solver["regularization_type"] == "L2" and solver["solver_mode"] == "GPU"
    assert solver["type"] == "SGD" and solver["max_iter"] == 0 and solver["average_loss"] == 1
    assert "net" not in solver and "snapshot_prefix" not in solver


def test_read_solver_lists_and_upgrades():
    solver = read_solver(
        "lr_policy: 'multistep' gamma: 0.1 stepvalue: 100 stepvalue: 200\nsolver_type: SGD solver_mode: 0"
    )
    assert solver["stepvalue"] == [100, 200] and solver["gamma"] == 0.1
    assert solver["type"] == "SGD" and "solver_type" not in solver
    assert solver["solver_mode"] == "CPU"
    with pytest.raises(PrototxtError, match="line 1:1: solver: unknown field 'my_field'"):
        read_solver("my_field: 3 lr_policy: 'fixed'")


@pytest.mark.parametrize(
    "text, message",
    [
        ("base_lr: 0.1", "lr_policy must be one of .*got None \\(Caffe has no default for it\\)"),
        ("lr_policy: 'cosine'", "lr_policy must be one of fixed, step, .*got 'cosine'"),
        ("lr_policy: 'fixed' type: 'Adam'", "solver type 'Adam' is not supported: dasknn only supports SGD"),
        ("lr_policy: 'fixed' solver_type: NESTEROV", "solver type 'Nesterov' is not supported"),
        ("lr_policy: 'fixed' type: 'SGD' solver_type: SGD", "either 'type' or the deprecated 'solver_type'"),
        ("lr_policy: 'step'", "lr_policy 'step' needs a stepsize > 0"),
        ("lr_policy: 'fixed' base_lr: 'big'", "field 'base_lr' must be a number, got 'big'"),
        ("lr_policy: 'fixed' max_iter: 1.5", "field 'max_iter' must be an integer, got 1.5"),
        ("lr_policy: 'fixed' solver_mode: TPU", "field 'solver_mode' must be one of CPU, GPU, got 'TPU'"),
        ("lr_policy: 'fixed' momentum: 0.9 momentum: 0.8", "field 'momentum' is given 2 times"),
        ("lr_policy: 'fixed' test_iter: true", "field 'test_iter' must be an integer, got True"),
    ],
)
def test_read_solver_errors(text, message):
    with pytest.raises(PrototxtError, match=message):
        read_solver(text)


def test_read_solver_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_solver(tmp_path / "nope.prototxt")
    with pytest.raises(FileNotFoundError):
        read_solver("nope_solver.prototxt")


# -- net ------------------------------------------------------------------------------------------
def test_read_net_lenet_train_chain_and_hyperparameters(caffe_models):
    net = read_net(caffe_models / "lenet_train_test.prototxt", input_shape=(1, 28, 28))
    assert net.name == "LeNet" and net.input_shape == (1, 28, 28)
    assert [layer.name for layer in net.layers] == LENET_CHAIN
    assert [layer.type for layer in net.layers] == [
        "Convolution",
        "Pooling",
        "Convolution",
        "Pooling",
        "InnerProduct",
        "ReLU",
        "InnerProduct",
    ]
    conv1, pool1, conv2, _, ip1, _, ip2 = net.layers
    assert (conv1.num_output, conv1.kernel_size, conv1.stride, conv1.pad) == (20, (5, 5), (1, 1), (0, 0))
    assert conv1.lr_mult == {"weight": 1.0, "bias": 2.0} and conv1.decay_mult == {"weight": 1.0, "bias": 1.0}
    assert conv1.weight_filler == Filler("xavier") and conv1.bias_filler == Filler("constant")
    assert (pool1.pool, pool1.kernel_size, pool1.stride) == ("max", (2, 2), (2, 2))
    assert conv2.num_output == 50 and ip1.num_output == 500 and ip2.num_output == 10
    assert net.transform == {"scale": 0.00390625}
    pixels = np.full((1, 1, 28, 28), 255.0)
    assert Transform(**net.transform)(pixels).max() == pytest.approx(255 / 256)
    assert net.shapes == [
        ("conv1", (20, 24, 24)),
        ("pool1", (20, 12, 12)),
        ("conv2", (50, 8, 8)),
        ("pool2", (50, 4, 4)),
        ("ip1", (500,)),
        ("relu1", (500,)),
        ("ip2", (10,)),
    ]


def test_read_net_test_phase_drops_accuracy_and_keeps_the_same_chain(caffe_models):
    net = read_net(caffe_models / "lenet_train_test.prototxt", phase="test", input_shape=(1, 28, 28))
    assert [layer.name for layer in net.layers] == LENET_CHAIN


def test_read_net_lenet_equals_zoo_lenet(caffe_models):
    net = read_net(caffe_models / "lenet_train_test.prototxt", input_shape=(1, 28, 28))
    reference = zoo.lenet()
    assert net.architecture() == reference.architecture()
    assert net.shapes == reference.shapes
    params, expected = net.get_params(), reference.get_params()
    assert params.keys() == expected.keys()
    assert all(np.array_equal(params[k], expected[k]) for k in params)


def test_read_net_cifar10_quick_equals_zoo(caffe_models):
    with pytest.warns(UserWarning, match="layer 'cifar': transform_param mean_file ignored"):
        net = read_net(caffe_models / "cifar10_quick_train_test.prototxt", input_shape=(3, 32, 32))
    types = [layer.type for layer in net.layers]
    assert (
        types.count("Convolution"),
        types.count("Pooling"),
        types.count("ReLU"),
        types.count("InnerProduct"),
    ) == (3, 3, 3, 2)
    assert [layer.pool for layer in net.layers if layer.type == "Pooling"] == ["max", "ave", "ave"]
    conv1 = net.layer("conv1")
    assert conv1.weight_filler == Filler("gaussian", std=0.0001) and conv1.pad == (2, 2)
    assert net.transform is None and net.output_shape == (10,)
    assert net.architecture() == zoo.cifar10_quick().architecture()


def test_read_net_deploy_takes_input_shape_from_input_layer(caffe_models):
    net = read_net(caffe_models / "lenet.prototxt", phase="TEST")
    assert net.input_shape == (1, 28, 28) and [layer.name for layer in net.layers] == LENET_CHAIN
    assert net.transform is None
    assert read_net(caffe_models / "lenet.prototxt", input_shape=(1, 32, 32)).input_shape == (1, 32, 32)


def test_read_net_accepts_text_and_parsed_messages():
    text = net_text(
        layer(
            "c",
            "Convolution",
            extra="convolution_param { num_output: 4 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride: 2 }",
        ),
        layer("r", "ReLU", "c", "c", "relu_param { negative_slope: 0.1 }"),
        layer("f", "Flatten", "c"),
        layer("d", "Dropout", "f", "f", "dropout_param { dropout_ratio: 0.3 }"),
        layer(
            "p",
            "InnerProduct",
            "f",
            extra="param { lr_mult: 0 decay_mult: 0 } inner_product_param { num_output: 2 bias_term: false }",
        ),
        'name: "l" type: "SoftmaxWithLoss" bottom: "p" bottom: "label" top: "l"',
    )
    for source in (text, parse_prototxt(text)):
        net = read_net(source)
        c, r, f, d, p = net.layers
        assert (c.kernel_size, c.pad, c.stride) == ((3, 1), (1, 0), (2, 2))
        assert c.weight_filler == Filler() and c.bias_filler == Filler()
        assert r.negative_slope == 0.1 and d.dropout_ratio == 0.3 and f.type == "Flatten"
        assert p.bias_term is False and p.lr_mult == {"weight": 0.0, "bias": 1.0}
        assert p.decay_mult == {"weight": 0.0, "bias": 1.0}
        assert net.shapes == [("c", (4, 4, 4)), ("r", (4, 4, 4)), ("f", (64,)), ("d", (64,)), ("p", (2,))]


def test_read_net_lrn_pooling_and_fillers():
    net = read_net(
        net_text(
            layer(
                "n",
                "LRN",
                extra="lrn_param { local_size: 3 alpha: 5e-05 beta: 0.75 norm_region: WITHIN_CHANNEL }",
            ),
            layer("g", "Pooling", "n", extra="pooling_param { pool: AVE global_pooling: true }"),
            layer(
                "p",
                "InnerProduct",
                "g",
                extra="inner_product_param { num_output: 2 "
                "weight_filler { type: 'msra' variance_norm: AVERAGE } "
                "bias_filler { value: 0.2 } }",
            ),
        )
    )
    n, g, p = net.layers
    assert (n.local_size, n.alpha, n.beta, n.k, n.norm_region) == (3, 5e-05, 0.75, 1.0, "within_channel")
    assert g.pool == "ave" and g.global_pooling and net.shapes[1] == ("g", (3, 1, 1))
    assert p.weight_filler == Filler("msra", variance_norm="average") and p.bias_filler == Filler(value=0.2)


def test_read_net_legacy_inputs_dummy_and_memory_data():
    relu = layer("r", "ReLU", top="data")
    legacy = 'input: "data" input_dim: 1 input_dim: 2 input_dim: 5 input_dim: 6\n'
    assert read_net(net_text(relu, head=legacy)).input_shape == (2, 5, 6)
    shape = 'input: "data" input_shape { dim: 1 dim: 3 dim: 4 dim: 4 }\n'
    assert read_net(net_text(relu, head=shape)).input_shape == (3, 4, 4)
    dummy = (
        'layer { name: "x" type: "DummyData" top: "data" '
        "dummy_data_param { num: 2 channels: 1 height: 7 width: 9 } }\n"
    )
    assert read_net(net_text(relu, head=dummy)).input_shape == (1, 7, 9)
    memory = (
        'layer { name: "m" type: "MemoryData" top: "data" top: "label" '
        "memory_data_param { batch_size: 4 channels: 3 height: 2 width: 2 } "
        "transform_param { mean_value: 1 mean_value: 2 mean_value: 3 } }\n"
    )
    net = read_net(net_text(relu, head=memory))
    assert net.input_shape == (3, 2, 2) and net.transform == {"scale": 1.0, "mean_value": [1.0, 2.0, 3.0]}
    assert Transform(**net.transform)(np.zeros((1, 3, 2, 2)))[0, :, 0, 0].tolist() == [-1.0, -2.0, -3.0]


def test_read_net_phase_level_and_stage_rules():
    text = net_text(
        layer("a", "ReLU", top="data", extra="exclude { phase: TEST }"),
        layer("b", "ReLU", top="data", extra='include { stage: "deploy" }'),
        layer("c", "ReLU", top="data", extra="include { min_level: 1 }"),
        layer("d2", "ReLU", top="data", extra='include { not_stage: "deploy" }'),
    )
    assert [lay.name for lay in read_net(text).layers] == ["a", "d2"]
    assert [lay.name for lay in read_net(text, "TEST", stages=["deploy"]).layers] == ["b"]
    assert [lay.name for lay in read_net(text, level=1).layers] == ["a", "c", "d2"]


def test_read_net_and_solver_resolves_the_net_beside_the_solver(caffe_models):
    net, solver = read_net_and_solver(caffe_models / "lenet_solver.prototxt", input_shape=(1, 28, 28))
    assert [lay.name for lay in net.layers] == LENET_CHAIN and solver["base_lr"] == 0.01


def test_read_net_and_solver_with_relative_path_and_inline_net(tmp_path):
    tiny = net_text(layer("r", "ReLU"))
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "tiny.prototxt").write_text(tiny)
    (tmp_path / "solver.prototxt").write_text('net: "nets/tiny.prototxt" lr_policy: "fixed" base_lr: 0.5')
    net, solver = read_net_and_solver(str(tmp_path / "solver.prototxt"))
    assert net.input_shape == (3, 8, 8) and solver["base_lr"] == 0.5
    (tmp_path / "inline.prototxt").write_text("net_param { " + tiny + " } lr_policy: 'fixed'")
    assert read_net_and_solver(tmp_path / "inline.prototxt")[0].layers[0].name == "r"
    (tmp_path / "lost.prototxt").write_text('net: "missing/net.prototxt" lr_policy: "fixed"')
    with pytest.raises(FileNotFoundError, match="missing/net.prototxt"):
        read_net_and_solver(tmp_path / "lost.prototxt")
    (tmp_path / "none.prototxt").write_text('lr_policy: "fixed"')
    with pytest.raises(PrototxtError, match="exactly one of train_net_param, train_net, net_param, net"):
        read_net_and_solver(tmp_path / "none.prototxt")


CONV = layer("c", "Convolution", extra="convolution_param { num_output: 2 kernel_size: 3 }")


@pytest.mark.parametrize(
    "layers, message",
    [
        (
            [layer("d1", "Deconvolution", top="data")],
            AT + "layer 'd1': type 'Deconvolution' is not supported; supported: Convolution, Pooling, ReLU",
        ),
        (
            [CONV, 'name: "l" type: "EuclideanLoss" bottom: "c" bottom: "label" top: "l"'],
            AT + "layer 'l': loss type 'EuclideanLoss' is not supported",
        ),
        ([CONV, layer("x", "ReLU")], "^net: net 't': blobs \\['c'\\] are computed but never used"),
        (
            [
                CONV,
                'name: "l" type: "SoftmaxWithLoss" bottom: "c" bottom: "label" top: "l"',
                layer("r", "ReLU", "c"),
            ],
            AT + "layer 'r': comes after the loss \\(layer 'l'\\)",
        ),
        (
            [CONV, layer("s", "Softmax")],
            AT + "layer 's': Softmax must read the output of the last layer \\('c'\\)",
        ),
        (
            [
                'name: "e" type: "Eltwise" bottom: "data" bottom: "data" top: "e" '
                "eltwise_param { operation: MAX coeff: 1 coeff: 2 }"
            ],
            AT + "layer 'e': coeff applies to operation 'sum' only",
        ),
        (
            [layer("p", "Pooling", extra="pooling_param { pool: STOCHASTIC kernel_size: 2 }")],
            AT + "layer 'p' pooling_param: STOCHASTIC pooling",
        ),
        (
            [layer("p", "Pooling", extra="pooling_param { pool: MAX }")],
            AT + "layer 'p' pooling_param: give kernel_size",
        ),
        (
            [layer("p", "Pooling", extra="pooling_param { kernel_size: 0 }")],
            AT + "layer 'p': need kernel_size >= 1",
        ),
        (
            [
                layer(
                    "c", "Convolution", extra="convolution_param { num_output: 2 kernel_size: 3 dilation: 2 }"
                )
            ],
            "dilation must be 1",
        ),
        (
            [
                layer(
                    "c", "Convolution", extra="convolution_param { num_output: 2 kernel_size: 3 kernel_h: 3 }"
                )
            ],
            "or both kernel_h and kernel_w",
        ),
        (
            [layer("c", "Convolution", extra="convolution_param { num_output: 2 kernel_size: [3, 3, 3] }")],
            "give one or two kernel_size \\(2-D only\\)",
        ),
        (
            [
                layer(
                    "c",
                    "Convolution",
                    extra="convolution_param { num_output: 2 kernel_size: 3 "
                    "weight_filler { type: 'bilinear' } }",
                )
            ],
            AT + "layer 'c': unknown filler type 'bilinear'",
        ),
        (
            [layer("c", "Convolution", extra="convolution_param { num_output: 2.5 kernel_size: 3 }")],
            AT + "layer 'c' convolution_param: field 'num_output' must be an integer >= 0, got 2.5",
        ),
        (
            [layer("n", "LRN", extra="lrn_param { local_size: 4 }")],
            AT + "layer 'n': LRN local_size must be a positive odd number",
        ),
        (
            [layer("c", "Convolution", extra="convolution_param { num_output: 2 kernel_size: 9 }")],
            "^net: layer 'c': kernel 9x9 larger than padded input",
        ),
        (
            [layer("r", "ReLU", extra="include { phase: TRAIN } exclude { phase: TEST }")],
            AT + "layer 'r': give include rules or exclude rules, not both",
        ),
        (
            ['name: "r" type: "ReLU" bottom: "data" bottom: "x" top: "r"'],
            AT + "layer 'r': needs bottoms written by earlier layers and one top",
        ),
        (
            [layer("i", "InnerProduct", extra='param { name: "w" } inner_product_param { num_output: 2 }')],
            "without shared names",
        ),
        (['name: "d2" type: "Input" top: "x"'], AT + "layer 'd2': a data layer .* \\(already: layer 'd'\\)"),
        ([layer("r", "ReLU"), layer("r", "ReLU", "r", "s")], "^net: layer names must be unique"),
    ],
)
def test_read_net_errors_name_the_layer(layers, message):
    with pytest.raises(PrototxtError, match=message):
        read_net(net_text(*layers))


def test_read_net_needs_an_input_shape(caffe_models):
    lenet = caffe_models / "lenet_train_test.prototxt"
    with pytest.raises(PrototxtError, match="no input shape: layer 'mnist' does not give .*input_shape="):
        read_net(lenet)
    for bad in [(28, 28), (1, 28.0, 28), (0, 28, 28), 28]:
        with pytest.raises(ValueError, match="input_shape must be 3 positive ints"):
            read_net(lenet, input_shape=bad)
    assert read_net(lenet, input_shape=np.array([1, 28, 28])).input_shape == (1, 28, 28)
    with pytest.raises(ValueError, match="phase must be 'TRAIN' or 'TEST'"):
        read_net(lenet, phase="deploy", input_shape=(1, 28, 28))


def test_read_net_rejects_v1_layers_and_mismatched_means():
    with pytest.raises(PrototxtError, match="deprecated V1 'layers' field"):
        read_net('name: "old" layers { name: "c" type: CONVOLUTION }')
    head = (
        'layer { name: "d" type: "Input" top: "data" transform_param { mean_value: 1 mean_value: 2 } '
        "input_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } } }\n"
    )
    with pytest.raises(PrototxtError, match="layer 'd': 2 mean_value for 3 channels"):
        read_net(net_text(layer("r", "ReLU"), head=head))


def test_a_one_line_str_that_is_no_file_reads_as_text_with_a_hint():
    with pytest.raises(PrototxtError, match="number \\(read as text: there is no file 'my_net.txt'\\)"):
        read_net("my_net.txt")
    with pytest.raises(FileNotFoundError):
        read_net("missing_net.prototxt")


PARAM_FIELDS = """num_output kernel_size kernel_h kernel_w stride pad pad_h group bias_term dilation axis
    pool global_pooling round_mode negative_slope local_size alpha norm_region dropout_ratio end_axis type std
    variance_norm sparse lr_mult name phase stage min_level scale mean_value mean_file dim""".split()
PARAM_VALUES = """0 1 2 3 -1 0.5 1e-3 inf nan true false MAX AVE STOCHASTIC FLOOR TRAIN FAN_OUT WITHIN_CHANNEL
    "gaussian" "bilinear" "x" {}""".split()
LAYER_TYPES = [
    "Convolution",
    "Pooling",
    "ReLU",
    "InnerProduct",
    "LRN",
    "Dropout",
    "Flatten",
    "Accuracy",
    "SoftmaxWithLoss",
    "Softmax",
    "Input",
    "Sigmoid",
]
PARAM_BLOCKS = [
    "convolution_param",
    "pooling_param",
    "inner_product_param",
    "relu_param",
    "lrn_param",
    "dropout_param",
    "flatten_param",
    "param",
    "include",
    "exclude",
    "transform_param",
    "weight_filler",
    "input_param",
]
fields = st.lists(
    st.builds("{}: {}".format, st.sampled_from(PARAM_FIELDS), st.sampled_from(PARAM_VALUES)), max_size=5
).map(" ".join)
blocks = st.lists(st.builds("{} {{ {} }}".format, st.sampled_from(PARAM_BLOCKS), fields), max_size=3).map(
    " ".join
)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(LAYER_TYPES), st.booleans(), blocks), max_size=5))
def test_read_net_on_random_layer_chains_raises_only_prototxt_error(chain):
    """Well-formed nets from Caffe's vocabulary, most of them wrong in some way."""
    bodies, blob = [], "data"
    for index, (ltype, in_place, params) in enumerate(chain):
        top = blob if in_place else f"b{index}"
        bodies.append(layer(f"l{index}", ltype, blob, top, params))
        blob = top
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            read_net(net_text(*bodies))
    except PrototxtError:
        pass
