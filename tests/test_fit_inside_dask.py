"""`fit` called from inside dask and joblib: a task that fits (client.submit), GridSearchCV under
joblib's dask backend, and GridSearchCV(n_jobs=2) without a client. Each trains and ends; the time
limits only catch a hang (a task holding the thread its run's actors need hung before)."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV

from dasknn import DistributedCNN
from dasknn.engine.dask import local_client

HANG = 300  # seconds
PARAMS = dict(
    net="mlp", input_shape="flat", n_groups=1, learning_rate=0.1, momentum=0.9, max_epochs=2,
    time_budget=None, eval_size=200, batch_size=64,
)  # fmt: skip
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import tests/


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.data / 16).astype(np.float32), d.target


@pytest.fixture(scope="module")
def client():
    with local_client(n_workers=2, threads_per_worker=1) as c:
        yield c


def fit_and_score(X, y) -> tuple[float, int]:
    """Run on a worker: a fit (on the cluster this task runs on), its score and its iterations."""
    est = DistributedCNN(**PARAMS).fit(X, y)
    return est.score(X, y), est.n_iter_


def test_a_task_that_fits_trains_on_its_own_cluster(client, digits):
    X, y = digits
    score, iterations = client.submit(fit_and_score, X, y, pure=False).result(timeout=HANG)
    assert iterations == 2 * (len(y) // 64) and score >= 0.85  # two epochs of whole batches


@pytest.mark.slow  # fits inside dask tasks stay in the default run (the two tests beside it)
def test_grid_search_under_the_joblib_dask_backend_trains_every_candidate(client, digits):
    import joblib

    X, y = digits
    with joblib.parallel_backend("dask", wait_for_workers_timeout=HANG):
        search = GridSearchCV(DistributedCNN(**PARAMS), {"learning_rate": [0.1, 0.03]}, cv=2).fit(X, y)
    assert len(search.cv_results_["mean_test_score"]) == 2
    assert search.best_score_ >= 0.75 and search.best_estimator_.n_iter_ > 0


@pytest.mark.slow
def test_grid_search_with_n_jobs_2_and_no_client_trains_every_candidate(digits):
    X, y = digits
    search = GridSearchCV(DistributedCNN(**PARAMS), {"learning_rate": [0.1, 0.03]}, cv=2, n_jobs=2)
    search.fit(X, y)
    assert search.best_score_ >= 0.75 and search.best_estimator_.n_iter_ > 0


def test_two_fits_at_once_on_one_cluster_each_train_their_own_model(client, digits):
    from concurrent.futures import ThreadPoolExecutor

    X, y = digits

    def fit(seed: int) -> DistributedCNN:
        return DistributedCNN(**PARAMS, random_state=seed).fit(X, y)

    with ThreadPoolExecutor(2) as pool:  # two fits on the same client at the same time
        a, b = pool.map(fit, [0, 1])
    for est in (a, b):
        assert est.n_iter_ == 2 * (len(y) // 64) and est.score(X, y) >= 0.85
    key = next(iter(a.state_.params))  # their own runs, actors and weights: nothing shared
    assert not np.allclose(a.state_.params[key], b.state_.params[key])
