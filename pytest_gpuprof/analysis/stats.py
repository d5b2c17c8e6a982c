"""Robust statistics over the rounds of a measurement."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Summary:
    """Median, range and interquartile range of one metric over rounds, with the samples."""

    median: float
    min: float
    max: float
    iqr: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if not samples:
            raise ValueError("a summary needs at least one sample")
        values = tuple(float(v) for v in samples)
        ordered = sorted(values)
        return cls(
            median=percentile(ordered, 0.5),
            min=ordered[0],
            max=ordered[-1],
            iqr=percentile(ordered, 0.75) - percentile(ordered, 0.25),
            samples=values,
        )

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "samples": list(self.samples)}


def percentile(ordered: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile ``q`` (0..1) of sorted values, to the bit: a
    window's rounds are few, and numpy's call costs half a millisecond each."""
    position = (len(ordered) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    a, b, t = ordered[below], ordered[above], position - below
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t
