"""SE: the one loss-smoothing rule, iterations to a target, and Theorem 1's implicit momentum 1 − 1/g
measured on asynchronous SGD (Omnivore §IV-C, Fig. 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.tradeoff.statistical import (
    fit_momentum,
    implicit_momentum,
    iterations_to_target,
    measure_implicit_momentum,
    smoothed_loss,
    target_loss,
)


def test_smoothed_loss_is_the_mean_of_the_last_ten():
    s = smoothed_loss(np.arange(1.0, 21.0))
    assert s[0] == 1.0 and s[9] == 5.5 and s[19] == 15.5


def test_iterations_to_target_counts_updates_until_the_smoothed_loss_reaches_it():
    assert iterations_to_target([5, 4, 3, 2, 1], 3.5) == 4  # smoothed: 5, 4.5, 4, 3.5, 3
    assert iterations_to_target([5, 4, 3, 2, 1], 2.5, window=1) == 4
    assert math.isnan(iterations_to_target([5, 4, 3], 1.0))


def test_target_loss_is_the_lowest_loss_every_finite_run_reached():
    assert target_loss([1.0, 2.0, float("nan"), float("inf")]) == 2.0
    assert math.isnan(target_loss([float("nan")]))


def test_fit_recovers_a_planted_momentum_exactly():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((50, 3))
    V = np.zeros((50, 3))
    V[0] = rng.standard_normal(3)
    for t in range(49):
        V[t + 1] = 0.7 * V[t] - 0.1 * G[t + 1]
    fit = fit_momentum(V, G)
    assert (
        fit.momentum == pytest.approx(0.7)
        and fit.lr_scale == pytest.approx(0.1)
        and fit.r2 == pytest.approx(1.0)
    )
    with pytest.raises(ValueError, match="same shape"):
        fit_momentum(V, G[:10])


@pytest.mark.parametrize("g", [1, 2, 4, 8, 16])
def test_asynchrony_adds_implicit_momentum_one_minus_one_over_g(g):
    lr = 0.8 / np.sqrt(g)
    fit = measure_implicit_momentum(g, lr=lr, seed=0)
    assert abs(fit.momentum - implicit_momentum(g)) < 0.1
    assert fit.lr_scale == pytest.approx(lr / g, rel=0.15)  # Theorem 1: the step shrinks to η/g
