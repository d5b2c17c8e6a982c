"""On the GPU: pinned upload bandwidth over buffer sizes, and out-of-memory handling."""

import pytest
from hypothesis import given, settings

from pytest_gpuprof.measure.workload import GpuOutOfMemory
from pytest_gpuprof.output.text import human_bytes
from pytest_gpuprof.strategies import buffer_sizes

pytestmark = pytest.mark.gpu

KIB, GIB = 1 << 10, 1 << 30


def bandwidth(gpuprof, gpu_workload, size):
    return gpuprof.measure(lambda: gpu_workload.upload(size), rounds=3, warmup=1).steps["upload"].gbps


def test_where_pinned_bandwidth_reaches_80_percent_of_peak(gpuprof, gpu_workload, gpu_device):
    peak = gpu_device.h2d_gbps
    sweep = [(1 << bits, bandwidth(gpuprof, gpu_workload, 1 << bits)) for bits in range(10, 33)]
    for size, gbps in sweep:
        print(f"\nupload {size:>11,} B: {gbps:6.2f} GB/s ({100 * gbps / peak:5.1f}% of the {peak:.1f} GB/s peak)")
    below = [size for size, gbps in sweep if gbps < 0.8 * peak]
    print(f"\nlargest size below 80% of peak: {max(below):,} B")
    assert sweep[0][1] < 0.8 * peak  # 1 KiB is latency-bound
    assert sweep[-1][1] >= 0.8 * peak  # 4 GiB reaches the link's plateau


@pytest.mark.gpu_budget(min_utilization=0.0)
@settings(settings.get_profile("gpuprof"), max_examples=15)
@given(size=buffer_sizes(256 << 20, 4 * GIB))
def test_large_uploads_keep_80_percent_of_peak(gpuprof, gpu_workload, gpu_device, size):
    gpuprof.measure(lambda: gpu_workload.upload(size), rounds=2, warmup=1)
    gpuprof.check(steps={"upload": {"min_gbps": 0.8 * gpu_device.h2d_gbps, "pageable": "forbid"}})


def test_out_of_memory_at_the_top_of_the_range(gpu_workload, gpuprof):
    free, _total = gpuprof.backend.memory_info()
    too_big = free + GIB
    with pytest.raises(GpuOutOfMemory) as info:
        gpu_workload.alloc(too_big)
    print(f"\n{info.value}")
    assert f"alloc of {human_bytes(too_big)} ({too_big:,} B) does not fit" in str(info.value)
    assert "free of" in str(info.value)
    buffer = gpu_workload.upload(GIB)  # the device is usable right after
    assert buffer.nbytes == GIB
    del buffer
