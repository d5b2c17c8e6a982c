"""Regression gates: compare-fail expressions and the verdict of one metric's change.

A change counts as a regression only when it is beyond the threshold and statistically
clear over the rounds: the one-sided 95% bootstrap interval of the difference of medians
(current minus baseline, 4,000 resamples, fixed seed) lies entirely beyond the threshold.
When the median change is beyond the threshold but the interval is not, the verdict is
``inconclusive``. Fewer than 3 samples on a side never give a verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

RESAMPLES = 4000
CONFIDENCE = 0.95
MIN_SAMPLES = 3
FRACTIONS = ("utilization", "busy_utilization", "reported_utilization", "discrepancy", "nvml.util_mean")

_EXPR = re.compile(r"^(?P<metric>[A-Za-z_][\w.\-]*):(?P<sign>[+-])(?P<amount>\d+(?:\.\d+)?)(?P<unit>%|pt|ms)$")


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
        if unit == "pt" and metric not in FRACTIONS:
            raise CompareError(
                f"compare-fail expression {part!r}: 'pt' (percentage points) applies to fractions only: "
                f"{', '.join(FRACTIONS)}"
            )
        direction: Literal[1, -1] = 1 if match["sign"] == "+" else -1
        out.append(Threshold(metric, direction, float(match["amount"]), unit, part))  # type: ignore[arg-type]
    if not out:
        raise CompareError("compare-fail: no expression given")
    return out


Verdict = Literal["regression", "inconclusive", "improvement", "unchanged", "missing"]


@dataclass(frozen=True, slots=True)
class Change:
    threshold: Threshold
    verdict: Verdict
    baseline: float | None
    current: float | None
    low: float | None = None
    high: float | None = None
    samples: tuple[int, int] = (0, 0)

    def describe(self) -> str:
        t = self.threshold
        if self.baseline is None or self.current is None:
            side = "baseline" if self.baseline is None else "this run"
            return f"{t.metric}: not in {side}"
        fmt = _formatter(t.metric)
        change = self.current - self.baseline
        relative = f", {100 * change / self.baseline:+.1f}%" if self.baseline else ""
        interval = (
            f"; 95% interval of the change [{fmt(self.low, True)}, {fmt(self.high, True)}]"
            if self.low is not None and self.high is not None
            else ""
        )
        rounds = f"{self.samples[0]} vs {self.samples[1]} rounds"
        return (
            f"{t.metric}: baseline {fmt(self.baseline)} -> {fmt(self.current)} "
            f"({fmt(change, True)}{relative}; limit {t.text}; {rounds}{interval}): {self.verdict}"
        )


def _formatter(metric: str) -> Callable[..., str]:
    if metric in FRACTIONS:
        return lambda v, signed=False: f"{100 * v:+.2f}pt" if signed else f"{100 * v:.2f}%"
    return lambda v, signed=False: f"{v:+.3f}" if signed else f"{v:.3f}"


def judge(threshold: Threshold, baseline: Sequence[float], current: Sequence[float]) -> Change:
    """The verdict on one metric: regression, inconclusive, improvement or unchanged."""
    if not baseline or not current:
        return Change(threshold, "missing", _median(baseline), _median(current))
    base_median, cur_median = float(np.median(baseline)), float(np.median(current))
    delta = threshold.delta(base_median)
    sign = threshold.direction
    worse = sign * (cur_median - base_median)
    n = (len(baseline), len(current))
    if min(n) < MIN_SAMPLES:
        verdict: Verdict = "inconclusive" if worse > delta else ("unchanged" if worse >= -delta else "inconclusive")
        return Change(threshold, verdict, base_median, cur_median, samples=n)
    low, high = bootstrap_interval(baseline, current)
    # the interval of the change in the worse direction
    worse_low, worse_high = sorted((sign * low, sign * high))
    if worse_low > delta:
        verdict = "regression"
    elif worse_high < -delta:
        verdict = "improvement"
    elif worse > delta or worse < -delta:
        verdict = "inconclusive"
    else:
        verdict = "unchanged"
    return Change(threshold, verdict, base_median, cur_median, low, high, n)


def bootstrap_interval(baseline: Sequence[float], current: Sequence[float]) -> tuple[float, float]:
    """Central ``2*CONFIDENCE-1`` interval of median(current) - median(baseline), so that each
    tail holds ``1-CONFIDENCE``: a one-sided test at ``CONFIDENCE`` either way."""
    rng = np.random.default_rng(20261129)
    base = np.asarray(baseline, dtype=float)
    cur = np.asarray(current, dtype=float)
    base_medians = np.median(base[rng.integers(0, base.size, (RESAMPLES, base.size))], axis=1)
    cur_medians = np.median(cur[rng.integers(0, cur.size, (RESAMPLES, cur.size))], axis=1)
    diffs = cur_medians - base_medians
    tail = 100 * (1 - CONFIDENCE)
    low, high = np.percentile(diffs, [tail, 100 - tail])
    return float(low), float(high)


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


def samples_of(test: dict[str, Any], metric: str) -> list[float]:
    """A report test's samples of ``metric``: its rounds, else its single value."""
    rounds = test.get("rounds", {}).get(metric)
    if isinstance(rounds, dict) and isinstance(rounds.get("samples"), list):
        return [float(v) for v in rounds["samples"]]
    value = _lookup(test.get("metrics", {}), metric)
    return [] if value is None else [float(value)]


def _lookup(metrics: dict[str, Any], path: str) -> float | None:
    node: object = metrics
    for part in _split_path(path):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node)


def _split_path(path: str) -> list[str]:
    # steps.NAME.key: a step name may itself contain dots
    if path.startswith("steps."):
        rest = path[len("steps.") :]
        name, _, key = rest.rpartition(".")
        return ["steps", name, key]
    return path.split(".")


def compare_tests(thresholds: Sequence[Threshold], baseline_test: dict[str, Any], current_test: dict) -> list[Change]:
    return [judge(t, samples_of(baseline_test, t.metric), samples_of(current_test, t.metric)) for t in thresholds]
