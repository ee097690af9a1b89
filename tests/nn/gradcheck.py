"""Finite-difference gradient checks for layers and nets (float64, central differences)."""

from __future__ import annotations

import numpy as np


def numerical_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d x by central differences, perturbing `x` in place element by element."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        fp = f()
        flat[i] = old - h
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return grad


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − b‖ / max(‖a‖, ‖b‖, tiny): the relative error used by every gradient test."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-300))


def check_layer(layer, x: np.ndarray, rng: np.random.Generator, tol: float = 1e-5) -> dict[str, float]:
    """Compare a layer's backward against finite differences of L = Σ y·dy; returns the errors."""
    y, _ = layer.forward(x, train=True)
    dy = rng.standard_normal(y.shape)

    def loss() -> float:
        out, _ = layer.forward(x, train=True)
        return float((out * dy).sum())

    _, cache = layer.forward(x, train=True)
    dx, grads = layer.backward(dy, cache, need_dx=True)
    errors = {"x": rel_error(dx, numerical_grad(loss, x))}
    for name, p in layer.params.items():
        errors[name] = rel_error(grads[name], numerical_grad(loss, p))
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, f"{layer!r}: gradient mismatch {bad}"
    return errors
