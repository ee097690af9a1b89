"""BatchNorm's running statistics recomputed for the weights a net is scored with
(`nn.scoring.Statistics`, "precise BatchNorm"): on the samples, and in the model a fit returns."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dasknn.nn.layers import InnerProduct
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm
from dasknn.nn.scoring import Statistics
from tests.test_divergence import bn_net


def first_layer_bn(use_global_stats=None) -> Net:
    entries = [
        (BatchNorm("bn", use_global_stats=use_global_stats), "data", "bn"),
        (InnerProduct("fc", 3), "bn", "fc"),
    ]
    return Net(entries, (2, 4, 4), name="bn-first", seed=0)


def channels(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2, 4, 4)).astype(np.float32)
    scale, shift = (np.array(v, np.float32).reshape(1, 2, 1, 1) for v in ([2.0, 0.5], [5.0, -3.0]))
    return X * scale + shift


def test_the_running_estimate_is_the_samples_statistics_and_normalises_them():
    net, X = first_layer_bn(), channels()
    params = net.get_params()  # running sums all zero: what an untrained net holds
    out = Statistics(net, X, batch_size=64)(params)
    factor = float(out["bn.scale_factor"][0])
    assert factor == pytest.approx(len(X))  # n per batch, summed
    assert out["bn.mean"] / factor == pytest.approx(X.mean(axis=(0, 2, 3)), abs=1e-4)
    # the mean of the batches' unbiased variances (each around its own batch mean), as Caffe sums them
    batches = [X[s : s + 64] for s in range(0, len(X), 64)]
    var = sum(len(b) * b.var(axis=(0, 2, 3), ddof=1) for b in batches) / len(X)
    assert out["bn.variance"] / factor == pytest.approx(var, rel=1e-4)
    net.set_params(out)
    normalised, _ = net.forward_heads(X, train=False)
    bn = net.layers[0].forward(X, train=False)[0]
    assert bn.mean(axis=(0, 2, 3)) == pytest.approx([0.0, 0.0], abs=1e-3)
    assert bn.std(axis=(0, 2, 3)) == pytest.approx([1.0, 1.0], abs=0.02)
    assert params["bn.mean"].sum() == 0  # the parameters given are not changed
    statistics = Statistics(first_layer_bn(), X, batch_size=64)
    once = statistics(params)
    assert statistics(params) is once  # the same arrays: computed once (an evaluation, the model)
    again = statistics({k: v.copy() for k, v in params.items()})
    assert again is not once and all(np.array_equal(again[k], once[k]) for k in once)
    assert set(normalised) == {"fc"}


def test_nets_without_running_statistics_and_global_statistics_layers_are_left_as_they_are():
    from tests.planted import small_net

    net = small_net()
    params = net.get_params()
    assert not Statistics(net, np.zeros((4, *net.input_shape), np.float32)).applies
    assert Statistics(net, np.zeros((4, *net.input_shape), np.float32))(params) is params
    fixed = first_layer_bn(use_global_stats=True)
    params = fixed.get_params()
    out = Statistics(fixed, channels())(params)
    assert all(np.array_equal(out[k], params[k]) for k in params)
    assert Statistics(first_layer_bn(), None)(params) is params  # no samples: nothing to recompute


def test_a_fit_scores_and_returns_its_batchnorm_net_with_statistics_recomputed(tmp_path):
    # Caffe's moving_average_fraction 0.999 over a few hundred iterations: the running sums weigh
    # the first batches' statistics as much as the last; the history's held-out accuracy is the
    # returned model's, whose statistics are those of the samples at its weights
    from dasknn.estimator import DistributedCNN

    d = load_digits()
    X, y = (d.data / 16).astype(np.float32).reshape(-1, 1, 8, 8), d.target
    est = DistributedCNN(
        net=bn_net(), engine="simulated", n_workers=1, n_groups=1, learning_rate=0.05, momentum=0.9,
        batch_size=32, max_epochs=3, time_budget=None, validation_fraction=0.2, eval_size=None,
        random_state=0, verbose=0,
    )  # fmt: skip
    est.fit(X, y)
    val = est.parts_.validation
    last = [h for h in est.history_ if "val_accuracy" in h and h["val_accuracy"] == h["val_accuracy"]][-1]
    assert est.score(X[val], y[val]) == pytest.approx(last["val_accuracy"], abs=1e-9)
    assert last["val_accuracy"] > 0.9
    trained, returned = est.state_.params, est.net_.get_params()
    for blob in ("mean", "variance"):  # the returned model's estimate is not the solver's running one
        key, factor = f"conv/bn.{blob}", "conv/bn.scale_factor"
        ours = returned[key] / returned[factor][0]
        assert not np.allclose(ours, trained[key] / trained[factor][0], rtol=1e-3)
    assert returned["conv/bn.scale_factor"][0] == pytest.approx(512)  # STATISTICS_SAMPLES, summed
    assert all(np.array_equal(returned[k], trained[k]) for k in trained if not k.startswith("conv/bn."))
    loaded = DistributedCNN.load(est.save(tmp_path / "bn"))  # saved as returned, statistics included
    np.testing.assert_array_equal(loaded.predict_proba(X[val]), est.predict_proba(X[val]))


def test_the_grid_tuners_selection_loss_scores_with_the_statistics_recomputed():
    from dasknn.engine.trace import TrainState
    from dasknn.nn.train import evaluate
    from dasknn.optimizer.search import SelectionLoss

    net, X = first_layer_bn(), channels()
    y = (X[:, 0, 0, 0] > 5).astype(np.int64)
    state = TrainState.from_net(net)  # running sums zero: the estimate divides by nothing
    statistics = Statistics(net, X)
    scored = net.copy()
    scored.set_params(statistics(state.params))
    expected, _ = evaluate(scored, X, y, 256)
    assert SelectionLoss(net, X, y, statistics=statistics)(state) == pytest.approx(expected)
    assert SelectionLoss(net, X, y)(state) != pytest.approx(expected)
