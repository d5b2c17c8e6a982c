"""The seed pipeline: two workers prestage and compute partitions.

With one lock over prestage and kernels, every upload idles the GPU, yet the
GPU_START..GPU_END brackets around each partition claim ~100% utilization. With two
locks, one worker uploads while the other's kernels run.
"""

import pytest

from pytest_gpuprof import GpuBudgetExceeded


@pytest.mark.xfail(
    strict=True,
    raises=GpuBudgetExceeded,
    reason="one lock over prestage and kernels: the GPU idles during every upload",
)
def test_single_lock_pipeline(gpuprof, gpu_workload):
    metrics = gpu_workload.partitions(n=8, workers=2, strategy="single-lock")
    # The brackets look perfect; the budget, asserted now, tells the truth.
    assert metrics.reported_utilization > 0.9
    gpuprof.check()


# Measured: 82.7-85.3% true, 14.6-17.2 points of discrepancy on an H200 (4 runs);
# 94.1% and 5.9 points on the host backend's virtual clock. The budget keeps a margin
# of 7 points or more below both.
@pytest.mark.gpu_budget(min_utilization=0.75, max_discrepancy=0.25)
def test_two_lock_pipeline(gpuprof, gpu_workload):
    metrics = gpu_workload.partitions(n=8, workers=2, strategy="two-lock")
    assert metrics.steps["upload"].count == 8
    gpuprof.check()
