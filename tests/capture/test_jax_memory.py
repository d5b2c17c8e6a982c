"""JAX's device memory under its own pool, from its allocator's statistics: one peak for
the whole process, never reset. A window's and a step's peak are exact where the process's
peak rose inside them, and otherwise a range that must hold the true peak (checked against
a replay of every allocation); a budget is judged where the range lies on one side of it,
and where it does not, says so with the range."""

from __future__ import annotations

import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import memory as memory_mod
from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.model import MemoryLog, MemoryMark, Span
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.capture import jax_memory
from pytest_gpuprof.capture.memory import Discovery, MemoryTracker
from pytest_gpuprof.capture.memory_sources import Reading
from pytest_gpuprof.output.text import describe_breach, explain_memory
from pytest_gpuprof.verdict.budget import Budget, StepBudget, evaluate, not_measured


class Device:
    """A JAX device as its allocator counts: what is in use, and the most ever in use."""

    def __init__(self, held=0, peak=0, stats=True):
        self.held, self.peak, self.stats = held, max(peak, held), stats
        self.arrays = []

    def alloc(self, nbytes):
        self.held += nbytes
        self.peak = max(self.peak, self.held)
        self.arrays.append(nbytes)

    def free(self, index):
        if self.arrays:
            self.held -= self.arrays.pop(index % len(self.arrays))

    def memory_stats(self):
        if not self.stats:
            return None
        return {
            "bytes_in_use": self.held,
            "peak_bytes_in_use": self.peak,
            "pool_bytes": 1 << 30,
            "bytes_limit": 1 << 30,
        }


# a program inside one window: allocate, free an array, open or close a step
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 10_000)),
        st.tuples(st.just("free"), st.integers(0, 50)),
        st.tuples(st.just("enter"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("exit"), st.just(0)),
    ),
    max_size=30,
)


def run(program, device):
    """The program under a tracker reading ``device``'s statistics, with a mark at every
    edge as the plugin takes them; and the brute force: what was held after each
    operation, with the steps open then."""
    open_, spans = [], []
    tracker = MemoryTracker(lambda tick: [] if tracker.sources else [jax_memory.JaxStats(device)], lambda: tuple(open_))
    base = device.held
    first = tracker.mark(0)
    history = [(device.held, ())]
    names = {}
    for kind, arg in program:
        if kind == "alloc":
            device.alloc(arg)
        elif kind == "free":
            device.free(arg)
        elif kind == "enter":
            span_id = len(names) + 1
            names[span_id] = arg
            open_.append(span_id)
            tracker.mark(0, step=True)
        elif kind == "exit" and open_:
            span_id = open_.pop()
            spans.append(Span(names[span_id], 1, 0, 0, len(open_), span_id))
            tracker.mark(0, step=True)
        history.append((device.held, tuple(names[i] for i in open_)))
    spans += [Span(names[i], 1, 0, 0, depth, i) for depth, i in enumerate(open_)]
    log = tracker.log(first, tracker.mark(0))
    return log, tuple(spans), base, history


@given(ops, st.integers(0, 5000), st.integers(0, 20_000))
def test_a_peak_from_the_process_peak_is_exact_where_it_rose_and_a_true_range_elsewhere(program, held, earlier):
    device = Device(held, held + earlier)
    before = device.peak
    log, spans, base, history = run(program, device)
    got, step_peaks = memory_mod.compute(log, spans)
    true = max(h for h, _ in history) - base
    lo, hi = got.bounds.get("memory.peak_bytes", (got.peak_bytes, got.peak_bytes))
    assert lo <= true <= hi
    if device.peak > before:  # the process's peak rose in the window: its peak is exact
        assert got.peak_bytes == true and "memory.peak_bytes" not in got.bounds
    if got.peak_bytes is None:
        assert got.peak_step is None
    previous = [history[0], *history]
    for name in {s.name for s in spans}:
        during = [h - base for (h, _), (_, open_) in zip(previous, history, strict=False) if name in open_]
        during += [h - base for h, open_ in history if name in open_]
        true_step = max([0, *during])
        lo, hi = got.bounds.get(f"steps.{name}.memory_peak_bytes", (step_peaks[name], step_peaks[name]))
        assert lo <= true_step <= hi
    assert got.leaked_bytes == max(history[-1][0] - base, 0)
    assert "no allocation or its place is seen" in got.note


