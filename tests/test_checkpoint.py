"""Checkpoints (issue #8): the format round-trips a real run's state; broken or partial writes never win."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from dasknn.engine import checkpoint
from dasknn.engine.simulated import SimulatedEngine
from dasknn.engine.trace import Budget, RunConfig, TrainState
from dasknn.nn import zoo


def _run(state=None, iterations=30):
    d = load_digits()
    X, y = d.data[:640].astype(np.float32).reshape(-1, 64, 1, 1) / 16, d.target[:640]
    net = zoo.get_net("mlp", input_shape=(64, 1, 1), num_classes=10, seed=0)
    engine = SimulatedEngine(t_conv=1.0, t_fc=0.3, n_workers=3, variability="gamma", verbose=0)
    config = RunConfig(n_groups=3, lr=0.05, momentum=0.9, batch_size=32, seed=1)
    return engine.run(net, X, y, config, Budget(iterations=iterations), start=state).state


def _same(a: TrainState, b: TrainState) -> None:
    assert a.iterations_done == b.iterations_done and a.batches_done == b.batches_done
    for group in ("params", "momentum"):
        x, z = getattr(a, group), getattr(b, group)
        assert x.keys() == z.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], z[key])


def test_a_simulator_state_round_trips_and_continues_exactly(tmp_path):
    state = _run()
    assert "simulator" in state.extra  # in-flight iterations, clock, timing and FC random generators
    history = pd.DataFrame({"time": [0.0, 1.5], "loss": [2.3, np.nan], "event": ["start", None]})
    path = checkpoint.save(tmp_path, state, {"loop": {"lr": 0.05, "big": 2**100}}, {"history": history})
    assert path.name == f"ckpt-{state.iterations_done:012d}"
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "manifest.json", "state.json"]
    ck = checkpoint.load(path)
    _same(ck.state, state)
    assert ck.meta == {"loop": {"lr": 0.05, "big": 2**100}}
    assert ck.tables["history"]["loss"].isna().tolist() == [False, True]
    assert ck.tables["history"]["event"].tolist()[0] == "start"
    _same(_run(ck.state), _run(state))  # the loaded state continues exactly like the original
    assert checkpoint.save(tmp_path, state).name == path.name + ".1"  # never overwritten
    assert checkpoint.latest(tmp_path).path.name == path.name + ".1"


def test_latest_skips_corrupted_truncated_and_partial_checkpoints(tmp_path):
    states = [TrainState({"w": np.full(1000, i, np.float32)}, iterations_done=i) for i in (1, 2, 3, 4)]
    paths = [checkpoint.save(tmp_path, s) for s in states]
    with open(paths[3] / "arrays.npz", "r+b") as f:  # truncated
        f.truncate(100)
    blob = bytearray((paths[2] / "arrays.npz").read_bytes())  # one flipped byte
    blob[-200] ^= 0xFF
    (paths[2] / "arrays.npz").write_bytes(bytes(blob))
    (paths[1] / "state.json").write_text('{"format": "dasknn-checkpoint", "vers')  # half-written JSON
    for broken in paths[1:]:
        with pytest.raises(checkpoint.CheckpointError):
            checkpoint.load(broken)
    (tmp_path / ".tmp-ckpt-999999999-dead").mkdir()  # a dead writer's temporary: not a checkpoint
    (tmp_path / "ckpt-000000000009").mkdir()  # empty: not complete
    with pytest.warns(UserWarning, match="damaged") as said:
        ck = checkpoint.latest(tmp_path)
    assert ck.state.iterations_done == 1 and float(ck.state.params["w"][0]) == 1.0
    (message,) = [str(w.message) for w in said]  # names the newest and the one loaded instead
    assert "ckpt-000000000009" in message and str(paths[0]) in message and "iteration 1" in message
    checkpoint.save(tmp_path, TrainState({"w": np.zeros(3)}, iterations_done=5), keep=1)
    assert not (tmp_path / ".tmp-ckpt-999999999-dead").exists()  # cleaned by the next save
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "ckpt-000000000005",
        "ckpt-000000000009",
    ]
    with pytest.warns(UserWarning, match="ckpt-000000000009 is damaged"):
        assert checkpoint.latest(tmp_path).state.iterations_done == 5


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from dasknn.engine import checkpoint
    from dasknn.engine.trace import TrainState
    i = int(sys.argv[2])
    while True:
        i += 1
        w = np.full(6_000_000, i, np.float32)  # 24 MB: a write takes a while
        checkpoint.save(sys.argv[1], TrainState({"w": w}, {"w": -w}, iterations_done=i), {"i": i}, keep=2)
        print(i, flush=True)
    """
)


