"""Placement: which worker hosts the servers, how groups form, how a batch is shared (CPU-side logic
of GPU placement included: it needs no GPU to decide)."""

from __future__ import annotations

import pytest

from dasknn.backend import cupy_available, get_xp
from dasknn.engine.dask.placement import plan, shard_sizes


def workers(*resources):
    return {f"tcp://10.0.0.{i}:1": {"resources": r, "nthreads": 1} for i, r in enumerate(resources)}


def test_fc_resource_gets_the_fc_server_and_no_conv_work():
    p = plan(workers({}, {"FC": 1}, {}, {}), n_groups=3)
    assert p.fc_worker == "tcp://10.0.0.1:1"
    assert p.fc_worker not in p.conv_workers and len(p.conv_workers) == 3
    assert p.conv_server_worker in p.conv_workers and not p.oversubscribed


def test_gpu_worker_hosts_fc_without_fc_resource_and_computes_with_cupy():
    p = plan(workers({}, {"GPU": 1}), n_groups=1)
    assert p.fc_worker == "tcp://10.0.0.1:1"
    assert p.devices == {"tcp://10.0.0.0:1": "cpu", "tcp://10.0.0.1:1": "gpu:0"}
    assert p.groups == [["tcp://10.0.0.0:1", "tcp://10.0.0.1:1"]]


def test_gpu_workers_of_one_host_get_different_device_indices():
    gpu = {"resources": {"GPU": 1}, "nthreads": 1}
    hosts = {
        "tcp://10.0.0.1:4001": gpu,
        "tcp://10.0.0.1:4000": gpu,
        "tcp://10.0.0.1:4002": {"resources": {}, "nthreads": 1},
        "tcp://10.0.0.2:4000": gpu,
        "tcp://10.0.0.1:4003": gpu,
    }
    assert plan(hosts, n_groups=1).devices == {
        "tcp://10.0.0.1:4000": "gpu:0",
        "tcp://10.0.0.1:4001": "gpu:1",
        "tcp://10.0.0.1:4002": "cpu",
        "tcp://10.0.0.1:4003": "gpu:2",
        "tcp://10.0.0.2:4000": "gpu:0",
    }


def test_groups_of_k_workers_and_oversubscription():
    p = plan(workers(*[{}] * 4), n_groups=2)
    assert [len(g) for g in p.groups] == [2, 2]
    q = plan(workers({}, {}), n_groups=4)
    assert q.oversubscribed and [len(g) for g in q.groups] == [1, 1, 1, 1]
    assert "conv group 3" in q.roles()["tcp://10.0.0.1:1"]


def test_flops_proportional_shares_and_shards():
    addrs = sorted(workers({}, {"GPU": 1}))
    p = plan(workers({}, {"GPU": 1}), n_groups=1, throughput={addrs[0]: 100.0, addrs[1]: 300.0})
    assert p.shares == {addrs[0]: 0.25, addrs[1]: 0.75}
    assert shard_sizes(64, [0.25, 0.75]) == [16, 48]
    assert shard_sizes(10, [1, 1, 1]) == [4, 3, 3] and sum(shard_sizes(7, [0.9, 0.05, 0.05])) == 7
    assert min(shard_sizes(7, [0.9, 0.05, 0.05])) >= 1


def test_placement_errors_are_named():
    with pytest.raises(RuntimeError, match="no workers"):
        plan({}, 1)
    with pytest.raises(ValueError, match="n_groups must be >= 1"):
        plan(workers({}), 0)
    with pytest.raises(ValueError, match="cannot be split over 3 workers"):
        shard_sizes(2, [1, 1, 1])


def test_gpu_device_without_cupy_is_a_clear_error():
    if cupy_available():
        pytest.skip("this machine has a GPU: the error path does not apply")
    with pytest.raises(RuntimeError, match="needs CuPy and a CUDA GPU"):
        get_xp("gpu")