def bounded(lo, hi, step=None):
    """A window's figures whose peak (or its step's) lies between ``lo`` and ``hi``."""
    spans = (Span(step, 1, 0, 100, span_id=1),) if step else ()
    marks = (MemoryMark(0, 0, 0, 0, open=(1,) if step else ()), MemoryMark(1, 100, 0, hi, peak_low=lo))
    return metrics.compute(Timeline(0, 100, "host", spans, memory=MemoryLog("jax", marks, None, jax_memory.STATS)))


@pytest.mark.parametrize(
    ("budget", "key"),
    [(Budget(max_memory=999), "max_memory"), (Budget(steps={"s": StepBudget(max_memory=999)}), "steps.s.max_memory")],
)
def test_a_range_breaches_where_its_least_exceeds_the_limit_and_keeps_it_where_its_most_does_not(budget, key):
    below, above, across = bounded(10, 999, "s"), bounded(1000, 5000, "s"), bounded(10, 5000, "s")
    assert evaluate(budget, below) == [] and not_measured(budget, below) == []
    (breach,) = evaluate(budget, above)
    assert breach.key == key and breach.value == 1000 and "between 1,000 and 5,000" in breach.detail
    assert describe_breach(breach) == f"{breach.metric} at least 1000 B (1,000 B) > 999 B (999 B) ({key})"
    assert not_measured(budget, above) == []
    assert evaluate(budget, across) == []
    (why,) = not_measured(budget, across)
    assert why.startswith(f"{key} not measured: it lies between 10 and 5,000 bytes")


def test_a_range_reads_as_one_in_the_json_never_as_a_figure():
    m = bounded(10, 5000, "s")
    assert m.memory.peak_bytes is None and m.steps["s"].memory_peak_bytes is None
    assert m.memory.to_dict()["bounds"] == {"memory.peak_bytes": [10, 5000], "steps.s.memory_peak_bytes": [10, 5000]}


@pytest.fixture
def jax(monkeypatch):
    """JAX with its CUDA backend started, on one device, under its default pool."""
    device = Device(64, 1 << 20)
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backends = {"cuda": object()}
    module = types.ModuleType("jax")
    module.local_devices = lambda: [device]
    monkeypatch.setitem(sys.modules, "jax", module)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    return device


