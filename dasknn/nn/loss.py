"""SoftmaxWithLoss and Accuracy (Caffe's loss layers), as pure functions of logits and labels."""

from __future__ import annotations

from dasknn.backend import array_module, to_device


def _labels_like(labels, logits):
    """`labels` on the device of `logits` (one copy when they are not there already)."""
    xp = array_module(logits)
    return labels if array_module(labels) is xp else to_device(labels, xp)


def softmax(logits):
    """Row-wise softmax, shifted by the row maximum for stability."""
    xp = array_module(logits)
    z = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_with_loss(logits, labels):
    """Mean cross-entropy of softmax(logits) against integer labels, and its gradient.

    Caffe's SoftmaxWithLoss with normalization VALID: loss = −(1/N) Σ log p[n, label_n];
    d loss / d logits = (p − onehot(labels)) / N.
    Returns (loss as a Python float, dlogits).
    """
    xp = array_module(logits)
    n = logits.shape[0]
    labels = _labels_like(labels, logits)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    z = logits - logits.max(axis=1, keepdims=True)
    log_sum = xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    log_p = z - log_sum
    rows = xp.arange(n)
    loss = -float(log_p[rows, labels].sum()) / n
    dlogits = xp.exp(log_p)
    dlogits[rows, labels] -= 1
    dlogits /= n
    return loss, dlogits


def accuracy(logits, labels) -> float:
    """Fraction of rows whose arg-max equals the label (Caffe's Accuracy, top_k = 1)."""
    return float((logits.argmax(axis=1) == _labels_like(labels, logits)).mean())
