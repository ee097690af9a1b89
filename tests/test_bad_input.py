"""Bad input to DistributedCNN.fit and the `dasknn` command is refused, named, before any work (issue #8).

"Before any work" is measured, not assumed: every dask graph executed during a fit is counted (with
the synchronous scheduler, so the callback sees each one). Validation costs at most one compute of
reductions over X and y (plus one for the labels of a dask y); a valid fit costs more (the
evaluation sample and the training batches), which `test_a_valid_fit_computes_beyond_validation`
checks, so the bound is not vacuous. For the CLI the data source is a trap: `--dataset mnist` in a
folder that does not exist, so reaching the data loader prints an MNIST error instead of the flag.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from contextlib import contextmanager

import dask
import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dasknn.cli import main
from dasknn.estimator import DistributedCNN
from dasknn.estimator_input import check_net_on_data, smallest_rate

FAST = dict(
    net="mlp", engine="simulated", n_workers=1, batch_size=8, max_epochs=1, time_budget=None,
    n_groups=1, learning_rate=0.01, momentum=0.9, eval_size=16,
)  # fmt: skip
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered in cast:RuntimeWarning",
    "ignore:invalid value encountered in cast:RuntimeWarning",
)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tiny(n: int = 32, c: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, c, 1, 1)).astype(np.float32), np.arange(n) % 3


@contextmanager
def dask_computes():
    """The sizes of the dask graphs executed inside the block (synchronous scheduler)."""
    graphs: list[int] = []
    with dask.config.set(scheduler="sync"), Callback(start=lambda dsk: graphs.append(len(dsk))):
        yield graphs


def rejected(X, y, *, names: list[str], max_computes: int, **params) -> str:
    """fit raises ValueError/TypeError naming one of `names`, after at most `max_computes` graphs."""
    with dask_computes() as graphs, pytest.raises((ValueError, TypeError)) as info:
        DistributedCNN(**{**FAST, **params}).fit(X, y)
    message = str(info.value)
    assert any(n.lower() in message.lower() for n in names), f"{names} not named in: {message}"
    assert len(graphs) <= max_computes, f"{len(graphs)} dask computes before the error: {message}"
    return message


def test_a_valid_fit_computes_beyond_validation():
    """The positive control of the work bound used below: a real fit runs more graphs than validation."""
    X, y = tiny()
    with dask_computes() as graphs:
        est = DistributedCNN(**FAST).fit(X, y)
    assert est.n_iter_ == 4 and len(graphs) >= 2
    with dask_computes() as graphs:
        DistributedCNN(**FAST).fit(da.from_array(X, chunks=8), da.from_array(y, chunks=8))
    assert len(graphs) >= 3


# -- option values --------------------------------------------------------------------------------
def _not(ok):
    return st.floats().filter(lambda v: not ok(v))


_text = st.text(max_size=5).filter(lambda s: s != "auto")
_junk = st.one_of(_text, st.none(), st.lists(st.integers(), max_size=2))
BAD_OPTIONS = {
    "batch_size": st.one_of(st.integers(max_value=0), st.floats(), st.booleans(), _junk),
    "n_groups": st.one_of(
        st.integers(max_value=0),
        _not(lambda v: math.isfinite(v) and v.is_integer() and v >= 1),
        st.booleans(),
        _junk,
    ),  # fmt: skip
    "learning_rate": st.one_of(_not(lambda v: math.isfinite(v) and v > 0), st.booleans(), _junk),
    "momentum": st.one_of(_not(lambda v: 0 <= v < 1), st.booleans(), _junk),
    "weight_decay": st.one_of(_not(lambda v: math.isfinite(v) and v >= 0), _junk),
    "time_budget": st.one_of(_not(lambda v: math.isfinite(v) and v > 0), _text),
    "max_epochs": st.one_of(_not(lambda v: math.isfinite(v) and v > 0), _text),
    "target_accuracy": st.one_of(_not(lambda v: 0 < v <= 1), _text),
    "engine": st.one_of(st.text(max_size=8).filter(lambda s: s not in ("dask", "simulated")), st.none()),
    "n_workers": st.one_of(st.integers(max_value=0), st.floats(), _text),
    "eval_size": st.one_of(st.integers(max_value=0), st.floats(), _text),  # None: all the held-out data
}


@PROPERTY
@given(st.sampled_from(sorted(BAD_OPTIONS)).flatmap(lambda k: st.tuples(st.just(k), BAD_OPTIONS[k])))
def test_a_bad_option_value_is_named_before_the_data_is_read(option):
    name, value = option
    X, y = tiny()
    rejected(X, y, names=[name], max_computes=0, **{name: value})


# -- X ------------------------------------------------------------------------------------------
@PROPERTY
@given(shape=hnp.array_shapes(min_dims=1, max_dims=6, min_side=1, max_side=4).filter(lambda s: len(s) != 4))
def test_X_of_any_other_ndim_is_rejected_naming_its_dimensions(shape):
    X = np.zeros(shape, np.float32)
    message = rejected(X, np.arange(shape[0]) % 2, names=["D"], max_computes=0, batch_size=1)
    assert re.search(rf"{len(shape)}-?D", message), message


@PROPERTY
@given(
    dtype=st.sampled_from(["U3", "S3", "complex64", "complex128", "datetime64[s]", "timedelta64[s]", "V4"]),
    as_dask=st.booleans(),
)
def test_X_of_a_non_numeric_dtype_is_rejected(dtype, as_dask):
    X = np.zeros((16, 2, 1, 1), dtype)
    if as_dask and dtype[0] not in "V":
        X = da.from_array(X, chunks=8)
    rejected(X, np.arange(16) % 2, names=["dtype", "complex", "string", "numbers"], max_computes=0)


@PROPERTY
@given(
    data=st.data(),
    n=st.integers(8, 40),
    sample=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    as_dask=st.booleans(),
)
def test_NaN_or_inf_anywhere_in_X_is_counted_before_training(data, n, sample, dtype, as_dask):
    X = np.random.default_rng(n).random((n, *sample)).astype(dtype)
    flat = X.reshape(-1)
    positions = data.draw(st.lists(st.integers(0, flat.size - 1), min_size=1, max_size=6, unique=True))
    bad = [math.nan, math.inf, -math.inf] + ([1e39] if dtype == "float64" else [])
    values = data.draw(st.lists(st.sampled_from(bad), min_size=len(positions), max_size=len(positions)))
    with np.errstate(over="ignore"):
        flat[positions] = values
    nans = sum(math.isnan(v) for v in values)
    if as_dask:
        X = da.from_array(X, chunks=(data.draw(st.integers(1, n)), -1, -1, -1))
    y = np.arange(n) % 2
    message = rejected(X, y, names=["NaN"], max_computes=1, batch_size=8)
    assert f"X contains {nans} NaN and {len(values) - nans} inf values" in message


# -- y ------------------------------------------------------------------------------------------
@PROPERTY
@given(n_y=st.integers(0, 64).filter(lambda m: m != 32), as_dask=st.booleans())
def test_y_of_the_wrong_length_is_rejected(n_y, as_dask):
    X, _ = tiny()
    y = np.arange(n_y) % 3
    if as_dask:
        y = da.from_array(y, chunks=8)
    rejected(X, y, names=[f"X has 32 samples but y has {n_y} labels"], max_computes=0)


@PROPERTY
@given(
    label=st.one_of(st.integers(-5, 5), st.just(1.0), st.sampled_from(["cat", "x"])), as_dask=st.booleans()
)
def test_a_single_class_is_rejected(label, as_dask):
    X, _ = tiny()
    y = np.full(32, label)
    as_dask = as_dask and not isinstance(label, str)  # dask labels must be numbers (check_X_y)
    if as_dask:
        y = da.from_array(y, chunks=8)
    rejected(X, y, names=["at least 2"], max_computes=2 if as_dask else 1)


@PROPERTY
@given(data=st.data(), as_dask=st.booleans())
def test_NaN_labels_are_rejected(data, as_dask):
    X, y = tiny()
    y = y.astype(np.float64)
    positions = data.draw(st.lists(st.integers(0, 31), min_size=1, max_size=5, unique=True))
    y[positions] = math.nan
    if as_dask:
        y = da.from_array(y, chunks=8)
    rejected(X, y, names=["NaN"], max_computes=1)


@PROPERTY
@given(columns=st.integers(2, 5), as_dask=st.booleans())
def test_2d_y_is_rejected(columns, as_dask):
    X, y = tiny()
    y2 = np.repeat(y[:, None], columns, axis=1)
    if as_dask:
        y2 = da.from_array(y2, chunks=8)
    message = rejected(X, y2, names=["1d", "1-D"], max_computes=0)
    assert str(columns) in message


@PROPERTY
@given(
    n_features=st.integers(1, 30),
    shape=st.one_of(st.tuples(*[st.integers(1, 6)] * 3), st.tuples(st.integers(1, 6), st.integers(1, 6))),
)
def test_an_input_shape_that_does_not_hold_the_features_is_rejected(n_features, shape):
    if len(shape) == 3 and math.prod(shape) == n_features:
        shape = (*shape[:2], shape[2] + 1)
    X = np.random.default_rng(0).random((32, n_features))
    rejected(X, tiny()[1], names=["input_shape"], max_computes=0, input_shape=shape)
    rejected(X.reshape(32, n_features, 1, 1), tiny()[1], names=["input_shape"], max_computes=0,
             input_shape=(n_features, 1, 1))  # fmt: skip


# -- accepted today, or refused late: each names the fix the estimator needs -------------------
LATE = "estimator.py _check_params: "


@pytest.mark.parametrize("name", ["weight_decay", "time_budget", "max_epochs", "target_accuracy",
                                  "n_workers", "eval_size"])  # fmt: skip
def test_a_bool_for_a_numeric_option_is_rejected(name):
    rejected(*tiny(), names=[name], max_computes=0, **{name: True})


@pytest.mark.parametrize("value", [-1, 1.5, "seed", None, 2**64])
def test_a_bad_random_state_is_rejected_before_work(value):
    rejected(*tiny(), names=["random_state"], max_computes=0, random_state=value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("verbose", "loud"),
        ("verbose", 1.5),
        ("warm_start", "yes"),
        ("scheduler", 5),
        ("scheduler", ["tcp://a:1"]),
    ],
)
def test_other_unchecked_options_are_rejected(name, value):
    rejected(*tiny(), names=[name], max_computes=0, **{name: value})


@pytest.mark.parametrize("value", [5, "abc", (1.5, 2, 2), (-1, -4, 1), ("4", 1, 1)])
def test_a_malformed_input_shape_is_rejected(value):
    X = tiny()[0].reshape(32, 4)
    rejected(X, tiny()[1], names=["input_shape"], max_computes=0, input_shape=value)


@pytest.mark.parametrize("net", [5, "vgg", "no/such/net.prototxt"])
def test_a_bad_net_is_named_before_the_data_is_read(net):
    with dask_computes() as graphs, pytest.raises((ValueError, TypeError, FileNotFoundError)) as info:
        DistributedCNN(**{**FAST, "net": net}).fit(*tiny())
    assert str(net) in str(info.value) and len(graphs) == 0


def test_more_groups_than_simulated_workers_is_rejected_before_work():
    rejected(*tiny(), names=["n_groups"], max_computes=1, n_groups=3, n_workers=2)


# -- the command line ---------------------------------------------------------------------------
TRAP = ["--dataset", "mnist", "--data-dir", "/nonexistent-dasknn-trap"]


def cli(*argv: str) -> tuple[int, str]:
    """(exit status, stderr) of `dasknn argv` run in this process; argparse errors are SystemExit."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as stop:
            code = stop.code
    return code, err.getvalue()


