"""A worker retired while the driver sends data (a scatter, its copy to every worker) on a real
LocalCluster: the step is done again on the workers left (`shipping.ship`).

Scheduler plugins make the retirement land inside the step: they wrap the scheduler's own
`scatter`, `replicate` and `retire_workers` and, when the keys of the value sent arrive there,
retire the chosen worker (`RetireInside`), or hold a retirement until the scatter has listed its
workers and the copy until the worker is gone (`RetirementBetweenScatterAndCopy`). Nothing of dask
is replaced: its scatter, copy and retirement run as always, only at the worst moment. A slow test
retires the servers' worker at 22 points of a fit."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.engine.dask import DaskEngine, cluster_workers, elastic, local_client
from dasknn.engine.dask.shipping import ship
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)


def _keys(step: str, args: tuple, kwargs: dict) -> list[str]:
    """The keys a call of the scheduler's `scatter` handler or `replicate` is about."""
    if step == "scatter":
        return [str(k) for k in kwargs["data"]]
    return [str(k) for k in kwargs.get("keys", args[0] if args else ())]


class RetireInside(SchedulerPlugin):
    """When a `step` ("scatter" or "replicate") of keys starting with a prefix of `victims` runs on
    the scheduler, first retire that prefix's worker (dask's own `retire_workers`); once per prefix."""

    name = "dasknn-test-retire-inside"

    def __init__(self, step: str, victims: dict[str, str]) -> None:
        self.step, self.victims = step, dict(victims)
        self.fired: list[str] = []

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        original = scheduler.handlers[self.step]  # the handler a client's call reaches

        async def step(*args, **kwargs):
            await self._fire(_keys(self.step, args, kwargs))
            return await original(*args, **kwargs)

        scheduler.handlers[self.step] = step
        if self.step == "replicate":  # the scheduler's scatter(broadcast=True) calls its own method
            scheduler.replicate = step

    async def _fire(self, keys) -> None:
        for prefix, victim in self.victims.items():
            if prefix not in self.fired and any(k.startswith(prefix) for k in keys):
                self.fired.append(prefix)
                await self.scheduler.retire_workers(workers=[victim], close_workers=True)


class RetirementBetweenScatterAndCopy(SchedulerPlugin):
    """dask's retirement of `victim` (the step after `ElasticPlugin`'s hold) starts only once a
    scatter of keys starting with `prefix` has listed its workers, and the copy of those keys to
    every worker (`replicate`) waits until the victim is gone: the retirement lands between the
    scatter's listing and its copy, every time."""

    name = "dasknn-test-retirement-between-scatter-and-copy"

    def __init__(self, prefix: str, victim: str) -> None:
        self.prefix, self.victim = prefix, victim
        self.fired: list[str] = []

    async def start(self, scheduler) -> None:
        scattering = asyncio.Event()
        retire, scatter, replicate = (
            scheduler.retire_workers,
            scheduler.handlers["scatter"],
            scheduler.replicate,
        )

        async def retire_workers(*args, **kwargs):
            await scattering.wait()
            return await retire(*args, **kwargs)

        async def scatter_(*args, **kwargs):
            if self._ours("scatter", args, kwargs):
                scattering.set()  # dask's scatter lists its workers before it next yields
            return await scatter(*args, **kwargs)

        async def replicate_(*args, **kwargs):
            if self._ours("replicate", args, kwargs):
                deadline = time.monotonic() + 30
                while self.victim in scheduler.workers and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            return await replicate(*args, **kwargs)

        scheduler.retire_workers = retire_workers  # what ElasticPlugin calls once its hold ends
        scheduler.handlers["scatter"] = scatter_
        scheduler.handlers["replicate"] = scheduler.replicate = replicate_

    def _ours(self, step: str, args: tuple, kwargs: dict) -> bool:
        if not any(k.startswith(self.prefix) for k in _keys(step, args, kwargs)):
            return False
        self.fired.append(step)
        return True


def _fired(name: str):
    return lambda dask_scheduler: list(dask_scheduler.plugins[name].fired)


