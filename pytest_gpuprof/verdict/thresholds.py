"""What may fail: compare-fail expressions (``utilization:-2pt,wall_ms:+10%,kernels:+1%``),
parsed and checked against the metric table, and which metrics are kernel times."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import is_fraction

# the metric may hold colons (what_if.overlap:upload.utilization): the last colon before a sign ends it
_EXPR = re.compile(r"^(?P<metric>[A-Za-z_][\w.:\-]*):(?P<sign>[+-])(?P<amount>\d+(?:\.\d+)?)(?P<unit>%|pt|ms)$")


# what a comparison with a baseline reports when no --gpu-compare-fail is given
DEFAULT_THRESHOLDS = "utilization:-2pt,wall_ms:+10%"


class CompareError(ValueError):
    """A compare-fail expression that cannot be used."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """``metric`` may move at most ``amount`` ``unit`` in the ``direction`` that is worse."""

    metric: str
    direction: Literal[1, -1]
    amount: float
    unit: Literal["%", "pt", "ms"]
    text: str

    def delta(self, baseline: float) -> float:
        """The allowed change in the metric's own units, away from ``baseline``."""
        if self.unit == "%":
            return abs(baseline) * self.amount / 100
        if self.unit == "pt":
            return self.amount / 100
        return self.amount


def parse_thresholds(text: str) -> list[Threshold]:
    """``utilization:-2pt,wall_ms:+10%,steps.upload.host_ms:+15%`` into thresholds."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _EXPR.match(part)
        if match is None:
            raise CompareError(
                f"compare-fail expression {part!r}: expected METRIC:+N% | METRIC:-N% | METRIC:+Npt | "
                "METRIC:-Npt | METRIC:+Nms | METRIC:-Nms, e.g. utilization:-2pt or wall_ms:+10%"
            )
        metric, unit = match["metric"], match["unit"]
        if metric == KERNELS:
            if unit == "pt" or match["sign"] != "+":
                raise CompareError(
                    f"compare-fail expression {part!r}: {KERNELS} gates each kernel's time: kernels:+N% or kernels:+Nms"
                )
        elif not descriptors.comparable(metric):
            known = [*descriptors.names("window"), *(f"nvml.{k}" for k in descriptors.names("nvml"))]
            close = difflib.get_close_matches(metric, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CompareError(
                f"compare-fail expression {part!r}: no metric {metric!r}{hint}; metrics are {descriptors.grammar()}"
            )
        worse = "+" if metric == KERNELS or descriptors.lookup(metric).worse == "up" else "-"  # type: ignore[union-attr]
        if match["sign"] != worse:
            way = "down" if worse == "-" else "up"
            raise CompareError(
                f"compare-fail expression {part!r}: the sign says which way is worse, and {metric} gets worse "
                f"going {way}: write {metric}:{worse}{match['amount']}{unit}"
            )
        if unit == "pt" and not is_fraction(metric):
            raise CompareError(
                f"compare-fail expression {part!r}: 'pt' (percentage points) applies to fractions only: "
                f"{', '.join(descriptors.fractions())}"
            )
        direction: Literal[1, -1] = 1 if match["sign"] == "+" else -1
        out.append(Threshold(metric, direction, float(match["amount"]), unit, part))  # type: ignore[arg-type]
    if not out:
        raise CompareError("compare-fail: no expression given")
    return out


def with_listed_kernels(thresholds: Sequence[Threshold]) -> list[Threshold]:
    """``thresholds`` and, unless one of them gates kernels already, ``LISTED_KERNELS``: a
    comparison lists the kernels that changed, whatever gates."""
    if any(t.metric == KERNELS for t in thresholds):
        return list(thresholds)
    return [*thresholds, *parse_thresholds(LISTED_KERNELS)]


# ``kernels:+N%``: every kernel's own time, by name, gated alone
KERNELS = "kernels"


# beside what gates, a comparison lists each kernel that changed by more than this
LISTED_KERNELS = "kernels:+5%"


def kernel_metric(metric: str) -> bool:
    """A kernel time (``kernel_ms``, one kernel's ``total_ms``): one a change of SM clock
    moves, compared in cycles where both clocks are known (here, and ``verdict.paired``)."""
    return metric == "kernel_ms" or (metric.startswith("kernels.") and metric.endswith(".total_ms"))
