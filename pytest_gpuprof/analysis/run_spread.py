"""The run as the statistical unit of a comparison (docs/gates.md, "The run as the unit").

Every round of one pytest process shares that process's level (its runner, its clocks,
where its buffers landed), so rounds are not independent evidence of a change between
processes. What runs of unchanged code differ by is learnt from a baseline's stored
history: the medians of the last accepted runs of that name on that machine.

The history's level is the mean of its newest runs, those after its one clear shift of
level if it holds one (the split whose two-sample t is largest, past its Bonferroni bound
at ``SHIFT``): a merge that sped ``main`` up is a new level, not spread. The spread ``s``
is the runs' standard deviation around their levels, with ``df`` = runs - levels. A new
run of unchanged code lies, for ``CONFIDENCE`` of histories, below the level plus

    bound = t'(CONFIDENCE; df, z(COVERAGE) * sqrt(k)) / sqrt(k) * s

but for ``1 - COVERAGE`` of the time, with ``k`` the runs of the newest level and ``t'``
the noncentral t quantile: the one-sided tolerance bound. It holds each history's own rate
of false alarms, where a prediction bound holds only their mean over histories (and every
run compared with one history shares its errors). The smallest change found ``POWER`` of
the time is

    detectable = bound + t(POWER, df) * s * sqrt(1 + 1/k).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# how many of a baseline name's newest accepted runs its between-run spread comes from
HISTORY_RUNS = 10
# a bound holds below all but 1 - COVERAGE of unchanged runs, for CONFIDENCE of histories
COVERAGE = 0.975
CONFIDENCE = 0.9
# the power a stated smallest detectable change is found with
POWER = 0.9
# how often runs of one level are split in two (Bonferroni over the splits): rarely, as the
# split picks the runs that agree best and its spread is then too small
SHIFT = 0.01

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(512)
_ERFC = np.vectorize(math.erfc, otypes=[float])


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int, shift: float = 0.0) -> float:
    """Student's t quantile ``p`` at ``df`` degrees of freedom, noncentral by ``shift``:
    the ``x`` at which P((Z + shift) / sqrt(V / df) <= x) = p, V chi-squared with ``df``.
    The probability is the mean of Phi(x u - shift) over u = sqrt(V / df), integrated by
    Gauss-Legendre over log u where u's density lies; ``x`` is found by bisection."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom")
    if not 0 < p < 1:
        raise ValueError(f"t quantile: probability {p}")
    # u = exp(w), integrated over w: its density lies near 1 for many degrees of freedom
    # and reaches down to 0 for few, where the far quantiles live
    width = 12 / math.sqrt(2 * df)
    low = 1 - width if 1 - width > 0.1 else 10 ** (-20 / df)
    high = 1 + width + (6 if df < 4 else 0)
    w = math.log(low) + (math.log(high) - math.log(low)) * (_NODES + 1) / 2
    u = np.exp(w)
    log_density = math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2) + df * w - df * u * u / 2
    weights = _WEIGHTS * np.exp(log_density)
    weights /= weights.sum()

    def cdf(x: float) -> float:
        return float((weights * _ERFC(-(x * u - shift) / math.sqrt(2))).sum() / 2)

    lo, hi = -1.0, 1.0
    while cdf(lo) > p:
        lo *= 2
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def tolerance_factor(df: int, k: int) -> float:
    """How many ``s`` above the mean of ``k`` runs a new run lies at most, but for
    ``1 - COVERAGE`` of the time, for ``CONFIDENCE`` of histories whose ``s`` has ``df``."""
    z = statistics.NormalDist().inv_cdf(COVERAGE)
    return t_quantile(CONFIDENCE, df, z * math.sqrt(k)) / math.sqrt(k)


def _squares(values: Sequence[float]) -> float:
    """The sum of squared deviations of ``values`` from their mean."""
    mean = statistics.fmean(values)
    return sum((v - mean) ** 2 for v in values)


def newest_level(medians: Sequence[float]) -> int:
    """How many of ``medians`` (newest first) lie at the newest level: all of them, or
    those after the history's one clear shift (the largest two-sample t over every split,
    past ``t(1 - SHIFT / (2 splits), runs - 2)``)."""
    n = len(medians)
    if n < 3:
        return n
    best, at = 0.0, n
    for j in range(1, n):
        new, old = medians[:j], medians[j:]
        gap = abs(statistics.fmean(new) - statistics.fmean(old))
        scale = math.sqrt((_squares(new) + _squares(old)) / (n - 2) * (1 / j + 1 / (n - j)))
        t = gap / scale if scale > 0 else (math.inf if gap > 0 else 0.0)
        if t > best:
            best, at = t, j
    return at if best > t_quantile(1 - SHIFT / (2 * (n - 1)), n - 2) else n


@dataclass(frozen=True, slots=True)
class Spread:
    """How far apart runs of unchanged code lie, for one metric of one test: ``sd`` of
    ``runs`` runs' medians around their levels (``None`` with fewer than two: unknown),
    ``center`` the mean of the newest level's ``level_runs`` runs, ``levels`` 1 or 2."""

    runs: int
    sd: float | None
    center: float | None = None
    level_runs: int = 0
    levels: int = 1

    @classmethod
    def of(cls, medians: Sequence[float]) -> Spread:
        """The spread of ``medians``, newest first."""
        if len(medians) < 2:
            return cls(len(medians), None)
        k = newest_level(medians)
        parts = [medians[:k], medians[k:]] if k < len(medians) else [medians]
        sd = math.sqrt(sum(_squares(part) for part in parts) / (len(medians) - len(parts)))
        return cls(len(medians), sd, statistics.fmean(medians[:k]), k, len(parts))

    @property
    def known(self) -> bool:
        return self.sd is not None

    @property
    def bound(self) -> float | None:
        """How far above (or below) ``center`` a new run of unchanged code lies at most."""
        if self.sd is None:
            return None
        return tolerance_factor(self.runs - self.levels, self.level_runs) * self.sd

    @property
    def detectable(self) -> float | None:
        """The smallest change from ``center`` found ``POWER`` of the time at this spread."""
        if self.sd is None or self.bound is None:
            return None
        df = self.runs - self.levels
        return self.bound + t_quantile(POWER, df) * self.sd * math.sqrt(1 + 1 / self.level_runs)

    def beyond(self, value: float, sign: int) -> bool:
        """Whether ``value`` lies past the bound in the direction ``sign`` (``True`` where
        the spread is unknown: nothing to explain a change by)."""
        if self.center is None or self.bound is None:
            return True
        return sign * (value - self.center) > self.bound

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "runs": self.runs,
            "sd": self.sd,
            "center": self.center,
            "level_runs": self.level_runs if self.known else None,
            "bound": self.bound,
            "detectable": self.detectable,
        }
