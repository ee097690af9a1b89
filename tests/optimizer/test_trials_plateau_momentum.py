"""Capped trials, the plateau rule and momentum by measurement, each fed planted numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasknn.engine.servers import ParameterSample
from dasknn.optimizer.decide import judge_trial
from dasknn.optimizer.momentum import regressed_momentum, steer_from_trajectory, trace_momentum
from dasknn.optimizer.plateau import Plateau
from dasknn.optimizer.trials import (
    MAX_TRIAL_GAIN,
    neighbours,
    predicted_noise,
    resolvable,
    trial_noise,
    trial_seconds,
)


# -- capped trials --------------------------------------------------------------------------------
def explore(job_seconds: float, segment: float = 1.0, wanted: float = 2.0) -> tuple[float, list]:
    """A job of training segments with a trial of `wanted` seconds offered after each, cut to what
    the cap allows; returns (explored seconds, (elapsed, explored) after every trial)."""
    elapsed = explored = 0.0
    after = []
    while elapsed < job_seconds:
        elapsed += segment
        allowed = trial_seconds(elapsed, explored)
        if allowed > 0.01:
            d = min(wanted, allowed)
            elapsed, explored = elapsed + d, explored + d
            after.append((elapsed, explored))
    return explored, after


def test_trials_stay_within_five_percent_of_the_elapsed_time_short_and_long_jobs():
    short, after = explore(5.0)
    assert short <= 0.05 * 5.3 and all(x <= 0.05 * e + 1e-12 for e, x in after)
    long, after = explore(3600.0)
    assert 0.04 * 3600 < long <= 0.05 * (3600 + 2) and all(x <= 0.05 * e + 1e-9 for e, x in after)
    assert trial_seconds(100.0, 5.0) == 0.0  # the cap is reached: no trial starts
    assert trial_seconds(100.0, 0.0) == pytest.approx(5 / 0.95)  # its own time counts as elapsed
    with pytest.raises(ValueError, match="fraction"):
        trial_seconds(1.0, 0.0, fraction=1.0)


def test_a_trial_is_adopted_only_beyond_the_noise_of_its_difference():
    """Planted from the 32-worker benchmark (seed 3, shifted digits): a 36-iteration trial at
    η × 2 made +14.18/s (± 19/s: its batch losses' slope over so few iterations) against −4.45/s
    around it (± 2/s each, 250-iteration runs). Without the noise it is adopted; with the standard
    error of the difference (19.17/s) it is not. A trial beyond that noise still is."""
    noise = trial_noise(19.0, 2.0, 2.0, before=-4.45)
    assert noise == pytest.approx(math.sqrt(19.0**2 + 2.0))
    assert judge_trial(14.18, -4.45, -4.45)[0]
    adopt, why = judge_trial(14.18, -4.45, -4.45, noise=noise)
    assert not adopt and "± 19.05/s" in why and "keep the current configuration" in why
    assert judge_trial(20.0, -4.45, -4.45, noise=noise)[0]
    assert trial_noise(3.0, 5.0, 4.0, before=math.nan) == pytest.approx(5.0)  # no run before: after alone
    assert trial_noise(math.nan, 0.0, math.nan) == 0.0  # nothing measured: the plain margin
    assert judge_trial(0.02, 0.01, 0.012, noise=0.0) == judge_trial(0.02, 0.01, 0.012)


def test_a_trial_too_short_to_tell_is_not_started():
    """The noise a trial will have is predicted from the last run's (a slope's error grows as
    n^-1.5 over fewer losses): a 250-iteration run at 10/s ± 0.5/s leaves a 36-iteration trial
    ±9.2/s, which it could beat only at 2.1× the progress; a 125-iteration trial could be told."""
    short = predicted_noise(0.5, 250, 36, before=10.0)
    assert short == pytest.approx(math.sqrt((0.5 * (250 / 36) ** 1.5) ** 2 + 0.5**2 / 2))
    assert not resolvable(short, 10.0)  # adopted only above 10 + 1 + 9.2 = 20.2/s > 2 × 10
    longer = predicted_noise(0.5, 250, 125, before=10.0)
    assert longer < short and resolvable(longer, 10.0)
    assert resolvable(8.9, 10.0) and not resolvable(9.0, 10.0)  # the line: base + 10% + noise = 2 × base
    assert not resolvable(0.0, 0.0) and not resolvable(0.0, -3.0)  # nothing to compare a trial against
    assert predicted_noise(0.0, 250, 36, before=10.0) == 0.0  # no error measured: the plain margin
    assert resolvable(0.0, 10.0, gain=MAX_TRIAL_GAIN)


def test_neighbours_cycle_through_the_rate_and_the_group_count():
    keys = [k for k, _, _ in neighbours(2, 0.1, [1, 2, 4, 8], turn=0)]
    assert keys == ["lr_up", "lr_down", "g_up", "g_down"]
    assert neighbours(2, 0.1, [1, 2, 4], turn=2)[0] == ("g_up", 4, 0.1)
    assert [k for k, _, _ in neighbours(1, 0.1, [1], turn=1)] == ["lr_down", "lr_up"]


# -- plateau --------------------------------------------------------------------------------------
def test_a_plateau_divides_the_rate_by_three_and_repeated_fruitless_drops_stop_the_fit():
    rule = Plateau(span=20, fraction=0.1, max_drops=2)
    assert rule.observe(0.02, 10, 0.90).action == "keep"  # half a span
    assert rule.observe(0.02, 10, 0.91).action == "keep"  # the span's 0.02/it is the reference
    assert rule.observe(0.015, 20, 0.92).action == "keep"
    step = rule.observe(0.001, 20, 0.93)  # below a tenth of the reference
    assert step.action == "drop" and "÷ 3" in step.reason
    assert rule.observe(0.004, 20, 0.95).action == "keep"  # the new η's first span: its reference
    assert rule.observe(0.0003, 20, 0.95).action == "drop"  # held-out rose 0.93 -> 0.95: it paid
    assert rule.observe(0.003, 20, 0.95).action == "keep"
    assert rule.observe(0.0002, 20, 0.95).action == "drop"  # no gain since the last drop: 1 of 2
    assert rule.observe(0.002, 20, 0.95).action == "keep"
    step = rule.observe(0.0001, 20, 0.95)
    assert step.action == "stop" and "no held-out gain" in step.reason
    again = Plateau.from_dict(rule.to_dict())
    assert again.to_dict() == rule.to_dict()


def test_one_noisy_window_does_not_make_a_plateau_and_a_steady_fall_never_does():
    rule = Plateau(span=30)
    rule.observe(0.01, 30)
    assert rule.observe(-0.02, 10).action == "keep"  # one bad window inside a span
    assert rule.observe(0.03, 20).action == "keep"  # the span's mean, 0.013/it, is no plateau
    assert {rule.observe(0.01, 30, None).action for _ in range(50)} == {"keep"}


def planted_windows(loss, n_windows: int, window: int = 25):
    """(progress per iteration, level) of consecutive windows of a planted loss curve `loss(t)`:
    the fall of log loss over the window per iteration, and its loss level (geometric mean)."""
    out = []
    for k in range(n_windows):
        t = np.arange(k * window, (k + 1) * window + 1, dtype=float)
        log_loss = np.log(loss(t))
        out.append(((log_loss[0] - log_loss[-1]) / window, float(np.exp(log_loss.mean()))))
    return out


def test_a_curve_that_merely_decelerates_as_its_loss_falls_keeps_its_rate():
    # L = 2 / (1 + t / 50): progress ∝ L (γ = 1), a tenth of the first span's after ~500 iterations
    windows = planted_windows(lambda t: 2.0 / (1 + t / 50), 80)
    levelled, plain = Plateau(span=50, patience=1), Plateau(span=50, patience=1)
    carried = [levelled.observe(p, 25, None, level).action for p, level in windows]
    uncarried = [plain.observe(p, 25).action for p, _ in windows]
    assert set(carried) == {"keep"}  # the reference carried to the loss now: no plateau
    assert "drop" in uncarried  # the first span taken as it is: the steep start read as a stale η
    assert windows[-1][0] < 0.1 * windows[1][0]


def test_a_floor_the_rate_cannot_get_below_is_a_plateau_after_two_low_spans():
    # the same fall down to a floor at 0.3: progress vanishes while the loss stays at the floor
    windows = planted_windows(lambda t: 0.3 + 1.7 / (1 + t / 50) ** 3, 40)
    rule = Plateau(span=50, patience=2)
    actions = [rule.observe(p, 25, 0.9, level).action for p, level in windows]
    first = actions.index("drop")
    assert set(actions[:first]) == {"keep"}
    assert windows[first][1] < 1.05 * 0.3  # within 5% of the floor
    assert windows[first - 2][1] > 1.05 * 0.3  # not on the way down: the span before was above it


def test_one_low_span_between_normal_ones_is_not_a_plateau_with_a_patience_of_two():
    rule = Plateau(span=20, patience=2)
    assert rule.observe(0.01, 20, None, 1.0).action == "keep"  # the reference
    low = rule.observe(0.0001, 20, None, 0.9)
    assert low.action == "keep" and "1 of 2 spans in a row" in low.reason
    assert rule.observe(0.005, 20, None, 0.8).action == "keep"  # the run of low spans is broken
    assert rule.observe(0.0001, 20, None, 0.8).action == "keep"
    assert rule.observe(0.0001, 20, None, 0.8).action == "drop"


def test_a_plateau_state_from_before_the_loss_level_loads_and_a_foreign_dict_is_refused():
    old = {  # as `to_dict` wrote it before the level, γ and patience were part of the state
        "span": 20, "fraction": 0.1, "factor": 3.0, "max_drops": 2, "min_gain": 0.001,
        "reference": 0.02, "fall": 0.01, "iterations": 10, "drops": 1, "drops_without_gain": 0,
        "best_held_out": 0.93, "held_out_at_drop": None,
    }  # fmt: skip
    rule = Plateau.from_dict(old)
    assert (rule.reference, rule.patience, rule.gamma) == (0.02, 1, 1.0)
    assert math.isnan(rule.reference_level) and rule.held_out_at_drop == -math.inf
    assert rule.observe(0.001, 10, None, 0.5).action == "drop"  # its reference is compared uncarried
    with pytest.raises(ValueError, match=r"not a plateau rule's state: unknown field\(s\) \['window'\]"):
        Plateau.from_dict({**old, "window": 3})


# -- momentum by measurement ----------------------------------------------------------------------
def heavy_ball(mu: float, steps: int = 400, coords: int = 200, seed: int = 0) -> np.ndarray:
    """A trajectory of momentum SGD on a noisy quadratic (curvatures 0.01..1, η = 0.05)."""
    rng = np.random.default_rng(seed)
    h = rng.uniform(0.01, 1.0, coords)
    w, v, out = rng.normal(size=coords), np.zeros(coords), []
    for _ in range(steps):
        v = mu * v - 0.05 * (h * w + 0.5 * rng.normal(size=coords))
        w = w + v
        out.append(w.copy())
    return np.array(out)


@pytest.mark.parametrize("mu", [0.0, 0.5, 0.9])
def test_the_regression_recovers_the_total_momentum_of_a_planted_trajectory(mu):
    assert regressed_momentum(heavy_ball(mu)) == pytest.approx(mu, abs=0.05)


def test_a_measured_total_above_target_lowers_mu_and_one_on_target_leaves_it():
    high = heavy_ball(0.95)
    mu, measured, why = steer_from_trajectory(0.9, high, target=0.8)
    assert measured > 0.85 and mu < 0.9 and "->" in why
    on = heavy_ball(0.8)
    mu, measured, why = steer_from_trajectory(0.8, on, target=0.8)
    assert mu == 0.8 and "unchanged" in why
    mu, measured, _ = steer_from_trajectory(0.7, np.zeros((3, 5)), target=0.9)
    assert mu == 0.7 and math.isnan(measured)  # too short to measure: µ left alone


def test_the_parameter_sample_reads_the_same_coordinates_every_time():
    rng = np.random.default_rng(1)
    params = {"conv1.w": rng.normal(size=(8, 3, 3)), "ip1.w": rng.normal(size=(50, 4)), "ip1.b": np.zeros(4)}
    sample = ParameterSample(params, size=32, seed=3)
    a = sample.read(params)
    assert a.shape == (32,) and np.array_equal(a, ParameterSample(params, size=32, seed=3).read(params))
    moved = {k: v + 1.0 for k, v in params.items()}
    assert np.allclose(sample.read(moved) - a, 1.0)


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_the_simulators_trace_measures_the_total_momentum_of_real_training(mu):
    """The conv model server's sampled updates (`update_dot`, `update_sq`) on the simulator, one
    group: the regressed total is the explicit µ."""
    from dasknn.data import load
    from dasknn.engine.simulated import SimulatedEngine
    from dasknn.engine.trace import Budget, RunConfig
    from dasknn.tradeoff.hardware import HEModel
    from tests.planted import small_net

    X, y = load("digits", size=8, batch_size=32)
    engine = SimulatedEngine(HEModel(T_cc=5.0, T_nc=0.0, t_fc=0.5, n_workers=1), verbose=0)
    trace = engine.run(small_net(), np.asarray(X), np.asarray(y), RunConfig(1, 0.02, mu, 0.0, 32, 0),
                       Budget(iterations=300)).trace  # fmt: skip
    measured = trace["update_sq"].notna()
    assert not measured.head(50).any() and measured.iloc[52:].all()  # once the drift's mean has 50 updates
    assert trace_momentum(trace) == pytest.approx(mu, abs=0.1)
    assert math.isnan(trace_momentum(trace[["loss"]]))
