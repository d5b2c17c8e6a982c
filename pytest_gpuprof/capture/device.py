"""The ``gpu_device`` fixture's object: what the device is and how fast its link is."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pytest_gpuprof.analysis.model import MIB
from pytest_gpuprof.capture.backends.base import Backend, DeviceInfo


class GpuDevice:
    """Name, memory, PCIe link, and peak pinned bandwidths measured once per session."""

    def __init__(self, backend: Backend, info: DeviceInfo) -> None:
        self.backend = backend
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def memory_bytes(self) -> int:
        return self.info.memory_bytes

    @property
    def pcie_gen(self) -> int | None:
        return self.info.pcie_gen

    @property
    def pcie_width(self) -> int | None:
        return self.info.pcie_width

    @property
    def calibration_bytes(self) -> int:
        # 1 GiB reaches the plateau of a PCIe Gen5 link; the CPU plateaus far earlier.
        return 1024 * MIB if self.backend.name == "cuda" else 64 * MIB

    @cached_property
    def h2d_gbps(self) -> float:
        """Peak pinned host-to-device bandwidth, GB/s (best of 5 timed copies, see below)."""
        return self._best_gbps("upload")

    @cached_property
    def d2h_gbps(self) -> float:
        """Peak pinned device-to-host bandwidth, GB/s (best of 5 timed copies, see below)."""
        return self._best_gbps("download")

    def _best_gbps(self, direction: str) -> float:
        """Bytes over the host time from issuing one copy to its stream being idle.

        One untimed warm-up copy first; the launch and synchronize (microseconds) are
        inside the timing, which a copy of ``calibration_bytes`` makes negligible. On the
        host backend's virtual clock a copy takes what its model says, so the model is the
        answer, not six real copies of 64 MiB (a tenth of a second in every session).
        """
        nbytes = self.calibration_bytes
        modeled = getattr(self.backend, "modeled_copy_ns", None)
        if modeled is not None and (ns := modeled(nbytes)):
            return nbytes / ns
        stream = self.backend.stream()
        buffer = self.backend.alloc(nbytes)
        try:
            best = float("inf")
            for attempt in range(6):
                start = self.backend.clock.now()
                if direction == "upload":
                    self.backend.upload(nbytes, out=buffer, stream=stream)
                else:
                    self.backend.download(buffer, stream=stream)
                self.backend.synchronize(stream)
                if attempt:
                    best = min(best, self.backend.clock.now() - start)
            return nbytes / best
        finally:
            del buffer
            self.backend.close_stream(stream)
            self.backend.trim()

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.info.backend,
            "index": self.info.index,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "driver": self.info.driver,
            "pcie": self.info.pcie,
        }

    def __repr__(self) -> str:
        return f"GpuDevice({self.name!r}, {self.memory_bytes / (1 << 30):.0f} GiB, pcie {self.info.pcie})"
