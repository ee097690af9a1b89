"""Structurally valid prototxt with wrong values: the reader raises PrototxtError, or returns a usable net.

tests/nn/test_prototxt.py fuzzes the parser with random text and mutated Caffe files (no digits
inserted). Here every numeric field of every supported layer, the input dims, the layer graph
(bottoms, tops: cycles, missing blobs) and the solver's fields get random values: small, zero,
negative, huge (up to 2**40), non-finite, or of the wrong type (issue #8). A net the reader accepts
must be within its size limits and run a forward pass to finite scores; a solver it accepts must
build Caffe's SGD.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dasknn.nn.net import MAX_BLOB, MAX_PARAMS
from dasknn.nn.prototxt import read_net, read_solver
from dasknn.nn.solver import SGD
from dasknn.nn.textformat import PrototxtError

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WILD = st.one_of(
    st.integers(0, 6).map(str),
    st.sampled_from(
        ["0.5", "1e-3", "2.0", "-1", "-0.5", "inf", "-inf", "nan", "1e30", "true", "MAX", '"x"', "{ }"]
    ),
    st.integers(-(2**40), 2**40).map(str),
)
SMALL_INT = st.integers(0, 5).map(str)  # mostly valid: the forward test needs nets that are accepted
SMALL_FLOAT = st.sampled_from(["0", "0.5", "1e-3", "1", "2.0"])
FLOATS = {
    "alpha",
    "beta",
    "k",
    "negative_slope",
    "dropout_ratio",
    "lr_mult",
    "decay_mult",
    *"std value min max mean".split(),
}
LAYER_FIELDS = {
    "Convolution": ("convolution_param", ["num_output", "kernel_size", "stride", "pad", "group"]),
    "InnerProduct": ("inner_product_param", ["num_output"]),
    "Pooling": ("pooling_param", ["kernel_size", "stride", "pad"]),
    "LRN": ("lrn_param", ["local_size", "alpha", "beta", "k"]),
    "ReLU": ("relu_param", ["negative_slope"]),
    "Dropout": ("dropout_param", ["dropout_ratio"]),
}
FILLER_FIELDS = ["std", "value", "min", "max", "mean"]


def _layer(index: int, ltype: str, values: st.DrawFn) -> str:
    block, fields = LAYER_FIELDS[ltype]
    body = " ".join(f"{f}: {values(f)}" for f in fields if values.keep())
    if ltype in ("Convolution", "InnerProduct"):
        filler = " ".join(f"{f}: {values(f)}" for f in FILLER_FIELDS if values.keep())
        body += f" weight_filler {{ type: 'gaussian' {filler} }}"
        body += f" }} param {{ lr_mult: {values('lr_mult')} decay_mult: {values('decay_mult')} "
    wiring = f'name: "l{index}" type: "{ltype}" bottom: "b{index}" top: "b{index + 1}"'
    return f"layer {{ {wiring} {block} {{ {body} }} }}\n"


class _Values:
    """Draws a value for a field: any WILD value, or (small=True) a small one of the field's type."""

    def __init__(self, draw, small: bool):
        self.draw, self.small = draw, small

    def __call__(self, field: str = "dim") -> str:
        if not self.small:
            return self.draw(WILD)
        return self.draw(SMALL_FLOAT if field in FLOATS else SMALL_INT)

    def keep(self) -> bool:
        return self.draw(st.booleans())


@st.composite
def nets(draw, small: bool = False) -> str:
    values = _Values(draw, small)
    dims = " ".join(f"dim: {values()}" for _ in range(4))
    text = (
        f'name: "fuzz" layer {{ name: "d" type: "Input" top: "b0" input_param {{ shape {{ {dims} }} }} }}\n'
    )
    chain = draw(st.lists(st.sampled_from(sorted(LAYER_FIELDS)), min_size=1, max_size=4))
    return text + "".join(_layer(i, ltype, values) for i, ltype in enumerate(chain))