class Cupy:
    name, sees_each, note = "cupy", False, None

    def read(self):
        return Reading(100, 100)

    def edge(self, seq, *, step=False):
        pass

    def settle(self, step_of):
        return None

    def forget(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("gated", [False, True])
def test_jax_pool_is_read_from_its_statistics_beside_the_other_frameworks(jax, gated):
    tracker = MemoryTracker(Discovery())
    if gated:
        tracker.see_each()
    tracker.sources.append(Cupy())  # found before JAX started: kept, its pool is its own
    first = tracker.mark(0)
    jax.alloc(2 << 20)  # above the process's earlier peak: exact
    log = tracker.log(first, tracker.mark(1))
    got, _ = memory_mod.compute(log, ())
    assert tracker.name == "cupy+jax" and got.peak_bytes == 2 << 20 and got.bounds == {}
    jax.free(0)
    first = tracker.mark(2)
    jax.alloc(1 << 20)  # under the process's peak, now 2 MiB more than the 64 bytes held
    got, _ = memory_mod.compute(tracker.log(first, tracker.mark(3)), ())
    assert got.peak_bytes is None and got.bounds == {"memory.peak_bytes": (1 << 20, 2 << 20)}


def test_jax_without_statistics_reads_not_measured_with_the_way_to_measure_it(jax):
    jax.stats = False
    tracker = MemoryTracker(Discovery())
    first = tracker.mark(0)
    assert tracker.log(first, tracker.mark(1)) is None
    assert tracker.why.startswith("JAX preallocated most of the device for its pool")
    assert "keeps no statistics" in tracker.why and "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in tracker.why


def test_a_range_reads_as_one_in_the_message():
    wide = explain_memory(bounded(10 << 20, 500 << 20), [], always=True)
    assert wide[0].startswith("device memory: peak between 10.0 MiB and 500.0 MiB over the window's start")
    narrow = explain_memory(bounded(576 << 20, (576 << 20) + 256), [], always=True)
    assert narrow[0].startswith("device memory: peak 576.0 MiB (to within 256 B) over the window's start")


def test_the_report_schema_takes_a_range_and_refuses_a_malformed_one():
    import jsonschema

    from pytest_gpuprof.output import schema

    memory = schema.report_schema()["$defs"]["test"]["properties"]["metrics"]["properties"]["memory"]
    good = bounded(10, 5000, "s").memory.to_dict()
    jsonschema.validate(good, memory)
    bad = {**good, "bounds": {"memory.peak_bytes": [10, 20, 30]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, memory)


def test_the_page_shows_a_steps_range_where_its_peak_is_one():
    from pytest_gpuprof.output.html import page_data
    from pytest_gpuprof.verdict.record import GpuRecord

    data = page_data(GpuRecord("t.py::test", bounded(10 << 20, 500 << 20, "s"), Budget(), [], enforced=True), None)
    step = data["steps"]["s"]
    assert step["memory_peak_bytes"] is None and step["memory_peak_range"] == (10 << 20, 500 << 20)
    assert any(line.startswith("device memory: peak between 10.0 MiB and 500.0 MiB") for line in data["explain"])


def test_the_memory_lane_draws_a_range_at_its_least_never_the_process_peak():
    from pytest_gpuprof.analysis.lanes import memory_counter

    marks = (MemoryMark(0, 0, 0, 0), MemoryMark(1, 100, 0, 900 << 20, peak_low=300 << 20))
    counter = memory_counter(Timeline(0, 100, "host", memory=MemoryLog("jax", marks, None, jax_memory.STATS)))
    assert max(v for _, v in counter.points) == 300


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000), st.booleans()), min_size=1, max_size=5))
def test_rounds_take_the_most_of_every_rounds_range(rounds):
    """Each round's step peak exact or a range; over the rounds, the least and the most the
    highest can be: a brute force over every round's own."""
    from pytest_gpuprof.analysis.rounds import aggregate

    made = []
    for a, b, exact in rounds:
        lo, hi = sorted((a, b))
        made.append(bounded(hi, hi, "s.1") if exact else bounded(lo, hi, "s.1"))
    got = aggregate(made)
    lows = [hi if exact else min(a, b) for a, b, exact in rounds for hi in [max(a, b)]]
    highs = [max(a, b) for a, b, _ in rounds]
    want = (max(lows), max(highs))
    for path, figure in [
        ("memory.peak_bytes", got.memory.peak_bytes),
        ("steps.s.1.memory_peak_bytes", got.steps["s.1"].memory_peak_bytes),
    ]:
        if want[0] == want[1]:
            assert figure == want[0] and path not in got.memory.bounds
        else:
            assert figure is None and got.memory.bounds[path] == want


def test_statistics_that_cannot_be_read_leave_the_window_not_measured_and_say_why(jax):
    tracker = MemoryTracker(Discovery())
    first = tracker.mark(0)

    def gone():
        raise RuntimeError("backend shut down")

    jax.memory_stats = gone
    assert tracker.log(first, tracker.mark(1)) is None
    assert tracker.why == "JAX's memory statistics could not be read (RuntimeError: backend shut down)"
