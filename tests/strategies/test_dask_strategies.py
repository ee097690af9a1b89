"""Issue #7's strategies on the DaskEngine (a real 2-worker LocalCluster): the unmerged map, Crossbow's
SMA, SparkNet's model averaging, and Crossbow's learner auto-tuner."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest

from dasknn.data.batching import iterate_batches
from dasknn.engine.autotune import MEASUREMENT_COLUMNS, tune_learners
from dasknn.engine.dask import DaskEngine, cluster_workers, local_client
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import TRACE_COLUMNS, Budget, RunConfig
from dasknn.nn import zoo
from dasknn.nn.solver import SGD
from dasknn.nn.train import train_step

from .conftest import training_accuracy

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=32, seed=2)


@pytest.fixture(scope="module")
def client2():
    with local_client(n_workers=2, threads_per_worker=2) as client:
        yield client


def in_process_sgd(X, y, config, iterations):
    """The reference: momentum SGD in one process on the engines' batch order."""
    net = zoo.lenet(seed=0)
    solver = SGD.for_net(net, base_lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    batches = iterate_batches(X, y, config.batch_size, epoch=0, seed=config.seed)
    for _ in range(iterations):
        train_step(net, solver, *dask.compute(*next(batches)))
    return net, solver


def assert_same_params(a, b, rtol=1e-4, atol=1e-6):
    assert set(a) == set(b)
    for key, value in a.items():
        np.testing.assert_allclose(value, b[key], rtol=rtol, atol=atol, err_msg=key)


def test_one_learner_of_model_averaging_on_dask_equals_momentum_sgd(client2, digits):
    X, y = digits
    strategy = Strategy("model_averaging", tau=3)
    net = zoo.lenet(seed=0)
    result = DaskEngine(client2, strategy=strategy).run(net, X, y, CFG, Budget(iterations=6))
    ref, solver = in_process_sgd(X, y, CFG, 6)
    assert_same_params(net.get_params(), ref.get_params())
    assert_same_params(result.state.momentum, solver.state_dict()["history"], rtol=1e-3)
    trace = result.trace
    assert list(trace["batch"]) == list(range(6)) and list(trace["iteration"]) == list(range(1, 7))
    assert (trace["staleness"] == 0).all() and trace.attrs["strategy"] == strategy.name


@pytest.mark.parametrize("strategy", [Strategy("sma"), Strategy("model_averaging", tau=2)])
def test_two_learners_on_dask_train_the_simulators_weights(client2, digits, strategy):
    X, y = digits
    cfg = CFG.with_(n_groups=2)
    dask_net, sim_net = zoo.lenet(seed=0), zoo.lenet(seed=0)
    engine = DaskEngine(client2, strategy=strategy)
    result = engine.run(dask_net, X, y, cfg, Budget(iterations=8))
    simulated = SimulatedEngine(t_conv=1.0, t_fc=0.1, n_workers=2, verbose=0, strategy=strategy).run(
        sim_net, X, y, cfg, Budget(iterations=8)
    )
    assert_same_params(result.state.params, simulated.state.params)
    assert_same_params(result.state.momentum, simulated.state.momentum, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(
        result.trace.sort_values("iteration")["loss"], simulated.trace["loss"], rtol=1e-5
    )
    assert sorted(engine.placement_.groups) == sorted([[w] for w in cluster_workers(client2)])
    assert result.state.batches_done == 8 and result.trace.attrs["learners_per_worker"] == 1


def test_unmerged_records_fc_staleness_in_the_merged_schema(client2, digits):
    X, y = digits
    cfg = CFG.with_(n_groups=2)
    merged = DaskEngine(client2).run(zoo.lenet(seed=0), X, y, cfg, Budget(iterations=4)).trace
    engine = DaskEngine(client2, strategy=Strategy(physical_map="unmerged"))
    # long enough that the two groups overlap even when one starts a moment after the other
    result = engine.run(zoo.lenet(seed=0), X, y, cfg, Budget(iterations=60))
    trace = result.trace
    n = len(TRACE_COLUMNS)
    assert list(trace.columns[:n]) == list(merged.columns[:n]) == list(TRACE_COLUMNS)
    assert (trace.dtypes.iloc[:n] == merged.dtypes.iloc[:n]).all()
    assert {"batch", "fc_staleness"} <= set(trace.columns)
    assert trace.attrs["physical_map"] == "unmerged" and trace.attrs["split"] == "ip1"
    assert sorted(trace["version_written"]) == list(range(1, 61))
    assert (trace["fc_staleness"] >= 0).all() and (trace["staleness"] >= 0).all()
    # two groups push concurrently: some updates were computed on stale FC (and conv) weights
    assert trace["fc_staleness"].max() >= 1 and trace["staleness"].max() >= 1
    assert set(result.state.params) == set(zoo.lenet().get_params())
    assert result.state.iterations_done == 60 and result.state.batches_done == 60


@pytest.mark.parametrize("shard_calls", ["actors", "tasks"])
def test_unmerged_one_group_of_two_workers_equals_momentum_sgd(client2, digits, shard_calls):
    X, y = digits
    net = zoo.lenet(seed=0)
    engine = DaskEngine(client2, strategy=Strategy(physical_map="unmerged"), shard_calls=shard_calls)
    result = engine.run(net, X, y, CFG, Budget(iterations=5))
    assert len(engine.placement_.groups[0]) == 2  # each worker runs conv + FC on its shard
    ref, _ = in_process_sgd(X, y, CFG, 5)
    assert_same_params(net.get_params(), ref.get_params(), rtol=1e-3, atol=5e-5)  # float32 shard sums
    assert (result.trace["fc_staleness"] == 0).all()


def test_auto_tuner_keeps_adding_learners_while_simulated_throughput_rises(digits):
    X, y = dask.compute(*digits)  # numpy: the simulator computes dask inputs again on every probe
    # 4 workers: l learners get 4 // l workers each; the 3rd learner drops to one slow worker
    t_conv = {4: 1.0, 2: 1.0, 1: 2.0}.__getitem__
    strategy = Strategy("sma", learners="auto")
    engine = SimulatedEngine(
        t_conv=t_conv, t_fc=0.1, t_fc_worker=0.0, n_workers=4, verbose=0, strategy=strategy
    )
    # the probes (4 rounds of 1, 2, 3 learners: 24 iterations) train, then 2 learners go on
    result = engine.run(zoo.lenet(seed=0), X, y, CFG.with_(batch_size=8), Budget(iterations=28))
    m = pd.DataFrame(result.trace.attrs["learner_tuning"])
    assert list(m.columns) == list(MEASUREMENT_COLUMNS)
    assert list(m["decision"]) == ["add", "add", "remove"] and result.trace.attrs["learners"] == 2
    np.testing.assert_allclose(m["throughput"], [8.0, 16.0, 12.0])  # images per simulated second
    trace = result.trace
    assert len(trace) == 28 and list(trace["iteration"]) == list(range(1, 29))
    assert list(trace["group"].iloc[24:]) == [0, 1, 0, 1] and trace["t_end"].is_monotonic_increasing
    assert result.state.batches_done == 28 and engine.strategy.learners == "auto"


def test_auto_tuner_adds_a_learner_then_stops_on_the_measured_plateau(client2, digits):
    X, y = digits
    engine = DaskEngine(client2, strategy=Strategy("sma"))
    cfg = CFG.with_(batch_size=64, lr=0.005)
    tuning = tune_learners(engine, zoo.lenet(seed=0), X, y, cfg, probe_rounds=6, max_learners=6)
    m = tuning.measurements
    # it always tries a second learner, then follows the measured throughput: where it stops (a
    # plateau, a drop, or the cap of six) depends on the machine's speed and load, so the test
    # checks each decision against the numbers measured, not the count it ends at
    assert m["decision"].iloc[0] == "add" and len(m) >= 2
    assert m["decision"].iloc[-1] in ("keep", "remove", "max") and 1 <= tuning.learners <= 6
    assert list(m["learners"]) == list(range(1, len(m) + 1))
    for row in m.iloc[1:].itertuples():  # every decision is Alg. 2's on the measured numbers
        expected = "add" if row.change > 0.05 else ("remove" if row.change < 0 else "keep")
        if expected == "add" and row.learners == 6:
            expected = "max"
        assert row.decision == expected, m
    np.testing.assert_allclose(m["throughput"], m["learners"] * 64 / m["round_seconds"])
    assert (m["throughput"] > 0).all() and (m["rounds"] == 6).all()
    assert tuning.trace.attrs["engine"] == "dask" and len(tuning.trace) == 6 * m["learners"].sum()
    assert tuning.state.iterations_done == len(tuning.trace)


def test_strategy_learners_option_is_validated():
    with pytest.raises(ValueError, match="learners"):
        Strategy("sma", learners="many")
    with pytest.raises(ValueError, match="sma"):
        Strategy(learners="auto")
    with pytest.raises(ValueError, match="probe_rounds"):
        tune_learners(
            SimulatedEngine(t_conv=1.0, t_fc=0.1, strategy=Strategy("sma")),
            None,
            None,
            None,
            CFG,
            probe_rounds=2,
        )


# -- training to accuracy (minutes) ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, config, iterations",
    [
        (Strategy(physical_map="unmerged"), RunConfig(n_groups=2, lr=0.02, momentum=0.6, batch_size=64), 800),
        # Alg. 1: µ moves the average model only, so SMA's replicas take a larger η than averaging's
        (Strategy("sma"), RunConfig(n_groups=2, lr=0.1, momentum=0.9, batch_size=64), 800),
        (
            Strategy("model_averaging", tau=4),
            RunConfig(n_groups=2, lr=0.01, momentum=0.9, batch_size=64),
            600,
        ),
    ],
    ids=["unmerged", "sma", "model_averaging"],
)
def test_dask_strategies_train_lenet_to_97_percent(client2, mnist, strategy, config, iterations):
    X, y, Xn, yn = mnist
    net = zoo.lenet(seed=0)
    result = DaskEngine(client2, strategy=strategy).run(net, X, y, config, Budget(iterations=iterations))
    accuracy = training_accuracy(net, Xn, yn)
    print(f"{strategy.name}/{strategy.physical_map}: {accuracy:.4f} after {len(result.trace)} iterations")
    assert accuracy >= 0.97


def test_unmerged_one_group_of_three_workers_sums_by_a_tree_of_shard_servers(digits):
    """k = 3: the two remote whole-net gradients meet in a tree among the ShardServers."""
    X, y = digits
    with local_client(n_workers=3) as client:
        net = zoo.lenet(seed=0)
        engine = DaskEngine(client, strategy=Strategy(physical_map="unmerged"))
        result = engine.run(net, X, y, CFG, Budget(iterations=4))
        assert len(engine.placement_.groups[0]) == 3
    ref, _ = in_process_sgd(X, y, CFG, 4)
    assert_same_params(net.get_params(), ref.get_params(), rtol=1e-3, atol=5e-5)
    assert list(result.trace["iteration"]) == [1, 2, 3, 4] and (result.trace["fc_staleness"] == 0).all()
