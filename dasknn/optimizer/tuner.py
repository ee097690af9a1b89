"""A tuner as a scikit-learn object: its user options are its parameters, and a fit runs a bound clone.

Follows scikit-learn's components (`Pipeline`'s steps, `BaggingClassifier(estimator=...)`):
`DistributedCNN(tuner=AutoPolicy(window=32))`, `est.set_params(tuner__window=32)` and
`GridSearchCV(est, {"tuner__window": [16, 32]})` reach the tuner's options, and `__init__` only
stores them. A fit never changes the user's object: `for_fit` returns a clone bound to that fit,
its options checked and converted by the class's table (`OPTIONS`, `rules.Option`) and given the
fit's settings (`SETTINGS`: the engine and what the estimator decides, such as the knobs the user
pinned, the target or the verbosity), which are not the tuner's parameters. The clone is the
`dasknn.policy.Policy` the loop runs; its state lives there (docs/architecture.md, "The loop and
its policies").
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Generator
from dataclasses import asdict, replace
from typing import Any, ClassVar

from sklearn.base import BaseEstimator, clone

from dasknn.policy import NextRun, Outcome, Stop
from dasknn.rules import Option, checked_options

__all__ = ["StepTuner", "Tuner"]


class Tuner(BaseEstimator):
    """The scikit-learn face of a tuner: parameters (`get_params`, `set_params`, `clone`) and
    `for_fit`. A subclass names itself (`name`, the estimator's shorthand: "auto", "grid",
    "online"), lists its options (`OPTIONS`, its `__init__`'s keywords in order) and its fit
    settings (`SETTINGS`), and derives what it needs from both in `bound`."""

    name: ClassVar[str] = ""
    OPTIONS: ClassVar[tuple[Option, ...]] = ()
    SETTINGS: ClassVar[tuple[Option, ...]] = ()
    engine: Any = None
    """The engine of a bound tuner (`for_fit`); None on the user's object."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each setting's default as a class attribute: a tuner the loop runs unbound (a test's
        `fitting.run_policy(AutoPolicy(), ...)`) reads the settings at their defaults."""
        super().__init_subclass__(**kwargs)
        for option in cls.SETTINGS:
            setattr(cls, option.name, option.default)

    def checked(self) -> dict[str, Any]:
        """The parameters, each checked by its rule and converted (`rules.checked_options`): a
        ValueError naming the first bad one."""
        return checked_options(self.OPTIONS, self.get_params(deep=False))

    def for_fit(self, engine: Any = None, **settings: Any) -> Tuner:
        """A clone of this tuner bound to one fit: its options checked and converted, the fit's
        `settings` (names of `SETTINGS`; the others at their defaults) and `engine` (for a
        standalone `optimize`; a fit's loop passes the engine itself). This object is unchanged."""
        known = {o.name for o in self.SETTINGS}
        unknown = sorted(set(settings) - known)
        if unknown:
            name = type(self).__name__
            raise ValueError(f"{name} has no setting(s) {unknown}; its settings: {sorted(known)}")
        bound = clone(self)
        values = {o.name: settings.get(o.name, o.default) for o in self.SETTINGS}
        for name, value in {**self.checked(), **checked_options(self.SETTINGS, values)}.items():
            setattr(bound, name, value)
        bound.engine = engine
        bound.bound()
        return bound

    def bound(self) -> None:
        """What the class derives from its checked options and settings once bound (a subclass's)."""

    def smallest_start_rate(self, net: Any) -> float:
        """The smallest learning rate this tuner may start `net` at, which the fit tries on the
        first batch before any work: here the net's reference solver's (`prior.solver_prior`);
        a tuner that starts elsewhere says so."""
        from dasknn.optimizer.prior import solver_prior

        return float(solver_prior(net)[0])


class StepTuner(Tuner, metaclass=ABCMeta):
    """A tuner whose fit is written as one generator of runs (Omnivore's Algorithm 1, the online
    optimizer): it yields each `NextRun`, receives its `Outcome`, and returns the `Stop`. This
    class answers the loop for it (`dasknn.policy.Policy.next_run`), the same way for each: the
    generator's next run, with the checkpoint session the tuner has pending, or its Stop with the
    final session."""

    def start_steps(self, steps: Generator[NextRun, Outcome, Stop]) -> None:
        """The fit's generator (`begin` calls it)."""
        self._steps, self._started = steps, False

    @abstractmethod
    def pending_checkpoint(self) -> dict[str, Any] | None:
        """The session to checkpoint before the next run, taken (None: no checkpoint)."""

    @abstractmethod
    def checkpointed(self) -> dict[str, Any] | None:
        """The session of the latest checkpoint (the final session starts from it)."""

    def next_run(self, last: Outcome | None) -> NextRun | Stop:
        """The generator's next run, or its Stop with the final session."""
        try:
            step = self._steps.send(last) if self._started else next(self._steps)
        except StopIteration as done:
            stop = done.value
            latest = self.checkpointed() or {"kind": "auto"}
            final = {**latest, "finished": True, "config": asdict(stop.config)}
            return replace(stop, session=final)
        self._started = True
        pending = self.pending_checkpoint()
        return step if pending is None else replace(step, checkpoint=pending)
