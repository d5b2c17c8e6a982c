"""The timeline of one measured window: host spans, device work, hardware samples.

Its own module, apart from ``model``, because it holds ``DeviceWork`` (numpy): loading the
plugin imports ``model`` but not this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval, HostSample, MemoryLog, Sample, Span, Truth
from pytest_gpuprof.analysis.occupancy import SmLimits
from pytest_gpuprof.analysis.processes import ProcessFigures


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything known about one window ``[start, end)``."""

    start: int
    end: int
    truth: Truth
    steps: tuple[Span, ...] = ()
    regions: tuple[Span, ...] = ()
    # a sequence of ``DeviceInterval``s is taken too, and held as ``DeviceWork``
    device: DeviceWork = field(default_factory=lambda: _work(()))
    samples: tuple[Sample, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # the device's SMs, where the backend knows them (for ``sm_utilization``)
    sm: SmLimits | None = None
    # NVML GPM's metrics between the window's edges (fractions), where the GPU has GPM
    gpm: Mapping[str, float] | None = None
    # sampled host stacks of the window (``None``: not sampled), and the native id of the
    # thread that measured it, which issues device work even where it opened no step
    stacks: tuple[HostSample, ...] | None = None
    thread: int = 0
    # device memory marks at the window's and its steps' edges (``None``: no allocator read)
    memory: MemoryLog | None = None
    memory_unseen: str | None = None
    # the processes whose device work ``device`` holds, the test's own first (none: only its own)
    processes: tuple[ProcessFigures, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", _work(self.device))


def _work(device: Sequence[DeviceInterval]) -> DeviceWork:
    return DeviceWork.of(device)
