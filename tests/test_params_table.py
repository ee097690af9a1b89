"""The table of parameters is the one description of DistributedCNN's parameters.

It equals `__init__` (names, order and defaults), the command line's flags come from it, and the
same bad value gives the same error text from Python and from `dasknn train`.
"""

from __future__ import annotations

import contextlib
import inspect
import io

import pytest

from dasknn.cli import build_parser, main
from dasknn.estimator import DistributedCNN
from dasknn.estimator_params import PARAMS, RESUME_PARAMS, Param
from dasknn.rules import Boolean

CLI_ONLY = {
    "dataset", "data_dir", "size", "classes", "resize", "lr_grid", "connect_timeout", "tls_ca_file",
    "tls_cert", "tls_key", "validation_fraction", "val_split", "output", "verbose", "debug", "help", "func",
}  # fmt: skip
"""`dasknn train` options that are not estimator parameters (the dataset and its loader's options,
the output), or that the command turns into one (--validation-fraction 0 means none; -q sets
verbose; the TLS files make `security`; --lr-grid is an optimizer option)."""


def _train_actions():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {a.dest: a for a in sub.choices["train"]._actions}


def test_the_table_equals_init_names_order_and_defaults():
    signature = inspect.signature(DistributedCNN.__init__).parameters
    init = {name: p.default for name, p in signature.items() if name != "self"}
    assert [p.name for p in PARAMS] == list(init)
    for p in PARAMS:
        assert p.default == init[p.name], p.name


def test_every_parameter_is_documented_from_the_table():
    doc = DistributedCNN.__doc__
    for p in PARAMS:
        assert f"\n    {p.name} : {p.rule.what}, default {p.default!r}\n" in doc
    assert "{parameters}" not in doc


def test_the_command_line_flags_are_the_tables():
    actions = _train_actions()
    flagged = [p for p in PARAMS if p.flag]
    assert {p.name for p in flagged} == set(actions) - CLI_ONLY
    for p in flagged:
        action = actions[p.name]
        assert action.option_strings == [p.option, *p.aliases]
        if isinstance(p.rule, Boolean):
            assert action.const is True and action.default is False
        else:
            assert action.default == p.command_default, p.name


def test_the_default_of_each_flag_passes_the_table():
    for p in PARAMS:
        p.rule.check(p.name, p.command_default)


def test_resume_parameters_are_the_ones_checkpoints_fingerprint():
    # the set checkpoints of earlier versions were written with, less the budget (time_budget,
    # max_epochs, target_accuracy), which a resume may change (their "optimizer" is read as
    # "tuner", test_auto_estimator): they must still resume. eval_size, which once counted the
    # training samples scored, bounds only the held-out scoring and is no longer compared
    assert set(RESUME_PARAMS) == {
        "net", "batch_size", "n_groups", "learning_rate", "momentum", "weight_decay",
        "engine", "n_workers", "input_shape",
        "validation_fraction", "selection_size", "strategy", "physical_map", "aggregation", "split",
        "random_state", "tuner", "simulated_gflops", "augment", "shuffle_window",
        "backend", "averaging",  # newer than some checkpoints: a key a checkpoint lacks is not compared
    }  # fmt: skip


def _python_error(name: str, value) -> str:
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        DistributedCNN(**{name: value})._check_params()
    return str(info.value)


def _command_error(option: str, text: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(SystemExit) as stop:
            main(["train", "-q", f"{option}={text}"])
    assert stop.value.code == 2
    line = err.getvalue().strip().splitlines()[-1]
    # "dasknn train: error: argument --x: <the text>; see `dasknn train --help`"
    return line.split(": ", 3)[-1].removesuffix("; see `dasknn train --help`")


BAD = [
    ("batch_size", "0"), ("batch_size", "2.5"), ("batch_size", "many"),
    ("n_groups", "0"), ("n_groups", "fast"), ("learning_rate", "-1"), ("learning_rate", "nan"),
    ("learning_rate", "fast"), ("momentum", "1"), ("momentum", "-0.1"), ("weight_decay", "inf"),
    ("time_budget", "0"), ("max_epochs", "-2"), ("target_accuracy", "1.5"), ("engine", "spark"),
    ("n_workers", "0"), ("eval_size", "0"), ("selection_size", "-1"), ("n_iter_no_change", "0"),
    ("tol", "-1"), ("strategy", "hogwild"), ("physical_map", "split"), ("aggregation", "allreduce"),
    ("random_state", "-1"), ("random_state", "4294967296"), ("tuner", "adam"),
    ("simulated_gflops", "0"), ("simulated_gflops", "fast"), ("data", "disk"), ("augment", "rotate"),
    ("shuffle_window", "0"), ("net", "vgg"), ("net", "no/such/net.prototxt"),
]  # fmt: skip


@pytest.mark.parametrize("name, text", BAD)
def test_a_bad_value_gives_the_same_error_from_python_and_from_the_command_line(name, text):
    p: Param = next(p for p in PARAMS if p.name == name)
    value = p.rule.parse(text)
    python = _python_error(name, value)
    assert python.startswith(name) or name in python
    for option in (p.option, *p.aliases):
        assert _command_error(option, text) == python


def _train_help() -> str:
    import contextlib
    import io

    from dasknn.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    return " ".join(out.getvalue().split())  # argparse's wrapping undone


def test_train_help_speaks_the_command_lines_words():
    text = _train_help()
    assert "(default None)" not in text  # what leaving an option out means, said in words
    from dasknn.estimator_params import PARAMS

    assert not [p.name for p in PARAMS if p.flag and "`" in p.cli_help]  # no Python objects
    assert "a Net" not in text and "copied" not in text
    assert 'engine="' not in text and "dasknn.nn" not in text
    backend = text[text.index("--backend {") :]
    assert "(default: the net's own, 'auto' for zoo and .prototxt nets)" in backend
    net = text[text.index("--net NET ") : text.index("--batch-size BATCH_SIZE ", text.index("--net NET "))]
    assert net.count("zoo") == 1 and net.count(".prototxt") == 1  # no phrase said twice
    assert "--checkpoint-dir" in text[text.index("--resume ") :]  # parameters named as options


def test_a_choice_that_includes_none_takes_the_word_none_on_the_command_line():
    """`--help` lists None among the choices (e.g. `--averaging {auto,ema,None}`): the word parses to
    None and passes the parameter's check."""
    from dasknn.rules import Choice

    with_none = [p for p in PARAMS if isinstance(p.rule, Choice) and None in p.rule.values]
    assert {"averaging", "backend"} <= {p.name for p in with_none}
    for p in with_none:
        assert p.rule.parse("None") is None and p.rule.check(p.name, p.rule.parse("None")) is None
    assert Choice(("a", "b")).parse("None") == "None"  # a word like any other where None is no choice
