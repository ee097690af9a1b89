"""Names that changed keep working for a while, with a DeprecationWarning naming the new one
(docs/architecture.md, "Glossary": one name per concept, one concept per name)."""

from __future__ import annotations

import pytest


def test_the_optimizers_old_class_names_are_deprecated_aliases():
    import dasknn.optimizer as optimizer
    from dasknn.optimizer import GridPolicy, OnlinePolicy, grid, online

    for module in (optimizer, grid):
        with pytest.warns(DeprecationWarning, match="OmnivoreOptimizer is now GridPolicy"):
            assert module.OmnivoreOptimizer is GridPolicy
    for module in (optimizer, online):
        with pytest.warns(DeprecationWarning, match="OnlineOptimizer is now OnlinePolicy"):
            assert module.OnlineOptimizer is OnlinePolicy


def test_the_online_option_segment_iterations_is_now_run_iterations():
    from dasknn.estimator_params import _NoEngine
    from dasknn.optimizer import OnlinePolicy

    with pytest.warns(DeprecationWarning, match="segment_iterations is now run_iterations"):
        policy = OnlinePolicy(_NoEngine(), segment_iterations=40)
    assert policy.run_iterations == 40
