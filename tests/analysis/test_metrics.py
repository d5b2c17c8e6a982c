from collections import defaultdict

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import attribution, metrics
from pytest_gpuprof.analysis.model import DeviceInterval, Sample, Span
from pytest_gpuprof.analysis.rounds import aggregate
from pytest_gpuprof.analysis.timeline import Timeline

MS = 1_000_000
GRID = 40


def kernel(start_ms, end_ms, **kw):
    return DeviceInterval("kernel", int(start_ms * MS), int(end_ms * MS), **kw)


def test_seed_figures_give_51_4_percent():
    # The seed story: 1,889 ms of kernels in a 3,672 ms GPU_START..GPU_END window.
    timeline = Timeline(
        0,
        3672 * MS,
        "cupti",
        regions=(Span("partition", 1, 0, 3672 * MS),),
        device=(kernel(1000, 2889),),
    )
    m = metrics.compute(timeline)
    assert m.kernel_ms == 1889
    assert round(100 * m.utilization, 1) == 51.4
    assert m.reported_utilization == 1.0
    assert m.discrepancy == pytest.approx(1 - 1889 / 3672)
    assert m.overhead_ms == 3672 - 1889


def test_hand_made_two_worker_timeline():
    # worker 1 uploads 0-40 then computes 40-80 (kernel 40-80); worker 2 uploads 30-70,
    # computes 80-100 (kernel 80-100). Window 0-100.
    steps = (
        Span("upload", 1, 0, 40 * MS, bytes=4 << 30),
        Span("compute", 1, 40 * MS, 80 * MS),
        Span("upload", 2, 30 * MS, 70 * MS, bytes=4 << 30),
        Span("compute", 2, 80 * MS, 100 * MS),
    )
    device = (
        kernel(40, 80),
        kernel(80, 100),
        DeviceInterval("memcpy", 0, 40 * MS, bytes=4 << 30),
        DeviceInterval("memset", 95 * MS, 100 * MS),
    )
    m = metrics.compute(Timeline(0, 100 * MS, "cupti", steps, (), device))
    assert m.wall_ms == 100
    assert m.kernel_ms == 60
    assert m.copy_ms == 40
    assert m.busy_ms == 100
    assert m.utilization == pytest.approx(0.6)
    assert m.busy_utilization == 1.0
    assert m.reported_utilization is None and m.discrepancy is None
    # idle is 0-40: 0-30 only worker 1 uploads, 30-40 both upload (split evenly)
    assert m.steps["upload"].idle_ms == pytest.approx(40)
    assert m.steps["compute"].idle_ms == 0
    assert m.unattributed_ms == 0
    assert m.steps["upload"].count == 2
    assert m.steps["upload"].host_ms == 80
    assert m.steps["upload"].host_ms_max == 40
    assert m.steps["upload"].bytes == 8 << 30


def test_nested_steps_charge_the_innermost_and_unattributed_the_rest():
    steps = (
        Span("prestage", 7, 0, 50 * MS, depth=0),
        Span("sync", 7, 10 * MS, 20 * MS, depth=1),
    )
    m = metrics.compute(Timeline(0, 60 * MS, "host", steps, (), (kernel(50, 55),)))
    assert m.steps["sync"].idle_ms == 10
    assert m.steps["prestage"].idle_ms == 40
    assert m.unattributed_ms == 5
    assert m.overhead_ms == 55


def test_copy_bandwidth_comes_from_the_copies_a_step_launched():
    steps = (Span("upload", 1, 0, 30 * MS, span_id=9),)
    device = (DeviceInterval("memcpy", 5 * MS, 25 * MS, bytes=2_000_000_000, pageable=True, span_id=9),)
    step = metrics.compute(Timeline(0, 30 * MS, "cupti", steps, (), device)).steps["upload"]
    assert step.gbps == pytest.approx(100.0)  # 2 GB in 20 ms
    assert step.bytes == 2_000_000_000
    assert step.pageable


