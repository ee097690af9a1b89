"""The Dask engine on GPU workers trains what the numpy path trains: groups of one, two and three
`GPU=1` workers (shards with CuPy, the FC server with CuPy on its GPU worker), conv-phase dropout
with the numpy run's masks, a mixed CPU + GPU group after `calibrate()`, and a lost GPU worker.
Run with `-m gpu` on a CUDA machine; the workers share its GPUs (`gpu:N` spreads them over several)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import cupy_available
from dasknn.engine.dask import DaskEngine, cluster_workers, local_client
from dasknn.engine.dask.actors import submit_actor
from dasknn.engine.servers import FCServer
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

from ..test_reproducible_dropout import dropout_net
from .test_driver import in_process
from .test_faults import ITERATIONS, KILL_AT, SNAPSHOT_EVERY, TARGET, Killer, check_trace, training_accuracy

pytestmark = pytest.mark.gpu

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)
GPU = {"GPU": 1}


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    if not cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")


def assert_like(net, ref, rtol=2e-3, atol=1e-4):
    for k, v in ref.params.items():
        assert isinstance(net.params[k], np.ndarray), f"{k} came back as {type(net.params[k])}"
        np.testing.assert_allclose(net.params[k], v, rtol=rtol, atol=atol, err_msg=k)


def _fc_param_modules(dask_worker) -> list[str]:
    """The array modules of the FC servers' parameters living in this worker (run by client.run)."""
    actors = getattr(getattr(dask_worker, "state", None), "actors", {})
    return sorted(
        {
            type(v).__module__.split(".")[0]
            for a in actors.values()
            if isinstance(a, FCServer)
            for v in a.net.params.values()
        }
    )


@pytest.mark.parametrize("shard_calls", ["actors", "tasks"])
def test_a_group_of_two_gpu_workers_trains_like_numpy_in_process(digits, shard_calls):
    X, y = digits
    with local_client(n_workers=2, resources=GPU) as client:
        engine = DaskEngine(client, shard_calls=shard_calls)
        net = zoo.lenet(seed=0)
        result = engine.run(net, X, y, CFG, Budget(iterations=8))
        placement = engine.placement_
    assert set(placement.devices.values()) == {"gpu:0", "gpu:1"} and len(placement.groups[0]) == 2
    assert list(result.trace["iteration"]) == list(range(1, 9))
    assert_like(net, in_process(X, y, CFG, 8))


def test_a_one_worker_gpu_group_trains_like_numpy_in_process(digits):
    X, y = digits
    with local_client(n_workers=1, resources=GPU) as client:
        net = zoo.lenet(seed=0)
        DaskEngine(client).run(net, X, y, CFG, Budget(iterations=8))
    assert_like(net, in_process(X, y, CFG, 8))


def test_conv_phase_dropout_on_gpu_workers_draws_the_numpy_run_s_masks(digits):
    X, y = digits
    nets = {}
    for name, resources in (("gpu", GPU), ("cpu", {})):
        with local_client(n_workers=2, resources=resources) as client:
            nets[name] = dropout_net()
            DaskEngine(client).run(nets[name], X, y, CFG.with_(lr=0.05), Budget(iterations=6))
    assert_like(nets["gpu"], nets["cpu"])


def test_the_fc_server_on_a_gpu_worker_computes_with_cupy(digits):
    _, fc = zoo.lenet(seed=0).split_phases()
    rng = np.random.default_rng(0)
    acts = rng.random((32, *fc.input_shape), dtype=np.float32)
    labels = rng.integers(0, 10, 32)  # numpy labels, as the groups send them
    with local_client(n_workers=1, resources=GPU) as client:
        (worker,) = cluster_workers(client)
        actor = submit_actor(client, FCServer, fc.copy(), 5e-4, 0, "gpu:0", worker=worker).result()
        outs = [actor.step(acts, labels, 0.01, 0.9).result() for _ in range(3)]
        assert client.run(_fc_param_modules, workers=[worker]) == {worker: ["cupy"]}
        state = actor.get_state().result()
    cpu = FCServer(fc.copy(), 5e-4, 0)
    for out in outs:
        want = cpu.step(acts, labels, 0.01, 0.9)
        assert isinstance(out["dacts"], np.ndarray)
        np.testing.assert_allclose(out["dacts"], want["dacts"], rtol=1e-3, atol=1e-6)
    assert all(isinstance(v, np.ndarray) for v in state["params"].values())
    for k, v in cpu.get_state()["params"].items():
        np.testing.assert_allclose(state["params"][k], v, rtol=1e-3, atol=1e-5, err_msg=k)


def test_a_mixed_cpu_and_gpu_group_after_calibrate_trains_like_numpy(digits):
    from distributed import Client, Nanny, Scheduler, SpecCluster

    X, y = digits
    workers = {
        "cpu": {"cls": Nanny, "options": {"nthreads": 1}},
        "gpu": {"cls": Nanny, "options": {"nthreads": 1, "resources": GPU}},
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        engine = DaskEngine(client)
        speeds = engine.calibrate()
        net = zoo.lenet(seed=0)
        engine.run(net, X, y, CFG, Budget(iterations=8))
        placement = engine.placement_
    assert sorted(placement.devices.values()) == ["cpu", "gpu:0"] and len(placement.groups[0]) == 2
    gpu = next(w for w, d in placement.devices.items() if d != "cpu")
    assert placement.fc_worker == gpu  # the FC server goes to the GPU worker
    share = placement.shares[gpu]
    assert share == pytest.approx(speeds[gpu] / sum(speeds.values()))
    assert_like(net, in_process(X, y, CFG, 8))


def test_a_tree_of_three_gpu_shards_sums_like_numpy(digits):
    X, y = digits
    with local_client(n_workers=3, resources=GPU) as client:
        engine = DaskEngine(client)  # actors: two shard servers reduce by a tree, the lead adds its own
        net = zoo.lenet(seed=0)
        engine.run(net, X, y, CFG, Budget(iterations=8))
        assert len(engine.placement_.groups[0]) == 3
    assert_like(net, in_process(X, y, CFG, 8))


def test_losing_a_gpu_worker_recovers_and_reaches_the_numpy_target(digits):
    X, y = digits
    with local_client(n_workers=2, resources=GPU) as client:
        engine = DaskEngine(client, timeout=20, poll=0.2, snapshot_every=SNAPSHOT_EVERY)
        killer = Killer(client, engine, lambda p: [p.fc_worker], at=KILL_AT, machine=True)
        killer.start()
        net = zoo.lenet(seed=0)
        result = engine.run(net, X, y, CFG.with_(n_groups=2), Budget(seconds=180, iterations=ITERATIONS))
        killer.join(timeout=5)
    (rec,) = result.trace.attrs["recoveries"]
    assert rec["worker"] == killer.victims[0] and "FC server" in rec["roles"] and rec["from_snapshot"]
    check_trace(result, ITERATIONS)
    acc = training_accuracy(net, X, y)
    assert acc >= TARGET, f"training accuracy {acc:.3f} after losing a GPU worker (numpy runs reach {TARGET})"
