"""Budgets: what a window's metrics must satisfy, and which limits a window breaches.

Parsing validates every key, type and range and names the source on error; evaluation
is a pure function of a ``Budget`` and a ``Metrics``. How a breach reads is ``text``'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import Metric
from pytest_gpuprof.verdict import validate as check
from pytest_gpuprof.verdict.validate import Number

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics


class BudgetError(check.Invalid):
    """A budget table with an unknown key, a wrong type or an out-of-range value."""


class _Limits:
    """A frozen set of limits, one per budget key of ``descriptors`` (``None``: not set)."""

    __slots__ = ("_limits", "own")
    KEYS: Mapping[str, Metric] = {}
    # the keys the test set itself (a marker, check()): each must be judged or said why not;
    # the run's own budget applies where it can (a limit on brackets, to tests with some)
    own: frozenset[str]

    def __init__(self, *, own: Iterable[str] = (), **limits: Any) -> None:
        wrong = sorted(set(limits) - set(self.KEYS))
        if wrong:
            raise TypeError(f"{type(self).__name__}: unknown keys {wrong}; valid keys: {', '.join(self.KEYS)}")
        object.__setattr__(self, "_limits", {k: limits[k] for k in self.KEYS if limits.get(k) is not None})
        object.__setattr__(self, "own", frozenset(own) & set(self._limits))

    def __getattr__(self, key: str) -> Any:
        if key in type(self).KEYS:
            return self._limits.get(key)
        raise AttributeError(f"{type(self).__name__} has no key {key!r}")

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def set(self) -> dict[str, Any]:
        """The limits that are set, in the descriptors' order."""
        return dict(self._limits)

    def _key(self) -> tuple[Any, ...]:
        return (type(self), tuple(self._limits.items()), tuple(sorted(self.own)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Limits) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._fields().items())})"

    def _fields(self) -> dict[str, Any]:
        return dict(self._limits)


class StepBudget(_Limits):
    """One step's limits (``max_ms``, ``max_idle_ms``, ``min_gbps``, ``pageable``,
    ``min_sm_utilization``). ``must_run``: the step must run in every judged window (a
    marker's or ``check()``'s step budget names this test's steps; a project-wide one
    applies wherever the step runs)."""

    __slots__ = ("must_run",)
    KEYS = descriptors.limits("step")
    must_run: bool

    def __init__(self, *, must_run: bool = False, own: Iterable[str] = (), **limits: Any) -> None:
        super().__init__(own=own, **limits)
        object.__setattr__(self, "must_run", must_run)

    def _key(self) -> tuple[Any, ...]:
        return (*super()._key(), self.must_run)

    def _fields(self) -> dict[str, Any]:
        return {**self._limits, **({"must_run": True} if self.must_run else {})}

    def over(self, base: StepBudget) -> StepBudget:
        return StepBudget(
            must_run=self.must_run or base.must_run, own=self.own | base.own, **{**base.set(), **self.set()}
        )


class Budget(_Limits):
    """A test's limits: the window's keys and each step's."""

    __slots__ = ("steps",)
    KEYS = descriptors.limits("window", "memory")
    steps: Mapping[str, StepBudget]

    def __init__(
        self, *, steps: Mapping[str, StepBudget] | None = None, own: Iterable[str] = (), **limits: Any
    ) -> None:
        super().__init__(own=own, **limits)
        object.__setattr__(self, "steps", dict(steps or {}))

    def _key(self) -> tuple[Any, ...]:
        return (*super()._key(), tuple(sorted(self.steps.items())))

    def _fields(self) -> dict[str, Any]:
        return {**self._limits, **({"steps": self.steps} if self.steps else {})}

    @property
    def empty(self) -> bool:
        return not self._limits and not self.steps

    @property
    def gates_memory(self) -> bool:
        """Whether a limit is on device memory (the tracker then sees each allocation)."""
        memory = {k for k, m in self.KEYS.items() if m.scope == "memory"}
        return bool(memory & set(self._limits)) or any(
            StepBudget.KEYS[k].unit == "bytes" and StepBudget.KEYS[k].limit is not None
            for s in self.steps.values()
            for k in s.set()
        )

    def merged_over(self, base: Budget) -> Budget:
        """This budget's keys over ``base``'s: the higher-precedence source wins key by key."""
        steps = dict(base.steps)
        for name, step in self.steps.items():
            steps[name] = step.over(steps.get(name, StepBudget()))
        return Budget(steps=steps, own=self.own | base.own, **{**base.set(), **self.set()})

    def keys(self) -> list[str]:
        """Every limit set, as a breach names it: ``min_utilization``, ``steps.upload.max_ms``."""
        return [*self.set(), *(f"steps.{name}.{key}" for name, s in self.steps.items() for key in s.set())]

    def limits(self) -> dict[str, Any]:
        out: dict[str, Any] = self.set()
        if self.steps:
            out["steps"] = {name: s.set() for name, s in self.steps.items()}
        return out


