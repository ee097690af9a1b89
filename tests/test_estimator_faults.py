"""DistributedCNN keeps training through a lost worker and says so in its history (issue #8)."""

from __future__ import annotations

import types

from dasknn import DistributedCNN
from dasknn.data import load
from dasknn.engine.dask import cluster_workers, local_client
from dasknn.engine.dask.placement import plan
from tests.engine.dask.test_faults import Killer


def test_fit_survives_losing_the_fc_machine_and_records_the_recovery():
    X, y = load("digits", size=28)
    with local_client(n_workers=2) as client:
        placement = plan(cluster_workers(client), 2)
        watch = types.SimpleNamespace(placement_=placement)  # the FC worker the fit will use
        killer = Killer(client, watch, lambda p: [p.fc_worker], at=10, machine=True)
        killer.start()
        est = DistributedCNN(
            n_groups=2, learning_rate=0.01, momentum=0.9, max_epochs=4, time_budget=200,
            target_accuracy=0.95, eval_size=500,
        )  # fmt: skip
        est.fit(X, y)
        killer.join(timeout=5)
        assert killer.victims == [placement.fc_worker]
        assert placement.fc_worker not in cluster_workers(client)
    notes = [h["event"] for h in est.history_ if str(h.get("event", "")).startswith("recovery")]
    assert len(notes) == 1 and placement.fc_worker in notes[0] and "iterations redone" in notes[0]
    assert "n_groups 2 -> 1" in notes[0]
    assert (est.decisions_["action"] == "recovery").sum() == 1
    assert est.history_[-1]["accuracy"] >= 0.95