def refused(flag: str, *argv: str) -> str:
    """`dasknn train` exits 2 through argparse naming `flag`, before the data loader is reached."""
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["train", *TRAP, "-q", *argv])
    message = err.getvalue()
    assert stop.value.code == 2 and flag in message, message
    assert "MNIST directory" not in message
    return message


def _not_positive(text: str) -> bool:
    try:
        return not float(text) > 0
    except ValueError:
        return True


_not_positive_int = st.one_of(
    st.integers(max_value=0).map(str), st.floats().map(str), _text.filter(lambda s: not s.strip().isdigit())
)
_not_positive_float = st.one_of(st.floats().map(str), _text).filter(_not_positive)
BAD_FLAGS = {
    "--batch-size": _not_positive_int,
    "--n-workers": _not_positive_int,
    "--eval-size": _not_positive_int,
    "--time-budget": _not_positive_float,
    "--max-epochs": _not_positive_float,
    "--engine": st.text(max_size=6).filter(lambda s: s not in ("dask", "simulated")),
    "--n-groups": st.sampled_from(["fast", "", "one", "1,2", "0x", "auto!"]),
    "--lr": st.sampled_from(["fast", "", "1e", "0.1.2", "--"]),
    "--momentum": st.sampled_from(["high", "", "9/10"]),
    "--seed": st.one_of(st.floats().map(str), _text.filter(lambda s: not s.strip().lstrip("+-").isdigit())),
}


