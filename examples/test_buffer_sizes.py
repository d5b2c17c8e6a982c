"""Stress prestage with hypothesis: every buffer size in a range must keep its budget.

Each example's ``measure`` (or ``partitions``) is its own window; a breach is re-measured
before it counts, so hypothesis shrinks to the smallest size that really breaches.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof.strategies import buffer_sizes, partition_counts

MIB = 1 << 20


@pytest.mark.gpu_budget(min_utilization=0.0)  # a pure transfer test: no kernels to keep busy
@settings(settings.get_profile("gpuprof"), max_examples=6)
@given(size=buffer_sizes(64 * MIB, 256 * MIB))
def test_upload_bandwidth_holds_for_large_buffers(gpuprof, gpu_workload, gpu_device, size):
    gpuprof.measure(lambda: gpu_workload.upload(size), rounds=1, warmup=1)
    # half the calibrated peak: a buffer this large that cannot reach it is a bug; and the
    # upload holds its buffer, no staging copy beside it (CuPy's pool rounds to 512 B)
    limits = {"min_gbps": 0.5 * gpu_device.h2d_gbps, "pageable": "forbid", "max_memory": size + 511}
    gpuprof.check(steps={"upload": limits})


@pytest.mark.gpu_budget(min_utilization=0.5, max_discrepancy=0.5)
@settings(settings.get_profile("gpuprof"), max_examples=4)
@given(n=partition_counts(8).filter(lambda n: n >= 4), data=st.data())
def test_two_lock_pipeline_keeps_the_kernels_busy(gpu_workload, n, data):
    # Partitions big enough that kernels, not Python, set the pace: a GPU's link moves
    # 16 MiB in 0.3 ms, a CPU copy engine takes ~2 ms.
    lo, hi = (512 * MIB, 2048 * MIB) if gpu_workload.backend.name == "cuda" else (16 * MIB, 64 * MIB)
    size = data.draw(buffer_sizes(lo, hi), label="upload_bytes")
    gpu_workload.partitions(n=n, upload_bytes=size, strategy="two-lock", rounds=1, warmup=1)
