"""Elastic fits with GPU workers: the elastic tests' bodies (test_elastic.py) parametrised by the
workers' kind, so that a body proven here on CPU workers runs unchanged under `-m gpu` on `GPU=1`
workers (docs/architecture.md, "Elastic clusters" and "Arrays and devices").

A worker that joins a running fit (the same kind as the fit's, or the other: a GPU worker joining
a CPU fit takes the FC server) is used, and a worker retired mid-fit while it holds the servers
(FC server, conv model server) or a shard server hands them over bit for bit: the servers keep
numpy state whatever device computes (`FCServer.get_state`), so the digests of the state read at
the hand-off and of the state set on the new servers are equal across devices too. After the run
the kept FC server computes with CuPy exactly when its worker is a GPU worker.

Every wait is tied to the run's progress (the conv model server's version), never to a guessed delay.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import numpy as np
import pytest

from dasknn.backend import cupy_available
from dasknn.engine.dask import DaskEngine, cluster_workers, local_client
from dasknn.engine.trace import Budget
from dasknn.nn import zoo
from tests.engine.dask.test_elastic import (
    CFG,
    JOIN_AT,
    JOIN_ITERATIONS,
    LEAVE_AT,
    TARGET,
    Retirer,
    _until,
    _updates,
)
from tests.engine.dask.test_faults import training_accuracy
from tests.engine.dask.test_gpu_engine import _fc_param_modules

RESOURCES = {"cpu": {}, "gpu": {"GPU": 1}}
"""A worker of each kind as `local_client` / a worker spec starts it."""

MODULE = {"cpu": "numpy", "gpu": "cupy"}
"""The array module a server computes with on a worker of each kind."""

LEAVE_ITERATIONS = 40  # the retirement is asked for at LEAVE_AT; 2 workers, then 1, train the rest
GPU_FACTOR = 4
"""A fit with a GPU worker trains GPU_FACTOR times the CPU variant's iterations: a LeNet iteration
on `GPU=1` workers takes 8-17 ms (experiments/README.md, "GPU runs on an H200"), many times less
than on CPU workers, while a joining worker's process takes seconds to start and a retirement a
few driver polls; with the CPU variant's iterations the fit could end before the change it waits for."""


def iterations_for(iterations: int, worker_kinds) -> int:
    return iterations * GPU_FACTOR if "gpu" in worker_kinds else iterations


def kinds(*values, cpu_marks=()):
    """A pytest.param of `values`, marked `gpu` when any kind in it is a GPU worker (else `cpu_marks`)."""
    flat = [k for v in values for k in (v if isinstance(v, tuple) else (v,))]
    marks = [pytest.mark.gpu] if "gpu" in flat else list(cpu_marks)
    return pytest.param(*values, marks=marks, id="-".join(flat))


def _needs(*kinds_used: str) -> None:
    if "gpu" in kinds_used and not cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")


def _kind_of(device: str) -> str:
    return device.split(":")[0]  # 'cpu', or 'gpu' from 'gpu:N'


def add_worker(client, kind: str) -> str:
    """Start one more worker of `kind` on the client's LocalCluster (as the FC-worker join test does:
    a spec with that kind's resources, then `cluster.scale` starts it); returns its address once the
    scheduler has it."""
    cluster = client.cluster
    before = set(cluster_workers(client))
    spec = copy.deepcopy(cluster.new_spec)
    spec["options"]["resources"] = dict(RESOURCES[kind])
    cluster.worker_spec[f"{kind}-{len(cluster.worker_spec)}"] = spec
    cluster.scale(len(cluster.worker_spec))
    _until(lambda: set(cluster_workers(client)) - before, f"the start of a {kind} worker")
    (new,) = set(cluster_workers(client)) - before
    return new


