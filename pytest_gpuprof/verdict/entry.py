"""A test's entry of the JSON report, typed: what every room reads of a test (the outputs,
the baselines, the gates), from this run or from a stored record."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["Entry"]


class Entry(TypedDict, total=False):
    """A test's entry of the JSON report (``GpuRecord.to_dict``; ``report.schema.json`` has
    each field's meaning): what the outputs, the baselines and the gate read of a test. A
    crashed test's entry holds its ``nodeid``, ``outcome`` and why (``crashed``) alone."""

    nodeid: str
    outcome: str
    reruns: int
    crashed: str
    metrics: dict[str, Any]
    rounds: dict[str, dict[str, Any]]
    budget: dict[str, Any]
    windows: int
    verdict: str
    judgement: dict[str, Any]
    device: int
    waited_ms: float
    waited_for: str
    breached_windows: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    baseline: dict[str, Any]
    comparisons: list[dict[str, Any]]
    gate: dict[str, Any]
    outside_windows: list[str]
    xfail: bool
    examples: int
    pooled: int  # a baseline's entry pooled from several runs: how many
