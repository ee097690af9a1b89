"""The free prior: g from the HE model, η and µ from the net's solver or the cache of the last fit."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn import zoo
from dasknn.nn.prototxt import read_solver
from dasknn.optimizer.prior import (
    CAFFE_DEFAULTS,
    ZOO_SOLVERS,
    PriorCache,
    dataset_key,
    groups_prior,
    solver_prior,
)
from dasknn.tradeoff.hardware import HEModel


def test_groups_prior_takes_the_smallest_g_within_ten_percent_of_the_best():
    model = HEModel(T_cc=5.0, T_nc=0.0, t_fc=0.5, n_workers=8)
    times = {g: model.he(g) for g in (1, 2, 4, 8)}
    assert times[8] < times[4] <= 1.1 * times[8]  # g = 4 is within 10% of the fastest, g = 8
    g, why = groups_prior(model, [1, 2, 4, 8])
    assert g == 4 and "within 10%" in why
    assert groups_prior(model, [1, 2, 4, 8], tolerance=0.05)[0] == 8
    assert groups_prior(model, [1, 2, 4, 8], tolerance=10.0)[0] == 1


def test_groups_prior_ignores_candidates_above_the_workers_and_rejects_none():
    model = HEModel(T_cc=5.0, T_nc=0.0, t_fc=1.0, n_workers=2)
    assert groups_prior(model, [1, 2, 4, 8])[0] == 2
    with pytest.raises(ValueError, match="no candidate g"):
        groups_prior(model, [4, 8])


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick"])
def test_zoo_solver_values_match_caffes_published_solver_files(caffe_models, name):
    published = read_solver(caffe_models / f"{name}_solver.prototxt")
    table = ZOO_SOLVERS[name]
    for key in ("base_lr", "momentum", "weight_decay"):
        assert table[key] == pytest.approx(published[key]), key
    lr, mu, source = solver_prior(name)
    assert (lr, mu) == (published["base_lr"], published["momentum"]) and "published solver" in source


def test_solver_prior_of_a_solver_a_zoo_net_object_and_a_net_without_one(caffe_models):
    solver = read_solver(caffe_models / "cifar10_quick_solver.prototxt")
    assert solver_prior("mlp", solver)[:2] == (0.001, 0.9)
    assert solver_prior(zoo.lenet())[:2] == (0.01, 0.9)  # a Net named after a zoo net
    lr, mu, source = solver_prior(zoo.mlp(input_shape=(4, 1, 1), num_classes=3))
    assert (lr, mu) == (CAFFE_DEFAULTS["base_lr"], CAFFE_DEFAULTS["momentum"])
    assert "no solver" in source
    with pytest.raises(ValueError, match="base_lr"):
        solver_prior("lenet", {"momentum": 0.9})


def test_the_cache_returns_a_jobs_last_configuration_and_ignores_other_jobs(tmp_path):
    cache = PriorCache(tmp_path / "home" / "cache.json")
    X = np.arange(200, dtype=np.float32).reshape(50, 1, 2, 2)
    lenet, cifar = zoo.lenet(), zoo.cifar10_quick()
    key = PriorCache.key(lenet, dataset_key(X), 64, (1, 28, 28), 0.0)
    assert cache.get(key) is None  # no file yet
    cache.put(key, 2, 0.08, 0.9)
    prior = cache.get(key)
    assert (prior.n_groups, prior.lr, prior.momentum) == (2, 0.08, 0.9)
    assert "last successful fit" in prior.source
    others = [
        PriorCache.key(cifar, dataset_key(X), 64, (1, 28, 28), 0.0),  # another net
        PriorCache.key(lenet, dataset_key(X + 1), 64, (1, 28, 28), 0.0),  # other data
        PriorCache.key(lenet, dataset_key(X), 128, (1, 28, 28), 0.0),  # another batch size
        PriorCache.key(lenet, dataset_key(X), 64, (1, 28, 28), 0.0005),  # another weight decay
    ]
    assert len(set(others) | {key}) == 5 and all(cache.get(k) is None for k in others)


def test_a_corrupt_cache_file_counts_as_empty(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    cache = PriorCache(path)
    assert cache.get("anything") is None
    cache.put("k", 1, 0.01, 0.9)
    assert cache.get("k").lr == 0.01


def _put_many(path: str, prefix: str, n: int, errors: list | None = None) -> None:
    try:
        cache = PriorCache(path)
        for i in range(n):
            cache.put(f"{prefix}/{i}", 1 + i % 3, 0.01 * (i + 1), 0.9)
    except BaseException as err:
        if errors is None:
            raise
        errors.append(err)


def test_fits_writing_the_cache_at_once_from_threads_and_processes_lose_no_entry(tmp_path):
    """Fits that end together (threads of one process, as under GridSearchCV's threading backend,
    and separate processes) each add their job's entry: none is lost, none fails to write, and no
    temporary file is left behind."""
    import multiprocessing
    import threading

    path, errors = str(tmp_path / "cache.json"), []
    threads = [threading.Thread(target=_put_many, args=(path, f"thread{t}", 25, errors)) for t in range(4)]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    procs = [ctx.Process(target=_put_many, args=(path, f"process{p}", 25)) for p in range(2)]
    for worker in (*procs, *threads):  # processes first: none is forked while a thread writes
        worker.start()
    for worker in (*threads, *procs):
        worker.join(timeout=120)
    assert not errors and all(p.exitcode == 0 for p in procs)
    cache = PriorCache(path)
    for prefix in [f"thread{t}" for t in range(4)] + [f"process{p}" for p in range(2)]:
        for i in range(25):
            prior = cache.get(f"{prefix}/{i}")
            assert prior is not None, f"{prefix}/{i} lost"
            assert (prior.n_groups, prior.lr) == (1 + i % 3, pytest.approx(0.01 * (i + 1)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "cache.json.lock"]
