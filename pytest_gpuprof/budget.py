"""Budgets: what a window's metrics must satisfy, and the verdict with its explanation.

Parsing validates every key, type and range and names the source on error; evaluation
and the failure message are pure functions of a ``Budget`` and a ``Metrics``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_gpuprof.model import UNATTRIBUTED

if TYPE_CHECKING:
    from pytest_gpuprof.metrics import Metrics

GIB = 1 << 30


class BudgetError(ValueError):
    """A budget table with an unknown key, a wrong type or an out-of-range value."""


@dataclass(frozen=True, slots=True)
class StepBudget:
    max_ms: float | None = None
    max_idle_ms: float | None = None
    min_gbps: float | None = None
    pageable: Literal["forbid", "allow"] | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    min_utilization: float | None = None
    max_overhead_ms: float | None = None
    max_discrepancy: float | None = None
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


# key: (kind of number, lower bound, upper bound); fractions live in [0, 1].
_TOP_KEYS: dict[str, tuple[float, float]] = {
    "min_utilization": (0.0, 1.0),
    "max_overhead_ms": (0.0, float("inf")),
    "max_discrepancy": (0.0, 1.0),
}
_STEP_KEYS: dict[str, tuple[float, float]] = {
    "max_ms": (0.0, float("inf")),
    "max_idle_ms": (0.0, float("inf")),
    "min_gbps": (0.0, float("inf")),
}
_PAGEABLE = ("forbid", "allow")


def parse_budget(table: Mapping[str, Any], source: str) -> Budget:
    """A ``Budget`` from a ``[tool.gpuprof.budget]``-shaped mapping; ``source`` names its origin."""
    if not isinstance(table, Mapping):
        raise BudgetError(f"{source}: the budget must be a table, not {type(table).__name__}")
    valid = [*_TOP_KEYS, "steps"]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "steps":
            values["steps"] = _parse_steps(value, source)
        elif key in _TOP_KEYS:
            values[key] = _number(value, key, source, _TOP_KEYS[key])
        else:
            raise BudgetError(_unknown(key, source, valid))
    return Budget(**values)


def _parse_steps(table: Any, source: str) -> dict[str, StepBudget]:
    if not isinstance(table, Mapping):
        raise BudgetError(f"{source}: 'steps' must be a table of step names, not {type(table).__name__}")
    steps: dict[str, StepBudget] = {}
    valid = [*_STEP_KEYS, "pageable"]
    for name, step in table.items():
        where = f"steps.{name}"
        if not isinstance(step, Mapping):
            raise BudgetError(f"{source}: '{where}' must be a table, not {type(step).__name__}")
        values: dict[str, Any] = {}
        for key, value in step.items():
            if key == "pageable":
                if value not in _PAGEABLE:
                    raise BudgetError(
                        f"{source}: '{where}.pageable' must be one of {', '.join(map(repr, _PAGEABLE))}, not {value!r}"
                    )
                values[key] = value
            elif key in _STEP_KEYS:
                values[key] = _number(value, f"{where}.{key}", source, _STEP_KEYS[key])
            else:
                raise BudgetError(_unknown(f"{where}.{key}", source, valid))
        steps[str(name)] = StepBudget(**values)
    return steps


def _number(value: Any, key: str, source: str, bounds: tuple[float, float]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BudgetError(f"{source}: '{key}' must be a number, not {type(value).__name__} {value!r}")
    lo, hi = bounds
    if not lo <= value <= hi:
        upper = "" if hi == float("inf") else f" and at most {hi:g}"
        raise BudgetError(f"{source}: '{key}' = {value!r} is out of range: it must be at least {lo:g}{upper}")
    return float(value)


def _unknown(key: str, source: str, valid: list[str]) -> str:
    return f"{source}: unknown budget key '{key}'; valid keys: {', '.join(valid)}"


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
    """Every limit of ``budget`` that ``metrics`` breaches, in the budget's order."""
    breaches: list[Breach] = []
    utilization, overhead = metrics.utilization, metrics.overhead_ms
    if budget.min_utilization is not None and utilization is not None and utilization < budget.min_utilization:
        breaches.append(Breach("utilization", utilization, budget.min_utilization, "min", "min_utilization"))
    if budget.max_overhead_ms is not None and overhead is not None and overhead > budget.max_overhead_ms:
        breaches.append(Breach("overhead_ms", overhead, budget.max_overhead_ms, "max", "max_overhead_ms"))
    if (
        budget.max_discrepancy is not None
        and metrics.discrepancy is not None
        and metrics.discrepancy > budget.max_discrepancy
    ):
        breaches.append(Breach("discrepancy", metrics.discrepancy, budget.max_discrepancy, "max", "max_discrepancy"))
    for name, limits in budget.steps.items():
        step = metrics.steps.get(name)
        if step is None:
            continue
        base = f"steps.{name}"
        if limits.max_ms is not None and step.host_ms > limits.max_ms:
            breaches.append(Breach(f"{base}.host_ms", step.host_ms, limits.max_ms, "max", f"{base}.max_ms"))
        if limits.max_idle_ms is not None and step.idle_ms is not None and step.idle_ms > limits.max_idle_ms:
            breaches.append(Breach(f"{base}.idle_ms", step.idle_ms, limits.max_idle_ms, "max", f"{base}.max_idle_ms"))
        if limits.min_gbps is not None and step.gbps is not None and step.gbps < limits.min_gbps:
            breaches.append(Breach(f"{base}.gbps", step.gbps, limits.min_gbps, "min", f"{base}.min_gbps"))
        if limits.pageable == "forbid" and step.pageable:
            breaches.append(Breach(f"{base}.pageable", 1.0, "forbid", "forbid", f"{base}.pageable"))
    return breaches


