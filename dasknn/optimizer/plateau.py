"""The plateau rule of the "auto" optimizer: η ÷ 3 when progress stalls, then stop on convergence.

Caffe's `step` policy divides η at fixed iterations chosen by hand; "auto" divides it when the
loss's progress stalls. Progress is measured over spans of at least `span` iterations (several
windows: one window's fall of the loss is too noisy, and the first windows after the start fall
fast at any η): the fall of log loss per iteration over the span. The first span at an η (after
the η ramp, after each drop) is the reference; when a later span's progress falls below
`fraction` of it, η is divided by `factor`. When `max_drops` drops in a row brought no held-out gain
(the best held-out accuracy did not rise by more than `min_gain` since the drop before), the fit
has converged and stops: the default stopping rule of a fit with no target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

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
    reference: float = math.nan  # the first span's progress at this η
    fall: float = 0.0  # log loss fallen in the span being accumulated
    iterations: int = 0  # its iterations
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

    def observe(self, progress: float, iterations: int, held_out: float | None = None) -> PlateauStep:
        """Add one kept window: its progress per iteration over `iterations`, and the held-out
        accuracy after it (if measured)."""
        if held_out is not None and math.isfinite(held_out):
            self.best_held_out = max(self.best_held_out, float(held_out))
        if not math.isfinite(progress) or iterations < 1:
            return PlateauStep("keep", "no progress measured")
        self.fall += progress * iterations
        self.iterations += int(iterations)
        if self.iterations < self.span:
            return PlateauStep("keep", f"{self.iterations} of {self.span} iterations in the span")
        recent = self.fall / self.iterations
        self.fall, self.iterations = 0.0, 0
        if not self.reference > 0:
            self.reference = recent
            return PlateauStep("keep", f"reference progress {recent:.3g}/it at this η")
        if recent >= self.fraction * self.reference:
            return PlateauStep(
                "keep", f"progress {recent:.3g}/it >= {self.fraction:g} x reference {self.reference:.3g}/it"
            )
        why = f"progress {recent:.3g}/it < {self.fraction:g} x reference {self.reference:.3g}/it"
        if self.drops:  # did the last drop pay on held-out data?
            gained = self.best_held_out > self.held_out_at_drop + self.min_gain
            self.drops_without_gain = 0 if gained else self.drops_without_gain + 1
        if self.drops_without_gain >= self.max_drops:
            return PlateauStep(
                "stop", f"{why}; the last {self.drops_without_gain} drops of η gave no held-out gain"
            )
        self.drops += 1
        self.held_out_at_drop = self.best_held_out
        self.reference = math.nan
        return PlateauStep("drop", f"{why}: η ÷ {self.factor:g} (drop {self.drops})")

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plateau:
        out = cls(**{k: v for k, v in d.items() if v is not None})
        for key, missing in (
            ("best_held_out", -math.inf),
            ("held_out_at_drop", -math.inf),
            ("reference", math.nan),
        ):
            if d.get(key) is None:
                setattr(out, key, missing)
        return out
