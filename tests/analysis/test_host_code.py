"""What the host ran during the unattributed idle: the pure charging, against a brute-force
reference on a grid of whole nanoseconds."""

from collections import defaultdict

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import attribution, host_code, metrics
from pytest_gpuprof.analysis.model import DeviceInterval, HostSample, Span
from pytest_gpuprof.analysis.rounds import aggregate
from pytest_gpuprof.analysis.timeline import Timeline
from tests.analysis.test_metrics import WINDOW, brute_force

GRID = 60
PLACES = ["test_a.py:3 f > lib/x.py:load", "test_a.py:9 g", "queue.py:get"]

rounds = st.lists(
    st.tuples(st.integers(0, GRID), st.lists(st.tuples(st.integers(1, 3), st.sampled_from(PLACES)), max_size=3)),
    max_size=8,
)


def samples_of(drawn):
    """One sample per thread a round saw (a round stamps every thread at one instant)."""
    out = []
    for time, seen in {t: s for t, s in drawn}.items():
        for thread, where in dict(seen).items():
            out.append(HostSample(time, thread, where))
    return out


def disjoint(points):
    points = sorted(set(points))
    return [(a, b) for a, b in zip(points[::2], points[1::2], strict=False)]


def reference(samples, idle, threads, reach):
    """Each grid unit of idle, charged to the first round after it that saw a sampled
    thread, if it lies within that round's reach."""
    by_round = defaultdict(list)
    for s in samples:
        if threads is None or s.thread in threads:
            by_round[s.time].append(s.where)
    times = sorted(by_round)
    out = defaultdict(float)
    for a, b in idle:
        for t in range(a, b):
            after = [r for r in times if r > t]
            if not after:
                continue
            r = after[0]
            if t < r - reach:
                continue
            for where in by_round[r]:
                out[where] += 1 / len(by_round[r])
    return dict(out)


@given(
    rounds.map(samples_of),
    st.lists(st.integers(0, GRID), max_size=10).map(disjoint),
    st.one_of(st.none(), st.sets(st.integers(1, 3))),
    st.integers(1, GRID),
)
def test_idle_by_code_matches_brute_force(samples, idle, threads, reach):
    got = host_code.totals(host_code.pieces(samples, idle, threads, reach))
    assert dict(got) == pytest.approx(reference(samples, idle, threads, reach))
    assert [ns for _, ns in got] == sorted((ns for _, ns in got), reverse=True)
    pieces = host_code.pieces(samples, idle, threads, reach)
    for piece in pieces:  # each piece lies in the idle and its shares add up to it
        assert any(a <= piece.start and piece.end <= b for a, b in idle)
        assert sum(piece.shares.values()) == pytest.approx(piece.end - piece.start)
    assert [p.start for p in pieces] == sorted(p.start for p in pieces)


def test_the_idle_is_charged_to_where_the_thread_was_at_the_round_that_ends_it():
    samples = [HostSample(10, 1, "a"), HostSample(20, 1, "b"), HostSample(20, 2, "c"), HostSample(40, 7, "x")]
    # thread 7 is not one that issues work: its round at 40 is no round, and the idle
    # after the last round stays unexplained
    got = host_code.totals(host_code.pieces(samples, [(0, 15), (18, 30)], {1, 2}, reach=1_000))
    assert got == [("a", 10.0), ("b", 3.5), ("c", 3.5)]
    # a round reaches no further back than ``reach``: the sampler was held off
    assert host_code.totals(host_code.pieces(samples, [(10, 20)], {1}, reach=4)) == [("b", 4.0)]


@given(*WINDOW)
def test_unattributed_stretches_are_what_attribution_leaves_unattributed(steps, kernels, transfers, window):
    timeline = Timeline(window[0], window[1], "host", tuple(steps), (), (*kernels, *transfers))
    stretches = metrics.idle_stretches(timeline)
    expected = [(s.start, s.end) for s in stretches if set(s.shares) == {attribution.UNATTRIBUTED}]
    seen = metrics._whatif_window(timeline)
    got = attribution.unattributed(timeline.steps, seen.idle, metrics._transfers(seen))
    assert got == expected


@given(*WINDOW, rounds.map(samples_of))
def test_a_window_names_the_host_code_of_exactly_its_unattributed_idle(steps, kernels, transfers, window, samples):
    assume(window[1] > window[0])  # a window of no time has no figures
    timeline = Timeline(
        window[0], window[1], "host", tuple(steps), (), (*kernels, *transfers), stacks=tuple(samples), thread=1
    )
    m = metrics.compute(timeline)
    *_, unattributed = brute_force(timeline)
    threads = {s.thread for s in steps} | {1}
    ms = 1_000_000
    named = sum(v for _, v in m.idle_by_code) * ms
    assert named <= m.unattributed_ms * ms + 1e-6
    if unattributed == 0:
        assert m.idle_by_code == ()
        return
    seen = metrics._whatif_window(timeline)
    idle = attribution.unattributed(timeline.steps, seen.idle, metrics._transfers(seen))
    want = reference(samples, idle, threads, host_code.REACH_NS)
    assert {w: v * ms for w, v in m.idle_by_code} == pytest.approx(want)


def test_not_sampled_is_none_and_sampled_rounds_take_medians():
    kernel = DeviceInterval("kernel", 0, 10)
    plain = metrics.compute(Timeline(0, 30, "host", (), (), (kernel,)))
    assert plain.idle_by_code is None and "idle_by_code" not in plain.to_dict()
    ms = 1_000_000
    rounds = []
    for spent in (4, 6, 20):
        stacks = (
            HostSample((10 + spent) * ms, 1, "test_x.py:5 epoch > lib/loader.py:next"),
            HostSample(30 * ms, 1, "b"),
        )
        timeline = Timeline(
            0, 30 * ms, "host", (), (), (DeviceInterval("kernel", 0, 10 * ms),), stacks=stacks, thread=1
        )
        rounds.append(metrics.compute(timeline))
    assert rounds[0].to_dict()["idle_by_code"] == [
        {"where": "b", "ms": 16.0},
        {"where": "test_x.py:5 epoch > lib/loader.py:next", "ms": 4.0},
    ]
    joined = aggregate(rounds)
    assert joined.idle_by_code == (("b", 14.0), ("test_x.py:5 epoch > lib/loader.py:next", 6.0))


def test_steps_explain_their_own_idle_and_stacks_only_the_rest():
    ms = 1_000_000
    step = Span("upload", 1, 10 * ms, 20 * ms)
    stacks = tuple(HostSample(t * ms, 1, "inside" if 10 < t <= 20 else "outside") for t in range(5, 35, 5))
    timeline = Timeline(0, 30 * ms, "host", (step,), (), (), stacks=stacks, thread=1)
    m = metrics.compute(timeline)
    assert m.unattributed_ms == 20.0
    assert m.idle_by_code == (("outside", 20.0),)
