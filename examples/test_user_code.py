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


@pytest.mark.gpu_budget(min_utilization=0.6, steps={"upload": {"min_gbps": 10}})
def test_asynchronous_upload_is_charged_for_the_wait(gpuprof, gpu_workload):
    # The upload returns once enqueued, as x.to("cuda", non_blocking=True) does; the
    # kernels after it on the same stream wait for the copy, and that wait is upload's;
    # its bandwidth is the copy's own (24 GB/s on the virtual clock, ~55 on an H200).
    def batch():
        gpu_workload.upload(32 << 20, non_blocking=True)
        gpu_workload.compute(ms=5)

    metrics = gpuprof.measure(batch, rounds=3, warmup=1)
    assert metrics.steps["upload"].idle_ms > 0.5 * metrics.overhead_ms
