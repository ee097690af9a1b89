"""`dasknn train` starts its LocalCluster ahead of the fit (cluster.ClusterAhead): a default client
whose workers have imported what the first computation needs, closed when the block ends."""

from __future__ import annotations

import pytest
from distributed import default_client

from dasknn.cluster import WARM_MODULES, ClusterAhead


def _modules(names):
    import sys

    return [name for name in names if name in sys.modules]


def test_the_cluster_started_ahead_is_the_default_client_with_warm_workers_and_closes():
    assert ClusterAhead.wanted(None, "dask", None)
    with ClusterAhead(n_workers=1) as cluster:
        client = cluster.client()
        assert default_client() is client  # the fit's dask_client then takes it
        assert len(client.scheduler_info()["workers"]) == 1
        assert list(client.run(_modules, WARM_MODULES).values()) == [list(WARM_MODULES)]
        assert not ClusterAhead.wanted(None, "dask", None)  # a default client exists: the fit uses it
        cluster.close_behind()
    assert client.status == "closed"
    with pytest.raises(ValueError):
        default_client()


def test_no_cluster_ahead_where_the_fit_would_not_start_a_local_one():
    assert not ClusterAhead.wanted("tcp://127.0.0.1:8786", "dask", None)
    assert not ClusterAhead.wanted(None, "simulated", None)
    assert not ClusterAhead.wanted(None, "dask", True)  # TLS: the fit's own path