@settings(PROPERTY, max_examples=60)
@given(st.sampled_from(sorted(BAD_FLAGS)).flatmap(lambda f: st.tuples(st.just(f), BAD_FLAGS[f])))
def test_a_bad_flag_value_exits_2_naming_the_flag_before_loading_data(flag_value):
    flag, value = flag_value
    refused(flag, f"{flag}={value}")


@pytest.mark.parametrize("flag", ["--engine", "--lr", "--dataset", "--batch-size", "--scheduler"])
def test_a_flag_given_the_separator_as_its_value_is_refused(flag):
    """argparse turns `--flag=--` into an empty list that skips choices= and type=."""
    assert "expected one value, got '--'" in refused(flag, f"{flag}=--")


def test_unknown_flags_and_commands_exit_2():
    assert cli("train", "--frobnicate")[0] == 2
    assert cli("nosuch")[0] == 2 and cli()[0] == 2
    code, err = cli("summary", "vgg")
    assert code == 2 and "unknown net 'vgg'" in err


CLI_LATE = "dasknn/cli/: validate in argparse (a type= or choices=) or before load_dataset: "


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--n-groups", "0"), ("--n-groups", "2.5"), ("--n-groups", "nan"),
        ("--lr", "-1"), ("--lr", "0"), ("--lr", "nan"), ("--lr", "inf"),
        ("--momentum", "1"), ("--momentum", "-0.1"), ("--momentum", "nan"),
        ("--weight-decay", "-1"), ("--weight-decay", "nan"), ("--weight-decay", "inf"),
        ("--time-budget", "inf"),
        ("--target-accuracy", "1.5"), ("--target-accuracy", "0"), ("--target-accuracy", "nan"),
        ("--seed", "-1"),
        ("--net", "vgg"), ("--net", "no/such/net.prototxt"),
    ],
)  # fmt: skip
def test_a_value_the_estimator_refuses_is_refused_before_loading_data(flag, value):
    refused(flag, f"{flag}={value}")


