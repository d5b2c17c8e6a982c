"""NVML GPM: the GPU's own SM counters (Hopper and later), as the hardware's cross-check
of ``sm_utilization``, the way NVML's utilization is the cross-check of ``utilization``.

GPM needs two samples; a window takes one at each edge, and ``between`` reads the
metrics of the stretch they bound. NVML refreshes the counters behind a sample about
every 100 ms and asks for samples at least that far apart, so a window shorter than
``MIN_INTERVAL_S`` carries no ``gpm`` figures: they would describe the stretch around it.
Where the GPU or driver has no GPM, ``start`` says why and windows carry none either.
"""

from __future__ import annotations

import time
from typing import Any

from pytest_gpuprof.capture.nvml import device_handle, nvml_library

# our name -> NVML's metric (percentages, read as fractions)
METRICS = {
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


# NVML's documented least interval between two GPM samples (its refresh period)
MIN_INTERVAL_S = 0.1


class Gpm:
    def __init__(self, pynvml: Any, handle: Any, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._nvml = pynvml
        self._handle = handle
        self.min_interval_s = min_interval_s
        self._ids = {name: getattr(pynvml, metric) for name, metric in METRICS.items()}

    @classmethod
    def start(cls, cuda_index: int) -> tuple[Gpm | None, str]:
        """GPM on this device and 'live', or ``None`` and 'off (why)'."""
        try:
            pynvml = nvml_library()
            handle = device_handle(pynvml, cuda_index)
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None, "off (this GPU has no GPM)"
            gpm = cls(pynvml, handle)
            gpm.release(gpm.sample())
        except Exception as e:  # an old driver or nvidia-ml-py, no permission
            return None, f"off ({type(e).__name__}: {e})"
        return gpm, f"live (windows of {MIN_INTERVAL_S * 1000:.0f} ms or more: NVML refreshes GPM every 100 ms)"

    def edge(self) -> tuple[Any, float] | None:
        """A sample at a window's edge and when it was taken, or ``None`` where taking it
        failed (the window then has no GPM figures)."""
        try:
            return self.sample(), time.monotonic()
        except Exception:
            return None

    def since(self, first: tuple[Any, float] | None) -> dict[str, float] | None:
        """The metrics from the edge ``first`` to now, or ``None`` where a sample failed or
        the two are closer than NVML's refresh; the samples are freed either way."""
        second = self.edge() if first is not None else None
        if first is None or second is None:
            if first is not None:
                self.release(first[0])
            return None
        if second[1] - first[1] < self.min_interval_s:
            self.release(first[0])
            self.release(second[0])
            return None
        try:
            return self.between(first[0], second[0])
        except Exception:
            return None

    def sample(self) -> Any:
        sample = self._nvml.nvmlGpmSampleAlloc()
        try:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
        except Exception:
            self.release(sample)
            raise
        return sample

    def release(self, sample: Any) -> None:
        self._nvml.nvmlGpmSampleFree(sample)

    def between(self, first: Any, second: Any) -> dict[str, float]:
        """The metrics of the stretch between two samples, as fractions; the samples are freed."""
        pynvml = self._nvml
        try:
            get = pynvml.c_nvmlGpmMetricsGet_t()
            get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(self._ids)
            get.sample1, get.sample2 = first, second
            for i, metric in enumerate(self._ids.values()):
                get.metrics[i].metricId = metric
            pynvml.nvmlGpmMetricsGet(get)
            return {
                name: get.metrics[i].value / 100
                for i, name in enumerate(self._ids)
                if get.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS
            }
        finally:
            self.release(first)
            self.release(second)
