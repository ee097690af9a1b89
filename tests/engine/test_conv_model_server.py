"""`ConvModelServer.push_pull`: one call that is a push and then a pull, or nothing once stopped."""

from __future__ import annotations

import numpy as np

from dasknn.engine.servers import ConvModelServer


def _server() -> ConvModelServer:
    rng = np.random.default_rng(0)
    return ConvModelServer({"w": rng.standard_normal((3, 4)).astype(np.float32)}, weight_decay=5e-4)


def test_push_pull_is_a_push_then_a_pull():
    grads = {"w": np.full((3, 4), 0.5, dtype=np.float32)}
    a, b = _server(), _server()
    pushed = a.push(grads, 0, 0.1, 0.9, {"t_start": 1.0})
    version, weights = a.pull()
    out, (version_b, weights_b) = b.push_pull(grads, 0, 0.1, 0.9, {"t_start": 1.0})
    assert out.keys() == pushed.keys()
    for key in set(out) - {"t_end"}:  # the update statistics are NaN after one update
        assert np.array_equal(out[key], pushed[key], equal_nan=True), key
    assert version_b == version == 1 and np.array_equal(weights_b["w"], weights["w"])
    weights_b["w"][:] = 0  # a copy: the server's weights stay
    assert np.array_equal(b.pull()[1]["w"], weights["w"])
    assert len(b.drain()["rows"]) == 1


def test_push_pull_after_stop_changes_nothing():
    server = _server()
    before = server.pull()[1]["w"].copy()
    server.stop()
    assert server.push_pull({"w": np.ones((3, 4), np.float32)}, 0, 0.1, 0.9) == (None, None)
    assert server.version == 0 and np.array_equal(server.pull()[1]["w"], before)
