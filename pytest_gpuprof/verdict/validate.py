"""One way to check a setting, wherever it comes from: command line, ``[tool.gpuprof]``,
a budget file, a marker or ``gpuprof.check()``.

Each check names the key, where it came from (``source``) and what would be valid; the
plugin turns the error into pytest's usage error before any test runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


class Invalid(ValueError):
    """A setting that cannot be used, with its key, its source and what is valid."""


class Number(NamedTuple):
    """A numeric setting's rule: ints only (``whole``) or any real number, within ``[lo, hi]``."""

    lo: float
    hi: float = float("inf")
    whole: bool = False


def number(value: Any, key: str, source: str, rule: Number, error: type[Invalid] = Invalid) -> float:
    """``value`` when it is a number of the rule's kind in its range (NaN never is)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (rule.whole and not isinstance(value, int)):
        kind = "a whole number" if rule.whole else "a number"
        raise error(f"{source}: '{key}' must be {kind}, not {type(value).__name__} {value!r}")
    if not rule.lo <= value <= rule.hi:
        upper = "" if rule.hi == float("inf") else f" and at most {rule.hi:g}"
        raise error(f"{source}: '{key}' = {value!r} is out of range: it must be at least {rule.lo:g}{upper}")
    return value


def choice(value: Any, key: str, source: str, choices: Sequence[str], error: type[Invalid] = Invalid) -> str:
    if value not in choices:
        raise error(f"{source}: '{key}' must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return str(value)


def table(value: Any, key: str, source: str, error: type[Invalid] = Invalid) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise error(f"{source}: '{key}' must be a table, not {type(value).__name__}")
    return value


def unknown(key: str, source: str, valid: Sequence[str], what: str = "key", error: type[Invalid] = Invalid) -> Invalid:
    return error(f"{source}: unknown {what} '{key}'; valid keys: {', '.join(valid)}")
