"""What-if predictions against hand-built timelines whose answer is known by hand."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.descriptors import comparable
from pytest_gpuprof.analysis.model import DeviceInterval, Span
from pytest_gpuprof.analysis.rounds import aggregate
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.text import failure_message
from pytest_gpuprof.verdict.budget import Budget
from pytest_gpuprof.verdict.thresholds import parse_thresholds

MS = 1_000_000


def serial_pipeline(units, copy_ms, kernel_ms, host_ms=0, threads=1, pageable=False, nbytes=0):
    """``units`` partitions run one after another (one lock): host time, a copy issued by
    "upload", then kernels issued by "compute"; partition i on thread i % threads."""
    steps, device, t, ids = [], [], 0, iter(range(1, 1000))
    for i in range(units):
        thread = 1 + i % threads
        if host_ms:
            steps.append(Span("alloc", thread, t, t + host_ms * MS, span_id=next(ids)))
            t += host_ms * MS
        up = next(ids)
        steps.append(Span("upload", thread, t, t + copy_ms * MS, span_id=up))
        device.append(DeviceInterval("memcpy", t, t + copy_ms * MS, bytes=nbytes, pageable=pageable, span_id=up))
        t += copy_ms * MS
        comp = next(ids)
        steps.append(Span("compute", thread, t, t + kernel_ms * MS, span_id=comp))
        device.append(DeviceInterval("kernel", t, t + kernel_ms * MS, span_id=comp))
        t += kernel_ms * MS
    return Timeline(0, t, "cupti", tuple(steps), (), tuple(device))


def test_a_two_stage_pipeline_overlapped_hides_every_copy_but_the_first():
    m = metrics.compute(serial_pipeline(4, copy_ms=2, kernel_ms=4))
    assert m.utilization == pytest.approx(16 / 24)
    (name,) = m.what_if
    assert name == "overlap:upload"
    assert m.what_if[name].wall_ms == pytest.approx(2 + 4 * 4)  # the first copy, then kernels back to back
    assert m.what_if[name].utilization == pytest.approx(16 / 18)


def test_a_pipeline_bound_by_the_copy_engine_is_its_copies_and_the_last_kernels():
    m = metrics.compute(serial_pipeline(4, copy_ms=4, kernel_ms=2))
    assert m.what_if["overlap:upload"].wall_ms == pytest.approx(4 * 4 + 2)
    assert m.what_if["overlap:upload"].utilization == pytest.approx(8 / 18)


def test_three_workers_taking_turns_predict_as_one():
    one = metrics.compute(serial_pipeline(6, copy_ms=3, kernel_ms=5))
    three = metrics.compute(serial_pipeline(6, copy_ms=3, kernel_ms=5, threads=3))
    assert three.what_if["overlap:upload"] == one.what_if["overlap:upload"]
    assert three.what_if["overlap:upload"].wall_ms == pytest.approx(3 + 6 * 5)


def test_host_time_stays_on_the_critical_path():
    # alloc 1 ms on the host, copy 2, kernels 4: the first alloc is the head, every
    # other alloc stays serial with the kernels
    m = metrics.compute(serial_pipeline(4, copy_ms=2, kernel_ms=4, host_ms=1))
    assert m.what_if["overlap:upload"].wall_ms == pytest.approx(1 + 2 + 3 * 5 + 4)


def test_a_pageable_step_predicts_its_copies_at_the_pinned_rate():
    # 8 MB in 4 ms (2 GB/s) per partition; pinned at 8 GB/s takes 1 ms
    timeline = serial_pipeline(2, copy_ms=4, kernel_ms=4, pageable=True, nbytes=8_000_000)
    m = metrics.compute(timeline, pinned_gbps=lambda: 8.0)
    assert m.what_if["pinned:upload"].wall_ms == pytest.approx(16 - 2 * 3)
    assert m.what_if["pinned:upload"].utilization == pytest.approx(8 / 10)
    assert "pinned:upload" not in metrics.compute(timeline).what_if  # no pinned rate known: not predicted


def test_faster_kernels():
    timeline = serial_pipeline(4, copy_ms=2, kernel_ms=4)
    p = metrics.what_if(timeline, "faster:compute:2")
    assert p is not None and p.wall_ms == pytest.approx(24 - 8)
    assert p.utilization == pytest.approx(8 / 16)
    with pytest.raises(ValueError, match="no step 'nothing' in the window; steps were: compute, upload"):
        metrics.what_if(timeline, "overlap:nothing")
    with pytest.raises(ValueError, match="no step 'nosuch'"):
        metrics.what_if(timeline, "faster:nosuch:2")
    with pytest.raises(ValueError, match="the factor must be above 0"):
        metrics.what_if(timeline, "faster:compute:0")
    with pytest.raises(ValueError, match="expected overlap:STEP"):
        metrics.what_if(timeline, "underlap:upload")


@given(
    st.integers(1, 8),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(0, 3),
)
def test_overlap_never_beats_the_busiest_engine_nor_loses_to_the_run(units, copy_ms, kernel_ms, host_ms):
    m = metrics.compute(serial_pipeline(units, copy_ms, kernel_ms, host_ms))
    p = m.what_if["overlap:upload"]
    assert p.wall_ms <= m.wall_ms + 1e-9
    assert p.wall_ms >= max(units * copy_ms, units * kernel_ms) - 1e-9
    assert p.utilization == pytest.approx(m.kernel_ms / p.wall_ms)


def test_predictions_are_metrics_a_gate_can_read():
    m = metrics.compute(serial_pipeline(4, copy_ms=2, kernel_ms=4))
    flat = m.flat()
    assert flat["what_if.overlap:upload.utilization"] == pytest.approx(16 / 18)
    assert m.to_dict()["what_if"] == {
        "overlap:upload": {"wall_ms": pytest.approx(18), "utilization": pytest.approx(16 / 18)}
    }
    assert comparable("what_if.overlap:upload.utilization") and not comparable("what_if.overlap:upload.gbps")
    (threshold,) = parse_thresholds("what_if.overlap:upload.utilization:-2pt")
    assert threshold.metric == "what_if.overlap:upload.utilization" and threshold.unit == "pt"
    rounds = aggregate([m, m, m])
    assert rounds.what_if == m.what_if


def test_the_breach_message_says_what_the_redesign_would_give():
    from pytest_gpuprof.verdict.budget import Budget, evaluate

    m = metrics.compute(serial_pipeline(4, copy_ms=2, kernel_ms=4))
    message = failure_message(evaluate(Budget(min_utilization=0.8), m), m)
    assert "what if: upload overlapped with the kernels -> ~88.9% (wall ~18 ms)" in message


def test_the_predicted_timeline_is_drawn_beside_the_measured_one():
    from pytest_gpuprof.output.html import page_data
    from pytest_gpuprof.verdict.record import GpuRecord

    timeline = serial_pipeline(2, copy_ms=2, kernel_ms=4)
    copies, rest = metrics.overlap_schedule(timeline, "upload")
    assert copies == [(0, 2 * MS), (2 * MS, 4 * MS)]  # back to back on their own engine
    assert rest == [(2 * MS, 6 * MS), (6 * MS, 10 * MS)]  # each unit after its own copy
    m = metrics.compute(timeline)
    record = GpuRecord("t", m, Budget(), [], enforced=False)
    predicted = [lane for lane in page_data(record, timeline)["lanes"] if lane["name"].startswith("what if")]
    assert [lane["name"] for lane in predicted] == [
        "what if overlap:upload: upload",
        "what if overlap:upload: the rest of each unit",
    ]
    assert predicted[0]["items"][1][:2] == [2000.0, 4000.0]  # microseconds from the window's start


def test_a_window_without_kernels_predicts_nothing():
    from pytest_gpuprof.analysis import metrics
    from pytest_gpuprof.analysis.model import DeviceInterval, Span
    from pytest_gpuprof.analysis.timeline import Timeline

    ms = 1_000_000
    steps = (Span("upload", 1, 0, 10 * ms, span_id=1),)
    copy = DeviceInterval("memcpy", 0, 10 * ms, bytes=1 << 20, span_id=1)
    timeline = Timeline(0, 10 * ms, "host", steps, (), (copy,))
    assert metrics.compute(timeline).what_if == {}
    assert metrics.what_if(timeline, "overlap:upload") is None
