"""Caffe's SGD update and learning-rate policies."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.nn.solver import SGD, UPDATE_BLOCK, learning_rate, sgd_update


def test_update_is_cafes_momentum_sgd_with_multipliers():
    w = {"a.weight": np.array([1.0, -2.0]), "a.bias": np.array([0.5])}
    g = {"a.weight": np.array([0.1, 0.2]), "a.bias": np.array([1.0])}
    s = SGD(
        base_lr=0.1,
        momentum=0.9,
        weight_decay=0.01,
        lr_mult={"a.weight": 1.0, "a.bias": 2.0},
        decay_mult={"a.weight": 1.0, "a.bias": 0.0},
    )
    v_w = np.zeros(2)
    w_ref = w["a.weight"].copy()
    for _ in range(3):
        v_w = 0.9 * v_w - 0.1 * (g["a.weight"] + 0.01 * w_ref)
        w_ref = w_ref + v_w
        s.step(w, g)
    np.testing.assert_allclose(w["a.weight"], w_ref, rtol=1e-12)
    # bias: lr x2, no decay: V = -0.2, -0.38, -0.542 -> W = 0.5 - 1.122
    np.testing.assert_allclose(w["a.bias"], [0.5 - 0.2 - 0.38 - 0.542], rtol=1e-12)
    assert s.iter == 3


@pytest.mark.parametrize(
    "policy, kwargs, it, expected",
    [
        ("fixed", {}, 500, 0.01),
        ("step", {"gamma": 0.1, "stepsize": 100}, 250, 0.01 * 0.1**2),
        ("multistep", {"gamma": 0.5, "stepvalue": (10, 20)}, 20, 0.01 * 0.25),
        ("exp", {"gamma": 0.99}, 10, 0.01 * 0.99**10),
        ("inv", {"gamma": 1e-4, "power": 0.75}, 10000, 0.01 * (1 + 1.0) ** -0.75),
        ("poly", {"power": 2.0, "max_iter": 100}, 50, 0.01 * 0.25),
    ],
)
def test_learning_rate_policies(policy, kwargs, it, expected):
    assert learning_rate(it, 0.01, policy, **kwargs) == pytest.approx(expected, rel=1e-12)


def test_from_caffe_settings_and_bad_values():
    s = SGD.from_caffe(
        {
            "base_lr": 0.01,
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "lr_policy": "inv",
            "gamma": 1e-4,
            "power": 0.75,
            "max_iter": 10000,
        }
    )
    assert (s.base_lr, s.momentum, s.lr_policy) == (0.01, 0.9, "inv")
    with pytest.raises(ValueError, match="solver type 'ADAM' is not supported"):
        SGD.from_caffe({"type": "Adam", "base_lr": 0.1})
    with pytest.raises(ValueError, match="unknown lr_policy 'cosine'"):
        SGD(lr_policy="cosine")
    with pytest.raises(ValueError, match="base_lr must be a finite number"):
        SGD(base_lr=float("nan"))


def test_state_dict_round_trip():
    w = {"x": np.ones(3)}
    s = SGD(base_lr=0.1, momentum=0.5)
    s.step(w, {"x": np.ones(3)})
    t = SGD(base_lr=0.1, momentum=0.5)
    t.load_state_dict(s.state_dict())
    w2 = {"x": w["x"].copy()}
    s.step(w, {"x": np.ones(3)})
    t.step(w2, {"x": np.ones(3)})
    np.testing.assert_array_equal(w["x"], w2["x"])
    assert t.iter == 2


@pytest.mark.parametrize("weight_decay", [5e-4, 0.0])
def test_blockwise_update_rounds_as_the_whole_array_formula(weight_decay):
    """A parameter of several update blocks gets bit for bit V ← µV − η(∇ + λW); W ← W + V."""
    rng = np.random.default_rng(0)
    w, v, g = (rng.standard_normal(3 * UPDATE_BLOCK + 5).astype(np.float32) for _ in range(3))
    w_ref, v_ref = w.copy(), v.copy()
    f = np.float32
    v_ref *= f(0.9)
    v_ref -= f(0.01) * (g + f(weight_decay) * w_ref) if weight_decay else f(0.01) * g
    w_ref += v_ref
    sgd_update(w, v, g, 0.01, 0.9, weight_decay)
    np.testing.assert_array_equal(v, v_ref)
    np.testing.assert_array_equal(w, w_ref)
