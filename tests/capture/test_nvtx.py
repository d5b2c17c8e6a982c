"""NVTX ranges as steps: nesting among the steps of a thread, and the figures of a range
equal to those of a ``gpuprof.step`` of its name."""

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.model import DeviceInterval, Span
from pytest_gpuprof.analysis.nvtx import RANGE_IDS, as_steps, range_name
from pytest_gpuprof.analysis.timeline import Timeline
from tests.analysis.test_metrics import nested_steps

MS = 1_000_000


def split(spans, which):
    """Some of the spans made NVTX ranges: depth 0 and a range's id, as CUPTI gives them."""
    steps, ranges = [], []
    for span, is_range in zip(spans, which, strict=False):
        if is_range:
            ranges.append(replace(span, depth=0, span_id=RANGE_IDS + span.span_id))
        else:
            steps.append(span)
    steps += spans[len(which) :]
    return steps, ranges


def order(s):
    return (s.start, -s.end, s.span_id)


@given(nested_steps, st.lists(st.booleans(), max_size=16))
def test_each_span_is_as_deep_as_the_spans_of_its_thread_around_it(spans, which):
    # a span of no length, where one closes and the next opens, lies in either: it owns no
    # time, and its depth is not defined by the times
    spans = [s for s in spans if s.end > s.start]
    steps, ranges = split(spans, which)
    merged = as_steps(steps, ranges)
    assert sorted(s.span_id for s in merged) == sorted(s.span_id for s in (*steps, *ranges))
    ranged = {r.thread for r in ranges}
    for s in merged:
        if s.thread not in ranged:
            assert s in steps  # a thread without ranges keeps its steps as they were
            continue
        around = [
            o
            for o in merged
            if o.thread == s.thread and o is not s and o.start <= s.start and s.end <= o.end and order(o) < order(s)
        ]
        assert s.depth == len(around)


def test_a_range_outside_the_default_domain_is_named_with_it():
    assert range_name("train", "") == "train"
    assert range_name("fwd", "megatron") == "megatron:fwd"


def test_a_range_and_a_step_of_one_name_are_one_step_with_the_same_figures():
    # a thread uploads under a range "upload", another under a gpuprof.step "upload"
    copy = DeviceInterval("memcpy", 2 * MS, 8 * MS, 1, "HTOD", 600_000_000, thread=7, issued=1 * MS)
    kernel = DeviceInterval("kernel", 8 * MS, 10 * MS, 1, "k", thread=7, issued=9 * MS)
    as_range = Span("upload", 7, 0, 3 * MS, span_id=RANGE_IDS + 1)
    train = Span("train", 7, 8 * MS, 10 * MS, span_id=RANGE_IDS + 2)
    ranged = Timeline(0, 10 * MS, "cupti", as_steps([], [as_range, train]), (), (copy, kernel))
    stepped = Timeline(
        0, 10 * MS, "cupti", (replace(as_range, span_id=1), replace(train, span_id=2)), (), (copy, kernel)
    )
    a, b = metrics.compute(ranged), metrics.compute(stepped)
    assert a.steps["upload"].bytes == b.steps["upload"].bytes == 600_000_000
    assert a.steps["upload"].idle_ms == b.steps["upload"].idle_ms > 0
    assert a.to_dict()["steps"] == b.to_dict()["steps"]
    # with a gpuprof.step "upload" around the range of that name: one step, counted once
    outer = Span("upload", 7, 0, 4 * MS, span_id=3)
    both = metrics.compute(Timeline(0, 10 * MS, "cupti", as_steps([outer], [as_range, train]), (), (copy, kernel)))
    assert both.steps["upload"].count == 1 and both.steps["upload"].bytes == 600_000_000


def test_a_range_from_before_the_test_does_not_stretch_its_window(monkeypatch):
    import threading

    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.capture.clock import VirtualClock
    from pytest_gpuprof.measure.profiler import Profiler

    backend = HostBackend(VirtualClock())
    me = threading.get_native_id()
    try:
        backend.clock.spend(50 * MS)
        earlier = Span("epoch", me, 0, 10 * MS, span_id=RANGE_IDS + 1)  # a test before this one
        session_long = Span("session", me, 5 * MS, 5 * MS, span_id=RANGE_IDS + 2)  # still open
        monkeypatch.setattr(backend.source, "ranges", lambda: ([earlier], [session_long]))
        profiler = Profiler(backend)
        backend.clock.spend(10 * MS)
        with profiler.step("compute"):
            backend.compute(2.0)
        window = profiler.whole_test()
        assert window is not None and window.timeline is not None
        assert window.timeline.start == 50 * MS  # the test's part of the open range, not before
        names = {s.name: s for s in window.timeline.steps}
        assert "epoch" not in names
        assert names["session"].start == 50 * MS and names["compute"].depth == 1
    finally:
        backend.close()
