"""Each parameter walked from its `dasknn train` flag to where the fit uses it: the flag's word,
parsed by the command's parser, becomes the estimator's parameter, the fit's `FitSettings` field
(every row of the table is one), and, for the knobs and the tuner, the setting the bound tuner or the
fixed-knob policy receives. Every value is a non-default one, so a link that drops it fails."""

from contextlib import ExitStack

import pytest

from dasknn import DistributedCNN
from dasknn.cli.app import build_parser
from dasknn.engine.trace import COLD_START
from dasknn.estimator_fit import FitSettings, Plan
from dasknn.estimator_input import smallest_rate
from dasknn.estimator_params import PARAMS, check_params, defaults, flag_values

WORDS = {
    # name: (the word on the command line, the value the estimator gets); None: a switch
    "net": ("cifar10_quick", "cifar10_quick"),
    "batch_size": ("32", 32),
    "n_groups": ("2", 2),
    "learning_rate": ("0.05", 0.05),
    "momentum": ("0.6", 0.6),
    "weight_decay": ("0.001", 0.001),
    "time_budget": ("30", 30.0),
    "max_epochs": ("3", 3.0),
    "max_wall_time": ("90", 90.0),
    "target_accuracy": ("0.9", 0.9),
    "engine": ("simulated", "simulated"),
    "scheduler": ("tcp://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
    "n_workers": ("4", 4),
    "worker_wait": ("5", 5.0),
    "eval_size": ("100", 100),
    "selection_size": ("256", 256),
    "early_stopping": (None, True),
    "n_iter_no_change": ("3", 3),
    "tol": ("0.01", 0.01),
    "strategy": ("sma", "sma"),
    "physical_map": ("unmerged", "unmerged"),
    "aggregation": ("ps", "ps"),
    "split": ("auto", "auto"),
    "random_state": ("7", 7),
    "checkpoint_dir": ("CKPT", "CKPT"),
    "resume": (None, True),
    "tuner": ("grid", "grid"),
    "prior_cache": (None, True),
    "simulated_gflops": ("20", 20.0),
    "data": ("persist", "persist"),
    "augment": ("shift", "shift"),
    "shuffle_window": ("2", 2),
    "backend": ("lowering", "lowering"),
    "averaging": ("ema", "ema"),
}


def _walked(tmp_path):
    """The estimator `dasknn train` builds from every flag at its non-default word."""
    argv = ["train"]
    for p in PARAMS:
        if p.flag:
            word, _ = WORDS[p.name]
            word = str(tmp_path / "ckpt") if word == "CKPT" else word
            argv += [p.option] if word is None else [p.option, word]
    args = build_parser().parse_args(argv)
    return DistributedCNN(**flag_values(args))


def _expected(name, tmp_path):
    value = WORDS[name][1]
    return str(tmp_path / "ckpt") if value == "CKPT" else value


def _settings(est, **resolved):
    resolved = {"tuner": est.tuner, "augment": None, "batch_size": est.batch_size, **resolved}
    return FitSettings(est.get_params(deep=False), max_wall_time=90.0, simulated_gflops=20.0, **resolved)


def test_every_flag_has_a_non_default_word():
    assert set(WORDS) == {p.name for p in PARAMS if p.flag}
    for p in PARAMS:
        if p.flag:
            assert WORDS[p.name][1] != p.command_default, p.name


def test_each_flag_reaches_the_estimator_and_the_fits_settings(tmp_path):
    from dasknn.optimizer import GridPolicy

    est = _walked(tmp_path)
    params = est.get_params(deep=False)
    # a real combination, as `dasknn train` checks it, but averaging: it runs on Omnivore's
    # compute groups, not the walk's SMA (its engine: test_the_engine_flags_reach_the_simulated_engine)
    check_params({**params, "averaging": None})
    s = _settings(est, tuner=GridPolicy())
    for p in PARAMS:
        if p.flag and p.name not in FitSettings.RESOLVED:
            assert params[p.name] == _expected(p.name, tmp_path), p.name
            assert getattr(s, p.name) == _expected(p.name, tmp_path), p.name
    assert (params["batch_size"], params["max_wall_time"], params["simulated_gflops"]) == (32, 90.0, 20.0)
    assert (params["tuner"], params["augment"]) == ("grid", "shift")


def test_every_row_of_the_table_is_a_field_of_the_settings():
    """Parameters set in Python only (no flag) reach the settings too; the resolved ones are the
    fit's values, not the parameters."""
    values = {
        **defaults(),
        "input_shape": "flat",
        "validation_fraction": 0.2,
        "verbose": 2,
        "warm_start": True,
    }
    s = FitSettings(values, tuner="T", augment="A", batch_size=8, max_wall_time=None, simulated_gflops=None)
    for p in PARAMS:
        expected = {"tuner": "T", "augment": "A", "batch_size": 8, "max_wall_time": None}.get(
            p.name, None if p.name == "simulated_gflops" else values[p.name]
        )
        assert getattr(s, p.name) == expected, p.name
    with pytest.raises(AttributeError, match="fixed for the fit"):
        s.learning_rate = 0.1
    with pytest.raises(TypeError, match="resolves"):
        FitSettings(values, tuner="T")


def test_the_knobs_reach_the_tuner_and_the_fixed_policy(tmp_path):
    """--n-groups, --learning-rate, --momentum pin the grid tuner's knobs; with fixed knobs they,
    --weight-decay, --batch-size and --random-state make the run's config."""
    from dasknn.optimizer import GridPolicy

    est = _walked(tmp_path)
    s = _settings(est, tuner=GridPolicy())
    tuner = s.policy(Plan(True, None, "", False), None, None, nb=10)
    assert (tuner.n_groups, tuner.learning_rate, tuner.momentum) == (2, 0.05, 0.6)
    assert tuner.lr_grid == (0.05,) and tuner.stop_check_iterations == 10
    fixed = s.policy(Plan(False, 12, "", False), None, None, nb=10)
    assert fixed.config == COLD_START.with_(
        n_groups=2, lr=0.05, momentum=0.6, weight_decay=0.001, batch_size=32, seed=7
    )
    assert (fixed.time_budget, fixed.max_iterations) == (30.0, 12)


def test_the_target_reaches_the_online_tuner_and_cold_start_fills_auto_knobs(tmp_path):
    from dasknn.optimizer import OnlinePolicy

    est = DistributedCNN(tuner="online", target_accuracy=0.9, learning_rate=0.05)
    s = _settings(est, tuner=OnlinePolicy())
    tuner = s.policy(Plan(True, None, "", False), None, None, nb=500)
    assert (tuner.target_accuracy, tuner.learning_rate, tuner.n_groups) == (0.9, 0.05, None)
    assert tuner.run_iterations == 200
    fixed = s.policy(Plan(False, 5, "", False), None, None, nb=500)
    assert (fixed.config.n_groups, fixed.config.lr, fixed.config.momentum) == (1, 0.05, 0.9)


def test_the_engine_flags_reach_the_simulated_engine(tmp_path):
    """--strategy, --physical-map, --aggregation, --split, --shuffle-window and the resolved augment
    make the simulated engine; --n-workers its workers; --averaging too, on Omnivore's groups."""
    from dasknn.data.augment import as_augment
    from dasknn.estimator_params import engine_averaging
    from dasknn.nn import zoo

    groups = _walked(tmp_path).set_params(strategy="omnivore", physical_map="merged")
    averaging = engine_averaging(groups.get_params(deep=False))  # what the fit sets as averaging_
    with ExitStack() as stack:
        engine, _ = _settings(groups, batch_size=32).engine_for(stack, zoo.lenet(seed=0), averaging)
    assert averaging == engine.averaging == "ema"
    est = _walked(tmp_path).set_params(averaging=None)  # SMA keeps no average
    shift = as_augment("shift")
    s = _settings(est, augment=shift, batch_size=32)
    with ExitStack() as stack:
        engine, client = s.engine_for(stack, zoo.lenet(seed=0))
    assert client is None
    strategy = engine.strategy
    assert (strategy.name, strategy.physical_map, strategy.aggregation, strategy.split) == (
        "sma",
        "unmerged",
        "ps",
        "auto",
    )
    assert engine.augment is shift and engine.shuffle_window == 2


def test_early_stopping_flags_reach_the_callback(tmp_path):
    from dasknn.callbacks import EarlyStopping

    s = _settings(_walked(tmp_path))
    (stopping,) = [cb for cb in s.fit_callbacks() if isinstance(cb, EarlyStopping)]
    assert (stopping.n_iter_no_change, stopping.tol) == (3, 0.01)


@pytest.mark.parametrize(
    ("tuner", "expected"),
    [
        ("online", COLD_START.lr),  # its own first rate, not the grid's smallest
        ("grid", 1e-5),
        ("auto", 0.001),  # cifar10_quick's reference solver
    ],
)
def test_the_first_batch_is_tried_at_the_tuners_smallest_start(tuner, expected):
    params = {**defaults(), "net": "cifar10_quick", "tuner": tuner}
    assert smallest_rate(params) == expected
    assert smallest_rate({**params, "learning_rate": 0.2}) == 0.2


def test_a_tuner_objects_options_set_its_smallest_start():
    from dasknn.optimizer import GridPolicy, OnlinePolicy

    assert smallest_rate({**defaults(), "tuner": OnlinePolicy(initial_lr=0.03)}) == 0.03
    assert smallest_rate({**defaults(), "tuner": GridPolicy(lr_grid=(0.1, 0.02))}) == 0.02