@contextlib.contextmanager
def cluster_of(worker_kinds: tuple[str, ...]):
    """A LocalCluster whose workers are of `worker_kinds` (a mixed one: the first kind's worker, then
    the others added), and a Client on it."""
    first, *rest = worker_kinds
    same = all(k == first for k in rest)
    n = len(worker_kinds) if same else 1
    with local_client(n_workers=n, **({"resources": RESOURCES[first]} if RESOURCES[first] else {})) as client:
        if not same:
            for kind in rest:
                add_worker(client, kind)
        client.wait_for_workers(len(worker_kinds))
        yield client


class KindJoiner(threading.Thread):
    """test_elastic.Joiner with the joining worker's kind chosen: once the run has written JOIN_AT
    updates, starts a worker of `kind` and records its address and when the scheduler had it."""

    def __init__(self, client, engine, kind: str) -> None:
        super().__init__(daemon=True)
        self.client, self.engine, self.kind = client, engine, kind
        self.worker = self.joined = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            _until(
                lambda: self.engine.placement_ is not None and _updates(self.client) >= JOIN_AT,
                "training",
                300,
            )
            self.worker = add_worker(self.client, self.kind)
            self.joined = time.time()
        except BaseException as err:  # reported by the test
            self.error = err


@pytest.mark.parametrize(
    ("fit", "joins"),
    [
        # the CPU variant is test_elastic's join test through this body: slow, as a duplicate
        kinds("cpu", "cpu", cpu_marks=[pytest.mark.slow]),
        kinds("gpu", "gpu"),
        kinds("gpu", "cpu"),
        kinds("cpu", "gpu"),
    ],
)
def test_a_worker_of_either_kind_that_joins_a_running_fit_is_used(fit, joins, digits):
    """A fit on one worker of kind `fit`; a worker of kind `joins` joins it once it has trained: the
    run hands its servers over bit for bit, the new worker becomes a shard of the one group (within
    10 s, as on CPU), the FC server sits on the GPU worker where there is one and computes with that
    worker's array module, and the fit reaches the CPU join test's training accuracy."""
    _needs(fit, joins)
    X, y = digits
    config = CFG.with_(n_groups=1)  # pinned: the new worker joins the group as a shard
    with cluster_of((fit,)) as client:
        (first,) = cluster_workers(client)
        engine = DaskEngine(client, timeout=30, poll=0.2)
        joiner = KindJoiner(client, engine, joins)
        joiner.start()
        net = zoo.lenet(seed=0)
        n = iterations_for(JOIN_ITERATIONS, (fit, joins))
        result = engine.run(net, X, y, config, Budget(iterations=n))
        joiner.join(timeout=60)
        placement = engine.placement_
        fc_modules = client.run(_fc_param_modules, workers=[placement.fc_worker])
        engine.close()
    assert joiner.error is None, joiner.error
    trace, new = result.trace, joiner.worker
    assert trace.attrs["worker_events"], f"the fit ended ({n} iterations) before the {joins} worker joined it"
    assert {w: _kind_of(d) for w, d in placement.devices.items()} == {first: fit, new: joins}
    (event,) = trace.attrs["worker_events"]
    assert event["joined"] == [new] and event["left"] == []
    assert event["n_groups_before"] == event["n_groups_after"] == 1 and event["n_workers"] == 2
    # both servers' state moved bit for bit (numpy state, whichever device computes)
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    # the FC server goes to the GPU worker when one of the two is (placement.plan), else the first
    gpu = [w for w, k in ((first, fit), (new, joins)) if k == "gpu"]
    assert placement.fc_worker == (gpu[0] if len(gpu) == 1 else min(first, new))
    assert f"'{placement.fc_worker}': ['FC server'" in event["placement"]
    fc_kind = _kind_of(placement.devices[placement.fc_worker])
    assert fc_modules == {placement.fc_worker: [MODULE[fc_kind]]}
    on_new = trace[trace["workers"].str.contains(new, regex=False)]
    assert len(on_new) > 0 and trace.attrs["started"] + on_new["t_start"].min() - joiner.joined < 10
    assert (on_new["workers"].str.count(",") == 1).all()  # one group of two workers
    assert sorted(trace["version_written"]) == list(range(1, n + 1))
    assert trace.attrs["recoveries"] == [] and np.isfinite(trace["loss"]).all()
    assert all(np.isfinite(v).all() for v in net.params.values())
    assert training_accuracy(net, X, y) >= TARGET