def test_nvml_figures_average_the_samples_in_the_window():
    samples = (
        Sample(5, util=0.9, power_w=300, mem_used_bytes=10),
        Sample(15, util=1.0, power_w=500, mem_used_bytes=30),
        Sample(99, util=0.0, power_w=0, mem_used_bytes=99),
    )
    m = metrics.compute(Timeline(0, 20, "cupti", samples=samples))
    assert m.nvml is not None
    assert m.nvml.util_mean == pytest.approx(0.95)
    assert (m.nvml.power_mean_w, m.nvml.power_max_w, m.nvml.mem_used_max_bytes) == (400, 500, 30)
    assert metrics.compute(Timeline(0, 20, "cupti")).nvml is None


def test_a_window_of_no_time_has_no_utilization_not_zero():
    m = metrics.compute(Timeline(5, 5, "host"))
    assert (m.wall_ms, m.utilization, m.overhead_ms, m.kernel_ms) == (0, None, None, None)
    assert m.unseen == metrics.EMPTY_WINDOW


@pytest.fixture(params=["python", "numpy"], scope="module")
def both_paths(request):
    """Plain Python for few intervals, numpy for many: both against the reference."""
    from pytest_gpuprof.analysis import intervals

    saved = intervals.SMALL
    intervals.SMALL = saved if request.param == "python" else 0
    yield
    intervals.SMALL = saved


# property: attribution against a brute-force reference on a grid
def spans_of(draws):
    """Steps as context managers make them: on each thread, opened and closed in LIFO order,
    each given its id when it opens, as ``gpuprof.step`` does."""
    spans, stacks, clock, opened = [], defaultdict(list), 0, 0
    for thread, opens, gap, name in draws:
        clock += gap
        stack = stacks[thread]
        if opens or not stack:
            opened += 1
            stack.append((name, clock, opened))
            continue
        name, start, span_id = stack.pop()
        spans.append(Span(name, thread, start, clock, len(stack), span_id=span_id))
    for thread, stack in stacks.items():
        while stack:
            name, start, span_id = stack.pop()
            spans.append(Span(name, thread, start, clock, len(stack), span_id=span_id))
    return spans


nested_steps = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.booleans(),
        st.integers(0, 4),
        st.sampled_from(["alloc", "upload", "sync", "trim", "compute"]),
    ),
    max_size=16,
).map(spans_of)
kernel_strategy = st.tuples(st.integers(0, GRID), st.integers(0, GRID)).map(
    lambda t: DeviceInterval("kernel", min(t), max(t))
)
# copies and memsets, tied by tag to one of the first steps or to none
transfer_strategy = st.tuples(
    st.integers(0, GRID), st.integers(0, GRID), st.sampled_from(["memcpy", "memset"]), st.integers(0, 6)
).map(lambda t: DeviceInterval(t[2], min(t[:2]), max(t[:2]), span_id=t[3] or None))


# a window's parts: steps, kernels, copies and memsets, and the window's edges
WINDOW = (
    nested_steps,
    st.lists(kernel_strategy, max_size=6),
    st.lists(transfer_strategy, max_size=4),
    st.tuples(st.integers(0, GRID), st.integers(0, GRID)).map(sorted),
)


def brute_force(timeline):
    names = {s.span_id: s.name for s in timeline.steps}
    charged = defaultdict(float)
    unattributed = 0.0
    kernel_time = 0
    for t in range(timeline.start, timeline.end):
        if any(k.start <= t < k.end for k in timeline.device if k.kind == "kernel"):
            kernel_time += 1
            continue
        moving = {
            names[d.span_id]
            for d in timeline.device
            if d.kind != "kernel" and d.span_id in names and d.start <= t < d.end
        }
        if moving:
            for name in moving:
                charged[name] += 1 / len(moving)
            continue
        lanes = defaultdict(list)
        for s in timeline.steps:
            if s.start <= t < s.end:
                lanes[s.thread].append(s)
        if not lanes:
            unattributed += 1
            continue
        for lane in lanes.values():
            inner = max(lane, key=lambda s: (s.depth, s.start, s.span_id))
            charged[inner.name] += 1 / len(lanes)
    return kernel_time, dict(charged), unattributed


