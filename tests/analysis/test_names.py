"""Kernel names: demangled as a person reads them, a short name for every line and label,
unique within a table; the mangled name stays the identity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import names
from pytest_gpuprof.analysis.device_work import DeviceInterval, DeviceWork
from pytest_gpuprof.analysis.names import SHORT, readable, short, short_names
from pytest_gpuprof.analysis.sm_metrics import top_kernels

MS = 1_000_000
TANH = (
    "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_16tanh_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE0_"
    "clEvENKUlvE0_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_"
)
REDUCE = (
    "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfZNS0_11sum_functorIfffEclERNS_"
    "14TensorIteratorEEUlffE_EEjfLi4EEEEEvT1_"
)
CUTLASS = "_ZN7cutlass6KernelINS_4gemm6kernel4GemmIiEEEEvNT_6ParamsE"


@pytest.fixture(params=["cpp-demangle", "libstdc++"])
def demangler(request, monkeypatch):
    """Each test twice: with the library, and with the C++ runtime's fallback alone."""
    if request.param == "cpp-demangle":
        pytest.importorskip("cpp_demangle")
    else:
        monkeypatch.setattr(names, "_library_demangler", lambda: None)
    readable.cache_clear()
    short.cache_clear()
    yield request.param
    readable.cache_clear()
    short.cache_clear()


@pytest.mark.parametrize(
    ("mangled", "expected"),
    [
        (TANH, "vectorized_elementwise_kernel<tanh_kernel_cuda>"),  # a lambda: the function it is in
        (REDUCE, "reduce_kernel<ReduceOp>"),  # numbers skipped: the first argument that names something
        (CUTLASS, "Kernel<Gemm>"),  # a generic wrapper: what it wraps
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_nn_align4>(Params)",
            "Kernel2<cutlass_80_tensorop_s1688gemm_64x64_nn_align4>",
        ),
        ("_Z3addPfS_i", "add"),  # a plain function: its name
        ("_ZN12_GLOBAL__N_16scaledEPf", "scaled"),  # in an anonymous namespace
        ("_ZNK3Foo3barEv", "bar"),  # a const member
        ("_ZN3FooclEv", "Foo"),  # a call operator: the type it belongs to
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),  # not C++: as it came
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n", "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n"),
    ],
)
def test_short_names_read_like_a_person_reads_them(demangler, mangled, expected):
    assert short(readable(mangled)) == expected


def test_the_library_reads_what_the_runtime_reads(demangler):
    assert readable("_Z3addPfS_i") == "add(float*, float*, int)"
    assert readable(TANH).startswith("void at::native::vectorized_elementwise_kernel<4, at::native::tanh_kernel_cuda(")
    assert readable("_Zbogus") == "_Zbogus"  # not a symbol: as it came, from either


def test_a_long_name_ends_in_an_ellipsis_at_80():
    name = "k" * 200
    assert short(name) == "k" * (SHORT - 1) + "\u2026"
    templated = f"void ns::{'x' * 100}_kernel<ns::{'y' * 100}>(int)"
    assert len(short(templated)) == SHORT and short(templated).endswith("\u2026")


def test_two_instances_of_one_template_are_told_apart_by_their_arguments():
    a = "void at::native::elementwise_kernel<128, 2, at::native::add_kernel(at::TensorIteratorBase&)::{lambda()#1}>(int)"
    b = "void at::native::elementwise_kernel<128, 4, at::native::add_kernel(at::TensorIteratorBase&)::{lambda()#1}>(int)"
    c = "void at::native::elementwise_kernel<128, 4, at::native::mul_kernel(at::TensorIteratorBase&)::{lambda()#1}>(int)"
    shown = short_names([a, b, c])
    assert shown[c] == "elementwise_kernel<mul_kernel>"  # unique already: left short
    assert shown[a] == "elementwise_kernel<128, 2, add_kernel>"
    assert shown[b] == "elementwise_kernel<128, 4, add_kernel>"


def test_names_alike_to_every_argument_get_a_number():
    shown = short_names(["k" * 90 + "a", "k" * 90 + "b", "k" * 90 + "c"])
    assert sorted(shown.values()) == ["k" * 79 + "\u2026", "k" * 76 + "\u2026 #2", "k" * 76 + "\u2026 #3"]


@given(st.lists(st.text(alphabet="ab:<>(){}[], #0123456789lambda", max_size=120), max_size=8))
def test_short_names_are_unique_short_and_total(texts):
    shown = short_names(texts)
    assert set(shown) == set(texts)
    assert len(set(shown.values())) == len(shown)
    assert all(0 < len(s) <= SHORT or (s == "" and t == "") for t, s in shown.items())


def test_top_kernels_carry_name_short_and_mangled_unique_in_the_window():
    a, b = (
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_10add_kernelERNS_18TensorIteratorBaseEEUlvE_EEviT1_",
        "_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_10add_kernelERNS_18TensorIteratorBaseEEUlvE_EEviT1_",
    )
    work = DeviceWork.of(
        [
            DeviceInterval("kernel", 0, 6 * MS, name=a, blocks=1, threads=32),
            DeviceInterval("kernel", 6 * MS, 10 * MS, name=b, blocks=1, threads=32),
        ]
    )
    first, second = top_kernels(work, None, (0, 10 * MS))
    assert (first.mangled, second.mangled) == (a, b)
    assert first.name == readable(a) and not first.name.startswith("_Z")
    assert first.short != second.short and all(len(k.short) <= SHORT for k in (first, second))
    assert first.to_dict()["short"] == first.short


def test_the_tables_largest_idle_cause_is_a_column_not_a_paragraph():
    from types import SimpleNamespace

    from pytest_gpuprof.analysis.metrics import UNATTRIBUTED
    from pytest_gpuprof.output.report import row

    where = "cupy/cuda/compiler.py:123 _compile_module_with_cache > " + "cupy/_core/core.pyx:_kernel > " * 6
    metrics = SimpleNamespace(
        wall_ms=10.0,
        utilization=0.5,
        reported_utilization=None,
        overhead_ms=5.0,
        unattributed_ms=5.0,
        idle_by_code=((where, 4.0),),
        idle_by_step=lambda: [(UNATTRIBUTED, 5.0)],
    )
    cause = row(SimpleNamespace(nodeid="t.py::t", status="-"), metrics)[5]  # type: ignore[arg-type]
    assert len(cause) == SHORT and cause.startswith(f"{UNATTRIBUTED} 5.0 ms, 80% in cupy/cuda/compiler.py:123")
