"""The run as the statistical unit of a comparison (docs/gates.md, "The run as the unit").

Every round of one pytest process shares that process's level (its runner, its clocks,
where its buffers landed), so rounds are not independent evidence of a change between
processes. What runs of unchanged code differ by is learnt from a baseline's stored
history: the medians of the last accepted runs of that name on that machine.

Their level is the runs' mean and their spread ``s`` the runs' standard deviation, over
``n`` runs. A new run of unchanged code lies, for ``CONFIDENCE`` of histories, within

    bound = t'(CONFIDENCE; n - 1, z(COVERAGE) * sqrt(n)) / sqrt(n) * s

of the level (above it, or below it) but for ``1 - COVERAGE`` of the time, ``t'`` the
noncentral t quantile: the one-sided tolerance bound. It holds each history's own rate of
false alarms, where a prediction bound holds only their mean over histories (and every run
compared with one history shares its errors). The smallest change found ``POWER`` of the
time is

    detectable = bound + t(POWER, n - 1) * s * sqrt(1 + 1/n).

The history is not split where its level shifted: a runner that moves between two speeds
(as virtual machines do) shifts it as a merge does, and runs of one speed agree too well to
stand for the next run.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# how many of a baseline name's newest accepted runs its between-run spread comes from
HISTORY_RUNS = 10
# a bound holds below all but 1 - COVERAGE of unchanged runs, for CONFIDENCE of histories
COVERAGE = 0.975
CONFIDENCE = 0.9
# the power a stated smallest detectable change is found with
POWER = 0.9

_ERFC = np.vectorize(math.erfc, otypes=[float])


@functools.cache
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-1, 1], made when a comparison first needs them
    (60 ms: never at start-up)."""
    return np.polynomial.legendre.leggauss(512)


