"""NVML GPM read through a stand-in for nvidia-ml-py: two samples bound a window."""

import ctypes

import pytest

from pytest_gpuprof.capture import gpm as gpm_mod
from pytest_gpuprof.capture.backends.host import HostBackend
from pytest_gpuprof.capture.clock import VirtualClock
from pytest_gpuprof.measure.profiler import Profiler
from pytest_gpuprof.measure.windows import Channels
from pytest_gpuprof.verdict.budget import Budget


class Metric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double)]


class MetricsGet(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),
        ("sample2", ctypes.c_void_p),
        ("metrics", Metric * 8),
    ]


class FakeNvml:
    """The GPM calls of nvidia-ml-py; each sample counts SM-active percent-milliseconds."""

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 2, 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL = 5, 10
    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(self):
        self.live, self.readings, self.next = set(), {}, 1
        self.sm_active = 40.0

    def nvmlGpmSampleAlloc(self):
        self.next += 1
        self.live.add(self.next)
        return self.next

    def nvmlGpmSampleGet(self, handle, sample):
        self.readings[sample] = self.sm_active

    def nvmlGpmSampleFree(self, sample):
        self.live.remove(sample)

    def nvmlGpmMetricsGet(self, get):
        for i in range(get.numMetrics):
            metric = get.metrics[i]
            if metric.metricId == self.NVML_GPM_METRIC_SM_UTIL:
                metric.value = self.readings[get.sample2]
            elif metric.metricId == self.NVML_GPM_METRIC_DRAM_BW_UTIL:
                metric.nvmlReturn = 999  # not supported: left out
            else:
                metric.value = 12.0


def test_a_window_carries_gpm_between_its_edges_and_frees_its_samples():
    nvml = FakeNvml()
    backend = HostBackend(VirtualClock())
    try:
        profiler = Profiler(
            backend, budget=Budget(), channels=Channels(gpm=gpm_mod.Gpm(nvml, handle=None, min_interval_s=0))
        )
        with profiler.window("w") as done:
            backend.compute(2.0)
        (window,) = done
        assert window.metrics.gpm == {"sm_active": 0.40, "sm_occupancy": 0.12, "tensor_active": 0.12}
        assert window.metrics.flat()["gpm.sm_active"] == pytest.approx(0.40)
        assert window.metrics.to_dict()["gpm"]["sm_occupancy"] == pytest.approx(0.12)
        assert nvml.live == set()  # both samples freed
    finally:
        backend.close()


def test_a_window_shorter_than_nvmls_gpm_refresh_has_no_gpm_figures():
    nvml = FakeNvml()
    backend = HostBackend(VirtualClock())
    try:
        profiler = Profiler(backend, budget=Budget(), channels=Channels(gpm=gpm_mod.Gpm(nvml, handle=None)))
        assert (
            profiler.channels.gpm is not None and profiler.channels.gpm.min_interval_s == gpm_mod.MIN_INTERVAL_S == 0.1
        )
        with profiler.window("w") as done:  # virtual time: the samples are microseconds apart
            backend.compute(200.0)
        assert done[0].metrics.gpm is None and "gpm" not in done[0].metrics.to_dict()
        assert nvml.live == set()
    finally:
        backend.close()


def test_without_gpm_a_window_has_no_gpm_figures():
    backend = HostBackend(VirtualClock())
    try:
        profiler = Profiler(backend, budget=Budget())
        with profiler.window("w") as done:
            backend.compute(1.0)
        assert done[0].metrics.gpm is None and "gpm" not in done[0].metrics.to_dict()
    finally:
        backend.close()


def test_a_window_says_when_another_process_used_the_device():
    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.capture.clock import VirtualClock
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Channels
    from pytest_gpuprof.verdict.budget import Budget

    class Observer:
        def __init__(self, others):
            self._others = others

        def samples(self, lo, hi):
            return []

        def others(self, since_s):
            return self._others

    backend = HostBackend(VirtualClock())
    try:
        for others, noted in (({4242: 87, 4343: 2}, True), ({4343: 2}, False), ({}, False)):
            profiler = Profiler(backend, budget=Budget(), channels=Channels(sampler=Observer(others)))
            m = profiler.measure(lambda: backend.compute(1.0), rounds=1, warmup=0)
            shared = [n for n in m.notes if n.startswith("another process used this device")]
            assert bool(shared) == noted
            if noted:
                assert "pid 4242 SM up to 87%" in shared[0] and "4343" not in shared[0]
    finally:
        backend.close()
