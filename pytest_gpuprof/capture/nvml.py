"""NVML: what an observer of the hardware sees, sampled in a background thread.

NVML's ``utilization.gpu`` is the share of the driver's last sample period (about 200 ms
on an H200) in which at least one kernel ran: it says nothing of the gaps between
kernels shorter than that, which is why it over-reports. Power is read from the instant
field where the driver has it (``nvmlDeviceGetPowerUsage`` is a one-second average).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Any

from pytest_gpuprof.analysis.model import Sample
from pytest_gpuprof.capture.clock import start_quiet


def nvml_library() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def device_handle(pynvml: Any, cuda_index: int) -> Any:
    """The NVML handle of CUDA device ``cuda_index``, matched by PCI bus id (the two
    numberings differ under ``CUDA_VISIBLE_DEVICES``)."""
    try:
        import cupy

        bus_id = cupy.cuda.Device(cuda_index).pci_bus_id
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode() if isinstance(bus_id, str) else bus_id)
    except Exception:
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def probe(cuda_index: int) -> str:
    """'live' or 'off (why)', for the session header."""
    try:
        pynvml = nvml_library()
        device_handle(pynvml, cuda_index)
    except Exception as e:
        return f"off ({type(e).__name__}: {e})"
    return "live"


def uuid(cuda_index: int) -> str | None:
    """The UUID of CUDA device ``cuda_index``, found without creating a CUDA context (so
    that a process can lock the device before its context takes device memory)."""
    try:
        pynvml = nvml_library()
        value = pynvml.nvmlDeviceGetUUID(device_handle(pynvml, cuda_index))
    except Exception:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version() -> str | None:
    try:
        version = nvml_library().nvmlSystemGetDriverVersion()
    except Exception:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def pcie_link(cuda_index: int) -> tuple[int, int] | None:
    """Maximum PCIe generation and width of the link (an idle link trains down to save power)."""
    try:
        pynvml = nvml_library()
        handle = device_handle(pynvml, cuda_index)
        return (
            int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
            int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        )
    except Exception:
        return None


class NvmlSampler:
    """Polls utilization, power and memory every ``interval_ms`` until stopped."""

    def __init__(self, pynvml: Any, handle: Any, interval_ms: float) -> None:
        self._nvml = pynvml
        self._handle = handle
        self._interval = interval_ms / 1000
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._instant_power = self._read_instant_power() is not None
        self._thread = threading.Thread(target=self._run, name="gpuprof-nvml", daemon=True)
        start_quiet(self._thread)

    @classmethod
    def start(cls, cuda_index: int, interval_ms: float) -> NvmlSampler | None:
        try:
            pynvml = nvml_library()
            return cls(pynvml, device_handle(pynvml, cuda_index), interval_ms)
        except Exception:
            return None

    def _read_instant_power(self) -> float | None:
        field = getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is None:
            return None
        try:
            (value,) = self._nvml.nvmlDeviceGetFieldValues(self._handle, [field])
        except Exception:
            return None
        if value.nvmlReturn != 0:
            return None
        return float(value.value.uiVal) / 1000  # milliwatts

    def _read(self) -> Sample:
        n = self._nvml
        util = n.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100
        power = self._read_instant_power() if self._instant_power else n.nvmlDeviceGetPowerUsage(self._handle) / 1000
        memory = n.nvmlDeviceGetMemoryInfo(self._handle).used
        clock = n.nvmlDeviceGetClockInfo(self._handle, n.NVML_CLOCK_SM)
        return Sample(time.perf_counter_ns(), util, power, int(memory), float(clock), self._read_throttle())

    def _read_throttle(self) -> int | None:
        """NVML's clock event reasons now (a bitmask); ``None`` where the driver has no such
        call: a sample is kept without it."""
        read = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if read is None:
            return None
        try:
            return int(read(self._handle))
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                sample = self._read()
            except Exception:
                continue
            with self._lock:
                self._samples.append(sample)
                if len(self._samples) > 1_000_000:  # an hour at 4 ms: keep the newest half
                    del self._samples[:500_000]

    def samples(self, lo: int, hi: int) -> list[Sample]:
        with self._lock:
            times = [s.time for s in self._samples]
            return self._samples[bisect.bisect_left(times, lo) : bisect.bisect_right(times, hi)]

    def others(self, since_s: float) -> dict[int, int]:
        """Other processes' SM utilization on this device since ``since_s`` (``time.time()``),
        the highest sample of each, by pid: NVML's per-process accounting, which sees what
        CUPTI, tracing this process only, cannot."""
        try:
            found = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, int(since_s * 1e6))
        except Exception:  # no sample since then (NVML_ERROR_NOT_FOUND), or not supported
            return {}
        out: dict[int, int] = {}
        for sample in found:
            pid = int(sample.pid)
            if pid != os.getpid() and int(sample.smUtil) > 0:
                out[pid] = max(out.get(pid, 0), int(sample.smUtil))
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
