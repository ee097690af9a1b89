"""The PyTorch reference of bench_tta: a plain loop with Caffe's LeNet solver on the same data and weights."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from dasknn.nn import zoo
from experiments.bench_iteration import torch_net

BATCH = 64
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


def rule_met(scores: list[float], target: float, rule: str) -> bool:
    """Whether a run's scores meet `target` by `rule` now, as `dasknn.reports.time_to_accuracy`
    reads them: "first" the last score at or above, "median5" the median of the last five (a rule
    that holds now, not one that held once: a stop callback asked again answers for the present)."""
    last = scores[-5:] if rule == "median5" else scores[-1:]
    return len(last) == (5 if rule == "median5" else 1) and float(np.median(last)) >= target


def caffe_lenet_loop(
    X,
    y,
    budget: float,
    target: float,
    eval_size: int,
    seed: int,
    threads: int,
    validation=None,
    rule: str = "first",
) -> pd.DataFrame:
    """A plain PyTorch loop with Caffe's LeNet solver, from dasknn's initial weights: its history.

    SGD lr 0.01 (biases ×2, Caffe's lr_mult), momentum 0.9, weight decay 5e-4, policy inv
    (lr · (1 + 1e-4 · it)^-0.75), batch 64, a fresh permutation each epoch. Training accuracy is
    scored on the estimator's evaluation subset on the estimator's fixed-loop schedule: after every
    pass over the data, or sooner once max(2, budget / 20) training seconds have passed since the
    last score (dasknn/fitting.py), so both report time to accuracy at the same granularity;
    scoring is not on the clock. With `validation=(X_val, y_val)` every score is also taken on
    those held-out samples (`val_accuracy`), and `target` applies to it. `rule`: the loop stops at
    the first score at or above `target` ("first") or once the median of the last five is
    ("median5", `dasknn.reports.RULES`).
    """
    if rule not in ("first", "median5"):
        raise ValueError(f"unknown rule {rule!r}; expected 'first' or 'median5'")
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    X, y = np.asarray(X.compute(), np.float32), np.asarray(y.compute(), np.int64)
    n = X.shape[0]
    idx = np.sort(np.random.default_rng(seed).choice(n, min(eval_size, n), replace=False))
    tX, ty = torch.from_numpy(X), torch.from_numpy(y)
    eX, ey = tX[idx], ty[idx]
    vX = vy = None
    if validation is not None:
        vX = torch.from_numpy(np.asarray(validation[0], np.float32))
        vy = torch.from_numpy(np.asarray(validation[1], np.int64))
    net = torch_net("lenet")
    ours = zoo.lenet(seed=seed).get_params()
    layers = [m for m in net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        for m, name in zip(layers, ("conv1", "conv2", "ip1", "ip2"), strict=True):
            m.weight.copy_(torch.from_numpy(ours[f"{name}.weight"]))
            m.bias.copy_(torch.from_numpy(ours[f"{name}.bias"]))
    groups = [
        {"params": [m.weight for m in layers], "lr": 0.01},
        {"params": [m.bias for m in layers], "lr": 0.02},
    ]
    opt = torch.optim.SGD(groups, lr=0.01, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
    loss_fn = torch.nn.CrossEntropyLoss()
    chunk, history, clock, it = max(2.0, budget / 20), [], 0.0, 0
    rng, t_wall = np.random.default_rng(seed), time.perf_counter()

    def score() -> float:
        with torch.no_grad():
            logits = net(eX)
            acc = float((logits.argmax(1) == ey).float().mean())
            row = {
                "time": clock,
                "iteration": it,
                "epoch": it * BATCH / n,
                "loss": float(loss_fn(logits, ey)),
                "accuracy": acc,
                "wall_time": time.perf_counter() - t_wall,
            }
            if vX is not None:
                val_logits = net(vX)
                row["val_loss"] = float(loss_fn(val_logits, vy))
                row["val_accuracy"] = acc = float((val_logits.argmax(1) == vy).float().mean())
            history.append(row)
        return acc

    next_eval = chunk
    metric = "val_accuracy" if vX is not None else "accuracy"

    def done() -> bool:
        return rule_met([r[metric] for r in history], target, rule)

    score()
    if done():
        return pd.DataFrame(history)
    while clock < budget:
        order = rng.permutation(n)
        for b in range(n // BATCH):
            batch = torch.from_numpy(order[b * BATCH : (b + 1) * BATCH])
            t0 = time.perf_counter()
            opt.zero_grad()
            loss_fn(net(tX[batch]), ty[batch]).backward()
            opt.step()
            sched.step()
            clock += time.perf_counter() - t0
            it += 1
            end_of_pass = b == n // BATCH - 1
            if clock >= next_eval or clock >= budget or end_of_pass:
                next_eval = clock + chunk
                score()
                if done() or clock >= budget:
                    return pd.DataFrame(history)
    return pd.DataFrame(history)
