"""A mixed suite for --gpu-exclusive: 40 CPU-only tests of 50 ms and 8 measured GPU tests.

Run serially and under ``-n 4`` on one GPU: the GPU tests hold the device alone (their
figures as serial), the CPU tests run beside them (``benchmarks/parallel.py`` compares).
"""

import time

import pytest


@pytest.mark.parametrize("i", range(40))
def test_cpu_only(i):
    time.sleep(0.05)


@pytest.mark.gpu_budget(min_utilization=0.5)
@pytest.mark.parametrize("i", range(8))
def test_measured(gpuprof, gpu_workload, i):
    gpuprof.measure(lambda: gpu_workload.compute(ms=50, kind="matmul"), rounds=3, warmup=1)