@given(*WINDOW)
def test_attribution_matches_brute_force(both_paths, steps, kernels, transfers, window):
    assume(window[1] > window[0])  # a window of no time has no figures (the test above)
    timeline = Timeline(window[0], window[1], "host", tuple(steps), (), (*kernels, *transfers))
    # metrics are in ms; scale back to grid units
    m = metrics.compute(timeline)
    kernel_time, charged, unattributed = brute_force(timeline)
    assert m.kernel_ms * MS == kernel_time
    assert m.utilization == pytest.approx(kernel_time / (window[1] - window[0]))
    assert m.unattributed_ms * MS == pytest.approx(unattributed)
    for name, figures in m.steps.items():
        assert figures.idle_ms * MS == pytest.approx(charged.get(name, 0.0), abs=1e-9)
    total = sum(s.idle_ms for s in m.steps.values()) + m.unattributed_ms
    assert total == pytest.approx(m.overhead_ms, abs=1e-12)


@given(*WINDOW)
def test_the_idle_lane_draws_what_the_metrics_charged(both_paths, steps, kernels, transfers, window):
    from pytest_gpuprof.analysis.lanes import idle_items

    assume(window[1] > window[0])
    timeline = Timeline(window[0], window[1], "host", tuple(steps), (), (*kernels, *transfers))
    m = metrics.compute(timeline)
    stretches = metrics.idle_stretches(timeline)
    drawn = defaultdict(float)
    for s in stretches:
        assert sum(s.shares.values()) == pytest.approx(s.end - s.start)
        for name, ns in s.shares.items():
            drawn[name] += ns
    assert sum(s.end - s.start for s in stretches) == pytest.approx(m.overhead_ms * MS)
    expected = {name: ms * MS for name, ms in m.idle_by_step() if ms}
    assert dict(drawn) == pytest.approx(expected)
    items = idle_items(timeline)
    assert [(i.start, i.end, i.label) for i in items] == [
        (s.start - window[0], s.end - window[0], s.cause) for s in stretches
    ]


@given(nested_steps, st.lists(st.tuples(st.integers(1, 4), st.integers(1, 60)), max_size=12))
def test_work_belongs_to_the_innermost_step_open_on_its_thread_when_issued(steps, calls):
    # issued=0 means "not known"; CUPTI times are never 0
    device = [DeviceInterval("kernel", 0, 1, thread=thread, issued=t) for thread, t in calls]
    expected = []

    def innermost(thread, t):
        open_then = [s for s in steps if s.thread == thread and s.start <= t <= s.end]
        # the rule, ties and zero-length steps included: the latest opened of the steps open
        # then (span ids grow as steps open; a step inside another opened after it)
        return max(open_then, key=lambda s: s.span_id).span_id if open_then else None

    for thread, t in calls:
        expected.append(innermost(thread, t))
    assert attribution.issuers(steps, device) == expected


