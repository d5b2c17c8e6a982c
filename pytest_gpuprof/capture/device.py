"""The ``gpu_device`` fixture's object: what the device is and how fast its link is."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

from pytest_gpuprof.capture.backends.base import Backend, DeviceInfo


class GpuDevice:
    """Name, memory, PCIe link, and peak pinned bandwidths measured once per session.

    ``shared``: a file and a run's id, where the processes of one run (xdist workers, each
    holding the device alone while it calibrates) keep the rates the first of them
    measured, so that each worker does not copy 12 GiB again.
    """

    def __init__(self, backend: Backend, info: DeviceInfo, shared: tuple[Path, str] | None = None) -> None:
        self.backend = backend
        self.info = info
        self.shared = shared

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
        return self.backend.kind.calibration_bytes

    @cached_property
    def h2d_gbps(self) -> float:
        """Peak pinned host-to-device bandwidth, GB/s (best of 5 timed copies, see below)."""
        return self._rate("upload")

    @cached_property
    def d2h_gbps(self) -> float:
        """Peak pinned device-to-host bandwidth, GB/s (best of 5 timed copies, see below)."""
        return self._rate("download")

    def _rate(self, direction: str) -> float:
        """Measured here, or by an earlier process of this run on this device."""
        if self.shared is None:
            return self._best_gbps(direction)
        path, run = self.shared
        rates = _read_rates(path, run)
        if direction not in rates:
            rates[direction] = self._best_gbps(direction)
            _keep(path, json.dumps({"run": run, **rates}))
        return rates[direction]

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


def _read_rates(path: Path, run: str) -> dict[str, float]:
    """The rates ``path`` holds for ``run``; none where it holds another run's or is unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("run") != run:
        return {}
    return {
        k: float(v) for k, v in data.items() if k in ("upload", "download") and isinstance(v, int | float) and v > 0
    }


def _keep(path: Path, text: str) -> None:
    """Write ``text`` whole to ``path``, or nothing where it cannot (another user's file in a
    shared folder): the next process then measures the rates itself."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rates.", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
