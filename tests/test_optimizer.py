"""GridPolicy (Omnivore Algorithm 1 + cold start) on the SimulatedEngine, real training:
the cold start's early stop, the initial g from the HE model, the µ* = 0 → halve g rule, the clock
that counts the search, the decisions record, and argument checks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn import zoo
from dasknn.optimizer import GridPolicy
from dasknn.optimizer.search import (
    DECISION_COLUMNS,
    Probe,
    clear_winner,
    group_candidates,
    he_model_from_probe,
    momentum_lr_grid,
    state_hash,
)
from dasknn.tradeoff.hardware import HEModel, phase_costs
from tests.planted import RaisingEngine, implicit_momentum_losses, small_net

PLANTED = HEModel(T_cc=5.0, T_nc=0.0, t_fc=1.0, n_workers=8)
"""8 conv devices; t_conv(8/g) + t_fc < g·t_fc first at g = 4: the FC server saturates at 4."""

TARGET = 0.99
"""Training accuracy (mean over the last 50 kept iterations) the end-to-end run must reach."""


@pytest.fixture(scope="module")
def digits8():
    X, y = load("digits", size=8, batch_size=32)
    return np.asarray(X), np.asarray(y)


def reached(trace: pd.DataFrame, target: float = TARGET, window: int = 50) -> bool:
    kept = trace[trace["kept"]]
    return len(kept) >= window and kept["accuracy"].tail(window).mean() >= target


@pytest.fixture(scope="module")
def run(digits8):
    """One end-to-end optimizer run: planted FC saturation at g = 4, stop at TARGET accuracy."""
    X, y = digits8
    net = small_net()
    start_hash = state_hash(TrainState.from_net(net))
    # Algorithm 1's loop from a synchronous cold start (the g ladder of appendix E-D has its own tests)
    opt = GridPolicy(probe_iterations=20, epoch_factor=3, cold_start_groups=False).for_fit(
        SimulatedEngine(PLANTED, verbose=0)
    )
    result = opt.optimize(
        net, X, y, batch_size=32, time_budget=20_000, should_stop=lambda state, trace: reached(trace)
    )
    return result, net, start_hash


def probes(decisions: pd.DataFrame, phase: str) -> pd.DataFrame:
    return decisions[(decisions["phase"] == phase) & (decisions["action"] == "probe")]


def test_cold_start_picks_a_sensible_rate_and_stops_at_the_first_worse_one(run):
    decisions = run[0].decisions
    cold = probes(decisions, "cold_start")
    cold = cold[cold["n_groups"] == 1]  # the rate probes; then the g ladder (appendix E-D)
    grid = (0.1, 0.01, 0.001, 1e-4, 1e-5)
    assert tuple(cold["lr"]) == grid[: len(cold)]
    assert (cold["n_groups"] == 1).all() and (cold["momentum"] == 0.9).all()
    scores = cold["score"].to_numpy()
    assert len(cold) < len(grid), "the rate after the first worse one must not be probed"
    assert scores[-1] > scores[-2], "the last rate probed is the first one worse than its predecessor"
    assert (np.diff(scores[:-1]) <= 0).all()
    chosen = decisions[decisions["action"] == "choose_lr"].iloc[0]
    assert chosen["lr"] in (0.1, 0.01) and chosen["score"] == scores.min()
    assert "stopped early" in chosen["reason"]


def test_initial_groups_is_the_smallest_saturating_g_of_the_planted_timing(run):
    result = run[0]
    row = result.decisions[result.decisions["action"] == "initial_groups"].iloc[0]
    assert PLANTED.smallest_saturating_g() == 4
    assert row["n_groups"] == 4
    assert result.he_model.smallest_saturating_g() == 4
    assert result.he_model.t_fc == pytest.approx(1.0) and result.he_model.T_cc == pytest.approx(5.0)
    first_search = probes(result.decisions, "search").iloc[0]
    assert first_search["n_groups"] == 4


def test_end_to_end_reaches_the_target_accuracy_and_counts_the_search_time(run):
    result, net, _ = run
    trace, decisions = result.trace, result.decisions
    assert reached(trace)
    assert decisions.iloc[-1]["action"] == "stop" and "should_stop" in decisions.iloc[-1]["reason"]
    assert trace["t_end"].is_monotonic_increasing and trace["run"].is_monotonic_increasing
    assert list(dict.fromkeys(trace["phase"])) == ["cold_start", "search", "train"]
    assert trace["t_end"].iloc[-1] == pytest.approx(decisions.iloc[-1]["time"])
    assert trace["t_end"].iloc[-1] <= 20_000
    run_seconds = trace.groupby("run")["t_end"].max() - trace.groupby("run")["t_start"].min()
    assert run_seconds.sum() == pytest.approx(trace["t_end"].iloc[-1]), "runs follow each other on one clock"
    searched = decisions[decisions["action"].isin(["probe", "extend"]) & (decisions["phase"] == "search")]
    search_runs = trace.loc[trace["phase"] == "search", "run"].unique()
    assert searched["seconds"].sum() == pytest.approx(run_seconds[search_runs].sum())
    assert len(search_runs) >= 7 and searched["seconds"].sum() > 0.05 * trace["t_end"].iloc[-1]
    assert result.history and result.history[-1]["accuracy"] >= 0.95
    assert [h["phase"] for h in result.history][0] == "cold_start"
    assert (np.diff([h["time"] for h in result.history]) > 0).all()
    assert result.chosen.n_groups in (1, 2, 4)
    for key, value in result.state.params.items():
        np.testing.assert_array_equal(net.get_params()[key], value, err_msg=key)


def test_decisions_have_the_documented_columns_and_probes_share_their_start(run):
    result, _, start_hash = run
    decisions = result.decisions
    assert tuple(decisions.columns) == DECISION_COLUMNS
    assert (probes(decisions, "cold_start")["start_hash"] == start_hash).all()
    search = decisions[decisions["phase"] == "search"]
    block = (search["action"] == "choose").shift(fill_value=False).cumsum()
    for _, rows in search[search["action"] == "probe"].groupby(block):
        assert rows["start_hash"].nunique() == 1
        assert rows["start_hash"].iloc[0] != start_hash
    chosen = decisions[decisions["chosen"] & (decisions["action"] == "probe")]
    assert len(chosen) == (decisions["action"].isin(["choose", "choose_groups"])).sum()
    kept_runs = set(result.trace.loc[result.trace["kept"], "run"])
    assert set(chosen["run"]) <= kept_runs


def test_momentum_zero_at_four_groups_tries_small_momenta_then_halves_g(digits8):
    X, y = digits8
    opt = GridPolicy(
        probe_iterations=8,
        epoch_factor=0.5,
        probe_losses=implicit_momentum_losses(optimal_total=0.6, best_lr=0.1),
        cold_start_groups=False,
    ).for_fit(SimulatedEngine(PLANTED, verbose=0))
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=2)
    d = result.decisions
    search = d[d["phase"] == "search"]
    at4 = search[(search["n_groups"] == 4) & (search["action"] == "probe")]
    assert list(zip(at4["momentum"], at4["lr"], strict=True))[-2:] == [(0.1, 0.1), (0.2, 0.1)]
    assert len(at4) == 4 + 4 + 2
    halve = search[search["action"] == "halve_groups"]
    assert (
        len(halve) == 1 and halve.iloc[0]["n_groups"] == 2 and "µ* = 0 still wins" in halve.iloc[0]["reason"]
    )
    choose = search[search["action"] == "choose"].iloc[0]
    assert (choose["n_groups"], choose["momentum"], choose["lr"]) == (2, 0.1, 0.1)
    assert result.chosen == RunConfig(2, 0.1, 0.1, batch_size=32)
    assert result.history[-1]["n_groups"] == 2


def test_a_raising_engine_counts_as_divergence_and_the_cold_start_moves_on(digits8):
    X, y = digits8
    engine = RaisingEngine(t_conv=1.0, t_fc=0.5, verbose=0, raises=lambda config, budget: config.lr >= 1.0)
    opt = GridPolicy(lr_grid=(1.0, 0.1, 0.01, 0.001, 1e-4), probe_iterations=20, epoch_factor=0.5).for_fit(
        engine
    )
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=1)
    cold = probes(result.decisions, "cold_start")[lambda r: r["n_groups"] == 1]
    assert cold.iloc[0]["lr"] == 1.0 and cold.iloc[0]["diverged"] and math.isinf(cold.iloc[0]["score"])
    assert not cold.iloc[1:]["diverged"].any() and len(cold) < 5
    assert result.chosen.lr in (0.1, 0.01)
    assert result.decisions.iloc[-1]["reason"] == "max_epochs=1 reached"


def test_when_every_probe_at_a_g_diverges_the_search_halves_g(digits8):
    X, y = digits8
    engine = RaisingEngine(PLANTED, verbose=0, raises=lambda config, budget: config.n_groups >= 4)
    opt = GridPolicy(probe_iterations=8, epoch_factor=0.5).for_fit(engine)
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=2)
    d = result.decisions
    at4 = probes(d, "search")[lambda r: r["n_groups"] == 4]
    assert len(at4) == 8 and at4["diverged"].all()
    halve = d[d["action"] == "halve_groups"].iloc[0]
    assert halve["n_groups"] == 2 and halve["reason"] == "every probe diverged"
    assert d[d["action"] == "choose"].iloc[0]["n_groups"] <= 2 and result.chosen.n_groups <= 2


def test_a_diverging_train_epoch_goes_back_to_its_start_and_divides_lr_by_10(digits8):
    X, y = digits8
    engine = RaisingEngine(
        PLANTED, verbose=0, raises=lambda config, budget: config.n_groups > 1 and budget.iterations is None
    )
    opt = GridPolicy(probe_iterations=8, epoch_factor=0.5, cold_start_groups=False).for_fit(engine)
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=3)
    d = result.decisions
    first, second = d[d["action"] == "choose"].iloc[0], d[d["action"] == "choose"].iloc[1]
    diverged = d[d["action"] == "diverged"]
    assert len(diverged) == 1 and diverged.iloc[0]["lr"] == pytest.approx(first["lr"] / 10)
    second_grid = probes(d, "search")[lambda r: r.index > first.name]
    assert second_grid["lr"].max() == pytest.approx(first["lr"] / 10) and second["lr"] <= first["lr"] / 10
    assert second_grid["n_groups"].iloc[0] == first["n_groups"] == 4
    trained = result.trace[result.trace["phase"] == "train"]
    assert len(trained) and (trained["lr"] <= first["lr"] / 10).all()
    assert np.isfinite(np.concatenate([v.ravel() for v in result.state.params.values()])).all()


def test_the_he_model_argument_sets_the_initial_groups(digits8):
    X, y = digits8
    he = HEModel(T_cc=1.0, T_nc=0.0, t_fc=1.0, n_workers=8)
    opt = GridPolicy(he_model=he, probe_iterations=10).for_fit(SimulatedEngine(PLANTED, verbose=0))
    result = opt.optimize(small_net(), X, y, batch_size=32, max_iterations=25)
    row = result.decisions[result.decisions["action"] == "initial_groups"].iloc[0]
    assert row["n_groups"] == he.smallest_saturating_g() == 2 and "he_model argument" in row["reason"]
    assert len(result.trace) == 25 and result.decisions.iloc[-1]["reason"] == "max_iterations=25 reached"


def test_he_model_from_a_probe_splits_t_fc_by_the_flop_fractions(digits8):
    X, y = digits8
    net = small_net()
    c = phase_costs(net, 32)
    planted = HEModel(T_cc=c["conv_flops"] * 1e-6, T_nc=0.0, t_fc=c["fc_flops"] * 1e-6, n_workers=4)
    trace = (
        SimulatedEngine(planted, verbose=0)
        .run(net, X, y, RunConfig(batch_size=32), Budget(iterations=6))
        .trace
    )
    del trace.attrs["t_fc"]
    model, why = he_model_from_probe(trace, net, 32, n_workers=4)
    assert "FLOP split" in why
    assert model.t_fc == pytest.approx(planted.t_fc) and model.T_cc == pytest.approx(planted.T_cc)
    assert model.smallest_saturating_g() == planted.smallest_saturating_g()


def test_the_grid_prunes_momenta_above_the_last_at_the_last_rate():
    grid = momentum_lr_grid(0.1, 0.6, (0.0, 0.3, 0.6, 0.9))
    assert grid == [(0.0, 0.1), (0.3, 0.1), (0.6, 0.1), (0.0, 0.01), (0.3, 0.01), (0.6, 0.01), (0.9, 0.01)]
    assert group_candidates(8, 8) == [1, 2, 4, 8]
    assert group_candidates(6, 24) == [1, 2, 3, 6, 12, 24]
    assert group_candidates(None, 32) == [1, 2, 4, 8, 16, 32]


def test_a_winner_is_clear_only_when_5_percent_below_every_other_over_the_window():
    def probe(losses, momentum):
        p = Probe(RunConfig(momentum=momentum), "h")
        p.trace = pd.DataFrame({"loss": losses})
        return p

    tail = np.ones(50)
    a, b, c = probe(np.r_[5.0, tail], 0.0), probe(np.r_[1.0, 1.04 * tail], 0.3), probe(1.1 * tail, 0.6)
    winner, tied = clear_winner([a, b, c], threshold=0.05, window=50)
    assert winner is a and tied == [b]
    assert clear_winner([a, c], 0.05, 50) == (a, [])
    winner, tied = clear_winner([a, c], threshold=0.05, window=51)
    assert winner is a and tied == [c], "over 51 iterations a's first loss counts"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lr_grid": ()}, "lr_grid must be a non-empty list, each item a finite number > 0, got ()"),
        (
            {"momentum_grid": []},
            "momentum_grid must be a non-empty list, each item a number in [0, 1), got []",
        ),
        (
            {"momentum_grid": (0.0, 1.0)},
            "momentum_grid must be a non-empty list, each item a number in [0, 1)",
        ),
        ({"lr_grid": (0.1, -1.0)}, "lr_grid must be a non-empty list, each item a finite number > 0"),
        ({"probe_iterations": 0}, "probe_iterations must be None or an integer >= 1, got 0"),
        ({"stop_check_iterations": 0}, "stop_check_iterations must be None or an integer >= 1, got 0"),
        ({"clear_winner": 1.5}, "clear_winner must be a number in [0, 1), got 1.5"),
        ({"epoch_factor": -1}, "epoch_factor must be a finite number > 0, got -1"),
        ({"n_workers": 4, "he_model": PLANTED}, "disagrees with he_model.n_workers=8"),
    ],
)
def test_bad_optimizer_options_raise_value_errors_naming_them(options, message):
    with pytest.raises(ValueError) as err:
        GridPolicy(**options).for_fit(SimulatedEngine(PLANTED, verbose=0))
    assert message in str(err.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rates'"):
        GridPolicy(learning_rates=(0.1,))  # an unknown option, as scikit-learn's estimators refuse one


@pytest.mark.parametrize(
    "options, message",
    [
        ({"time_budget": -5}, "time_budget must be None or a finite number > 0, got -5"),
        ({"max_epochs": 0}, "max_epochs must be None or an integer >= 1, got 0"),
        ({"max_iterations": 0}, "max_iterations must be None or an integer >= 1, got 0"),
        ({}, "give time_budget, max_epochs or max_iterations"),
        ({"max_epochs": 1, "should_stop": True}, "should_stop must be callable"),
        ({"max_epochs": 1, "tolerance": 1e-3}, "unknown option(s) ['tolerance']"),
    ],
)
def test_bad_optimize_arguments_raise_value_errors_naming_them(digits8, options, message):
    X, y = digits8
    opt = GridPolicy().for_fit(SimulatedEngine(PLANTED, verbose=0))
    with pytest.raises(ValueError) as err:
        opt.optimize(small_net(), X, y, batch_size=32, **options)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="engine must have a run"):
        GridPolicy().for_fit(object())


@pytest.mark.slow
def test_lenet_on_digits_reaches_99_percent_training_accuracy_within_its_budget():
    X, y = load("digits", size=28, batch_size=32)
    timing = HEModel(T_cc=1.0, T_nc=0.0, t_fc=0.5, n_workers=4)
    opt = GridPolicy(probe_iterations=20, epoch_factor=3).for_fit(SimulatedEngine(timing, verbose=0))
    result = opt.optimize(
        zoo.lenet(), X, y, batch_size=32, time_budget=3000, should_stop=lambda s, t: reached(t, 0.99, 50)
    )
    d = result.decisions
    cold = probes(d, "cold_start")
    cold = cold[cold["n_groups"] == 1]  # the rate probes (then the g ladder of appendix E-D)
    assert cold.iloc[0]["lr"] == 0.1 and cold.iloc[0]["diverged"], "µ = 0.9, η = 0.1 diverges on LeNet"
    assert d[d["action"] == "choose_lr"].iloc[0]["lr"] == 0.01 and len(cold) < 5
    assert d[d["action"] == "initial_groups"].iloc[0]["n_groups"] == timing.smallest_saturating_g() == 4
    assert reached(result.trace, 0.99, 50)
    # the g ladder (appendix E-D) picked the cold-start epoch's g, which trained to the target
    chosen_g = d[d["action"] == "choose_groups"].iloc[0]["n_groups"]
    assert chosen_g > 1 and (d[d["action"] == "train"]["n_groups"] == chosen_g).all()
    assert result.trace["t_end"].is_monotonic_increasing and result.trace["t_end"].iloc[-1] <= 3000


@pytest.mark.slow
def test_stop_check_iterations_makes_train_runs_of_at_most_that_many_iterations(digits8):
    """Training runs end every `stop_check_iterations` so should_stop (the estimator's evaluation)
    sees the model as often as a fixed run's loop does; without it an epoch is 4 runs."""
    X, y = digits8
    checks: list[int] = []

    def should_stop(state: TrainState, trace: pd.DataFrame) -> bool:
        checks.append(state.iterations_done)
        return False

    opt = GridPolicy(
        probe_iterations=20, epoch_factor=3, cold_start_groups=False, stop_check_iterations=15
    ).for_fit(SimulatedEngine(PLANTED, verbose=0))
    capped = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=2, should_stop=should_stop)
    per_run = capped.trace[capped.trace["phase"] == "train"].groupby("run").size()
    assert len(per_run) > 4 and per_run.max() <= 15
    assert len(checks) >= len(per_run) and np.all(np.diff(checks) > 0)
    train_seconds = capped.decisions.query("action == 'train'")
    assert len(train_seconds) == 2  # the cold-start epoch and one Algorithm 1 epoch, each checked
    opt.stop_check_iterations = None
    uncapped = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=2, should_stop=lambda s, t: False)
    assert uncapped.trace[uncapped.trace["phase"] == "train"].groupby("run").ngroups == 4
