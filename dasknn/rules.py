"""What a parameter accepts: a rule per kind of value, with its error text and its command-line parsing.

A rule is written once and used wherever its value is checked: the estimator's table of parameters
(`dasknn.estimator_params`), the command line derived from that table (`dasknn.cli`), an engine
run's `RunConfig` (docs/architecture.md, "One table of parameters"). A bad value raises
`ValueError("<name> must be <what>, got <value>")`, the same text from Python and from the command
line. This module imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Boolean",
    "Choice",
    "Custom",
    "Grid",
    "Number",
    "Option",
    "Rule",
    "ACCURACY",
    "LEARNING_RATE",
    "MOMENTUM",
    "N_GROUPS",
    "VERBOSE",
    "checked_options",
]


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_one_of(value: Any, values: tuple) -> bool:
    """`value` is one of `values` (None by identity, strings by equality; arrays are none of them)."""
    return any(value is v if v is None else (isinstance(value, str) and value == v) for v in values)


def _quoted(values: tuple) -> str:
    return ", ".join(repr(v) for v in values)


class Rule(ABC):
    """What one parameter accepts: `ok(value)`, its description `what`, and `parse(text)`."""

    what: str = "a value"

    @abstractmethod
    def ok(self, value: Any) -> bool:
        """True when the parameter may take `value`."""

    def check(self, name: str, value: Any) -> Any:
        """`value` when the rule accepts it, else ValueError naming `name`, the rule and the value."""
        if not self.ok(value):
            raise ValueError(f"{name} must be {self.what}, got {value!r}")
        return value

    def parse(self, text: str) -> Any:
        """The value a command-line word stands for (checked afterwards, as a Python value is)."""
        return text

    def convert(self, value: Any) -> Any:
        """An accepted `value` as its user stores it (a Number as int or float; default: itself)."""
        return value


@dataclass(frozen=True)
class Number(Rule):
    """A number (an integer with `integer`) in a range, or one of the words `also` ("auto", None).

    Bools are not numbers here; a real number must be finite. `text` overrides the range's wording.
    """

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    also: tuple = ()
    text: str | None = None

    @property
    def what(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.text is not None:
            body = f"{kind} {self.text}"
        elif math.isinf(self.high):
            bound = f"{'>' if self.low_open else '>='} {self.low:g}"
            body = f"{kind} {bound}" if self.integer else f"a finite number {bound}"
        else:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            body = f"{kind} in {left}{self.low:g}, {self.high:g}{right}"
        words = " or ".join("None" if a is None else repr(a) for a in self.also)
        return f"{words} or {body}" if words else body

    def ok(self, value: Any) -> bool:
        if _is_one_of(value, self.also):
            return True
        if _is_bool(value) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            return False
        if not math.isfinite(float(value)):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return bool(above and below)

    def parse(self, text: str) -> Any:
        if text in self.also:
            return text
        if self.integer:
            try:
                return int(text)
            except ValueError:
                pass
        try:
            return float(text)
        except ValueError:
            return text

    def convert(self, value: Any) -> Any:
        if _is_one_of(value, self.also):
            return value
        return int(value) if self.integer else float(value)


@dataclass(frozen=True)
class Grid(Rule):
    """A list of numbers to search over, each accepted by `item`; non-empty unless `empty` (then
    None and an empty list also mean none). Stored as a tuple of floats."""

    item: Number
    empty: bool = False

    @property
    def what(self) -> str:
        none = "None or " if self.empty else ""
        return f"{none}a {'' if self.empty else 'non-empty '}list, each item {self.item.what}"

    def ok(self, value: Any) -> bool:
        if self.empty and value is None:
            return True
        if not isinstance(value, (list, tuple, np.ndarray)) or getattr(value, "ndim", 1) != 1:
            return False
        return (self.empty or len(value) > 0) and all(self.item.ok(v) for v in value)

    def convert(self, value: Any) -> Any:
        return () if value is None else tuple(float(v) for v in value)

    def parse(self, text: str) -> Any:
        """Comma-separated items, each parsed by `item` ("0.1,0.01")."""
        return tuple(self.item.parse(t.strip()) for t in text.split(","))


@dataclass(frozen=True)
class Choice(Rule):
    """One of a few words (or None, when None is among them)."""

    values: tuple

    @property
    def what(self) -> str:
        return f"one of {_quoted(self.values)}"

    def ok(self, value: Any) -> bool:
        return _is_one_of(value, self.values)

    def parse(self, text: str) -> Any:
        """The word, or None for "None" (as `--help` lists it) where None is a choice."""
        return None if text == "None" and None in self.values else text


@dataclass(frozen=True)
class Boolean(Rule):
    """True or False (a flag without a value on the command line)."""

    what: str = "True or False"

    def ok(self, value: Any) -> bool:
        return _is_bool(value)


@dataclass(frozen=True)
class Custom(Rule):
    """A rule of its own: `accepts(value)` says yes or no, `what` describes it; or `check_value`
    raises its own ValueError (a net that names the zoo's nets, a folder that says why it is not
    writable); `parse` turns a command-line word into the value (default: the word itself)."""

    what: str
    accepts: Callable[[Any], bool] | None = None
    check_value: Callable[[Any], Any] | None = None
    parse_text: Callable[[str], Any] | None = None

    def ok(self, value: Any) -> bool:
        return self.accepts is None or bool(self.accepts(value))

    def check(self, name: str, value: Any) -> Any:
        super().check(name, value)
        if self.check_value is not None:
            self.check_value(value)
        return value

    def parse(self, text: str) -> Any:
        return text if self.parse_text is None else self.parse_text(text)


@dataclass(frozen=True)
class Option:
    """One keyword option of a component (a tuner's): its name, default and rule; a table of them
    is the component's one description of what it accepts (`checked_options`)."""

    name: str
    default: Any
    rule: Rule


def checked_options(table: tuple[Option, ...], values: dict[str, Any]) -> dict[str, Any]:
    """The value of each option of `table` in `values` (e.g. an `__init__`'s `locals()`), checked
    by its rule (ValueError "<name> must be <what>, got <value>") and converted (`Rule.convert`)."""
    return {o.name: o.rule.convert(o.rule.check(o.name, values[o.name])) for o in table}


LEARNING_RATE = Number(0, low_open=True)
"""η: a finite number > 0."""
MOMENTUM = Number(0, 1, high_open=True)
"""µ: a number in [0, 1) (Omnivore's explicit momentum)."""
N_GROUPS = Number(1, integer=True)
"""g: an integer >= 1 (compute groups, Omnivore §III-B)."""
ACCURACY = Number(0, 1, low_open=True)
"""An accuracy to reach: a number in (0, 1]."""
VERBOSE = Number(0, integer=True)
"""How much a fit tells: an integer >= 0."""