def _rule(metric: Metric) -> Number:
    """A limit's range: fractions live in [0, 1], the rest are at least 0."""
    return Number(0.0, 1.0) if metric.fraction else Number(0.0)


_PAGEABLE = ("forbid", "allow")
# a byte count's units, binary as GPU memory is counted ("GB" is taken as the decimal one)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 1 << 10, "MIB": 1 << 20}
_UNITS |= {"GIB": 1 << 30, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: Any, key: str, source: str) -> int:
    """A byte count: a number, or a string with a unit (``"512 MiB"``, ``"2 GiB"``, ``"1.5 GB"``)."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match[2].upper() if match else ""
        if match is None or (unit and unit not in _UNITS):
            raise BudgetError(
                f"{source}: {key} = {value!r}: not a size; write a number of bytes or a number and a unit, "
                f"one of {', '.join(u if u == 'B' else u[:-2] + 'iB' if u.endswith('IB') else u for u in _UNITS)}"
            )
        return int(float(match[1]) * _UNITS[unit or "B"])
    return int(check.number(value, key, source, Number(0.0), BudgetError))


def _limit(value: Any, key: str, source: str, metric: Metric) -> float:
    if metric.unit == "bytes":
        return float(parse_bytes(value, key, source))
    limit = float(check.number(value, key, source, _rule(metric), BudgetError))
    if not math.isfinite(limit):  # a limit no figure can breach: a gate silently off
        raise BudgetError(f"{source}: {key!r} = {value!r}: a limit must be a finite number")
    return limit


def parse_budget(table: Mapping[str, Any], source: str, *, own: bool = False) -> Budget:
    """A ``Budget`` from a ``[tool.gpuprof.budget]``-shaped mapping; ``source`` names its
    origin; ``own``: the test's own budget (a marker's, ``check()``'s), whose step budgets
    name steps that must run and whose every limit must be judged."""
    if not isinstance(table, Mapping):
        raise BudgetError(f"{source}: the budget must be a table, not {type(table).__name__}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "steps":
            values["steps"] = _parse_steps(value, source, own)
        elif key in Budget.KEYS:
            values[key] = _limit(value, key, source, Budget.KEYS[key])
        else:
            raise check.unknown(key, source, [*Budget.KEYS, "steps"], "budget key", BudgetError)
    return Budget(own=values if own else (), **values)


def _parse_steps(table: Any, source: str, own: bool) -> dict[str, StepBudget]:
    steps: dict[str, StepBudget] = {}
    for name, step in check.table(table, "steps", source, BudgetError).items():
        where = f"steps.{name}"
        values: dict[str, Any] = {}
        for key, value in check.table(step, where, source, BudgetError).items():
            metric = StepBudget.KEYS.get(key)
            if metric is None or metric.limit is None:
                raise check.unknown(f"{where}.{key}", source, list(StepBudget.KEYS), "budget key", BudgetError)
            if metric.limit.direction == "forbid":
                values[key] = check.choice(value, f"{where}.{key}", source, _PAGEABLE, BudgetError)
            else:
                values[key] = _limit(value, f"{where}.{key}", source, metric)
        steps[str(name)] = StepBudget(must_run=own, own=values if own else (), **values)
    return steps


@dataclass(frozen=True, slots=True)
class Breach:
    metric: str
    value: float
    limit: float | str
    kind: Literal["min", "max", "forbid", "missing"]
    key: str
    # what a person needs beyond the figures (a missing step: the steps that did run)
    detail: str = ""
    window: int | None = None  # which of the test's windows breached (0-based), where known

    @property
    def severity(self) -> float:
        """How far past its limit, relative to it: what orders a test's breaching windows,
        worst first (a forbidden flag or a missing step: without bound)."""
        if self.kind in ("forbid", "missing") or not isinstance(self.limit, int | float):
            return math.inf
        excess = self.limit - self.value if self.kind == "min" else self.value - self.limit
        return excess / abs(self.limit) if self.limit else math.inf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.metric,
            "value": self.value,
            "limit": self.limit,
            "kind": self.kind,
            "key": self.key,
        }
        if self.detail:
            out["detail"] = self.detail
        return {**out, "window": self.window} if self.window is not None else out


def evaluate(budget: Budget, metrics: Metrics) -> list[Breach]:
    """Every limit of ``budget`` that ``metrics`` breaches, in the descriptors' order; a
    limit on a figure that was not measured (``None``) is neither kept nor breached
    (``not_measured`` says so). A step budget that must run, on a step absent from the
    window, is a breach: never a gate silently off. A figure known as a range only
    (``MemoryMetrics.bounds``) breaches a limit its least exceeds."""
    bounds = _bounds(metrics)
    breaches = _breached("", budget, metrics, bounds)
    for name, limits in budget.steps.items():
        step = metrics.steps.get(name)
        if step is None:
            if limits.must_run:
                ran = ", ".join(sorted(metrics.steps)) or "none"
                detail = f"step {name!r} never ran in the window; steps were: {ran}"
                breaches.append(Breach(f"steps.{name}", 0.0, "must run", "missing", f"steps.{name}", detail))
            continue
        breaches += _breached(f"steps.{name}.", limits, step, bounds)
    return breaches


def _bounds(metrics: Metrics) -> Mapping[str, tuple[int, int]]:
    return metrics.memory.bounds if metrics.memory is not None else {}


def _ranged(value: tuple[int, int], limit: Any, direction: str) -> bool | None:
    """Whether a figure known only to lie in ``value`` breaches ``limit`` (``None``: it may or may not)."""
    lo, hi = value
    breached = lo > limit if direction == "max" else hi < limit
    kept = hi <= limit if direction == "max" else lo >= limit
    return True if breached else False if kept else None


def _figure(figures: Any, metric: Metric) -> Any:
    """The value ``metric`` limits, in a window's or a step's figures (``None``: not measured)."""
    if metric.scope == "memory":
        figures = figures.memory
    return None if figures is None else getattr(figures, metric.name)


def _path(prefix: str, metric: Metric) -> str:
    return f"memory.{metric.name}" if metric.scope == "memory" else prefix + metric.name


def _breached(prefix: str, limits: _Limits, figures: Any, bounds: Mapping[str, tuple[int, int]]) -> list[Breach]:
    out = []
    for key, limit in limits.set().items():
        metric = limits.KEYS[key]
        value = _figure(figures, metric)
        direction = metric.limit.direction if metric.limit is not None else "max"
        ranged = bounds.get(_path(prefix, metric)) if value is None else None
        if ranged is not None and _ranged(ranged, limit, direction):
            lo, hi = ranged
            side, bound = ("at least", lo) if direction == "max" else ("at most", hi)
            detail = f"{side} {bound:,}: it lies between {lo:,} and {hi:,}"
            out.append(Breach(_path(prefix, metric), float(bound), limit, direction, prefix + key, detail))
        if value is None:
            continue
        if direction == "forbid":
            if limit == "forbid" and value:
                out.append(Breach(_path(prefix, metric), 1.0, "forbid", "forbid", prefix + key))
        elif value < limit if direction == "min" else value > limit:
            out.append(Breach(_path(prefix, metric), float(value), limit, direction, prefix + key))
    return out


def not_measured(budget: Budget, metrics: Metrics) -> list[str]:
    """The limits of ``budget`` that ``metrics`` cannot be judged on, each with the reason:
    neither kept nor breached, and said so. A limit of the run's budget on what this
    window has none of (brackets, copies) does not apply to it, and is not listed."""
    return [f"{key} not measured: {why}" for key, why, reported in _unjudged(budget, metrics) if reported]


def _unjudged(budget: Budget, metrics: Metrics) -> list[tuple[str, str, bool]]:
    owners: list[tuple[str, _Limits, Any]] = [("", budget, metrics)]
    owners += [(f"steps.{n}.", lim, metrics.steps[n]) for n, lim in budget.steps.items() if n in metrics.steps]
    bounds = _bounds(metrics)
    out = []
    for prefix, limits, figures in owners:
        for key, limit in limits.set().items():
            metric = limits.KEYS[key]
            if _figure(figures, metric) is None:
                ranged = bounds.get(_path(prefix, metric))
                if ranged is not None:  # judged where the whole range lies on one side of the limit
                    if _ranged(ranged, limit, metric.limit.direction if metric.limit else "max") is None:
                        lo, hi = ranged
                        note = metrics.memory.note if metrics.memory is not None else None
                        out.append((prefix + key, f"it lies between {lo:,} and {hi:,} bytes ({note})", True))
                    continue
                why = getattr(metrics, metric.unseen_by) if metric.unseen_by else None
                # the source did not see it (reported), or the window has none of it
                reported = key in limits.own or metric.unseen_by is not None
                out.append((prefix + key, why or metric.unseen, reported))
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """A budget's judgement of one window: the limits it judged, those the window
    breached, and those it could not judge, with the reason."""

    budget: Budget = field(default_factory=lambda: Budget())
    breaches: tuple[Breach, ...] = ()
    unjudged: tuple[str, ...] = ()

    @property
    def breached(self) -> bool:
        return bool(self.breaches)


def judge(budget: Budget, metrics: Metrics) -> Verdict:
    """The one judgement of a budget on a window: the session's, ``gpuprof.check()``'s,
    and that of the re-measuring that confirms a breach inside a hypothesis example."""
    if budget.empty:
        return Verdict(budget)
    return Verdict(budget, tuple(evaluate(budget, metrics)), tuple(not_measured(budget, metrics)))
