"""How much of the GPU the kernels of a window used: ``sm_utilization`` and the top
kernels, from each kernel's geometry (``occupancy``). Pure code.

``sm_utilization`` is the window's kernel time weighted by the fraction of SMs each
kernel's grid covered, over the wall time, and never more than ``utilization``: it equals
``utilization`` for kernels that fill the GPU, and about 1/132 of it for a one-block
kernel on an H200. A step's ``sm_utilization`` is the same weighting over its own
kernels' time: how full the GPU was while they ran.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from pytest_gpuprof import intervals as iv
from pytest_gpuprof.model import NS_PER_MS, DeviceInterval
from pytest_gpuprof.occupancy import Geometry, SmLimits, coverage, occupancy

TOP = 5


@dataclass(frozen=True, slots=True)
class KernelSummary:
    """One kernel name's launches in a window (the geometry of the longest launch)."""

    name: str
    count: int
    total_ms: float
    blocks: int
    threads: int
    sm_coverage: float | None
    occupancy: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def geometry(d: DeviceInterval) -> Geometry:
    return Geometry(d.blocks, d.threads, d.registers, d.shared)


def unseen(kernels: Sequence[DeviceInterval], sm: SmLimits | None, reason: str) -> str | None:
    """Why the kernels' SM use is not known, or ``None`` when it is."""
    if sm is None:
        return reason
    if any(d.threads <= 0 for d in kernels):
        return "some kernel records carry no geometry (grid, block): read as cupti-python's objects"
    return None


def sm_weighted_ns(kernels: Iterable[DeviceInterval], sm: SmLimits, window: iv.Interval) -> float:
    """Kernel time inside ``window``, each kernel weighted by its SM coverage."""
    lo, hi = window
    return sum(max(0, min(d.end, hi) - max(d.start, lo)) * coverage(geometry(d), sm) for d in kernels)


def top_kernels(
    kernels: Sequence[DeviceInterval], sm: SmLimits | None, window: iv.Interval
) -> tuple[KernelSummary, ...]:
    """The kernels that took the most time in the window, by name."""
    lo, hi = window
    by_name: dict[str, list[DeviceInterval]] = defaultdict(list)
    for d in kernels:
        by_name[d.name].append(d)
    out = []
    for name, launches in by_name.items():
        total = sum(max(0, min(d.end, hi) - max(d.start, lo)) for d in launches)
        longest = max(launches, key=lambda d: d.end - d.start)
        known = sm is not None and longest.threads > 0
        out.append(
            KernelSummary(
                name=name,
                count=len(launches),
                total_ms=total / NS_PER_MS,
                blocks=longest.blocks,
                threads=longest.threads,
                sm_coverage=coverage(geometry(longest), sm) if known and sm is not None else None,
                occupancy=occupancy(geometry(longest), sm) if known and sm is not None else None,
            )
        )
    return tuple(sorted(out, key=lambda k: -k.total_ms)[:TOP])