def test_a_writer_killed_at_random_points_leaves_the_previous_checkpoint_loadable(tmp_path):
    rng = np.random.default_rng(0)
    start, mid_write = 0, 0
    for _ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(start)], stdout=subprocess.PIPE, text=True
        )
        assert int(child.stdout.readline()) == start + 1  # at least one complete checkpoint
        time.sleep(float(rng.uniform(0.0, 0.4)))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        mid_write += any(tmp_path.glob(f".tmp-ckpt-{child.pid}-*"))  # killed inside a save
        ck = checkpoint.latest(tmp_path)
        i = ck.meta["i"]
        assert i > start and ck.state.iterations_done == i
        assert np.all(ck.state.params["w"] == i) and np.all(ck.state.momentum["w"] == -i)
        start = i + 1000  # the next writer's checkpoints are all newer
    assert checkpoint.latest(tmp_path).meta["i"] > 3000
    assert mid_write >= 1, "no kill landed inside a write; the test did not test it"


def test_bad_input_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match="TrainState"):
        checkpoint.save(tmp_path, {"w": np.zeros(2)})
    with pytest.raises(TypeError, match="object"):
        checkpoint.save(tmp_path, TrainState({"w": np.zeros(2)}, extra={"x": np.array([None])}))
    with pytest.raises(TypeError, match="set"):
        checkpoint.save(tmp_path, TrainState({"w": np.zeros(2)}, extra={"x": {1, 2}}))
    with pytest.raises(ValueError, match="keep"):
        checkpoint.save(tmp_path, TrainState({"w": np.zeros(2)}), keep=0)
    assert checkpoint.list_checkpoints(tmp_path) == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(checkpoint.CheckpointError, match="not a complete checkpoint"):
        checkpoint.load(tmp_path)
    assert checkpoint.latest(tmp_path / "missing") is None


def test_healthy_flags_non_finite_and_exploding_weights():
    assert checkpoint.healthy(TrainState({"w": np.ones(3)}, {"w": np.zeros(3)}))
    assert not checkpoint.healthy(TrainState({"w": np.array([1.0, np.nan])}))
    assert not checkpoint.healthy(TrainState({"w": np.ones(3)}, {"w": np.array([np.inf])}))
    assert not checkpoint.healthy(TrainState({"w": np.array([2 * checkpoint.WEIGHT_LIMIT])}))


def test_rows_of_runs_a_policy_undid_may_lie_beyond_the_state(tmp_path):
    """After "auto" undid a window (its row at 112 stays in the history, its trace rows not kept),
    a checkpoint of the state at 96 is whole; one whose last row or kept trace lies beyond is not."""
    state = TrainState.from_net(zoo.mlp((64, 1, 1), 10, seed=0))
    state.iterations_done = 96
    path = tmp_path / "ckpt-000000000096"
    history = pd.DataFrame({"iteration": [0, 64, 112, 96]})
    trace = pd.DataFrame({"iteration": [64, 112, 96], "kept": [True, False, True]})
    assert checkpoint.check_document(path, state, {"history": history, "trace": trace}, False) == ""
    later = pd.DataFrame({"iteration": [0, 64, 128]})
    assert "history" in checkpoint.check_document(path, state, {"history": later}, False)
    kept = trace.assign(kept=True)
    assert "trace" in checkpoint.check_document(path, state, {"history": history, "trace": kept}, False)
