"""The Dask engine on GPU workers: a group of two `GPU=1` workers computes its shards with CuPy (the
lead's inline, the other on its ShardServer actor, or as tasks) and trains what in-process numpy
training does. Run with `-m gpu` on a CUDA machine; both workers share the one GPU."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import cupy_available
from dasknn.engine.dask import DaskEngine, local_client
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

from .test_driver import in_process

pytestmark = pytest.mark.gpu

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)


@pytest.mark.parametrize("shard_calls", ["actors", "tasks"])
def test_a_group_of_two_gpu_workers_trains_like_numpy_in_process(digits, shard_calls):
    if not cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    X, y = digits
    with local_client(n_workers=2, resources={"GPU": 1}) as client:
        engine = DaskEngine(client, shard_calls=shard_calls)
        net = zoo.lenet(seed=0)
        result = engine.run(net, X, y, CFG, Budget(iterations=8))
        placement = engine.placement_
    assert set(placement.devices.values()) == {"gpu"} and len(placement.groups[0]) == 2
    assert list(result.trace["iteration"]) == list(range(1, 9))
    ref = in_process(X, y, CFG, 8)
    for k, v in ref.params.items():
        assert isinstance(net.params[k], np.ndarray), f"{k} came back as {type(net.params[k])}"
        np.testing.assert_allclose(net.params[k], v, rtol=2e-3, atol=1e-4, err_msg=k)