def _read(text: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_net(text)


@PROPERTY
@given(nets())
def test_wrong_values_anywhere_raise_prototxt_error_or_give_a_net_within_the_limits(text):
    try:
        net = _read(text)
    except PrototxtError:
        event("refused: PrototxtError")
        return
    event("accepted")
    assert net.n_params <= MAX_PARAMS
    assert all(math.prod(shape) <= MAX_BLOB for _, shape in net.shapes)


@PROPERTY
@given(nets(small=True), st.integers(0, 2**16))
def test_an_accepted_small_net_runs_forward_to_finite_scores(text, seed):
    try:
        net = _read(text)
    except PrototxtError:
        event("refused: PrototxtError")
        return
    event("accepted")
    x = np.random.default_rng(seed).random((2, *net.input_shape), dtype=np.float32)
    scores, _ = net.forward(x, train=True, rng=np.random.default_rng(seed))
    assert scores.shape == (2, *net.output_shape) and np.isfinite(scores).all()


BLOBS = ["data", "a", "b", "c", "missing"]


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["ReLU", "Dropout", "Flatten"]), st.sampled_from(BLOBS),
                          st.sampled_from(BLOBS)), min_size=1, max_size=5))  # fmt: skip
def test_any_wiring_of_bottoms_and_tops_reads_as_a_chain_or_raises_prototxt_error(wiring):
    """Cycles, blobs nobody wrote, two layers writing one blob: only a chain from `data` is a net."""
    shape = "shape { dim: 1 dim: 2 dim: 3 dim: 3 }"
    head = f'layer {{ name: "d" type: "Input" top: "data" input_param {{ {shape} }} }}\n'
    body = "".join(
        f'layer {{ name: "l{i}" type: "{t}" bottom: "{bottom}" top: "{top}" }}\n'
        for i, (t, bottom, top) in enumerate(wiring)
    )
    try:
        net = _read(head + body)
    except PrototxtError:
        event("refused: PrototxtError")
        return
    event("accepted")
    blob = "data"
    for _, bottom, top in wiring:
        assert bottom == blob, f"accepted a layer reading {bottom!r} after {blob!r}"
        blob = top
    assert len(net.layers) == len(wiring)


SOLVER_FIELDS = ["base_lr", "momentum", "weight_decay", "gamma", "power", "max_iter", "stepsize",
                 "stepvalue", "iter_size", "average_loss", "test_iter", "test_interval", "display",
                 "snapshot", "clip_gradients", "random_seed"]  # fmt: skip
POLICIES = st.sampled_from(["fixed", "step", "multistep", "exp", "inv", "poly", "sigmoid", "cosine", ""])


@PROPERTY
@given(
    policy=POLICIES,
    fields=st.lists(st.tuples(st.sampled_from(SOLVER_FIELDS), WILD), max_size=8),
)
def test_a_solver_with_wrong_values_raises_prototxt_error_or_builds_sgd(policy, fields):
    text = f'lr_policy: "{policy}" ' + " ".join(f"{f}: {v}" for f, v in fields)
    try:
        settings_ = read_solver(text)
    except PrototxtError:
        event("refused: PrototxtError")
        return
    event("accepted")
    sgd = SGD.from_caffe(settings_)
    rates = []
    for it in (0, 1):
        sgd.iter = it
        try:
            rates.append(sgd.current_lr())
        except OverflowError:  # the known solver.py issue below: not a reader problem
            return
    assert all(isinstance(r, float) and math.isfinite(r) and r >= 0 for r in rates), (text, rates)


def test_learning_rate_policies_do_not_overflow_on_large_exponents():
    sgd = SGD.from_caffe(read_solver('lr_policy: "sigmoid" base_lr: 0.1 gamma: 1000 stepsize: 1000'))
    assert sgd.current_lr() == 0.0


LINED = """name: "lined"
input: "data"
input_shape { dim: 1 dim: 1 dim: 28 dim: 28 }
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  convolution_param {
    num_output: 8
    kernel_size: 3
    stride: 1
  }
}
layer {
  name: "norm1"
  type: "LRN"
  bottom: "conv1"
  top: "norm1"
  lrn_param { local_size: 5 }
}
"""


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("stride: 1", "stride: 0", 4),  # the layer's own check: the layer's line
        ("kernel_size: 3", "kernel_size: 0", 4),
        ("num_output: 8", "num_output: 0", 4),
        ("num_output: 8", 'num_output: "abc"', 10),  # a field named in the error: its own line
        ("stride: 1", "stride: 1\n    pad: -1", 13),
        ("local_size: 5", "local_size: 4", 15),  # the second layer's line
    ],
)
def test_a_bad_layer_value_is_named_with_its_line(old, new, line):
    with pytest.raises(PrototxtError) as err:
        read_net(LINED.replace(old, new))
    assert err.value.line == line and f"line {line}:" in str(err.value), str(err.value)
