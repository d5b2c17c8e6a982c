"""The run as the statistical unit of a comparison (docs/gates.md, "The run as the unit").

Every round of one pytest process shares that process's level (its runner, its clocks,
where its buffers landed), so rounds are not independent evidence of a change between
processes. What two runs of unchanged code differ by is the spread of the runs' medians,
learnt from a baseline's stored history: the last accepted runs of that name on that
machine. A new run's median lies, if nothing changed, within the one-sided prediction
interval of those runs:

    bound = t(1 - alpha, n - 1) * s * sqrt(1 + 1/k)

with ``s`` the standard deviation of the ``n`` runs' medians and ``k`` the runs the
baseline's own figure stands for (1 for ``main``, K for ``main~K``). A change must pass both
the threshold and this bound. The smallest change found 90% of the time at that false-alarm
rate is

    detectable = (t(1 - alpha, n - 1) + t(0.9, n - 1)) * s * sqrt(1 + 1/k).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpuprof.analysis.mann_whitney import ALPHA

# how many of a baseline name's newest accepted runs its between-run spread comes from
HISTORY_RUNS = 10
# the power a stated smallest detectable change is found with
POWER = 0.9

# Student's t quantiles for 1 to 30 degrees of freedom (from any table; tests/analysis
# holds them to scipy's): beyond 30, the Cornish-Fisher expansion is within 1e-4
_T = {
    0.95: (6.3138, 2.92, 2.3534, 2.1318, 2.015, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125, 1.7959, 1.7823, 1.7709,
           1.7613, 1.7531, 1.7459, 1.7396, 1.7341, 1.7291, 1.7247, 1.7207, 1.7171, 1.7139, 1.7109, 1.7081, 1.7056,
           1.7033, 1.7011, 1.6991, 1.6973),
    0.9: (3.0777, 1.8856, 1.6377, 1.5332, 1.4759, 1.4398, 1.4149, 1.3968, 1.383, 1.3722, 1.3634, 1.3562, 1.3502,
          1.345, 1.3406, 1.3368, 1.3334, 1.3304, 1.3277, 1.3253, 1.3232, 1.3212, 1.3195, 1.3178, 1.3163, 1.315,
          1.3137, 1.3125, 1.3114, 1.3104),
}  # fmt: skip


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``p`` (0.95 or 0.9) at ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom")
    table = _T[round(p, 4)]
    if df <= len(table):
        return table[df - 1]
    z = statistics.NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True, slots=True)
class Spread:
    """How far apart runs of unchanged code lie, for one metric of one test: ``sd`` of
    ``runs`` runs' medians (``None`` with fewer than two: unknown), the baseline's figure
    standing for ``pooled`` of them."""

    runs: int
    sd: float | None
    pooled: int = 1

    @classmethod
    def of(cls, medians: Sequence[float], pooled: int = 1) -> Spread:
        if len(medians) < 2:
            return cls(len(medians), None, pooled)
        return cls(len(medians), statistics.stdev(medians), pooled)

    @property
    def known(self) -> bool:
        return self.sd is not None

    def _scale(self) -> float:
        assert self.sd is not None
        return self.sd * math.sqrt(1 + 1 / max(self.pooled, 1))

    @property
    def bound(self) -> float | None:
        """How far a new run of unchanged code lies from the baseline at most, but for
        ``ALPHA`` of the time (the one-sided prediction bound)."""
        if self.sd is None:
            return None
        return t_quantile(1 - ALPHA, self.runs - 1) * self._scale()

    @property
    def detectable(self) -> float | None:
        """The smallest change found ``POWER`` of the time at this spread."""
        if self.sd is None:
            return None
        df = self.runs - 1
        return (t_quantile(1 - ALPHA, df) + t_quantile(POWER, df)) * self._scale()

    def to_dict(self) -> dict[str, float | int | None]:
        return {"runs": self.runs, "sd": self.sd, "bound": self.bound, "detectable": self.detectable}
