"""What an observer of the hardware (NVML) saw during a window."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.model import Sample


@dataclass(frozen=True, slots=True)
class NvmlMetrics:
    """What an observer of the hardware saw during the window."""

    util_mean: float | None
    power_mean_w: float | None
    power_max_w: float | None
    mem_used_max_bytes: int | None
    samples: int
    sm_clock_mhz: float | None = None
    throttle_reasons: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def nvml_metrics(samples: Iterable[Sample], window: iv.Interval) -> NvmlMetrics | None:
    inside = [s for s in samples if window[0] <= s.time <= window[1]]
    if not inside:
        return None
    utils = [s.util for s in inside if s.util is not None]
    powers = [s.power_w for s in inside if s.power_w is not None]
    mems = [s.mem_used_bytes for s in inside if s.mem_used_bytes is not None]
    clocks = [s.sm_clock_mhz for s in inside if s.sm_clock_mhz is not None]
    reasons = [s.throttle_reasons for s in inside if s.throttle_reasons is not None]
    return NvmlMetrics(
        util_mean=sum(utils) / len(utils) if utils else None,
        power_mean_w=sum(powers) / len(powers) if powers else None,
        power_max_w=max(powers) if powers else None,
        mem_used_max_bytes=max(mems) if mems else None,
        samples=len(inside),
        sm_clock_mhz=sum(clocks) / len(clocks) if clocks else None,
        throttle_reasons=functools.reduce(operator.or_, reasons) if reasons else None,
    )
