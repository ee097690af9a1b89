"""bench_auto_sim32's cluster: each group computing as one device, with the fit's augmentation."""

from __future__ import annotations

import numpy as np

from dasknn.data import load
from dasknn.data.augment import Augment
from dasknn.nn import zoo
from dasknn.tradeoff.hardware import HEModel
from experiments import bench_auto_sim32 as bench
from experiments.whatif_cpu_l import C4_GFLOPS, EFFICIENCY


def _fit(augment):
    X, y = load("mnist-sample", batch_size=8)
    model = HEModel.estimate(zoo.lenet(seed=0), 8, bench.N_WORKERS, C4_GFLOPS, 1e9 / 8, efficiency=EFFICIENCY)
    est = bench.contender("async", 0, model, 5.0, lr=0.003, max_epochs=0.05, target=0.999, augment=augment)
    est.fit(np.asarray(X), np.asarray(y))
    return est


def test_the_benchmark_trains_on_shifted_digits_by_default_and_unshifted_with_none():
    assert bench.AUGMENT == "shift"
    shifted, plain = _fit(bench.AUGMENT), _fit(None)
    (engine,) = shifted.bench_engine.engines.values()
    assert isinstance(engine.augment, Augment) and engine.augment.shift == 2
    assert next(iter(plain.bench_engine.engines.values())).augment is None
    a, b = shifted.trace_.sort_values("iteration"), plain.trace_.sort_values("iteration")
    assert len(a) == len(b) == 25  # 0.05 of an epoch of 500 batches
    # the same batches and weights at the first iteration; the shifts change what the net sees
    assert not np.allclose(a["loss"].to_numpy(), b["loss"].to_numpy())
    again = _fit(bench.AUGMENT).trace_.sort_values("iteration")
    np.testing.assert_array_equal(a["loss"].to_numpy(), again["loss"].to_numpy())  # seeded draws
