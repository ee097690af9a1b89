"""The plateau rule of the "auto" optimizer: η ÷ 3 when progress stalls, then stop on convergence.

Caffe's `step` policy divides η at fixed iterations chosen by hand; "auto" divides it when the
loss's recent progress (the median of the last `smoothing` windows' fall of log loss per
iteration, `ramp.window_progress`) drops below `fraction` of its reference: the progress right
after the η ramp, and after each drop the progress of the first window at the new η. After
`patience` windows at an η at least. When `max_drops` drops in a row brought no held-out gain
(the best held-out accuracy did not rise by more than `min_gain` since the drop before), the fit
has converged and stops: the default stopping rule of a fit with no target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["Plateau", "PlateauStep"]


@dataclass
class PlateauStep:
    """The rule's answer after a window: "keep", "drop" (η ÷ factor) or "stop", and why."""

    action: str
    reason: str


@dataclass
class Plateau:
    """The rule's state (JSON-able: `to_dict` / `from_dict`); `observe` each kept window."""

    reference: float
    fraction: float = 0.1
    factor: float = 3.0
    max_drops: int = 2
    patience: int = 3
    smoothing: int = 3
    min_gain: float = 0.001
    recent: list[float] = field(default_factory=list)
    since_drop: int = 0
    drops: int = 0
    drops_without_gain: int = 0
    best_held_out: float = -math.inf
    held_out_at_drop: float = -math.inf
    fresh: bool = False  # the first window after a drop sets the new reference

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise ValueError(f"the plateau fraction must be in (0, 1), got {self.fraction}")
        if not self.factor > 1:
            raise ValueError(f"the plateau factor must be > 1, got {self.factor}")
        if int(self.max_drops) < 1:
            raise ValueError(f"max_drops must be >= 1, got {self.max_drops}")

    def observe(self, progress: float, held_out: float | None = None) -> PlateauStep:
        """Judge one kept window's progress (and the held-out accuracy after it, if measured)."""
        if held_out is not None and math.isfinite(held_out):
            self.best_held_out = max(self.best_held_out, float(held_out))
        if self.fresh:
            self.fresh = False
            if math.isfinite(progress) and progress > 0:
                self.reference = float(progress)
        self.since_drop += 1
        self.recent = (self.recent + [float(progress)])[-int(self.smoothing) :]
        recent = float(np.median(self.recent))
        if self.since_drop < self.patience or not (self.reference > 0):
            return PlateauStep("keep", f"progress {recent:.3g}/it ({self.since_drop} windows at this η)")
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
                "stop",
                f"{why}; the last {self.drops_without_gain} drops of η gave no held-out gain: converged",
            )
        self.drops += 1
        self.held_out_at_drop = self.best_held_out
        self.since_drop, self.recent, self.fresh = 0, [], True
        return PlateauStep("drop", f"{why}: η ÷ {self.factor:g} (drop {self.drops})")

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plateau:
        out = cls(**{k: v for k, v in d.items() if v is not None})
        for k in ("best_held_out", "held_out_at_drop"):
            if d.get(k) is None:
                setattr(out, k, -math.inf)
        return out