def not_measured(budget: Budget, metrics: Metrics) -> list[str]:
    """The limits of ``budget`` that ``metrics`` cannot be judged on, each with the reason:
    neither kept nor breached, and said so."""
    if metrics.unseen is None:
        return []
    keys = ["min_utilization", "max_overhead_ms"] if budget.min_utilization is not None else ["max_overhead_ms"]
    keys = [k for k in keys if getattr(budget, k) is not None]
    keys += [f"steps.{name}.max_idle_ms" for name, limits in budget.steps.items() if limits.max_idle_ms is not None]
    return [f"{key} not measured: {metrics.unseen}" for key in keys]


def human_bytes(n: float) -> str:
    """Binary units, as GPU memory is counted: 4.00 GiB, 64.0 MiB, 512 B."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal: 0.483 -> '48.3%'; None -> '-'."""
    return "-" if x is None else f"{100 * x:.1f}%"


def describe_breach(b: Breach) -> str:
    if b.kind == "forbid":
        return f'{b.metric.removesuffix(".pageable")} used pageable host memory (pageable = "forbid")'
    is_fraction = b.metric in ("utilization", "discrepancy")
    shown = pct(b.value) if is_fraction else f"{b.value:.1f}"
    limit = pct(float(b.limit)) if is_fraction else f"{float(b.limit):.1f}"
    unit = "" if is_fraction else (" GB/s" if b.metric.endswith("gbps") else " ms")
    sign = "<" if b.kind == "min" else ">"
    return f"{b.metric} {shown}{unit} {sign} {limit}{unit} ({b.key})"


def explain(metrics: Metrics) -> list[str]:
    """Where the time went: the decomposition lines of a budget message."""
    rounds = f"  (medians of {_rounds(metrics)} rounds)" if _rounds(metrics) > 1 else ""
    if metrics.kernel_ms is None or metrics.overhead_ms is None or metrics.utilization is None:
        return [
            f"wall {metrics.wall_ms:.1f} ms; kernel time not measured{rounds}",
            *(f"note: {n}" for n in metrics.notes),
        ]
    lines = [
        f"wall {metrics.wall_ms:.1f} ms = kernels {metrics.kernel_ms:.1f} ms + kernel-idle {metrics.overhead_ms:.1f} ms"
        + rounds
    ]
    parts = []
    for name, idle_ms in metrics.idle_by_step():
        if name == UNATTRIBUTED:
            parts.append(f"{UNATTRIBUTED} {idle_ms:.1f} ms")
            continue
        step = metrics.steps[name]
        detail = ""
        if step.bytes and step.gbps is not None:
            size = (
                human_bytes(step.bytes)
                if step.count <= 1
                else f"{step.count} x {human_bytes(step.bytes // step.count)}"
            )
            detail = f" ({size} @ {step.gbps:.1f} GB/s, {'pageable' if step.pageable else 'pinned'})"
        parts.append(f"{name} {idle_ms:.1f} ms{detail}")
    lines.append("kernel-idle by step: " + ", ".join(parts))
    observers = []
    if metrics.reported_utilization is not None:
        observers.append(f"brackets report {pct(metrics.reported_utilization)}")
    if metrics.nvml is not None and metrics.nvml.util_mean is not None:
        observers.append(f"NVML {pct(metrics.nvml.util_mean)}")
    if observers:
        claimed = max(
            v for v in (metrics.reported_utilization, metrics.nvml.util_mean if metrics.nvml else None) if v is not None
        )
        points = 100 * (claimed - metrics.utilization)
        verdict = f"instrumentation over-reports by {points:.1f} points" if points > 0 else "no over-report"
        lines.append(" and ".join(observers) + f": {verdict}")
    # what the measurement itself missed (CUPTI records dropped or lost) or cannot tell
    lines += [f"note: {note}" for note in metrics.notes]
    return lines


def _rounds(metrics: Metrics) -> int:
    summary = metrics.rounds.get("wall_ms")
    return len(summary.samples) if summary else 1


def failure_message(breaches: list[Breach], metrics: Metrics) -> str:
    head = "GPU budget exceeded: " + "; ".join(describe_breach(b) for b in breaches)
    return "\n  ".join([f"{head}  [truth: {metrics.truth}]", *explain(metrics)])