@pytest.fixture
def client4():
    """Four in-process workers (threads): a real scheduler and workers, cheap to start."""
    with LocalCluster(n_workers=4, processes=False, threads_per_worker=1, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            yield client


@pytest.mark.parametrize("step", ["scatter", "replicate"])
def test_a_worker_retired_inside_a_scatter_is_named_no_more_and_the_copy_reaches_the_rest(step, client4):
    """dask's scatter(broadcast=True) names a worker retired inside it and fails with KeyError(its
    address); `ship` sends again to the workers left, and the value ends on each of them."""
    client = client4
    assert elastic.install(client)
    a, b, *rest = sorted(cluster_workers(client))
    # "bytes-..." keys: dask's own broadcast; "ndarray-..." keys: ship's
    client.register_plugin(RetireInside(step, {"bytes-": a, "ndarray-": b}))
    with pytest.raises(KeyError, match=re.escape(a)):
        client.scatter(b"the value", workers=sorted(cluster_workers(client)), broadcast=True, hash=False)
    value = np.arange(1000, dtype=np.float32)
    future = ship(client, value, broadcast=True)
    fired = client.run_on_scheduler(_fired(RetireInside.name))
    assert fired == ["bytes-", "ndarray-"]  # each retirement fired inside its scatter
    left = set(cluster_workers(client))
    assert left == set(rest)
    assert set(client.who_has([future])[future.key]) == left  # a copy on every worker left
    np.testing.assert_array_equal(future.result(timeout=10), value)


def test_a_retirement_of_the_kept_servers_worker_that_lands_in_the_next_runs_scatter(digits):
    """Between runs the kept conv model and FC servers' worker is retired: the next run plans
    without it, lets the kept servers go (so dask goes on with the retirement) and sends its
    conv-phase template; the copy to every worker runs only once that worker is gone. The run
    names no such worker and trains its iterations."""
    X, y = digits
    with local_client(n_workers=2) as client:
        engine = DaskEngine(client, timeout=30, poll=0.2)
        net = zoo.lenet(seed=0)
        first = engine.run(net, X, y, CFG, Budget(iterations=5))
        victim = engine.placement_.conv_server_worker
        client.register_plugin(RetirementBetweenScatterAndCopy("Net-", victim))
        retired = {}
        thread = threading.Thread(target=lambda: retired.update(client.retire_workers([victim])), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while victim not in elastic.leaving(client):
            assert time.monotonic() < deadline, "the retirement was not announced within 30 s"
            time.sleep(0.05)
        second = engine.run(net, X, y, CFG, Budget(iterations=5), start=first.state)
        thread.join(timeout=30)
        left = set(cluster_workers(client))
        fired = client.run_on_scheduler(_fired(RetirementBetweenScatterAndCopy.name))
        engine.close()
    assert fired == ["scatter", "replicate"]  # the template's copy waited for the retirement to finish
    assert victim in retired and victim not in left and len(left) == 1
    assert second.trace["version_written"].tolist() == list(range(1, 6))
    assert not second.trace["workers"].str.contains(victim, regex=False).any()


def _servers_worker(dask_scheduler) -> str | None:
    """The worker holding a conv model server (an actor), if one does."""
    for address, ws in dask_scheduler.workers.items():
        if any(str(getattr(ts, "key", ts)).startswith("ConvModelServer") for ts in ws.actors):
            return address
    return None


class ServersRetirer(threading.Thread):
    """Once a fit's servers exist, waits `delay` seconds and retires the worker then holding them
    (`client.retire_workers`, as a user would); records whether the fit was still going on."""

    def __init__(self, client, delay: float, fitting: threading.Event) -> None:
        super().__init__(daemon=True)
        self.client, self.delay, self.fitting = client, delay, fitting
        self.victim = self.retired = self.during_fit = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 120
            while self.client.run_on_scheduler(_servers_worker) is None:
                assert time.monotonic() < deadline, "no conv model server within 120 s"
                time.sleep(0.02)
            time.sleep(self.delay)
            self.victim = self.client.run_on_scheduler(_servers_worker)
            self.during_fit = self.fitting.is_set() and self.victim is not None
            if self.victim is not None:
                self.retired = self.client.retire_workers([self.victim])
        except BaseException as err:  # reported by the test
            self.error = err


def _scale_back(client, n: int) -> None:
    """Start workers until the LocalCluster has `n` again: a retirement through the client leaves
    the retired worker's spec (its nanny closed), so new workers take new names."""
    missing = n - len(cluster_workers(client))
    client.cluster.scale(len(client.cluster.worker_spec) + missing)


@pytest.mark.slow
def test_a_fit_finishes_whichever_point_the_servers_worker_is_retired_at(digits):
    """The servers' worker retired at 22 points of a fit (mid-run hand-offs, the runs' boundaries
    where the kept servers are let go and the next run sends its template): every fit finishes and
    every retirement completes; the cluster is scaled back to three workers after each."""
    from dasknn.estimator import DistributedCNN

    X, y = digits
    points, finished = [0.25 * i for i in range(22)], []
    with local_client(n_workers=3) as client:
        for delay in points:
            fitting = threading.Event()
            fitting.set()
            retirer = ServersRetirer(client, delay, fitting)
            retirer.start()
            est = DistributedCNN(net="lenet", time_budget=6.0, eval_size=200, random_state=0)
            est.fit(X, y)
            fitting.clear()
            retirer.join(timeout=120)
            assert retirer.error is None, f"at {delay} s: {retirer.error!r}"
            if retirer.victim is not None:  # dask did not refuse it, nor did the fit hold it for good
                assert retirer.victim in retirer.retired, f"at {delay} s the servers' worker was not retired"
            finished.append((delay, retirer.during_fit, est.n_iter_))
            _scale_back(client, 3)
            deadline = time.monotonic() + 60
            while len(cluster_workers(client)) < 3:
                assert time.monotonic() < deadline, "the cluster did not scale back to 3 workers"
                time.sleep(0.1)
    assert len(finished) == len(points) and all(n > 0 for _, _, n in finished)
    assert sum(during for _, during, _ in finished) >= 20, finished  # retired while the fit went on