def _chi_grid(df: int, thin: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``u`` of sqrt(V / df), V chi-squared with ``df``, and their weights (summing to
    1): Gauss-Legendre over log u where its density lies (``thin``: every thin-th node)."""
    # u = exp(w), integrated over w: its density lies near 1 for many degrees of freedom
    # and reaches down to 0 for few, where the far quantiles live
    width = 12 / math.sqrt(2 * df)
    low = 1 - width if 1 - width > 0.1 else 10 ** (-20 / df)
    high = 1 + width + (6 if df < 4 else 0)
    nodes, node_weights = (a[::thin] for a in _legendre())
    w = math.log(low) + (math.log(high) - math.log(low)) * (nodes + 1) / 2
    u = np.exp(w)
    log_density = math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2) + df * w - df * u * u / 2
    weights = node_weights * np.exp(log_density)
    return u, weights / weights.sum()


@functools.lru_cache(maxsize=256)
def paired_detectable_factor(n: int, confidence: float, power: float) -> float:
    """``k`` such that a true mean change of ``limit + k s / sqrt(n)``, ``s`` the sd of the
    ``n`` pairs that printed it, is found ``power`` of the time by ``n`` fresh pairs whose
    interval's low end (``t(confidence, n - 1)`` of their own sd) must pass ``limit``.
    Both sds are random: the power is the mean of Phi(k u1 - t u2) over two independent
    chi variates, solved for ``k`` by bisection. Normal pair differences assumed."""
    u, weights = _chi_grid(n - 1, thin=4)
    t = t_quantile(confidence, n - 1)
    outer = np.outer(weights, weights)

    def found(k: float) -> float:
        return float((outer * _ERFC(-(k * u[:, None] - t * u[None, :]) / math.sqrt(2))).sum() / 2)

    return _solve(found, power, 0.0, 1.0)


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
    u, weights = _chi_grid(df)

    def cdf(x: float) -> float:
        return float((weights * _ERFC(-(x * u - shift) / math.sqrt(2))).sum() / 2)

    return _solve(cdf, p, -1.0, 1.0)


def _solve(rising: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The ``x`` at which the increasing ``rising`` reaches ``target``: the bracket
    [``lo``, ``hi``] widened by doubling until it holds it, then 60 bisections."""
    while lo < 0 and rising(lo) > target:
        lo *= 2
    while rising(hi) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rising(mid) < target else (lo, mid)
    return (lo + hi) / 2


def t_tail(x: float, df: int) -> float:
    """P(T > ``x``) for Student's t at ``df`` degrees of freedom (the same integral as
    ``t_quantile``)."""
    u, weights = _chi_grid(df)
    return float((weights * _ERFC(x * u / math.sqrt(2))).sum() / 2)


@functools.lru_cache(maxsize=256)
def false_alarm_rate(runs: int) -> float:
    """How often, on average over histories of ``runs`` normal runs, a new run of unchanged
    code lies past the tolerance bound: P(t(runs - 1) > c / sqrt(1 + 1/runs)), ``c`` the
    bound's factor (the bound alone; a threshold past it makes it rarer)."""
    return t_tail(tolerance_factor(runs) / math.sqrt(1 + 1 / runs), runs - 1)


def tolerance_factor(runs: int) -> float:
    """How many ``s`` above the mean of ``runs`` runs (``s`` of the same runs) a new run lies
    at most, but for ``1 - COVERAGE`` of the time, for ``CONFIDENCE`` of histories."""
    z = statistics.NormalDist().inv_cdf(COVERAGE)
    return t_quantile(CONFIDENCE, runs - 1, z * math.sqrt(runs)) / math.sqrt(runs)


@dataclass(frozen=True, slots=True)
class Spread:
    """How far apart runs of unchanged code lie, for one metric of one test: ``sd`` of
    ``runs`` runs' medians around their mean ``center`` (``None`` with fewer than two:
    unknown)."""

    runs: int
    sd: float | None
    center: float | None = None

    @classmethod
    def of(cls, medians: Sequence[float], exact: bool = False) -> Spread:
        """``exact``: runs of unchanged code give the same figures by construction (the
        host backend's virtual clock), so one run knows the spread: none."""
        if exact and len(medians) == 1:
            return cls(1, 0.0, medians[0])
        if len(medians) < 2:
            return cls(len(medians), None)
        return cls(len(medians), statistics.stdev(medians), statistics.fmean(medians))

    @property
    def bound(self) -> float | None:
        """How far above (or below) ``center`` a new run of unchanged code lies at most."""
        if self.sd is None:
            return None
        return tolerance_factor(self.runs) * self.sd if self.sd > 0 else 0.0

    @property
    def noise(self) -> float | None:
        """How far past its level a new run of this spread lies at most, ``POWER`` of the
        time (the predictive quantile: the level itself is estimated from ``runs`` runs)."""
        if self.sd is None:
            return None
        return t_quantile(POWER, self.runs - 1) * self.sd * math.sqrt(1 + 1 / self.runs) if self.sd > 0 else 0.0

    @property
    def detectable(self) -> float | None:
        """The smallest change from ``center`` that passes the bound ``POWER`` of the time at
        this spread, whatever the threshold: what the spread alone lets a comparison see."""
        if self.bound is None or self.noise is None:
            return None
        return self.bound + self.noise

    def detectable_from(self, baseline: float, allowed: float, sign: int) -> float | None:
        """The smallest true change from the ``baseline``'s figure, in the worse direction
        ``sign``, that a comparison catches ``POWER`` of the time: it must pass both the
        threshold (``allowed`` past ``baseline``) and the bound (past ``center``), and a new
        run lies ``noise`` short of its level at worst, ``POWER`` of the time. It rests on
        normally distributed run levels and holds on average over histories."""
        if self.center is None or self.bound is None or self.noise is None:
            return None
        past_bound = self.bound + sign * (self.center - baseline)
        return max(allowed, past_bound) + self.noise

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
            "bound": self.bound,
            "detectable": self.detectable,
        }
