"""The optimizer's cold start as appendix E-D describes it (g tuned too, compared at equal time),
probes scored on the selection part, the µ early stop, and the estimator's optimizer_options; real
training on the SimulatedEngine with planted timings and probe losses."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from dasknn import DistributedCNN
from dasknn.data import load
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import TrainState
from dasknn.nn.train import evaluate
from dasknn.optimizer import GridPolicy
from dasknn.optimizer.cold_start import ladder
from dasknn.optimizer.search import SelectionLoss, state_hash
from dasknn.tradeoff.hardware import HEModel
from tests.planted import implicit_momentum_losses, small_net

PLANTED = HEModel(T_cc=5.0, T_nc=0.0, t_fc=1.0, n_workers=8)
"""8 conv devices, FC saturated from g = 4; iterations per second: g=1 0.62, g=2 0.89, g=4 1.0."""


@pytest.fixture(scope="module")
def digits8():
    X, y = load("digits", size=8, batch_size=32)
    return np.asarray(X), np.asarray(y)


def rows(d: pd.DataFrame, action: str, phase: str = "cold_start") -> pd.DataFrame:
    return d[(d["phase"] == phase) & (d["action"] == action)]


def test_the_ladder_runs_powers_of_two_up_to_the_initial_g():
    assert ladder([1, 2, 4, 8, 16, 32], 8) == [2, 4, 8]
    assert ladder([1, 2, 3, 6], 6) == [2, 6]
    assert ladder([1, 2], 1) == []


def test_momentum_zero_at_g2_stops_the_ladder_and_g2_wins_at_equal_time(digits8):
    """Planted Theorem 1 losses (best total momentum 0.6): at g = 2 the implicit momentum 0.5 leaves
    an explicit 0.1, the grid's µ* = 0, so the ladder stops there; g = 2 beats g = 1's (0.9, 0.1)."""
    X, y = digits8
    opt = GridPolicy(
        probe_iterations=8,
        epoch_factor=0.5,
        probe_losses=implicit_momentum_losses(optimal_total=0.6, best_lr=0.1),
    ).for_fit(SimulatedEngine(PLANTED, verbose=0))
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=2)
    d = result.decisions
    at2 = rows(d, "probe")[lambda r: r["n_groups"] == 2]
    # µ from the highest down at lr = 0.1, each better than the last (all four), then lr = 0.01
    assert list(at2["momentum"])[:4] == [0.9, 0.6, 0.3, 0.0] and set(at2["lr"]) == {0.1, 0.01}
    assert not (rows(d, "probe")["n_groups"] == 4).any()
    stop = rows(d, "stop_ladder").iloc[0]
    assert stop["n_groups"] == 2 and "µ* = 0 at g=2" in stop["reason"]
    chosen = rows(d, "choose_groups").iloc[0]
    assert chosen["chosen"] and (chosen["n_groups"], chosen["momentum"], chosen["lr"]) == (2, 0.0, 0.1)
    assert "lowest loss after the same time" in chosen["reason"]
    assert result.history[0]["phase"] == "cold_start" and result.history[0]["n_groups"] == 2
    assert rows(d, "initial_groups").iloc[0]["n_groups"] == 4
    assert rows(d, "probe", "search").iloc[0]["n_groups"] == 4, "Algorithm 1's loop starts at the initial g"
    # the g = 2 winner's start is the cold start's (every ladder probe starts from the initial state)
    assert rows(d, "probe")["start_hash"].nunique() == 1


@pytest.mark.slow
def test_equal_time_lets_the_faster_g_win_when_every_g_learns_alike(digits8):
    """A loss that falls with the iterations done, the same at every g (no SE penalty) and lowest at
    µ = 0.6: at equal time the g that iterates fastest (FC-saturated g = 4) has done the most."""
    X, y = digits8

    def losses(trace: pd.DataFrame, config) -> np.ndarray:
        n = np.arange(1, len(trace) + 1)
        return (1 + abs(config.momentum - 0.6)) * 10 / (10 + n)

    opt = GridPolicy(probe_iterations=20, probe_losses=losses).for_fit(SimulatedEngine(PLANTED, verbose=0))
    result = opt.optimize(small_net(), X, y, batch_size=32, max_epochs=1)
    d = result.decisions
    assert set(rows(d, "choose_at_g")["n_groups"]) == {2, 4}
    assert set(rows(d, "choose_at_g")["momentum"]) == {0.6}
    # early stop in µ: from the highest allowed down, 0.3 (worse than 0.6) ends each rate's column,
    # so µ = 0 is skipped; at η*_last no µ above µ*_last = 0.6 (appendix E's pruning)
    at4 = rows(d, "probe")[lambda r: r["n_groups"] == 4]
    top, tenth = at4["lr"].max(), at4["lr"].min()
    assert list(at4[at4["lr"] == top]["momentum"]) == [0.6, 0.3]
    assert list(at4[at4["lr"] == tenth]["momentum"]) == [0.9, 0.6, 0.3] and tenth == pytest.approx(top / 10)
    assert (rows(d, "skip")["reason"].str.contains("not probed: µ=0")).all() and len(rows(d, "skip")) >= 2
    chosen = rows(d, "choose_groups").iloc[0]
    assert chosen["n_groups"] == 4 and result.history[0]["n_groups"] == 4
    # each g's winner is continued to the same time: g = 1 once (then clearly worse), g = 2 and 4
    # (tied within 5%) a second round to twice that time, within an iteration of each other
    spent = {}
    for g in (1, 2, 4):
        w = rows(d, "choose_lr").iloc[0] if g == 1 else rows(d, "choose_at_g").set_index("n_groups").loc[g]
        mine = d[(d["phase"] == "cold_start") & d["action"].isin(["probe", "extend"]) & (d["n_groups"] == g)]
        spent[g] = mine[(mine["momentum"] == w["momentum"]) & (mine["lr"] == w["lr"])]["seconds"].sum()
    equal = rows(d, "extend")[lambda r: r["reason"].str.startswith("equal time")]
    first, second = sorted({float(r.split(": ")[1].split(" s")[0]) for r in equal["reason"]})
    slowest_iteration = 1.625  # g = 1: t_conv(8) + t_fc
    assert abs(spent[1] - first) <= slowest_iteration and second == pytest.approx(2 * first, rel=0.05)
    assert abs(spent[2] - spent[4]) <= 2 * slowest_iteration and spent[4] >= second - slowest_iteration


@pytest.mark.slow
def test_selection_scores_judge_the_probes_and_their_time_is_charged(digits8):
    X, y = digits8
    net = small_net()
    selection = SelectionLoss(net, X[:96], y[:96])
    start = TrainState.from_net(net)
    scratch = net.copy()
    scratch.set_params(start.params)
    assert selection.n_samples == 96 and selection(start) == pytest.approx(
        evaluate(scratch, X[:96], y[:96])[0]
    )

    calls: dict[str, float] = {}

    def score(state: TrainState) -> float:
        calls[state_hash(state)] = value = selection(state)
        return value

    score.n_samples = selection.n_samples
    opt = GridPolicy(probe_iterations=10, probe_score=score).for_fit(SimulatedEngine(PLANTED, verbose=0))
    result = opt.optimize(net, X, y, batch_size=32, max_epochs=1)
    d, trace = result.decisions, result.trace
    probed = d[d["action"].isin(["probe", "extend"]) & ~d["diverged"]]
    assert len(calls) == len(probed)
    np.testing.assert_allclose(sorted(probed["score"]), sorted(calls.values()))
    assert "selection loss" in " ".join(d["reason"])
    # scoring is charged to the simulated clock: gaps between the runs, so the runs' spans add up
    # to less than the clock
    spans = trace.groupby("run")["t_end"].max() - trace.groupby("run")["t_start"].min()
    assert d["time"].iloc[-1] > spans.sum() * 1.005


def test_the_estimator_scores_probes_on_its_selection_part_and_passes_optimizer_options():
    digits = load_digits()
    X, y = digits.data.astype(np.float32) / 16, digits.target
    options = {"lr_grid": (0.3, 0.03, 0.003), "probe_iterations": 12}
    est = DistributedCNN(net="mlp", input_shape="flat", engine="simulated", n_workers=4, batch_size=32,
                         time_budget=None, max_epochs=3, eval_size=300,
                         tuner=GridPolicy(**options))  # fmt: skip
    est.fit(X, y)
    d = est.decisions_
    cold = rows(d, "probe")[lambda r: r["n_groups"] == 1]
    assert set(cold["lr"]) <= {0.3, 0.03, 0.003} and cold["lr"].iloc[0] == 0.3
    assert (rows(d, "probe")["iterations"] == 12).all()
    assert "selection loss" in " ".join(d["reason"]), "the estimator judges probes on its selection part"


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"lr_grid": (0.1, -1.0)},
            r"tuner GridPolicy\(lr_grid=\(0.1, -1.0\)\): lr_grid must be a non-empty list, each item "
            r"a finite number > 0",
        ),
        ({"probe_iterations": 0}, "probe_iterations"),
        ({"cold_start_groups": "yes"}, "cold_start_groups must be True or False"),
    ],
)
def test_bad_optimizer_options_are_named_before_any_work(options, message):
    X = np.zeros((64, 1, 8, 8), dtype=np.float32)
    y = np.arange(64) % 2
    with pytest.raises(ValueError, match=message):
        DistributedCNN(engine="simulated", max_epochs=1, tuner=GridPolicy(**options)).fit(X, y)
    with pytest.raises(ValueError, match="tuner must be one of 'auto', 'grid', 'online' or a tuner"):
        DistributedCNN(engine="simulated", max_epochs=1, tuner={"lr_grid": (0.1,)}).fit(X, y)
