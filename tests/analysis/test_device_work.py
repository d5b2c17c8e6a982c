"""``DeviceWork``, the device intervals as columns, and the SM figures read from its
columns, against plain Python over the same intervals."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import sm_metrics
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.analysis.occupancy import Geometry, SmLimits, coverage, occupancy

H200 = SmLimits(sms=132)


@st.composite
def device_interval(draw, kinds=("kernel", "memcpy", "memset")):
    start = draw(st.integers(0, 1000))
    return DeviceInterval(
        draw(st.sampled_from(kinds)),
        start,
        start + draw(st.integers(0, 300)),
        draw(st.integers(0, 3)),
        draw(st.sampled_from(["gemm", "spin", "h2d", ""])),
        draw(st.integers(0, 1 << 40)),
        draw(st.booleans()),
        draw(st.none() | st.integers(1, 5)),
        draw(st.integers(0, 2)),
        draw(st.integers(0, 1000)),
        draw(st.sampled_from([1, 132, 1000])),
        draw(st.sampled_from([32, 256, 1024])),
        draw(st.sampled_from([0, 32, 128])),
        draw(st.sampled_from([0, 48 * 1024])),
    )


intervals = st.lists(device_interval(), max_size=20)


@given(intervals, intervals, st.data())
def test_columns_give_back_the_intervals_they_were_made_of(a, b, data):
    work = DeviceWork.of(a)
    assert list(work) == a and len(work) == len(a)
    if a:
        i = data.draw(st.integers(0, len(a) - 1))
        assert work[i] == a[i] and list(work[i:]) == a[i:]
    assert list(DeviceWork.join([work, DeviceWork.of(b)])) == a + b
    kept = data.draw(st.lists(st.booleans(), min_size=len(a), max_size=len(a)))
    assert list(work.where(np.array(kept, dtype=bool))) == [d for d, k in zip(a, kept, strict=True) if k]
    assert list(work.where(work.of_kind("memcpy"))) == [d for d in a if d.kind == "memcpy"]


def test_an_empty_join_is_empty_and_equal_to_no_intervals():
    assert DeviceWork.join([]) == [] and DeviceWork.join([DeviceWork(), DeviceWork.of([])]) == ()


kernels = st.lists(device_interval(kinds=("kernel",)), max_size=20)
window = st.tuples(st.integers(0, 1300), st.integers(0, 1300)).map(sorted).map(tuple)


def inside(d, lo, hi):
    return max(0, min(d.end, hi) - max(d.start, lo))


def shape(d):
    return Geometry(d.blocks, d.threads, d.registers, d.shared)


@given(kernels, window)
def test_sm_weighted_time_is_each_kernels_time_in_the_window_times_its_coverage(found, span):
    expected = sum(inside(d, *span) * coverage(shape(d), H200) for d in found)
    assert sm_metrics.sm_weighted_ns(DeviceWork.of(found), H200, span) == pytest.approx(expected)


@given(kernels, window)
def test_top_kernels_sum_each_names_time_and_show_its_longest_launch(found, span):
    got = {k.name: k for k in sm_metrics.top_kernels(DeviceWork.of(found), H200, span)}
    names = {d.name for d in found}
    totals = {n: sum(inside(d, *span) for d in found if d.name == n) for n in names}
    assert len(got) == min(len(names), sm_metrics.TOP)
    # the top ones: no name left out took longer than one shown
    assert all(totals[n] <= min(totals[g] for g in got) for n in names - got.keys())
    for name, top in got.items():
        launches = [d for d in found if d.name == name]
        longest = max(launches, key=lambda d: d.end - d.start)  # the first, among equals
        assert (top.count, top.blocks, top.threads) == (len(launches), longest.blocks, longest.threads)
        assert top.total_ms == pytest.approx(totals[name] / 1e6)
        assert top.sm_coverage == coverage(shape(longest), H200)
        assert top.occupancy == occupancy(shape(longest), H200)


@given(kernels, window, st.data())
def test_each_top_kernels_step_is_the_one_whose_launches_of_it_took_the_most_time(found, span, data):
    """A kernel's step in the records (what explain matches a swapped kernel by): over its
    launches, the step whose time inside the window is the largest; none where no step
    issued any of its time."""
    names = ("load", "step", "save")
    issued = [data.draw(st.integers(-1, len(names) - 1)) for _ in found]
    steps = sm_metrics.Steps(np.array(issued, dtype=np.int64), names)
    got = {k.name: k.step for k in sm_metrics.top_kernels(DeviceWork.of(found), H200, span, steps)}
    for name, step in got.items():
        spent = {i: 0 for i in range(len(names))}
        for d, i in zip(found, issued, strict=True):
            if d.name == name and i >= 0:
                spent[i] += inside(d, *span)
        most = max(spent.values())
        assert step == ("" if most == 0 else names[min(i for i, v in spent.items() if v == most)])
