"""Fixed knobs size their runs from the measured run boundary (`fixed.boundary_seconds`,
`fixed.run_length`): planted numbers, no engine (≈ 0.1 s)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasknn.optimizer.fixed import BOUNDARY_SHARE, boundary_seconds, run_length


def steady_run(n: int, per_iteration: float, start_up: float) -> pd.DataFrame:
    """One group's trace: `n` iterations `per_iteration` apart after a start-up of `start_up` s."""
    t_end = start_up + per_iteration * np.arange(1, n + 1)
    return pd.DataFrame({"group": 0, "t_start": t_end - per_iteration, "t_end": t_end})


def test_a_runs_boundary_is_its_charge_beyond_its_iterations_at_their_steady_time():
    trace = steady_run(40, 0.05, start_up=0.0)
    assert boundary_seconds(trace, 2.0 + 0.6) == pytest.approx(0.6)  # 40 × 0.05 s trained, 0.6 s more
    assert boundary_seconds(trace, 1.9) == 0.0  # never negative
    assert boundary_seconds(steady_run(1, 0.05, 0.0), 3.0) == 0.0  # too little ran to say


def test_runs_lengthen_so_that_a_boundary_is_five_percent_of_one_but_never_past_the_clock_so_far():
    assert run_length(2.0, 0.6, elapsed=100.0) == pytest.approx(0.6 / BOUNDARY_SHARE)  # 12 s
    assert run_length(2.0, 0.6, elapsed=5.0) == 5.0  # early in a fit: the runs as long as the fit so far
    assert run_length(2.0, 0.6, elapsed=0.0) == 2.0  # the first run: the least length
    assert run_length(2.0, 0.05, elapsed=100.0) == 2.0  # a cheap boundary: the least length
