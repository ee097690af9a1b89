"""What crosses between host and device in one iteration, counted by `backend.transfer_counts` on
the real path of a numpy shard (the copies a GPU worker would make): the weights once as one
buffer, the images, the dropout mask and d(activations) once each, the activations and the
gradients (one buffer) back once each; the FC server takes activations and labels, returns dacts."""

from __future__ import annotations

import numpy as np

from dasknn.backend import transfer_counts
from dasknn.engine.dask import tasks
from dasknn.engine.servers import FCServer

from ..test_reproducible_dropout import dropout_net


def since(before: dict[str, int]) -> dict[str, int]:
    now = transfer_counts()
    return {k: now[k] - before[k] for k in now}


def test_one_iteration_of_a_numpy_shard_moves_what_the_design_says():
    conv, fc = dropout_net().split_phases()
    weights = conv.get_params()
    weight_bytes = sum(w.nbytes for w in weights.values())
    x = np.random.default_rng(0).random((16, 1, 28, 28), dtype=np.float32)
    y = np.arange(16) % 10
    fc_server = FCServer(fc.copy())
    mask_bytes = 16 * int(np.prod(conv.layer("drop1").out_shape))  # one byte per unit

    before = transfer_counts()
    tasks._net("count", conv, "cpu")  # the worker's device copy of the net, made once per run
    assert since(before) == {
        "to_device": 2,
        "to_device_bytes": weight_bytes,
        "to_host": 0,
        "to_host_bytes": 0,
    }
    before = transfer_counts()
    acts = tasks.conv_forward("count", "i0", 0, conv, weights, x, "cpu", (0, 0))
    forward = since(before)
    before = transfer_counts()
    out = fc_server.step(acts, y, 0.01, 0.9)
    fc_step = since(before)
    before = transfer_counts()
    grads = tasks.conv_backward("count", "i0", 0, conv, weights, acts, out["dacts"], "cpu")
    backward = since(before)

    assert forward == {
        "to_device": 3,  # the packed weights, the images, the dropout mask
        "to_device_bytes": weight_bytes + x.nbytes + mask_bytes,
        "to_host": 1,  # the activations
        "to_host_bytes": acts.nbytes,
    }
    assert fc_step == {
        "to_device": 2,  # activations and labels
        "to_device_bytes": acts.nbytes + y.nbytes,
        "to_host": 1,  # d(activations)
        "to_host_bytes": out["dacts"].nbytes,
    }
    assert backward == {  # the weights are loaded already: the caches hold the lowered ones
        "to_device": 1,
        "to_device_bytes": out["dacts"].nbytes,
        "to_host": 1,  # all gradients in one buffer
        "to_host_bytes": weight_bytes,
    }
    flat = next(iter(grads.values())).base
    assert flat is not None and all(g.base is flat for g in grads.values())
    assert flat.nbytes == weight_bytes

    before = transfer_counts()  # the next batch on the same pulled weights sends no weights
    tasks.conv_forward("count", "i1", 0, conv, weights, x, "cpu", (0, 1))
    assert since(before)["to_device_bytes"] == x.nbytes + mask_bytes
    tasks.forget_run("count")
