"""Goodput-sized clusters: the productive number of workers from planted HE-model timings, and an
`Adaptive` built from it driving a real LocalCluster."""

from __future__ import annotations

import math
import time

import pytest

from dasknn.engine.dask import cluster_workers, local_client
from dasknn.optimizer.sizing import GoodputAdaptive, goodput_by_size, productive_workers
from dasknn.tradeoff.hardware import HEModel

B = 64


def test_the_size_stops_growing_where_the_fc_server_saturates():
    # T_cc = 1 s on one device, no network cost, t_fc = 0.1 s: with N groups of one worker
    # HE(N) = max(0.1, 1.1 / N), so the FC server saturates at N = 11 and no worker helps beyond
    model = HEModel(T_cc=1.0, T_nc=0.0, t_fc=0.1, n_workers=1)
    n, why, values = productive_workers(model, B, math.inf, max_workers=32)
    assert n == 11 and "N=11" in why
    # HE reaches t_fc at N = 11 (and FC saturates beyond), not before
    assert replace_n(model, 11).he(11) == pytest.approx(0.1) and replace_n(model, 10).he(10) > 0.1
    assert replace_n(model, 12).saturates(12)
    assert values[11] == pytest.approx(B / 0.1) and values[32] == pytest.approx(values[11])
    assert values[10] == pytest.approx(B * 10 / 1.1)


def replace_n(model: HEModel, n: int) -> HEModel:
    return HEModel(model.T_cc, model.T_nc, model.t_fc, n)


def test_a_small_noise_scale_stops_the_cluster_before_saturation():
    # t_conv(k) = max(1 / k, 0.01 k) is least at k = 10; past N = 10 only a second group helps,
    # whose efficiency (φ + B) / (φ + 2B) is 0.53 at φ = 8: 20 workers give 339 samples/s against
    # 320 at 10, 1.9 a worker for an average share of 32, so the size stops at 10; with no noise
    # measured as limiting (φ = ∞) the FC server saturates at N = 11 (g = 1 cannot use more)
    model = HEModel(T_cc=1.0, T_nc=0.01, t_fc=0.1, n_workers=1)
    n, _, values = productive_workers(model, B, 8.0, max_workers=32)
    assert n == 10 and values[10] == pytest.approx(320.0) and max(values.values()) > values[10]
    floor = 0.1 * values[n] / n
    assert all((values[m] - values[n]) / (m - n) < floor for m in range(n + 1, 33))
    assert productive_workers(model, B, math.inf, max_workers=32)[0] == 11


def test_network_cost_limits_a_pinned_single_group():
    # one group of k workers: t_conv(k) = max(T_cc / k, T_nc · k) is least at k = 5 (1 / 5 = 0.04 · 5)
    model = HEModel(T_cc=1.0, T_nc=0.04, t_fc=0.0, n_workers=1)
    n, _, values = productive_workers(model, B, math.inf, max_workers=12, n_groups=1)
    assert n == 5 and values[6] < values[5]


def test_a_pinned_g_looks_past_sizes_that_leave_a_worker_idle():
    # g = 2 pinned: N = 3 gives k = 1 (one worker idle, no gain), N = 4 gives k = 2
    model = HEModel(T_cc=1.0, T_nc=0.0, t_fc=0.01, n_workers=1)
    values = goodput_by_size(model, B, math.inf, 8, n_groups=2)
    assert values[3] == pytest.approx(values[2]) and values[4] > values[2]
    n, _, _ = productive_workers(model, B, math.inf, max_workers=8, n_groups=2)
    assert n == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_workers": 0}, "minimum"), ({"max_workers": 4, "minimum": 5}, "minimum"),
     ({"max_workers": 4, "min_gain": 0}, "min_gain")],
)  # fmt: skip
def test_bad_sizes_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        productive_workers(HEModel(1.0, 0.0, 0.1, 1), B, math.inf, **kwargs)


def _wait_for_workers(client, n: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while len(cluster_workers(client)) != n:
        assert time.monotonic() < deadline, f"the cluster did not reach {n} workers"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_goodput_adaptive_drives_a_local_cluster_to_the_productive_size():
    # saturates at N = 3 (HE = max(0.5, 1.5 / N)), then at N = 2 (HE = max(1, 2 / N)) after a new measurement
    with local_client(n_workers=1) as client:
        cluster = client.cluster
        adaptive = cluster.adapt(
            Adaptive=GoodputAdaptive,
            model=HEModel(T_cc=1.0, T_nc=0.0, t_fc=0.5, n_workers=1),
            batch_size=B,
            noise_scale=math.inf,
            minimum=1,
            maximum=6,
            interval="100ms",
            wait_count=1,
        )
        _wait_for_workers(client, 3)
        assert "N=3" in adaptive.why
        adaptive.update(model=HEModel(T_cc=1.0, T_nc=0.0, t_fc=1.0, n_workers=1))
        _wait_for_workers(client, 2)
        assert "N=2" in adaptive.why
        adaptive.stop()
