"""The trimmed mean of paired differences: ``gpuprof ab``'s interval (``verdict.paired``),
which a pair that straddles a runner's change of speed cannot sway. Its quantiles and
detectable change are drawn for normal pairs, once per number of pairs, seeded."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_gpuprof.analysis.run_spread import paired_detectable_factor, solve, t_quantile

# the share of pairs trimmed from each end of a pair's differences (``Trimmed``)
TRIM = 0.2
# fewer pairs than this are not trimmed: 3 kept of 5 make an interval twice as wide as
# Student's, and a pair that straddles a change of speed leaves their interval unsure anyway
TRIM_FROM = 6


@dataclass(frozen=True, slots=True)
class Trimmed:
    """Yuen's trimmed mean of ``values`` and its standard error: the ``g`` lowest and highest
    (``trimmed_count``: a fifth, from ``TRIM_FROM`` values) left out of the mean and, in the
    spread, replaced by their nearest kept neighbour (the winsorized variance),
    ``se = s_w / ((1 - 2 g / n) sqrt(n))``. A value as far off as a pair that straddles a
    runner's change of speed moves neither end of the interval more than its kept neighbour
    does. Where nothing is trimmed it is Student's mean and sd.

    Yuen's t with ``n - 2 g - 1`` degrees of freedom is too narrow for few pairs (at 10, its
    one-sided 99.5% end is passed 0.8% of the time), so the interval's ends are the
    quantiles of the trimmed t itself for normal pairs (``trimmed_quantile``)."""

    center: float
    se: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Trimmed:
        ordered = sorted(values)
        n = len(ordered)
        if n < 2:
            raise ValueError(f"trimmed mean: {n} values, 2 or more needed")
        g = trimmed_count(n)
        kept = ordered[g : n - g]
        winsorized = [kept[0]] * g + kept + [kept[-1]] * g
        se = statistics.stdev(winsorized) / ((1 - 2 * g / n) * math.sqrt(n))
        return cls(statistics.fmean(kept), se, n)

    def low(self, confidence: float) -> float:
        """The interval's low end: below the true center ``1 - confidence`` of the time."""
        return self.center - trimmed_quantile(confidence, self.n) * self.se

    def high(self, confidence: float) -> float:
        return self.center + trimmed_quantile(confidence, self.n) * self.se

    def detectable(self, limit: float, confidence: float, power: float) -> float:
        """The true center past ``limit`` that a fresh set of as many pairs, their interval's
        low end at ``confidence``, finds past the limit ``power`` of the time."""
        return limit + trimmed_detectable_factor(self.n, confidence, power) * self.se


@functools.lru_cache(maxsize=64)
def _trimmed_draws(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The trimmed mean's error and its ``se`` over normal samples of ``n`` (sd 1), drawn
    once per ``n`` with the seed ``n``: the same figures in every run (2**21 values in all:
    131,072 samples of 5, 10,485 of 200)."""
    rng = np.random.default_rng(n)
    x = np.sort(rng.standard_normal((min(1 << 17, (1 << 21) // n), n)), axis=1)
    g = trimmed_count(n)
    kept = x[:, g : n - g]
    winsorized = np.concatenate([np.repeat(kept[:, :1], g, 1), kept, np.repeat(kept[:, -1:], g, 1)], axis=1)
    se = winsorized.std(axis=1, ddof=1) / ((1 - 2 * g / n) * math.sqrt(n))
    return kept.mean(axis=1), se


def trimmed_count(n: int) -> int:
    """How many of ``n`` values are trimmed from each end."""
    return int(TRIM * n) if n >= TRIM_FROM else 0


@functools.lru_cache(maxsize=1024)
def trimmed_quantile(p: float, n: int) -> float:
    """The ``p`` quantile of (trimmed mean - center) / se over ``n`` normal pairs: Student's
    exactly where nothing is trimmed, else drawn (``_trimmed_draws``)."""
    if not trimmed_count(n):
        return t_quantile(p, n - 1)
    error, se = _trimmed_draws(n)
    return float(np.quantile(error / se, p))


@functools.lru_cache(maxsize=1024)
def trimmed_detectable_factor(n: int, confidence: float, power: float) -> float:
    """``k`` such that a true center ``limit + k se``, ``se`` that of the ``n`` pairs that
    printed it, is found ``power`` of the time by ``n`` fresh pairs whose interval's low end
    must pass the limit; both ``se`` random (``paired_detectable_factor`` where nothing is
    trimmed). Drawn: the fresh pairs' and the printing pairs' ``se`` from two halves of the
    draws."""
    if not trimmed_count(n):
        return paired_detectable_factor(n, confidence, power)
    error, se = _trimmed_draws(n)
    half = len(se) // 2
    q = trimmed_quantile(confidence, n)
    fresh = error[:half] - q * se[:half]
    printing = se[half : 2 * half]
    return solve(lambda k: float(np.mean(fresh + k * printing > 0)), power, 0.0, 1.0)
