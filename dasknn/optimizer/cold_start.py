"""Omnivore's cold start (appendix E-D): η* at g = 1, then g tuned too.

1. S = 0 (g = 1), µ = 0.9: probe η in `lr_grid` order from the same state, stopping at the first
   rate worse than the previous one (or diverging) → η*_sync.
2. "Tuning the number of compute groups is also important for the cold-start phase": for g = 2,
   4, … (powers of two among the candidates) up to the g that saturates the FC server (the
   optimization that runs asynchronously "only up to FC saturation"), a grid µ ∈ momentum_grid ×
   η ∈ {η*_last, η*_last/10} (no µ > µ*_last at η*_last) from the same state → (µ*, η*) per g.
   The ladder stops at a g where µ* = 0 (its implicit momentum is already too high) or every
   probe diverged.
3. "Run each S … until there is a clear winner in terms of loss": each g's winner is continued
   from its own end state until all have run the same time (a faster g does more iterations in
   it), then the lowest loss wins; without a clear winner, all run that long again, once.

The cold-start epoch then trains the winning g with its (µ*, η*), from the winning probe's state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dasknn.optimizer.search import Probe, Runs, clear_winner, record_probe, state_hash

if TYPE_CHECKING:  # pragma: no cover
    from dasknn.engine.trace import TrainState
    from dasknn.optimizer.session import _Session

__all__ = ["cold_start_groups", "cold_start_lr", "ladder"]


def cold_start_lr(session: _Session, state: TrainState) -> Runs:
    """η* at g = 1, µ = cold_start_momentum: lr_grid in order, stop at the first worse rate."""
    opt, log = session.opt, session.log
    probes: list[Probe] = []
    why = "every rate of lr_grid probed: the lowest score"
    for i, lr in enumerate(opt.lr_grid):
        reason = f"cold-start rate {i + 1} of {len(opt.lr_grid)}"
        p = yield from session.prober.probe(session.base.with_(lr=lr), state, "cold_start", reason)
        if p is None:
            why = "the budget ran out during the cold start"
            break
        probes.append(p)
        prev = probes[-2] if len(probes) > 1 else None
        if prev is not None and any(not q.diverged for q in probes[:-1]):
            if p.diverged or (not prev.diverged and p.score > prev.score):
                skipped = ", ".join(f"{v:g}" for v in opt.lr_grid[i + 1 :]) or "none"
                what = "diverged" if p.diverged else f"is worse than lr={prev.config.lr:g}"
                why = f"stopped early: lr={lr:g} {what}; not probed: {skipped}"
                break
    finite = [p for p in probes if not p.diverged]
    if probes and not finite:
        raise FloatingPointError(f"every rate of lr_grid {opt.lr_grid} diverged at n_groups=1")
    if not finite:
        return None
    best = min(finite, key=lambda p: p.score)
    log.record("cold_start", "choose_lr", best.config, why, score=best.score)
    return best


def ladder(candidates: list[int], up_to: int) -> list[int]:
    """g = 2, 4, 8, … among the candidates, up to `up_to` (included when it is a candidate)."""
    steps = [c for c in candidates if 1 < c <= up_to and c & (c - 1) == 0]
    if up_to in candidates and up_to > 1 and up_to not in steps:
        steps.append(up_to)
    return steps


def cold_start_groups(session: _Session, state: TrainState, sync: Probe, up_to: int) -> Runs:
    """The cold start's g (steps 2-3 of the module docstring): (the winning probe, why)."""
    from dasknn.optimizer.search import momentum_lr_grid

    opt, log, prober = session.opt, session.log, session.prober
    best_of: dict[int, Probe] = {1: sync}
    last = sync
    for g in ladder(session.candidates, up_to):
        grid = momentum_lr_grid(last.config.lr, last.config.momentum, opt.momentum_grid)
        if opt.learning_rate is not None:
            grid = [(m, lr) for m, lr in grid if lr == opt.learning_rate]
        probes = yield from prober.grid(
            last.config.with_(n_groups=g),
            grid,
            state,
            "cold_start",
            f"cold-start g={g}: ",
            opt.momentum_early_stop,
        )
        finite = [p for p in probes if not p.diverged]
        if not finite:
            why = "the budget ran out" if not probes else "every probe diverged"
            log.record("cold_start", "stop_ladder", last.config.with_(n_groups=g), f"g={g}: {why}")
            break
        winner, _, why = yield from prober.pick(finite)
        best_of[g], last = winner, winner
        log.record("cold_start", "choose_at_g", winner.config, why, score=winner.score)
        if winner.config.momentum == 0 and opt.momentum_grid != (0.0,):
            why = f"µ* = 0 at g={g}: its implicit momentum is already too high; no larger g"
            log.record("cold_start", "stop_ladder", winner.config, why, score=winner.score)
            break
    if len(best_of) == 1:
        return sync, "no g > 1 to try (or none ran): g = 1"
    return (yield from _equal_time_winner(session, best_of))


def _seconds(session: _Session, p: Probe) -> float:
    return float(sum(session.log.charged[r] for r in p.runs))


def _equal_time_winner(session: _Session, best_of: dict[int, Probe]) -> Runs:
    """Continue each g's winner to the same time, then the lowest loss (one more round if unclear)."""
    log, prober = session.log, session.prober
    contenders = list(best_of.values())
    rounds, first = 0, max(_seconds(session, p) for p in contenders)
    while True:
        target = first * (1 + rounds)
        for p in contenders:
            left = target - _seconds(session, p)
            if left > 0.02 * target and not p.diverged and p.state is not None:
                budget = log.budget(seconds=left)
                if budget is None:
                    break
                start_hash = state_hash(p.state)
                yield from prober.advance(p, p.state, budget)
                record_probe(
                    log, "extend", p, f"equal time for every g: {target:.3g} s", prober.window, start_hash
                )
        finite = [p for p in contenders if not p.diverged and math.isfinite(p.score)]
        if not finite:
            return best_of[1], "every g's winner diverged when continued: g = 1"
        winner, tied = clear_winner(finite, prober.threshold, prober.window)
        if not tied or rounds >= 1 or log.exhausted():
            break
        contenders, rounds = [winner, *tied], rounds + 1
    times = ", ".join(f"g={p.config.n_groups}: {p.score:.4g}" for p in finite)
    return winner, f"lowest loss after the same time ({times})" + ("" if not tied else "; no clear winner")
