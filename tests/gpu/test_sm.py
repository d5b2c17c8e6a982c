"""Busy is not full, on the H200: SM coverage from CUPTI's kernel geometry, and the
occupancy of kernels of different shapes against CUDA's own occupancy API."""

import ctypes

import pytest

from pytest_gpuprof.analysis.occupancy import Geometry, blocks_per_sm

pytestmark = pytest.mark.gpu

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""

SHAPES = r"""
extern "C" __global__ void scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
extern "C" __global__ void tile(float* x, int n) {
    __shared__ float buf[12288];  // 48 KiB, static
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) x[i] = buf[(threadIdx.x + 1) % blockDim.x];
}
extern "C" __global__ void staged(float* x, int n) {
    extern __shared__ float dyn[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    dyn[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) x[i] = dyn[blockDim.x - 1 - threadIdx.x];
}
extern "C" __global__ void heavy(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float acc[48];
    #pragma unroll
    for (int k = 0; k < 48; k++) acc[k] = (i < n ? x[i] : 0.0f) * (k + 1);
    #pragma unroll
    for (int r = 0; r < 8; r++) {
        #pragma unroll
        for (int k = 0; k < 48; k++) acc[k] = acc[k] * acc[(k + r + 1) % 48] + 1.0f;
    }
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 48; k++) s += acc[k];
    if (i < n) x[i] = s;
}
"""


def spin_cycles(cp, ms):
    rate_khz = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)
    return int(ms * rate_khz)


def test_a_one_block_kernel_reads_busy_but_not_full(gpuprof):
    import cupy as cp

    from pytest_gpuprof import GpuBudgetExceeded

    spin = cp.RawKernel(SPIN, "spin")
    cycles = spin_cycles(cp, 1.0)
    spin((1,), (32,), (cp.int64(cycles),))
    cp.cuda.Device().synchronize()

    def loop():
        with gpuprof.step("spin"):
            for _ in range(50):
                spin((1,), (32,), (cp.int64(cycles),))
            cp.cuda.Device().synchronize()

    m = gpuprof.measure(loop, rounds=3, warmup=1)
    print(
        f"\none-block spin: utilization {m.utilization:.3f}, sm_utilization {m.sm_utilization:.4f}, top {m.top_kernels[0]}"
    )
    assert m.utilization > 0.9
    assert m.sm_utilization < 0.05
    with pytest.raises(GpuBudgetExceeded, match=r"sm_utilization .*< 50.0% \(min_sm_utilization\)") as info:
        gpuprof.check(min_sm_utilization=0.5)
    assert "grid 1 x block 32, SMs 0.8%" in str(info.value)


def test_a_large_matmul_fills_the_sms(gpuprof, gpu_workload):
    m = gpuprof.measure(lambda: gpu_workload.compute(ms=50, kind="matmul"), rounds=3, warmup=1)
    print(
        f"\nmatmul 4096: utilization {m.utilization:.3f}, sm_utilization {m.sm_utilization:.3f}, top {m.top_kernels[0]}"
    )
    assert m.sm_utilization > 0.8


def test_occupancy_equals_cudas_occupancy_api(gpuprof):
    import cupy as cp

    module = cp.RawModule(code=SHAPES)
    x = cp.ones(1 << 20, dtype=cp.float32)
    n = cp.int32(x.size)
    launches = [  # (kernel, threads a block, dynamic shared bytes)
        ("scale", 256, 0),
        ("scale", 1024, 0),
        ("scale", 96, 0),
        ("tile", 128, 0),
        ("staged", 256, 32 * 1024),
        ("heavy", 128, 0),
        ("heavy", 512, 0),
    ]
    cuda = ctypes.CDLL("libcuda.so.1")
    with gpuprof.step("shapes"):
        for name, threads, dynamic in launches:
            kernel = module.get_function(name)
            kernel(((x.size + threads - 1) // threads,), (threads,), (x, n), shared_mem=dynamic)
        cp.cuda.Device().synchronize()
    window = gpuprof.whole_test()
    sm = window.timeline.sm
    records = [d for d in window.timeline.device if d.kind == "kernel"]
    assert len(records) == len(launches)
    rows = []
    for record, (name, threads, dynamic) in zip(sorted(records, key=lambda d: d.start), launches, strict=True):
        kernel = module.get_function(name)
        blocks = ctypes.c_int()
        status = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(kernel.kernel.ptr), ctypes.c_int(threads), ctypes.c_size_t(dynamic)
        )
        assert status == 0
        ours = blocks_per_sm(Geometry(record.blocks, record.threads, record.registers, record.shared), sm)
        rows.append((name, threads, record.registers, record.shared, ours, blocks.value))
    print("\n(kernel, threads, registers, shared bytes, blocks per SM ours, CUDA's):", *rows, sep="\n  ")
    assert [r[4] for r in rows] == [r[5] for r in rows]
    assert len({(r[2], r[3], r[5]) for r in rows}) >= 5  # shapes that differ where it matters


def test_gpm_agrees_with_sm_utilization(gpuprof, gpu_workload):
    import cupy as cp

    assert gpuprof.channels.gpm is not None, "this GPU or driver has no NVML GPM"
    spin = cp.RawKernel(SPIN, "spin")
    cycles = spin_cycles(cp, 1.0)

    def one_block():
        with gpuprof.step("spin"):
            for _ in range(500):
                spin((1,), (32,), (cp.int64(cycles),))
            cp.cuda.Device().synchronize()

    # rounds of 500 ms: NVML refreshes GPM's counters every ~100 ms
    for name, loop in (
        ("one-block spin", one_block),
        ("matmul 4096", lambda: gpu_workload.compute(ms=500, kind="matmul")),
    ):
        m = gpuprof.measure(loop, rounds=2, warmup=1)
        print(f"\n{name}: sm_utilization {m.sm_utilization:.3f}, GPM {m.gpm}")
        assert m.gpm is not None
        assert m.gpm["sm_active"] == pytest.approx(m.sm_utilization, abs=0.10)
    short = gpuprof.measure(lambda: gpu_workload.compute(ms=20, kind="matmul"), rounds=1, warmup=0)
    assert short.gpm is None  # closer than NVML's refresh: no figures rather than the stretch around it
