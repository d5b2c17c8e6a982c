"""A report in the formats of the dashboards teams already run (``gpuprof export``).

- ``bmf``: Bencher Metric Format, ``{benchmark: {measure: {value, lower_value, upper_value}}}``,
  one benchmark per test, one measure per metric.
- ``github-action-benchmark``: its custom tools' list of ``{name, unit, value, range}``; the
  tool takes one direction a file, so ``tool`` picks the metrics that get better going
  down (``customSmallerIsBetter``) or up (``customBiggerIsBetter``), from the metric
  descriptors.

Each value is the median of the test's rounds, the range their lowest and highest.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.verdict.samples import samples_of

TOOLS = {"customSmallerIsBetter": "up", "customBiggerIsBetter": "down"}  # the way each tool's metrics get worse


def _figures(report: dict[str, Any], metrics: Sequence[str]) -> list[tuple[str, str, list[float]]]:
    """(test, metric, samples) of every test and metric measured."""
    return [(t["nodeid"], m, samples) for t in report["tests"] for m in metrics if (samples := samples_of(t, m))]


def export(report: dict[str, Any], fmt: str, metrics: Sequence[str], tool: str = "customSmallerIsBetter") -> str:
    figures = _figures(report, metrics)
    if fmt == "bmf":
        out: dict[str, dict[str, dict[str, float]]] = {}
        for test, metric, samples in figures:
            out.setdefault(test, {})[metric] = {
                "value": statistics.median(samples),
                "lower_value": min(samples),
                "upper_value": max(samples),
            }
        return json.dumps(out, indent=1) + "\n"
    worse = TOOLS[tool]
    entries = []
    for test, metric, samples in figures:
        described = descriptors.lookup(metric)
        if described is None or described.worse != worse:
            continue
        half = (max(samples) - min(samples)) / 2
        entries.append(
            {
                "name": f"{test} {metric}",
                "unit": described.unit,
                "value": statistics.median(samples),
                "range": f"± {half:.6g}",
                "extra": f"{len(samples)} rounds; machine {report['machine'].get('id')}",
            }
        )
    return json.dumps(entries, indent=1) + "\n"
