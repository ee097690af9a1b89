"""η and µ schedules inside a run: the `Schedule` values, their plain form and checks, and the
simulator applying them at the update they say, recording them in the Trace, and resuming exactly."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from dasknn.engine import checkpoint
from dasknn.engine.schedule import Schedule, value_at
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from tests.engine.simulated.test_engine import assert_same_weights, tiny_net


def test_each_kind_gives_its_values_at_the_iteration_index():
    assert [Schedule.steps_of(0.1, {3: 0.01, 5: 0.001}).value(i) for i in range(7)] == [
        0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001,
    ]  # fmt: skip
    linear = Schedule.linear(0.4, 0.2, length=4, begin=2)
    assert [linear.value(i) for i in range(8)] == pytest.approx([0.4, 0.4, 0.4, 0.35, 0.3, 0.25, 0.2, 0.2])
    cosine = Schedule.cosine(1.0, 0.0 + 0.5, length=10)
    assert cosine.value(0) == 1.0 and cosine.value(5) == pytest.approx(0.75) and cosine.value(99) == 0.5
    ramp = Schedule.geometric(0.001, 0.1, length=2)
    assert [ramp.value(i) for i in range(4)] == pytest.approx([0.001, 0.01, 0.1, 0.1])
    assert Schedule.constant(0.3).value(10**9) == 0.3 and value_at(0.3, 7) == 0.3


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule.constant(0.5),
        Schedule.geometric(0.001, 0.1, 50, begin=10),
        Schedule.linear(0.1, 0.01, 7),
        Schedule.cosine(0.9, 0.5, 20, begin=3),
        Schedule.steps_of(0.1, {10: 0.05, 20: 0.01}),
    ],
)
def test_the_plain_form_is_json_and_reads_back_equal(schedule):
    d = json.loads(json.dumps(schedule.to_dict()))
    assert Schedule.from_dict(d) == schedule and Schedule.from_dict(asdict(schedule)) == schedule


@pytest.mark.parametrize(
    "given, names",
    [
        ({"kind": "exponential", "start": 0.1}, "kind must be one of"),
        ({"kind": "linear", "start": 0.1, "end": 0.01}, "needs length"),
        ({"kind": "linear", "start": 0.1, "end": 0.01, "length": 0}, "length must be an integer >= 1"),
        ({"kind": "cosine", "start": 0.1, "end": math.nan, "length": 5}, "end must be a finite number"),
        ({"kind": "geometric", "start": 0.0, "end": 0.1, "length": 5}, "start and end must be > 0"),
        ({"kind": "steps", "start": 0.1, "steps": [[5, 0.01], [5, 0.001]]}, "step iterations must increase"),
        ({"kind": "steps", "start": 0.1, "steps": []}, "needs at least one"),
        ({"kind": "constant", "start": 0.1, "rate": 2}, "no field rate"),
        ({"kind": "constant", "start": 0.1, "end": 0.2}, "takes no end"),
    ],
)
def test_a_bad_schedule_is_refused_naming_its_field(given, names):
    with pytest.raises(ValueError, match=f"lr: .*{names}"):
        RunConfig(lr=given)


def test_run_config_checks_every_value_a_schedule_takes_and_keeps_constants_as_floats():
    with pytest.raises(ValueError, match="every value of the momentum schedule must be a number in"):
        RunConfig(momentum=Schedule.steps_of(0.9, {100: 1.0}))
    with pytest.raises(ValueError, match="every value of the lr schedule must be a finite number > 0"):
        RunConfig(lr=Schedule.linear(0.1, 0.0, 10))
    assert RunConfig(lr=Schedule.constant(0.02)) == RunConfig(lr=0.02)
    scheduled = RunConfig(lr=Schedule.cosine(0.1, 0.01, 10).to_dict())
    assert scheduled.lr == Schedule.cosine(0.1, 0.01, 10) and RunConfig(**asdict(scheduled)) == scheduled


def test_replica_strategies_refuse_a_schedule_before_any_work(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.5, verbose=0, strategy=Strategy("sma"))
    config = RunConfig(lr=Schedule.steps_of(0.1, {2: 0.01}), batch_size=8)
    with pytest.raises(ValueError, match="strategy 'sma' takes a constant lr and momentum"):
        engine.run(tiny_net(), X, y, config, Budget(iterations=2))


def sim_run(X, y, config, iterations, start=None, net=None):
    net = tiny_net() if net is None else net
    engine = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0)
    return engine.run(net, X, y, config, Budget(iterations=iterations), start)


@pytest.mark.parametrize("g, physical_map", [(1, "merged"), (3, "merged"), (3, "unmerged")])
def test_a_step_schedule_changes_eta_at_exactly_its_iteration(tiny_data, g, physical_map):
    X, y = tiny_data
    k = 7
    config = RunConfig(n_groups=g, lr=Schedule.steps_of(0.05, {k: 0.2}), momentum=0.5, batch_size=8)
    engine = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0, strategy=Strategy(physical_map=physical_map))
    trace = engine.run(tiny_net(), X, y, config, Budget(iterations=12)).trace
    # update index i = iteration - 1: the first k updates apply 0.05, the others 0.2
    before = trace["iteration"] <= k
    assert (trace["lr"][before] == 0.05).all() and (trace["lr"][~before] == 0.2).all()
    assert sorted(trace["iteration"]) == list(range(1, 13)) and (trace["momentum"] == 0.5).all()


def test_a_scheduled_run_equals_two_runs_with_the_constants_bit_for_bit(tiny_data):
    X, y = tiny_data
    k, base = 5, RunConfig(n_groups=1, momentum=0.9, batch_size=8, seed=1)
    scheduled = base.with_(lr=Schedule.steps_of(0.05, {k: 0.2}), momentum=Schedule.steps_of(0.9, {k: 0.5}))
    one = sim_run(X, y, scheduled, 11)
    first = sim_run(X, y, base.with_(lr=0.05, momentum=0.9), k)
    second = sim_run(X, y, base.with_(lr=0.2, momentum=0.5), 11 - k, start=first.state)
    assert_same_weights(one.state.params, second.state.params)
    assert_same_weights(one.state.momentum, second.state.momentum)
    assert one.trace["lr"].tolist() == first.trace["lr"].tolist() + second.trace["lr"].tolist()
    assert one.trace["momentum"].tolist() == [0.9] * k + [0.5] * (11 - k)


def test_resume_mid_schedule_from_a_checkpoint_equals_an_uninterrupted_run(tiny_data, tmp_path):
    X, y = tiny_data
    config = RunConfig(
        n_groups=2, lr=Schedule.cosine(0.2, 0.02, 12, begin=2), momentum=Schedule.linear(0.5, 0.9, 10),
        batch_size=8, seed=2,
    )  # fmt: skip
    whole = sim_run(X, y, config, 16)
    part = sim_run(X, y, config, 6)
    saved = checkpoint.save(tmp_path, part.state, meta={"config": asdict(config)})
    ckpt = checkpoint.load(saved)
    resumed_config = RunConfig(**ckpt.meta["config"])
    assert resumed_config == config
    rest = sim_run(X, y, resumed_config, 10, start=ckpt.state)
    assert_same_weights(whole.state.params, rest.state.params)
    assert_same_weights(whole.state.momentum, rest.state.momentum)
    joined = part.trace["lr"].tolist() + rest.trace["lr"].tolist()
    assert joined == whole.trace["lr"].tolist() and len(set(joined)) > 8
