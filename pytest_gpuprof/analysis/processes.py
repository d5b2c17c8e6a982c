"""The processes whose device work a window holds: each one's kernel and copy time inside
the window, the test's own process first (``capture.children`` reads the others). Pure code."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import NS_PER_MS


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    pid: int | None  # None: a process seen starting only (a native program, say)
    command: str
    rank: int | None
    kernel_ms: float | None  # None: its device work was not seen (``why``)
    copy_ms: float | None
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return out if self.why else {k: v for k, v in out.items() if k != "why"}


def figures(
    pid: int | None,
    command: str,
    rank: int | None,
    work: DeviceWork | None,
    window: iv.Interval,
    why: str | None = None,
) -> ProcessFigures:
    """One process's kernel and copy time inside ``window`` (the unions of its intervals)."""
    if work is None:
        return ProcessFigures(pid, command, rank, None, None, why)
    kernels = iv.covered_length(work.where(work.of_kind("kernel")).spans(), window) / NS_PER_MS
    copies = iv.covered_length(work.where(work.of_kind("memcpy")).spans(), window) / NS_PER_MS
    return ProcessFigures(pid, command, rank, kernels, copies)


def note(processes: tuple[ProcessFigures, ...]) -> str | None:
    """``2 of 3 processes traced; pid 812 (python train.py): killed or crashed ...``."""
    unseen = [p for p in processes if p.kernel_ms is None]
    if not unseen:
        return None
    said = "; ".join(f"{f'pid {p.pid}' if p.pid else 'a process'} ({p.command[:60]}): {p.why}" for p in unseen)
    bound = "the window's kernel and copy figures are lower bounds: they hold none of that work"
    return f"{len(processes) - len(unseen)} of {len(processes)} processes traced; {said}; {bound}"
