"""The rules of the tuners' options, shared: one kind of value is checked one way, with one text.

Each policy declares its options once, as a table of `rules.Option` (name, default, rule) beside
its class (`grid.OPTIONS`, `online.OPTIONS`, `auto.OPTIONS`), its `__init__` stores them as given
and `Tuner.checked` checks them by the table; a test keeps each table equal to its `__init__`'s
signature. The knobs a fit sets on a bound tuner (its `SETTINGS`: η, µ, g, `target_accuracy`,
`verbose`) use the estimator's rules (`dasknn.rules`, `dasknn.estimator_params`), with None, not
"auto", for "tune it"; so a bad value gets the same words from a tuner's option, a tuner given as
DistributedCNN's `tuner` and the estimator's parameter
(docs/architecture.md, "One table of parameters").
"""

from __future__ import annotations

from dataclasses import replace

from dasknn.rules import ACCURACY, LEARNING_RATE, MOMENTUM, N_GROUPS, VERBOSE, Custom, Number
from dasknn.tradeoff.hardware import HEModel

__all__ = [
    "COUNT",
    "FRACTION",
    "GAIN",
    "HE_MODEL",
    "PINNED_GROUPS",
    "PINNED_LR",
    "PINNED_MOMENTUM",
    "POSITIVE",
    "PROBE_SCORE",
    "SOME_COUNT",
    "SOME_POSITIVE",
    "TARGET_ACCURACY",
    "VERBOSE",
]

COUNT = Number(1, integer=True)
"""An integer >= 1 (iterations, checks, drops)."""
SOME_COUNT = replace(COUNT, also=(None,))
"""None (the policy's own default) or an integer >= 1."""
POSITIVE = Number(0, low_open=True)
"""A finite number > 0."""
SOME_POSITIVE = replace(POSITIVE, also=(None,))
"""None or a finite number > 0 (seconds)."""
GAIN = Number(0, 1, low_open=True)
"""A feedback's gain: a number in (0, 1]."""
FRACTION = Number(0, 1, high_open=True)
"""A number in [0, 1) (a share, a tolerance, a relative margin)."""
PINNED_GROUPS = replace(N_GROUPS, also=(None,))
"""g pinned by the user (the estimator's rule for n_groups), or None: tuned."""
PINNED_LR = replace(LEARNING_RATE, also=(None,))
"""η pinned by the user (the estimator's rule for learning_rate), or None: tuned."""
PINNED_MOMENTUM = replace(MOMENTUM, also=(None,))
"""µ pinned by the user (the estimator's rule for momentum), or None: tuned."""
TARGET_ACCURACY = replace(ACCURACY, also=(None,))
"""None or an accuracy in (0, 1] (the estimator's rule for target_accuracy)."""
HE_MODEL = Custom("None or an HEModel", accepts=lambda v: v is None or isinstance(v, HEModel))
PROBE_SCORE = Custom("None or a callable (a TrainState -> loss)", accepts=lambda v: v is None or callable(v))
