"""Robust statistics over the rounds of a measurement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


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
        values = np.asarray(samples, dtype=float)
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        return cls(
            median=float(median),
            min=float(values.min()),
            max=float(values.max()),
            iqr=float(q3 - q1),
            samples=tuple(float(v) for v in values),
        )

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "samples": list(self.samples)}
