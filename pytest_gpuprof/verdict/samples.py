"""A report test's figures by metric path: its rounds' samples, or its one value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis import descriptors

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.entry import Entry

__all__ = ["samples_of", "split_path", "value_at"]


def samples_of(test: Entry, metric: str) -> list[float]:
    """A report test's samples of ``metric``: its rounds, else its single value."""
    rounds = test.get("rounds", {}).get(metric)
    if isinstance(rounds, dict) and isinstance(rounds.get("samples"), list):
        return [float(v) for v in rounds["samples"]]
    value = value_at(test.get("metrics", {}), metric)
    return [] if value is None else [float(value)]


def value_at(metrics: dict[str, Any], path: str) -> float | None:
    """A report entry's ``metrics`` value at a flat path (``steps.upload.idle_ms``), else None."""
    node: object = metrics
    for part in split_path(path):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node)


def split_path(path: str) -> list[str]:
    """Where a flat metric path lies in a report's ``metrics`` (a step name may itself
    contain dots: ``steps.NAME.key``, ``what_if.SCENARIO.key``)."""
    parts = descriptors.split_path(path)
    if parts is None:
        return path.split(".")
    scope, owner, name = parts
    if scope == "kernel":  # a report keeps each kernel's time under kernel_totals
        return ["kernel_totals", owner or ""]
    head = {"window": None, "step": "steps"}.get(scope, scope)
    return [p for p in (head, owner, name) if p is not None]
