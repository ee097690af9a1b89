"""The plateau rule of the "auto" optimizer: η ÷ 3 when progress stalls, then stop on convergence.

Caffe's `step` policy divides η at fixed iterations chosen by hand; "auto" divides it when the
loss's progress stalls. Progress is measured over spans of at least `span` iterations (several
windows: one window's fall of the loss is too noisy): the fall of log loss per iteration over the
span, and the span's loss level (the geometric mean of its windows' levels). The first span at an
η (after the η ramp, after each drop) is the reference.

The confound (the ramp's, `optimizer.ramp`): early in training the loss falls fast at any η, and
the fall slows as the loss gets lower, so a later span falls slower than the reference only
because training has progressed. A plain "a tenth of the reference" then divides η while it is
still right: after a short ramp the reference sits in the steep start. So the reference is carried
to the later span's loss level as the ramp carries progress between windows, p_ref · (L/L_ref)^γ
(`ramp.expected_ratio`, γ the ramp's exponent: progress ∝ L^γ, a function of where training is,
not of how long it took): a curve that merely decelerates as its loss falls keeps its η; a stale η
is one whose progress falls below `fraction` of what the same η made at a higher loss, carried to
the loss now: the loss stopped falling at a level that η cannot get below (SGD's noise floor).
Spans are noisy (a window's loss may rise at a steady η), so η is divided only after `patience`
spans in a row fell below that (two for "auto": on the simulated 32-worker benchmark a single low
span between two normal ones was noise, experiments/README.md "Plateau rule's reference").

When `max_drops` drops in a row brought no held-out gain (the best held-out accuracy did not rise by
more than `min_gain` since the drop before), the fit has converged and stops: the default stopping
rule of a fit with no target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from dasknn.optimizer.ramp import expected_ratio

__all__ = ["Plateau", "PlateauStep"]


@dataclass
class PlateauStep:
    """The rule's answer after a window: "keep", "drop" (η ÷ factor) or "stop", and why."""

    action: str
    reason: str


@dataclass
class Plateau:
    """The rule's state (JSON-able: `to_dict` / `from_dict`); `observe` each kept window."""

    span: int
    fraction: float = 0.1
    factor: float = 3.0
    max_drops: int = 2
    min_gain: float = 0.001
    gamma: float = 1.0  # progress ∝ loss^γ at a fixed η (the ramp's exponent)
    patience: int = 1  # spans in a row below the expectation before a drop
    reference: float = math.nan  # the first span's progress at this η
    reference_level: float = math.nan  # its loss level (NaN: unknown, no carrying)
    fall: float = 0.0  # log loss fallen in the span being accumulated
    iterations: int = 0  # its iterations
    log_level: float = 0.0  # Σ iterations · log(level) over the span's windows
    level_iterations: int = 0  # the iterations whose window had a level (all of them, or it is unknown)
    low: int = 0  # spans in a row below the expectation
    drops: int = 0
    drops_without_gain: int = 0
    best_held_out: float = -math.inf
    held_out_at_drop: float = -math.inf

    def __post_init__(self) -> None:
        if int(self.span) < 1:
            raise ValueError(f"the plateau span must be >= 1 iteration, got {self.span}")
        if not 0 < self.fraction < 1:
            raise ValueError(f"the plateau fraction must be in (0, 1), got {self.fraction}")
        if not self.factor > 1:
            raise ValueError(f"the plateau factor must be > 1, got {self.factor}")
        if int(self.max_drops) < 1:
            raise ValueError(f"max_drops must be >= 1, got {self.max_drops}")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"the plateau's loss exponent γ must be finite and >= 0, got {self.gamma}")
        if int(self.patience) < 1:
            raise ValueError(f"the plateau patience must be >= 1 span, got {self.patience}")

    def observe(
        self, progress: float, iterations: int, held_out: float | None = None, level: float | None = None
    ) -> PlateauStep:
        """Add one kept window: its progress per iteration over `iterations`, the held-out accuracy
        after it (if measured), and its loss level (`ramp.window_level`; None or NaN: unknown)."""
        if held_out is not None and math.isfinite(held_out):
            self.best_held_out = max(self.best_held_out, float(held_out))
        if not math.isfinite(progress) or iterations < 1:
            return PlateauStep("keep", "no progress measured")
        self.fall += progress * iterations
        self.iterations += int(iterations)
        if level is not None and level > 0 and math.isfinite(level):
            self.log_level += math.log(level) * iterations
            self.level_iterations += int(iterations)
        if self.iterations < self.span:
            return PlateauStep("keep", f"{self.iterations} of {self.span} iterations in the span")
        recent = self.fall / self.iterations
        known = self.level_iterations == self.iterations
        span_level = math.exp(self.log_level / self.iterations) if known else math.nan
        self.fall, self.iterations, self.log_level, self.level_iterations = 0.0, 0, 0.0, 0
        if not self.reference > 0:
            self.reference, self.reference_level, self.low = recent, span_level, 0
            why = f"reference progress {recent:.3g}/it at this η (loss {span_level:.3g})"
            return PlateauStep("keep", why)
        expected = self.reference * expected_ratio(self.gamma, self.reference_level, span_level)
        against = (
            f"{self.fraction:g} x {expected:.3g}/it (the reference {self.reference:.3g}/it "
            f"carried from loss {self.reference_level:.3g} to {span_level:.3g})"
        )
        if recent >= self.fraction * expected:
            self.low = 0
            return PlateauStep("keep", f"progress {recent:.3g}/it >= {against}")
        self.low += 1
        why = f"progress {recent:.3g}/it < {against}"
        if self.low < self.patience:
            return PlateauStep("keep", f"{why}: {self.low} of {self.patience} spans in a row")
        self.low = 0
        if self.drops:  # did the last drop pay on held-out data?
            gained = self.best_held_out > self.held_out_at_drop + self.min_gain
            self.drops_without_gain = 0 if gained else self.drops_without_gain + 1
        if self.drops_without_gain >= self.max_drops:
            return PlateauStep(
                "stop", f"{why}; the last {self.drops_without_gain} drops of η gave no held-out gain"
            )
        self.drops += 1
        self.held_out_at_drop = self.best_held_out
        self.reference, self.reference_level = math.nan, math.nan
        return PlateauStep("drop", f"{why}: η ÷ {self.factor:g} (drop {self.drops})")

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plateau:
        """The state `to_dict` wrote; a dict from before the loss level and patience existed loads
        with their defaults (its reference, if any, then has no level: it is compared uncarried)."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"not a plateau rule's state: unknown field(s) {sorted(unknown)}")
        out = cls(**{k: v for k, v in d.items() if v is not None})
        for key, missing in (
            ("best_held_out", -math.inf),
            ("held_out_at_drop", -math.inf),
            ("reference", math.nan),
            ("reference_level", math.nan),
        ):
            if d.get(key) is None:
                setattr(out, key, missing)
        return out
