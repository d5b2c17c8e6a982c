"""SM coverage and theoretical occupancy against figures worked out by hand from CUDA's
occupancy rules (H200: 132 SMs, 2,048 threads, 32 blocks, 64 Ki registers, 228 KiB of
shared memory per SM, 1 KiB reserved per block); the same figures against CUDA's own
occupancy API are in tests/gpu/test_sm.py."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval, Span
from pytest_gpuprof.analysis.occupancy import Geometry, SmLimits, blocks_per_sm, coverage, occupancy
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.verdict.budget import Budget, evaluate, not_measured

H200 = SmLimits(sms=132)
MS = 1_000_000


@pytest.mark.parametrize(
    ("geometry", "per_sm", "occupied"),
    [
        (Geometry(1, 256, 32, 0), 8, 1.0),  # warps: 64 / 8 = 8 blocks, full
        (Geometry(1, 1024, 32, 0), 2, 1.0),
        (Geometry(1, 256, 128, 0), 2, 0.25),  # registers: 128 x 32 = 4096 a warp, 16 warps an SM, 2 blocks of 8
        (Geometry(1, 128, 64, 48 * 1024), 4, 0.25),  # shared: 49 KiB a block, 4 in 228 KiB
        (Geometry(1, 32, 16, 0), 32, 0.5),  # blocks: at most 32 an SM, 32 warps of 64
        # registers: 40 x 32 = 1280 a warp, 12 warps in each of 4 sub-partitions: 16 blocks of 3
        (Geometry(1, 96, 40, 0), 16, 0.75),
    ],
)
def test_blocks_per_sm_and_occupancy(geometry, per_sm, occupied):
    assert blocks_per_sm(geometry, H200) == per_sm
    assert occupancy(geometry, H200) == pytest.approx(occupied)


def test_coverage_of_waves_and_tails():
    assert coverage(Geometry(1, 256), H200) == pytest.approx(1 / 132)
    assert coverage(Geometry(132, 256), H200) == 1.0
    assert coverage(Geometry(8 * 132, 256), H200) == 1.0  # one full wave of 8 blocks an SM
    # two full waves and a tail of 66 blocks over 66 SMs: (2 + 0.5) / 3
    assert coverage(Geometry(2 * 8 * 132 + 66, 256), H200) == pytest.approx(2.5 / 3)
    assert coverage(Geometry(1, 4096), H200) == 0.0  # does not fit an SM


@given(st.integers(1, 10**6), st.sampled_from([32, 64, 128, 256, 512, 1024]), st.integers(0, 255))
def test_coverage_is_a_fraction_and_a_full_grid_covers_everything(blocks, threads, registers):
    g = Geometry(blocks, threads, registers)
    assert 0.0 <= coverage(g, H200) <= 1.0
    per_sm = blocks_per_sm(g, H200)
    if per_sm:
        assert coverage(Geometry(per_sm * H200.sms * 3, threads, registers), H200) == 1.0


def one_block_spin(sm=H200):
    steps = (Span("spin", 1, 0, 100 * MS, span_id=1),)
    device = (DeviceInterval("kernel", 0, 95 * MS, name="spin", span_id=1, blocks=1, threads=32, registers=16),)
    return Timeline(0, 100 * MS, "cupti", steps, (), device, sm=sm)


def test_a_one_block_kernel_is_busy_but_not_full():
    m = metrics.compute(one_block_spin())
    assert m.utilization == pytest.approx(0.95)
    assert m.sm_utilization == pytest.approx(0.95 / 132)
    assert m.steps["spin"].sm_utilization == pytest.approx(1 / 132)
    (top,) = m.top_kernels
    assert (top.name, top.count, top.blocks, top.threads) == ("spin", 1, 1, 32)
    # 32 blocks of one warp could live on an SM: theoretical occupancy 50%; this grid fills one
    assert top.sm_coverage == pytest.approx(1 / 132) and top.occupancy == pytest.approx(0.5)
    breaches = evaluate(Budget(min_sm_utilization=0.5), m)
    assert [b.key for b in breaches] == ["min_sm_utilization"]


def test_where_no_sms_are_known_sm_utilization_is_not_measured():
    m = metrics.compute(Timeline(0, 100 * MS, "host"))
    assert m.sm_utilization is None and "no SMs" in m.sm_unseen
    assert evaluate(Budget(min_sm_utilization=0.5), m) == []
    assert not_measured(Budget(min_sm_utilization=0.5), m) == [
        "min_sm_utilization not measured: the host backend runs on a CPU, which has no SMs"
    ]
    assert "sm_utilization" not in m.flat()


def test_kernel_names_read_as_a_person_reads_them_and_keep_the_linkers():
    from pytest_gpuprof.analysis.names import readable
    from pytest_gpuprof.analysis.sm_metrics import top_kernels

    mangled = "_ZN5cudnn19engines_precompiled16nchwToNhwcKernelIfffLb0ELb1EEEvNS0_18nchw2nhwc_params_tIT1_EEPKT_PT0_"
    assert readable("_Z3addPfS_i") == "add(float*, float*, int)"
    assert readable(mangled).startswith(
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>("
    )
    assert readable("sm80_xmma_gemm_f32f32") == "sm80_xmma_gemm_f32f32"  # not a C++ symbol: as it came
    assert readable("_Zbogus") == "_Zbogus"  # not a valid one: as it came
    work = DeviceWork.of([DeviceInterval("kernel", 0, 10 * MS, name=mangled, blocks=1, threads=32)])
    (k,) = top_kernels(work, H200, (0, 10 * MS))
    assert k.name == readable(mangled) and k.mangled == mangled