def test_an_asynchronous_upload_is_charged_for_the_idle_its_copy_caused():
    # The host enqueues a 40 ms copy in 1 ms and moves on to "train", which launches a
    # kernel that waits for the copy: the device idles 40 ms while copying for "upload".
    steps = (
        Span("upload", 11, 0, 1 * MS, span_id=1),
        Span("train", 11, 1 * MS, 60 * MS, span_id=2),
    )
    device = (
        DeviceInterval("memcpy", 0, 40 * MS, bytes=4_000_000_000, thread=11, issued=MS // 2),
        DeviceInterval("kernel", 40 * MS, 60 * MS, thread=11, issued=2 * MS),
    )
    m = metrics.compute(Timeline(0, 60 * MS, "cupti", steps, (), device))
    assert m.steps["upload"].idle_ms == 40
    assert m.steps["train"].idle_ms == 0
    assert m.steps["upload"].gbps == pytest.approx(100.0)  # 4 GB over the copy's 40 ms, not the 1 ms step
    assert m.steps["upload"].bytes == 4_000_000_000


def test_declared_bytes_are_compared_with_what_was_copied():
    steps = (Span("upload", 1, 0, 10 * MS, span_id=1, bytes=1000),)
    device = (DeviceInterval("memcpy", 0, 5 * MS, bytes=600, span_id=1),)
    m = metrics.compute(Timeline(0, 10 * MS, "cupti", steps, (), device))
    assert m.steps["upload"].bytes == 600
    assert any("declared 1,000 bytes" in n and "moved 600" in n for n in m.notes)


def test_events_that_saw_nothing_measure_nothing_not_zero():
    steps = (Span("train", 1, 0, 10 * MS, span_id=1),)
    m = metrics.compute(Timeline(0, 10 * MS, "events", steps))
    assert m.utilization is None and m.kernel_ms is None and m.overhead_ms is None
    assert m.unseen and "not measured" in m.notes[-1]
    assert m.steps["train"].idle_ms is None
    assert "utilization" not in m.flat() and m.flat()["wall_ms"] == 10
    assert metrics.compute(Timeline(0, 10 * MS, "cupti", steps)).utilization == 0.0  # CUPTI saw every stream


def test_aggregate_takes_per_metric_medians_and_keeps_the_samples():
    rounds = [
        metrics.compute(Timeline(0, wall * MS, "host", (Span("compute", 1, 0, wall * MS),), (), (kernel(0, k),)))
        for wall, k in ((10, 5), (10, 8), (20, 5))
    ]
    m = aggregate(rounds)
    assert m.wall_ms == 10
    assert m.kernel_ms == 5
    assert m.utilization == pytest.approx(0.5)
    assert m.rounds["utilization"].samples == pytest.approx((0.5, 0.8, 0.25))
    assert m.rounds["utilization"].min == 0.25 and m.rounds["utilization"].max == 0.8
    assert m.rounds["wall_ms"].iqr == pytest.approx(5.0)
    assert m.steps["compute"].host_ms == 10
    assert m.flat()["steps.compute.idle_ms"] == pytest.approx(5.0)


def test_copies_without_a_tag_belong_to_the_step_open_on_their_stream():
    steps = (
        Span("upload", 1, 0, 30 * MS, span_id=1, stream=5),
        Span("upload", 2, 0, 30 * MS, span_id=2, stream=6),
        Span("compute", 1, 30 * MS, 60 * MS, span_id=3, stream=7),
    )
    device = (
        DeviceInterval("memcpy", 1 * MS, 21 * MS, stream=5, bytes=1_000_000_000),
        DeviceInterval("memcpy", 2 * MS, 12 * MS, stream=6, bytes=1_000_000_000),
        DeviceInterval("memcpy", 40 * MS, 50 * MS, stream=9, bytes=7),  # no step on stream 9
    )
    m = metrics.compute(Timeline(0, 60 * MS, "cupti", steps, (), device))
    assert m.steps["upload"].bytes == 2_000_000_000
    assert m.steps["upload"].gbps == pytest.approx(2e9 / 20e6)  # union of the two copies: 20 ms
    assert m.steps["compute"].bytes == 0


@pytest.mark.parametrize(
    ("truth", "kernels", "every_us", "noted"),
    [
        ("cupti", 2_000, 6, True),  # a storm of tiny kernels: tracing is a good part of it
        ("cupti", 2_000, 20, False),  # kernels long enough that 2 us a launch is noise
        ("cupti", 500, 6, False),  # too few launches to matter
        ("host", 2_000, 6, False),  # no CUPTI, no tracing cost
    ],
)
def test_a_launch_bound_window_under_cupti_says_tracing_slows_it(truth, kernels, every_us, noted):
    every = every_us * 1_000
    device = tuple(DeviceInterval("kernel", i * every, i * every + 1_000, name="tiny") for i in range(kernels))
    m = metrics.compute(Timeline(0, kernels * every, truth, device=device))
    notes = [n for n in m.notes if "CUPTI's tracing" in n]
    assert len(notes) == noted
    if noted:
        assert notes[0].startswith(f"{kernels:,} kernels, one every {every_us:.1f} us")


def test_a_device_to_device_copy_never_sets_a_steps_host_bandwidth():
    # torch.compile's graph replays copy each input device to device: 125.8 MB at 1,790 GB/s
    # was shown as the step's bandwidth
    steps = (Span("infer", 1, 0, 10 * MS, span_id=1),)
    device = (
        DeviceInterval("memcpy", 0, 1 * MS, name="DTOD", bytes=1_000_000_000, span_id=1),
        DeviceInterval("memcpy", 1 * MS, 3 * MS, name="HTOD", bytes=100_000_000, span_id=1),
        DeviceInterval("memcpy", 3 * MS, 4 * MS, name="DTOH", bytes=20_000_000, span_id=1),
        DeviceInterval("kernel", 4 * MS, 10 * MS, span_id=1),
    )
    step = metrics.compute(Timeline(0, 10 * MS, "cupti", steps, (), device)).steps["infer"]
    assert step.bytes == 120_000_000
    assert step.gbps == pytest.approx(120_000_000 / (3 * MS))
    assert step.copies == {
        "h2d": {"bytes": 100_000_000, "gbps": pytest.approx(50.0)},
        "d2h": {"bytes": 20_000_000, "gbps": pytest.approx(20.0)},
        "d2d": {"bytes": 1_000_000_000, "gbps": pytest.approx(1000.0)},
    }


def test_work_from_threads_that_opened_no_step_is_counted_apart_and_said_so():
    # JAX issues a device_put's copy from its runtime threads, when they get to it: not
    # the step open then, which is often the next one
    copy = DeviceInterval("memcpy", 1 * MS, 4 * MS, name="HTOD", bytes=64 << 20, thread=77, issued=1 * MS)
    kernel = DeviceInterval("kernel", 6 * MS, 9 * MS, thread=1, issued=5 * MS + 1)
    steps = (Span("upload", 1, 0, 5 * MS, span_id=1), Span("compute", 1, 5 * MS, 10 * MS, span_id=2))
    m = metrics.compute(Timeline(0, 10 * MS, "cupti", steps, (), (copy, kernel)))
    assert m.steps["upload"].bytes == 0 and m.copy_ms == 3.0
    assert any(
        n.startswith("1 copies (67,108,864 bytes) and 0 kernels came from 1 thread(s) that opened no step")
        for n in m.notes
    )
    alone = metrics.compute(Timeline(0, 10 * MS, "cupti", steps, (), (kernel,)))
    assert not any("opened no step" in n for n in alone.notes)


@given(nested_steps)
def test_properly_nested_steps_are_never_called_interleaved(steps):
    assert attribution.interleaved_note(steps) is None


def test_steps_of_one_thread_that_overlap_without_nesting_are_said():
    # three asyncio tasks on one thread: each opens its step, then they close in turn
    a = Span("a", 1, 0, 7, depth=0, span_id=1)
    b = Span("b", 1, 0, 9, depth=1, span_id=2)
    c = Span("c", 1, 0, 12, depth=2, span_id=3)
    note = attribution.interleaved_note([a, b, c])
    assert note is not None and note.startswith("steps 'a' and 'b' of one thread overlap without nesting")
    assert attribution.interleaved_note([Span("a", 1, 0, 7), Span("b", 2, 3, 9)]) is None  # two threads
    m = metrics.compute(Timeline(0, 12, "host", (a, b, c)))
    assert note in m.notes


def test_the_idle_lane_blames_the_copy_not_a_step_open_on_another_thread():
    from pytest_gpuprof.analysis import metrics
    from pytest_gpuprof.analysis.lanes import idle_items
    from pytest_gpuprof.analysis.model import DeviceInterval, Span
    from pytest_gpuprof.analysis.timeline import Timeline

    ms = 1_000_000
    steps = (Span("upload", 1, 0, 1 * ms, span_id=1), Span("sync", 2, 0, 10 * ms, span_id=2))
    device = (
        DeviceInterval("memcpy", 1 * ms, 10 * ms, bytes=1 << 20, span_id=1),
        DeviceInterval("kernel", 10 * ms, 11 * ms),
    )
    timeline = Timeline(0, 11 * ms, "host", steps, (), device)
    m = metrics.compute(timeline)
    drawn = {}
    for item in idle_items(timeline):
        for name, charged in item.args["charged_ms"].items():
            drawn[name] = drawn.get(name, 0.0) + charged
    assert m.steps["upload"].idle_ms == pytest.approx(9.5)
    assert drawn == pytest.approx({name: ms_ for name, ms_ in m.idle_by_step() if ms_})
