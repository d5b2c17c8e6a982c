"""Budgets: what a window's metrics must satisfy, and which limits a window breaches.

Parsing validates every key, type and range and names the source on error; evaluation
is a pure function of a ``Budget`` and a ``Metrics``. How a breach reads is ``text``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_gpuprof.verdict import validate as check
from pytest_gpuprof.verdict.validate import Number

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics


class BudgetError(check.Invalid):
    """A budget table with an unknown key, a wrong type or an out-of-range value."""


@dataclass(frozen=True, slots=True)
class StepBudget:
    max_ms: float | None = None
    max_idle_ms: float | None = None
    min_gbps: float | None = None
    pageable: Literal["forbid", "allow"] | None = None
    min_sm_utilization: float | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    min_utilization: float | None = None
    max_overhead_ms: float | None = None
    max_discrepancy: float | None = None
    min_sm_utilization: float | None = None
    steps: Mapping[str, StepBudget] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self == Budget()

    def merged_over(self, base: Budget) -> Budget:
        """This budget's keys over ``base``'s: the higher-precedence source wins key by key."""
        top = {f.name: getattr(self, f.name) for f in fields(Budget) if f.name != "steps"}
        merged = replace(base, **{k: v for k, v in top.items() if v is not None})
        steps = dict(base.steps)
        for name, step in self.steps.items():
            old = steps.get(name, StepBudget())
            steps[name] = replace(
                old, **{f.name: getattr(step, f.name) for f in fields(StepBudget) if getattr(step, f.name) is not None}
            )
        return replace(merged, steps=steps)

    def limits(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            f.name: getattr(self, f.name)
            for f in fields(Budget)
            if f.name != "steps" and getattr(self, f.name) is not None
        }
        if self.steps:
            out["steps"] = {
                name: {f.name: getattr(s, f.name) for f in fields(StepBudget) if getattr(s, f.name) is not None}
                for name, s in self.steps.items()
            }
        return out


# the limits and their ranges; fractions live in [0, 1]
_TOP_KEYS = {
    "min_utilization": Number(0.0, 1.0),
    "max_overhead_ms": Number(0.0),
    "max_discrepancy": Number(0.0, 1.0),
    "min_sm_utilization": Number(0.0, 1.0),
}
_STEP_KEYS = {
    "max_ms": Number(0.0),
    "max_idle_ms": Number(0.0),
    "min_gbps": Number(0.0),
    "min_sm_utilization": Number(0.0, 1.0),
}
_PAGEABLE = ("forbid", "allow")


def parse_budget(table: Mapping[str, Any], source: str) -> Budget:
    """A ``Budget`` from a ``[tool.gpuprof.budget]``-shaped mapping; ``source`` names its origin."""
    if not isinstance(table, Mapping):
        raise BudgetError(f"{source}: the budget must be a table, not {type(table).__name__}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "steps":
            values["steps"] = _parse_steps(value, source)
        elif key in _TOP_KEYS:
            values[key] = float(check.number(value, key, source, _TOP_KEYS[key], BudgetError))
        else:
            raise check.unknown(key, source, [*_TOP_KEYS, "steps"], "budget key", BudgetError)
    return Budget(**values)


def _parse_steps(table: Any, source: str) -> dict[str, StepBudget]:
    steps: dict[str, StepBudget] = {}
    for name, step in check.table(table, "steps", source, BudgetError).items():
        where = f"steps.{name}"
        values: dict[str, Any] = {}
        for key, value in check.table(step, where, source, BudgetError).items():
            if key == "pageable":
                values[key] = check.choice(value, f"{where}.pageable", source, _PAGEABLE, BudgetError)
            elif key in _STEP_KEYS:
                values[key] = float(check.number(value, f"{where}.{key}", source, _STEP_KEYS[key], BudgetError))
            else:
                raise check.unknown(f"{where}.{key}", source, [*_STEP_KEYS, "pageable"], "budget key", BudgetError)
        steps[str(name)] = StepBudget(**values)
    return steps


@dataclass(frozen=True, slots=True)
class Breach:
    metric: str
    value: float
    limit: float | str
    kind: Literal["min", "max", "forbid"]
    key: str

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "limit": self.limit, "kind": self.kind, "key": self.key}


def evaluate(budget: Budget, metrics: Metrics) -> list[Breach]:
    """Every limit of ``budget`` that ``metrics`` breaches, in the budget's order; a limit
    on a figure that was not measured (``None``) is neither kept nor breached
    (``not_measured`` says so)."""
    checks: list[tuple[float | None, float | None, str, Literal["min", "max"], str]] = [
        (budget.min_utilization, metrics.utilization, "utilization", "min", "min_utilization"),
        (budget.max_overhead_ms, metrics.overhead_ms, "overhead_ms", "max", "max_overhead_ms"),
        (budget.max_discrepancy, metrics.discrepancy, "discrepancy", "max", "max_discrepancy"),
        (budget.min_sm_utilization, metrics.sm_utilization, "sm_utilization", "min", "min_sm_utilization"),
    ]
    breaches = _breached(checks)
    for name, limits in budget.steps.items():
        step = metrics.steps.get(name)
        if step is None:
            continue
        base = f"steps.{name}"
        breaches += _breached(
            [
                (limits.max_ms, step.host_ms, f"{base}.host_ms", "max", f"{base}.max_ms"),
                (limits.max_idle_ms, step.idle_ms, f"{base}.idle_ms", "max", f"{base}.max_idle_ms"),
                (limits.min_gbps, step.gbps, f"{base}.gbps", "min", f"{base}.min_gbps"),
                (
                    limits.min_sm_utilization,
                    step.sm_utilization,
                    f"{base}.sm_utilization",
                    "min",
                    f"{base}.min_sm_utilization",
                ),
            ]
        )
        if limits.pageable == "forbid" and step.pageable:
            breaches.append(Breach(f"{base}.pageable", 1.0, "forbid", "forbid", f"{base}.pageable"))
    return breaches


def _breached(checks: list[tuple[float | None, float | None, str, Literal["min", "max"], str]]) -> list[Breach]:
    return [
        Breach(metric, value, limit, kind, key)
        for limit, value, metric, kind, key in checks
        if limit is not None and value is not None and (value < limit if kind == "min" else value > limit)
    ]


def not_measured(budget: Budget, metrics: Metrics) -> list[str]:
    """The limits of ``budget`` that ``metrics`` cannot be judged on, each with the reason:
    neither kept nor breached, and said so."""
    out = []
    if metrics.unseen is not None:
        keys = [k for k in ("min_utilization", "max_overhead_ms") if getattr(budget, k) is not None]
        keys += [f"steps.{n}.max_idle_ms" for n, limits in budget.steps.items() if limits.max_idle_ms is not None]
        out += [f"{key} not measured: {metrics.unseen}" for key in keys]
    if budget.min_sm_utilization is not None and metrics.sm_utilization is None:
        out.append(f"min_sm_utilization not measured: {metrics.sm_unseen or 'no kernel ran'}")
    for name, limits in budget.steps.items():
        step = metrics.steps.get(name)
        if limits.min_sm_utilization is not None and step is not None and step.sm_utilization is None:
            why = metrics.sm_unseen or "the step issued no kernel"
            out.append(f"steps.{name}.min_sm_utilization not measured: {why}")
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a budget says of a test's windows: each window's breaches, the first window
    whose breaches count (not already judged inside its hypothesis example), and the
    limits that could not be judged, with the reason."""

    breaches: tuple[tuple[Breach, ...], ...]
    first: int | None
    unjudged: tuple[str, ...]

    @property
    def breached(self) -> bool:
        return self.first is not None


def breaches_of(budget: Budget, metrics: Metrics) -> list[Breach]:
    """``judge`` on one window: its breaches."""
    return list(judge(budget, [metrics]).breaches[0])


def judge(budget: Budget, windows: Sequence[Metrics], settled: Sequence[bool] = ()) -> Verdict:
    """The one judgement of a budget: used on a test's windows by the session, and on one
    window by ``gpuprof.check()`` and by the re-measuring that confirms a breach."""
    if budget.empty:
        return Verdict(tuple(() for _ in windows), None, ())
    breaches = tuple(tuple(evaluate(budget, m)) for m in windows)
    done = list(settled) + [False] * (len(windows) - len(settled))
    first = next((i for i, (b, s) in enumerate(zip(breaches, done, strict=True)) if b and not s), None)
    unjudged = tuple(line for m in windows[-1:] for line in not_measured(budget, m))
    return Verdict(breaches, first, unjudged)