@pytest.mark.parametrize(
    ("worker_kinds", "role"),
    [
        # the CPU variants are test_elastic's graceful retirement through this body: slow, as duplicates
        kinds(("cpu", "cpu"), "servers", cpu_marks=[pytest.mark.slow]),
        kinds(("cpu", "cpu"), "shard server", cpu_marks=[pytest.mark.slow]),
        kinds(("gpu", "gpu"), "servers"),
        kinds(("gpu", "gpu"), "shard server"),
        # the GPU worker (it holds the FC server: placement.plan) leaves; the CPU worker takes all
        kinds(("gpu", "cpu"), "servers"),
    ],
)
def test_a_worker_of_either_kind_retired_mid_fit_hands_over_and_the_other_finishes(
    worker_kinds, role, digits
):
    """Two workers, one group of both; `client.retire_workers` on the worker that holds `role`
    (test_elastic.ROLES: the FC and conv model servers and the group's lead, or the group's shard
    server) once the run has trained: it leaves within 30 s, the servers' state moves bit for bit,
    the versions go on with none lost or doubled and no recovery, and the remaining worker trains
    every later iteration alone, its FC server computing with its own array module."""
    _needs(*worker_kinds)
    X, y = digits
    with cluster_of(worker_kinds) as client:
        info = cluster_workers(client)
        kind = {
            w: ("gpu" if float(i.get("resources", {}).get("GPU", 0)) > 0 else "cpu") for w, i in info.items()
        }
        assert sorted(kind.values()) == sorted(worker_kinds)
        engine = DaskEngine(client, timeout=30, poll=0.2)
        retirer = Retirer(client, engine, role, "client.retire_workers")
        retirer.start()
        net = zoo.lenet(seed=0)
        n = iterations_for(LEAVE_ITERATIONS, worker_kinds)
        result = engine.run(net, X, y, CFG.with_(n_groups=1), Budget(iterations=n))
        retirer.join(timeout=90)
        placement = engine.placement_
        left = set(cluster_workers(client))
        fc_modules = client.run(_fc_param_modules, workers=sorted(left))
        engine.close()
    assert retirer.error is None, retirer.error
    trace, victim = result.trace, retirer.victim
    assert trace.attrs["worker_events"], f"the fit ended ({n} iterations) before {victim} was retired"
    assert retirer.gone is not None and retirer.gone - retirer.asked < 30, "the worker did not leave in 30 s"
    (other,) = set(kind) - {victim}
    assert left == {other}
    if len(set(worker_kinds)) > 1:
        assert kind[victim] == "gpu"  # the mixed case retires the GPU worker, from the FC server's seat
    (event,) = [e for e in trace.attrs["worker_events"] if e["left"]]
    assert event["left"] == [victim] and event["version"] >= LEAVE_AT and event["n_workers"] == 1
    assert victim not in event["placement"]
    assert event["conv_state"][0] == event["conv_state"][1] != ""
    assert event["fc_state"][0] == event["fc_state"][1] != ""
    # the remaining worker holds every role, on its own device
    assert placement.fc_worker == placement.conv_server_worker == other and placement.groups == [[other]]
    assert _kind_of(placement.devices[other]) == kind[other]
    assert fc_modules == {other: [MODULE[kind[other]]]}
    assert sorted(trace["version_written"]) == list(range(1, n + 1))
    assert sorted(trace["iteration"]) == list(range(1, n + 1))
    assert result.state.iterations_done == n
    assert trace.attrs["recoveries"] == [] and not trace["recovered"].any()
    after = trace[trace["version_written"] > event["version"]]
    assert len(after) > 0 and (after["workers"] == other).all()
    assert np.isfinite(trace["loss"]).all() and all(np.isfinite(v).all() for v in net.params.values())
