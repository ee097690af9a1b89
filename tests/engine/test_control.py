"""Control of a running run on the simulator (`engine.control`): a schedule changed mid-run at the
iteration the control says, bit for bit; a snapshot kept by the servers and restored mid-run gives
the state it took; the run ended by its control; a resume mid-schedule after a change; bad
commands refused before they apply. Each test is a few tiny simulated runs (< 1 s each)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from dasknn.engine import checkpoint
from dasknn.engine.control import End, Progress, Reschedule, Restore, TakeSnapshot
from dasknn.engine.schedule import Schedule
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.strategy import Strategy
from dasknn.engine.trace import Budget, RunConfig
from tests.engine.simulated.test_engine import assert_same_weights, tiny_net


class Script:
    """A control that answers each poll from a script {state iteration: commands}, once each, and
    remembers every poll's progress."""

    def __init__(self, script):
        self.script, self.seen = dict(script), []

    def poll(self, progress: Progress):
        self.seen.append(progress)
        return self.script.pop(progress.iteration, [])


def sim_run(X, y, config, iterations, start=None, control=None, g_workers=None):
    engine = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0, n_workers=g_workers)
    return engine.run(tiny_net(), X, y, config, Budget(iterations=iterations), start, control=control)


@pytest.mark.parametrize("g", [1, 3])
def test_a_reschedule_mid_run_equals_the_same_schedule_given_at_the_start_bit_for_bit(tiny_data, g):
    X, y = tiny_data
    base = RunConfig(n_groups=g, lr=0.05, momentum=0.9, batch_size=8, seed=1)
    k = 7  # the control speaks after update 3, for the updates with index >= 7
    ramp = Schedule.linear(0.9, 0.5, 4, begin=k)  # a schedule is of the fit's iteration index
    control = Script({3: [Reschedule(lr=0.2, momentum=ramp, at=k)]})
    changed = sim_run(X, y, base, 14, control=control)
    given = base.with_(lr=Schedule.steps_of(0.05, {k: 0.2}), momentum=ramp)
    planned = sim_run(X, y, given, 14)
    assert_same_weights(changed.state.params, planned.state.params)
    assert_same_weights(changed.state.momentum, planned.state.momentum)
    assert changed.trace["lr"].tolist() == planned.trace["lr"].tolist()
    before = changed.trace["iteration"] <= k  # update index i = iteration − 1
    assert (changed.trace["lr"][before] == 0.05).all() and (changed.trace["lr"][~before] == 0.2).all()
    assert changed.trace.attrs["control"][0] == {
        "command": "Reschedule", "iteration": k, "seconds": control.seen[2].seconds, "at": k,
        "lr": 0.2, "momentum": ramp.to_dict(),
    }  # fmt: skip
    assert [p.iteration for p in control.seen] == list(range(1, 15))
    assert all(len(p.rows) == 1 for p in control.seen)


def test_a_reschedule_for_an_iteration_already_passed_takes_effect_at_the_next_update(tiny_data):
    X, y = tiny_data
    control = Script({5: [Reschedule(lr=0.2, at=2)]})
    run = sim_run(X, y, RunConfig(lr=0.05, batch_size=8), 9, control=control)
    assert run.trace["lr"].tolist() == [0.05] * 5 + [0.2] * 4
    assert run.trace.attrs["control"][0]["iteration"] == 5


def test_a_snapshot_restored_mid_run_gives_the_state_it_took(tiny_data):
    X, y = tiny_data
    config = RunConfig(n_groups=1, lr=Schedule.linear(0.1, 0.02, 10), momentum=0.9, batch_size=8, seed=2)
    control = Script({4: [TakeSnapshot("a")], 9: [Restore("a"), End("restored")]})
    run = sim_run(X, y, config, 20, control=control)
    taken = sim_run(X, y, config, 4)  # the same run, stopped where the snapshot was taken
    assert_same_weights(run.state.params, taken.state.params)
    assert_same_weights(run.state.momentum, taken.state.momentum)
    assert run.state.iterations_done == 4 and len(run.trace) == 9  # the rows went on, the state went back
    assert [(c["command"], c["iteration"]) for c in run.trace.attrs["control"]] == [
        ("TakeSnapshot", 4), ("Restore", 4), ("End", 4),
    ]  # fmt: skip