def test_an_unknown_dataset_is_an_argparse_error():
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["train", "--dataset", "imagenet", "-q"])
    assert stop.value.code == 2 and "--dataset" in err.getvalue()


def test_an_output_folder_that_cannot_be_created_is_refused_before_loading_data(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused("--output", "--output", str(blocker / "run"))


def test_a_non_integer_batch_size_says_integer():
    assert "batch_size must be an integer >= 1, got 2.5" in refused("--batch-size", "--batch-size=2.5")


def test_summary_num_classes_is_checked_by_argparse():
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["summary", "lenet", "--num-classes", "0"])
    assert stop.value.code == 2 and "--num-classes" in err.getvalue()


def test_summary_of_an_absurd_input_shape_exits_2_instead_of_exhausting_memory():
    code, err = cli("summary", "lenet", "--input-shape", "1", "100000", "100000")
    assert code == 2 and "input" in err


# -- checked before any work: the checkpoint folder, the split, the first forward pass ----------------
NO_SCHEDULER = "tcp://127.0.0.1:9"  # nothing listens: a check that came after connecting would fail there


def test_a_checkpoint_dir_that_is_a_file_is_rejected_before_training(tmp_path):
    X, y = tiny()
    (tmp_path / "file").write_text("not a folder")
    rejected(X, y, names=["is not a directory"], max_computes=0, checkpoint_dir=tmp_path / "file")
    below_a_file = tmp_path / "file" / "ckpt"
    rejected(X, y, names=["checkpoint_dir"], max_computes=0, checkpoint_dir=below_a_file)


@pytest.mark.parametrize("split", ["nolayer", "conv1"])
def test_a_split_the_net_cannot_take_is_named_before_a_cluster_starts(split, digits28):
    X, y = digits28
    with pytest.raises(ValueError, match=f"split={split!r}"):
        DistributedCNN(net="lenet", engine="dask", scheduler=NO_SCHEDULER, split=split, **KNOBS).fit(X, y)


def test_values_that_overflow_the_first_forward_pass_are_named_before_a_cluster_starts(digits28):
    X, y = digits28
    with pytest.raises(ValueError, match="overflows net 'LeNet'.*scale X"):
        DistributedCNN(net="lenet", engine="dask", scheduler=NO_SCHEDULER, **KNOBS).fit(X * 1e30, y)


KNOBS = dict(n_groups=1, learning_rate=0.01, momentum=0.9, max_epochs=1, time_budget=None, eval_size=64)


@pytest.fixture(scope="module")
def digits28():
    from dasknn.data import load

    X, y = load("digits", size=28)
    return X[:128].compute(), y[:128].compute()


def test_an_untrained_batchnorm_net_on_unit_scale_data_passes_the_overflow_check():
    # BatchNorm's running statistics start at zero: only a training-mode pass says whether X overflows;
    from dasknn.nn.zoo import get_net

    net = get_net("resnet20")
    X = np.random.default_rng(0).random((8, 3, 32, 32), dtype=np.float32)
    rate = smallest_rate(DistributedCNN(net="resnet20", batch_size=8).get_params())  # the tuner's smallest
    check_net_on_data(net, X, None, 8, rate)  # a test-mode pass divided by the zero running variance: NaN
    # and BatchNorm normalises any scale away: large values reach it finite and leave it unit-sized
    check_net_on_data(net, X * np.float32(1e6), None, 8, rate)
