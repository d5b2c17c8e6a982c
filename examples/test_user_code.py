"""Steps around your own code: what a GPU engineer writes in a test of their pipeline."""

import numpy as np
import pytest


@pytest.mark.gpu_budget(min_utilization=0.5, steps={"decode": {"max_ms": 250}})
def test_decode_then_kernels(gpuprof, gpu_workload):
    with gpuprof.step("decode"):
        # CPU-side work before the GPU can start: a few milliseconds of parsing.
        records = np.random.default_rng(0).integers(0, 1 << 32, size=1 << 18, dtype=np.uint32)
        records.sort()
    gpu_workload.compute(ms=40, kind="fft")
    assert gpuprof.metrics.steps["decode"].count == 1


def test_measured_kernel_loop(gpuprof, gpu_workload):
    # Each round is its own window: from the call to the end of the kernels it launched.
    metrics = gpuprof.measure(lambda: gpu_workload.compute(ms=20, kind="matmul"), rounds=5, warmup=1)
    assert metrics.rounds["utilization"].median == pytest.approx(metrics.utilization)