def test_training_goes_on_after_a_restore_from_the_snapshot_at_its_schedule_position(tiny_data):
    """After a restore the schedule is read at the snapshot's iteration index again, and the state's
    count goes on from there (the data does not go back)."""
    X, y = tiny_data
    config = RunConfig(n_groups=2, lr=Schedule.steps_of(0.05, {6: 0.2}), momentum=0.5, batch_size=8)
    control = Script({4: [TakeSnapshot("a")], 8: [Restore("a")]})
    run = sim_run(X, y, config, 12, control=control)
    assert run.state.iterations_done == 8  # 4 (the snapshot's) + the 4 updates after the restore
    lrs = run.trace["lr"].tolist()
    assert lrs[:8] == [0.05] * 6 + [0.2] * 2 and lrs[8:] == [0.05, 0.05, 0.2, 0.2]


def test_end_stops_the_run_at_the_poll_that_says_so(tiny_data):
    X, y = tiny_data
    run = sim_run(X, y, RunConfig(n_groups=2, batch_size=8), 50, control=Script({6: [End()]}))
    assert len(run.trace) == 6 and run.state.iterations_done == 6


def test_resume_mid_schedule_after_a_reschedule_equals_an_uninterrupted_run(tiny_data, tmp_path):
    """A controlled run's checkpoint resumes exactly when the change goes on as the resumed run's
    schedule (the loop keeps a run's schedule in its session)."""
    X, y = tiny_data
    config = RunConfig(n_groups=2, lr=0.2, momentum=0.9, batch_size=8, seed=3)
    decay = Schedule.cosine(0.2, 0.02, 8, begin=5)  # 0.2 before index 5: the run's schedule goes on
    whole = sim_run(X, y, config, 14, control=Script({2: [Reschedule(lr=decay)]}))
    resumed_config = config.with_(lr=decay)
    part = sim_run(X, y, resumed_config, 6)
    saved = checkpoint.load(checkpoint.save(tmp_path, part.state, meta={"config": asdict(resumed_config)}))
    rest = sim_run(X, y, RunConfig(**saved.meta["config"]), 8, start=saved.state)
    assert_same_weights(whole.state.params, rest.state.params)
    assert_same_weights(whole.state.momentum, rest.state.momentum)
    assert whole.trace["lr"].tolist() == part.trace["lr"].tolist() + rest.trace["lr"].tolist()


@pytest.mark.parametrize(
    "answer, match",
    [
        (["stop"], "not a Reschedule"),
        ([Reschedule(lr=-1.0)], "lr"),
        ([Reschedule(momentum=Schedule.linear(0.9, 1.2, 3))], "momentum"),
        ([Reschedule(lr=0.1, at=-2)], "at must be"),
        ([Restore("never")], "no snapshot 'never'"),
        ([TakeSnapshot("s", fetch=True)], "does not fetch"),
    ],
)
def test_a_bad_command_is_refused_naming_it(tiny_data, answer, match):
    X, y = tiny_data
    with pytest.raises((ValueError, KeyError), match=match):
        sim_run(X, y, RunConfig(batch_size=8), 4, control=Script({1: answer}))


def test_a_control_needs_the_merged_map_of_compute_groups(tiny_data):
    X, y = tiny_data
    engine = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0, strategy=Strategy(physical_map="unmerged"))
    with pytest.raises(ValueError, match="merged map"):
        engine.run(tiny_net(), X, y, RunConfig(batch_size=8), Budget(iterations=2), control=Script({}))


def test_a_policy_attaches_a_control_to_the_run_it_asks_for(tiny_data):
    """The loop hands a NextRun's control to the engine: one run, η changed inside it (< 1 s)."""
    from dasknn.engine.trace import TrainState
    from dasknn.fitting import Loop
    from dasknn.policy import NextRun, Stop

    X, y = tiny_data
    config = RunConfig(n_groups=2, lr=0.05, momentum=0.9, batch_size=8)

    class OneSteeredRun:
        def begin(self, fit, resume):
            pass

        def next_run(self, outcome):
            if outcome is None:
                return NextRun(config, Budget(iterations=10), control=Script({4: [Reschedule(lr=0.2, at=6)]}))
            return Stop("one run", config)

    net = tiny_net()
    engine = SimulatedEngine(t_conv=2.0, t_fc=0.5, verbose=0)
    result = Loop(engine, net, X, y, batch_size=8, n_classes=3).run(OneSteeredRun(), TrainState.from_net(net))
    assert result.trace["lr"].tolist() == [0.05] * 6 + [0.2] * 4 and result.state.iterations_done == 10
