"""Each tuner's options are one table (`OPTIONS`: name, default, rule) that it is checked by, and
a fit's settings another (`SETTINGS`), which are not its parameters.

The table equals the signature; one kind of value is checked by one rule, so the same bad value
gets the same error text from every tuner, from a tuner object given to the estimator and from
`dasknn train --lr-grid`.
"""

from __future__ import annotations

import contextlib
import inspect
import io

import numpy as np
import pytest

from dasknn.cli import main
from dasknn.estimator import DistributedCNN
from dasknn.optimizer import auto, grid, online
from dasknn.optimizer.auto import AutoPolicy
from dasknn.optimizer.grid import GridPolicy
from dasknn.optimizer.online import OnlinePolicy

TABLES = [(GridPolicy, grid.OPTIONS), (OnlinePolicy, online.OPTIONS), (AutoPolicy, auto.OPTIONS)]


class Engine:
    """An engine a tuner may be built on; nothing runs in these tests."""

    def run(self, *args, **kwargs):
        raise AssertionError("no run: only the options are checked")


def _error(make) -> str:
    with pytest.raises(ValueError) as err:
        make()
    return str(err.value)


@pytest.mark.parametrize("cls, table", TABLES, ids=lambda v: getattr(v, "__name__", ""))
def test_the_table_equals_init_names_order_and_defaults(cls, table):
    signature = inspect.signature(cls.__init__).parameters
    init = {n: p.default for n, p in signature.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert [o.name for o in table] == list(init)
    for o in table:
        assert o.default == init[o.name], o.name
        assert o.rule.ok(o.default), f"{o.name}'s default fails its own rule"


@pytest.mark.parametrize("cls, table", TABLES, ids=lambda v: getattr(v, "__name__", ""))
def test_a_bound_tuner_holds_its_options_checked_and_converted_and_its_settings(cls, table):
    policy = cls().for_fit(Engine())
    for o in table:
        assert getattr(policy, o.name) == o.rule.convert(o.default), o.name
    for o in cls.SETTINGS:
        assert getattr(policy, o.name) == o.default and o.name not in cls().get_params(), o.name
    assert GridPolicy(lr_grid=[1, 0.5]).for_fit(Engine()).lr_grid == (1.0, 0.5)
    assert GridPolicy(lr_grid=[1, 0.5]).lr_grid == [1, 0.5]  # the user's object: as given (sklearn's clone)


@pytest.mark.parametrize(
    "option, value, text",
    [
        ("momentum", 1.5, "momentum must be None or a number in [0, 1), got 1.5"),
        ("learning_rate", -0.1, "learning_rate must be None or a finite number > 0, got -0.1"),
        ("n_groups", 0, "n_groups must be None or an integer >= 1, got 0"),
        ("n_workers", 2.5, "n_workers must be None or an integer >= 1, got 2.5"),
        ("he_model", "planted", "he_model must be None or an HEModel, got 'planted'"),
        ("verbose", -1, "verbose must be an integer >= 0, got -1"),
    ],
)
def test_the_same_bad_value_gets_the_same_text_from_every_tuner(option, value, text):
    for cls, table in TABLES:
        if option in {o.name for o in table}:  # an option: checked when bound
            assert _error(lambda cls=cls: cls(**{option: value}).for_fit(Engine())) == text, cls.__name__
        else:  # a fit's setting
            assert _error(lambda cls=cls: cls().for_fit(Engine(), **{option: value})) == text, cls.__name__


def test_options_two_tuners_share_get_the_same_text():
    for option, value in [("momentum_tolerance", 1.5), ("momentum_gain", 0.0)]:
        options = {option: value}
        texts = {_error(lambda c=c, o=options: c(**o).for_fit(Engine())) for c in (OnlinePolicy, AutoPolicy)}
        assert len(texts) == 1, texts
    assert _error(lambda: OnlinePolicy().for_fit(Engine(), target_accuracy=2)) == (
        "target_accuracy must be None or a number in (0, 1], got 2"
    )


def test_the_estimator_and_the_command_line_give_the_tuners_text():
    X, y = np.zeros((64, 1, 8, 8), dtype=np.float32), np.arange(64) % 2
    policy_text = _error(lambda: GridPolicy(lr_grid=(0.1, -0.01)).for_fit(Engine()))
    assert policy_text == "lr_grid must be a non-empty list, each item a finite number > 0, got (0.1, -0.01)"
    est = DistributedCNN(engine="simulated", max_epochs=1, tuner=GridPolicy(lr_grid=(0.1, -0.01)))
    assert _error(lambda: est.fit(X, y)) == f"tuner GridPolicy(lr_grid=(0.1, -0.01)): {policy_text}"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        main(["train", "--lr-grid", "0.1,-0.01"])
    assert policy_text in err.getvalue()
    # the estimator's own momentum and a tuner's pinned one: one rule, "auto" or None for "tune it"
    estimator_text = _error(lambda: DistributedCNN(engine="simulated", max_epochs=1, momentum=1.5).fit(X, y))
    assert estimator_text == "momentum must be 'auto' or a number in [0, 1), got 1.5"
