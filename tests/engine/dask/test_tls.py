"""DaskEngine over TLS (issue #8): a LocalCluster whose scheduler, workers and client talk tls:// with
a throwaway certificate (`Security.temporary()`), and a plain-TCP peer is refused."""

from __future__ import annotations

import asyncio

import dask
import pytest

from dasknn.engine.dask import DaskEngine, cluster_workers, local_client
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo
from dasknn.nn.train import evaluate

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=0)


async def plain_tcp_identity(address: str) -> dict:
    """Ask the scheduler at `address` who it is over an unencrypted connection (its own event loop,
    so the test's client is untouched)."""
    from distributed.comm import connect

    comm = await connect(address, timeout=5)
    try:
        await comm.write({"op": "identity"})
        return await comm.read()
    finally:
        comm.abort()


def test_training_over_tls_reaches_its_accuracy_and_plain_tcp_is_refused(digits):
    from distributed.security import Security

    X, y = digits
    with local_client(n_workers=1, security=Security.temporary()) as client:
        address = client.scheduler.address
        assert address.startswith("tls://")
        assert all(w.startswith("tls://") for w in cluster_workers(client))
        with pytest.raises(OSError):  # CommClosedError: the scheduler drops a plain-TCP peer
            asyncio.run(plain_tcp_identity(address.replace("tls://", "tcp://")))
        net = zoo.lenet(seed=0)
        result = DaskEngine(client, timeout=30, poll=0.5).run(
            net, X, y, CFG, Budget(seconds=60, iterations=60)
        )
    trace = result.trace
    assert len(trace) == 60 and trace.attrs["recoveries"] == []
    head, tail = trace["loss"].iloc[:8].mean(), trace["loss"].iloc[-8:].mean()
    assert tail < 0.5 * head, (head, tail)
    _, acc = evaluate(net, *dask.compute(X, y))
    assert acc >= 0.9, f"training accuracy {acc:.3f} after 60 iterations over TLS"


def test_local_client_rejects_a_security_of_the_wrong_type():
    with pytest.raises(TypeError, match="security must be"):
        with local_client(n_workers=1, security="tls"):
            pass
