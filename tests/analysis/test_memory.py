"""Device memory: the peak over a window and per step against a brute-force replay of the
allocations, the budgets on it (every key must be able to fail), sizes with units, and the
plugin end to end on the host backend, whose pool tells of each allocation."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import descriptors, metrics
from pytest_gpuprof.analysis import memory as memory_mod
from pytest_gpuprof.analysis.model import Allocation, MemoryLog, MemoryMark, Span
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.verdict.budget import Budget, BudgetError, StepBudget, evaluate, not_measured, parse_budget

MIB = 1 << 20

# a program: allocate, free an earlier allocation, open or close a step
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 10_000)),
        st.tuples(st.just("free"), st.integers(0, 50)),
        st.tuples(st.just("enter"), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("exit"), st.just(0)),
    ),
    max_size=40,
)


def replay(program, held_before=0):
    """Run ``program`` as a counted source would see it: marks at the window's and the
    steps' edges (each with the peak since the one before and the steps open after it),
    allocations, steps. Also the brute force: the held bytes after every operation, with
    the steps open then (names, and the innermost)."""
    seq, held, peak, peak_seq = 0, held_before, held_before, None
    marks, live, done, steps, open_ = [], {}, [], [], []
    history = []

    def tick():
        nonlocal seq
        seq += 1
        return seq

    def mark():
        nonlocal peak, peak_seq
        marks.append(MemoryMark(tick(), 0, held, peak, peak_seq, open=tuple(i for _, i, _ in open_)))
        peak, peak_seq = held, None

    mark()
    for kind, arg in program:
        if kind == "alloc":
            at = tick()
            held += arg
            live[at] = Allocation(at, None, arg, f"line {at}", open_[-1][1] if open_ else None)
            if held > peak:
                peak, peak_seq = held, at
        elif kind == "free" and live:
            a = live.pop(sorted(live)[arg % len(live)])
            held -= a.nbytes
            done.append(a._replace(end_seq=tick()))
        elif kind == "enter":
            open_.append((arg, len(steps) + len(open_) + 1, len(open_)))
            mark()
        elif kind == "exit" and open_:
            name, span_id, depth = open_.pop()
            steps.append(Span(name, 1, 0, 0, depth, span_id))
            mark()
        history.append((held, tuple(n for n, _, _ in open_), open_[-1][0] if open_ else None))
    for name, span_id, depth in reversed(open_):
        steps.append(Span(name, 1, 0, 0, depth, span_id))
    mark()
    log = MemoryLog("counted", tuple(marks), (*done, *live.values()))
    return log, tuple(steps), history, live


@given(ops, st.integers(0, 5000))
def test_peaks_per_window_and_step_match_a_replay_of_every_allocation(program, before):
    log, steps, history, live = replay(program, before)
    got, step_peaks = memory_mod.compute(log, steps)
    assert got is not None
    expected = max([before, *(h for h, _, _ in history)]) - before
    assert got.peak_bytes == expected
    assert got.leaked_bytes == sum(a.nbytes for a in live.values())
    previous = [(before, (), None), *history]
    for name in {s.name for s in steps}:
        # held while the step was open: after each operation inside it, and as it opened
        during = [h - before for (h, _, _), (_, names, _) in zip(previous, history, strict=False) if name in names]
        during += [h - before for h, names, _ in history if name in names]
        assert step_peaks.get(name, 0) == max([0, *during])
    if expected > 0:  # the innermost step open when the peak was first reached
        first = next(i for i, (h, _, _) in enumerate(history) if h - before == expected)
        assert got.peak_step == history[first][2]
    else:  # never more than the window began with: no peak, so no step reached it
        assert got.peak_step is None and got.peak_within == ()


@given(ops, st.integers(0, 5000), st.sets(st.integers(0, 50)), st.integers(0, 3000))
def test_a_leak_is_what_the_window_kept_and_the_call_still_holds_at_its_end(program, before, frees, extra):
    """After the window, before the call ends, the test frees some of what the window kept
    (``frees``) and allocates ``extra`` bytes: the window's leak, and each step's, is what
    it kept that is still live (a brute force over the program); read by the counters
    alone, never less than that and never more than the window's own figure."""
    log, steps, history, live = replay(program, before)
    m, _ = memory_mod.compute(log, steps)
    assert m is not None
    made = sorted((*live.values(), *(a for a in log.allocations if a.end_seq is not None)), key=lambda a: a.seq)
    open_names = [names for (kind, _), (_, names, _) in zip(program, history, strict=True) if kind == "alloc"]
    names_of = {a.seq: set(names) for a, names in zip(made, open_names, strict=True)}
    order = sorted(live)
    gone = {order[i % len(order)] for i in frees} if order else set()
    still = {seq: a for seq, a in live.items() if seq not in gone}
    held = before + sum(a.nbytes for a in still.values()) + extra
    exact = memory_mod.at_call_end(m, memory_mod.Live(frozenset(still) | {10_000}, held))
    assert exact.leaked_bytes == sum(a.nbytes for a in still.values())
    for name in {s.name for s in steps}:
        assert exact.step_leaks[name] == sum(a.nbytes for seq, a in still.items() if name in names_of[seq])
    assert sum(h.nbytes for h in exact.leaks) == exact.leaked_bytes
    counted = memory_mod.at_call_end(replace(m, kept=None), memory_mod.Live(None, held))
    assert exact.leaked_bytes <= counted.leaked_bytes <= m.leaked_bytes
    if extra == 0:
        assert counted.leaked_bytes == exact.leaked_bytes


# a conftest's fixture that holds buffers past the test's call: freed in its teardown
KEPT = """
import pytest

@pytest.fixture
def kept():
    held = []
    yield held
    held.clear()
"""

LEAKS_AT_THE_CALLS_END = """
import pytest

@pytest.mark.gpu_budget(max_leaked_bytes=0, steps={"fill": {"max_leaked_bytes": 0}})
def test_freed_before_the_call_ends(gpuprof, gpu_workload):
    held = []
    def body():
        with gpuprof.step("fill"):
            held.append(gpu_workload.alloc(4096))
    def tidy():
        with gpuprof.step("fill"):
            scratch = gpu_workload.alloc(2048)
            del scratch
    gpuprof.measure(body, rounds=3, warmup=0)  # each round keeps 4 KiB, past its window
    between = gpu_workload.alloc(8192)  # whatever comes between: an allocation, another window
    gpuprof.measure(tidy, rounds=1, warmup=0)
    del between
    held.clear()

@pytest.mark.gpu_budget(max_leaked_bytes=0, steps={"fill": {"max_leaked_bytes": 0}})
def test_held_past_the_call_fails(gpuprof, gpu_workload, kept):
    def body():
        with gpuprof.step("fill"):
            kept.append(gpu_workload.alloc(4096))
    gpuprof.measure(body, rounds=3, warmup=0)

@pytest.mark.gpu_budget(max_leaked_bytes=0)
def test_of_two_windows_the_one_still_held_fails(gpuprof, gpu_workload, kept):
    first = []
    gpuprof.measure(lambda: first.append(gpu_workload.alloc(4096)), rounds=1, warmup=0)
    gpuprof.measure(lambda: kept.append(gpu_workload.alloc(8192)), rounds=1, warmup=0)
    first.clear()
"""


def test_a_window_whose_buffers_the_call_freed_passes_max_leaked_bytes_0(pytester):
    """A test that allocated in a step and freed the buffer before its call ended passes
    ``max_leaked_bytes=0`` (the window's and the step's), whatever came between; of two
    windows, the one whose buffer the call still held fails, with its bytes only."""
    pytester.makeconftest(KEPT)
    pytester.makepyfile(test_leaks=LEAKS_AT_THE_CALLS_END)
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_held_past_the_call_fails*memory.leaked_bytes 4.0 KiB (4,096 B) > 0 B (0 B) (max_leaked_bytes)*",
            "*test_of_two_windows_the_one_still_held_fails*memory.leaked_bytes 8.0 KiB (8,192 B) > 0 B*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*steps.fill.leaked_bytes 4.0 KiB (4,096 B) > 0 B (0 B) (steps.fill.max_leaked_bytes)*"]
    )
    assert "(window 'measure', 1 of 2)" not in result.stdout.str()  # the window whose buffer the call freed
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    freed = tests["test_freed_before_the_call_ends"]
    assert freed["outcome"] == "passed" and freed["windows"] == 2
    assert freed["metrics"]["memory"]["leaked_bytes"] == 0
    assert tests["test_held_past_the_call_fails"]["metrics"]["steps"]["fill"]["leaked_bytes"] == 4096
    assert tests["test_of_two_windows_the_one_still_held_fails"]["metrics"]["memory"]["leaked_bytes"] == 8192


def test_the_largest_allocations_live_at_the_peak_and_the_leaks_by_step():
    program = [("enter", "load"), ("alloc", 300), ("alloc", 100), ("exit", 0), ("free", 0)]
    program += [("enter", "train"), ("alloc", 50), ("exit", 0)]
    log, steps, _, _ = replay(program)
    got, _ = memory_mod.compute(log, steps)
    assert got.peak_bytes == 400 and got.peak_step == "load"
    assert [(h.nbytes, h.step) for h in got.largest] == [(300, "load"), (100, "load")]
    assert [(h.nbytes, h.step) for h in got.leaks] == [(100, "load"), (50, "train")]
    assert got.leaked_bytes == 150


def _window(peak, steps=(), step_peak=None):
    """A window whose memory marks say ``peak`` bytes over its start."""
    spans = tuple(Span(name, 1, 0, 100, span_id=i + 1) for i, name in enumerate(steps))
    opened = tuple(s.span_id for s in spans)
    marks = (MemoryMark(0, 0, 0, 0, open=opened), MemoryMark(1, 100, 0, peak, None, 2 * peak, 2 * peak))
    return metrics.compute(Timeline(0, 100, "host", spans, memory=MemoryLog("host", marks, ())))


@pytest.mark.parametrize(
    ("budget", "key"),
    [
        (Budget(max_memory=999), "max_memory"),
        (Budget(steps={"s": StepBudget(max_memory=999)}), "steps.s.max_memory"),
    ],
)
def test_every_memory_key_fails_when_breached_and_passes_under_its_limit(budget, key):
    assert [b.key for b in evaluate(budget, _window(1000, ["s"]))] == [key]
    assert evaluate(budget, _window(999, ["s"])) == []


def test_max_leaked_bytes_fails_a_window_that_kept_memory():
    marks = (MemoryMark(0, 0, 0, 0), MemoryMark(2, 100, 64, 64))
    kept = metrics.compute(Timeline(0, 100, "host", memory=MemoryLog("host", marks, (Allocation(1, None, 64, "x"),))))
    assert kept.memory.leaked_bytes == 64
    assert [b.key for b in evaluate(Budget(max_leaked_bytes=0), kept)] == ["max_leaked_bytes"]
    assert evaluate(Budget(max_leaked_bytes=64), kept) == []


def test_a_steps_leak_is_what_it_and_the_steps_inside_it_kept_and_max_leaked_bytes_judges_it():
    """``max_leaked_bytes`` per step (it was refused as an unknown key): a budget on an outer
    step sees what the steps nested in it kept; a step that freed what it made passes 0."""
    program = [("enter", "outer"), ("enter", "inner"), ("alloc", 64), ("exit", 0), ("alloc", 32), ("exit", 0)]
    program += [("enter", "tidy"), ("alloc", 16), ("free", 2), ("exit", 0)]
    log, steps, _, _ = replay(program)
    m = metrics.compute(Timeline(0, 10_000, "host", tuple(steps), memory=log))
    assert {n: s.leaked_bytes for n, s in m.steps.items()} == {"outer": 96, "inner": 64, "tidy": 0}
    budget = Budget(steps={n: StepBudget(max_leaked_bytes=0) for n in ("outer", "inner", "tidy")})
    assert sorted(b.key for b in evaluate(budget, m)) == [
        "steps.inner.max_leaked_bytes",
        "steps.outer.max_leaked_bytes",
    ]
    assert evaluate(Budget(steps={"outer": StepBudget(max_leaked_bytes=96)}), m) == []


def test_a_steps_leak_where_allocations_are_not_seen_one_by_one_reads_not_measured():
    marks = (MemoryMark(0, 0, 0, 0, open=(1,)), MemoryMark(1, 100, 64, 64))
    counters = MemoryLog("host", marks, None)
    m = metrics.compute(Timeline(0, 100, "host", (Span("s", 1, 0, 100, span_id=1),), memory=counters))
    assert m.steps["s"].leaked_bytes is None
    budget = Budget(steps={"s": StepBudget(max_leaked_bytes=0)}, own=set())
    assert not_measured(budget, m) == [
        "steps.s.max_leaked_bytes not measured: the allocator is read by its counters only: "
        "its allocations are not seen one by one"
    ]


def test_every_budget_key_has_a_window_that_breaches_it():
    """No key that nothing can breach: each descriptor's limit is tested somewhere to fail."""
    keys = {*descriptors.limits("window", "memory"), *descriptors.limits("step")}
    assert {"max_memory", "max_leaked_bytes"} <= keys
    assert descriptors.lookup("memory.peak_bytes").limit.key == "max_memory"
    assert descriptors.lookup("steps.x.memory_peak_bytes").limit.key == "max_memory"


def test_memory_that_no_allocator_saw_reads_not_measured_never_zero():
    m = metrics.compute(Timeline(0, 100, "cupti"))
    assert m.memory is None and "memory" not in m.flat()
    assert not_measured(Budget(max_memory=1, own={"max_memory"}), m) == [
        f"max_memory not measured: {metrics.NO_ALLOCATOR}"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512 MiB", 512 * MIB), ("2 GiB", 2 << 30), ("1.5GB", 1_500_000_000), ("100", 100), ("64 KiB", 64 << 10)],
)
def test_sizes_take_units(text, expected):
    assert parse_budget({"max_memory": text}, "m").max_memory == expected
    assert parse_budget({"steps": {"s": {"max_memory": text}}}, "m").steps["s"].max_memory == expected


@pytest.mark.parametrize("bad", ["1 GX", "lots", "-1 GiB", "2 GiBs"])
def test_a_bad_size_names_the_key_and_the_source(bad):
    with pytest.raises(BudgetError, match=re.escape(f"pyproject.toml: steps.s.max_memory = {bad!r}: not a size")):
        parse_budget({"steps": {"s": {"max_memory": bad}}}, "pyproject.toml")


def test_memory_paths_are_comparable():
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    (t,) = parse_thresholds("memory.peak_bytes:+10%")
    assert t.metric == "memory.peak_bytes"
    assert "memory.peak_bytes" in _window(10).flat()
    assert _window(10, ["s"]).flat()["steps.s.memory_peak_bytes"] == 10


# the plugin, on the host backend

STEPS = """
import pytest

def body(gpuprof, gpu_workload, big):
    with gpuprof.step("load"):
        small = gpu_workload.alloc(1 << 20)
    with gpuprof.step("train"):
        activations = gpu_workload.alloc(big)
        del activations
    del small

@pytest.mark.gpu_budget(steps={"train": {"max_memory": "1 GiB"}})
@pytest.mark.parametrize("big", [int(1.5 * (1 << 30)), int(0.9 * (1 << 30))])
def test_train(gpuprof, gpu_workload, big):
    gpuprof.measure(lambda: body(gpuprof, gpu_workload, big), rounds=1, warmup=0)
"""


def test_a_step_over_its_memory_fails_naming_the_step_and_the_line(pytester):
    pytester.makepyfile(test_steps=STEPS)
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json", "--gpu-html=r.html")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*steps.train.memory_peak_bytes 1.50 GiB (1,611,661,312 B) > 1.00 GiB (1,073,741,824 B) (steps.train.max_memory)*",
            "*device memory: peak 1.50 GiB over the window's start in step train > alloc (host)*",
            "*live at the peak: 1.50 GiB at test_steps.py:7 body*; 1.0 MiB at test_steps.py:5 body*",
        ]
    )
    tests = {t["nodeid"].split("[")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    failed = tests["1610612736]"]["metrics"]
    held = (3 << 29) + (1 << 20)  # the activations, and what "load" still held
    assert failed["memory"]["peak_bytes"] == held and failed["memory"]["source"] == "host"
    assert failed["memory"]["peak_step"] == "alloc" and failed["steps"]["train"]["memory_peak_bytes"] == held
    assert failed["steps"]["load"]["memory_peak_bytes"] == 1 << 20
    assert tests["966367641]"]["verdict"] == "ok"
    # the page reads the breach and the memory as the message does
    page = (pytester.path / "r.html").read_text()
    for text in (
        "steps.train.memory_peak_bytes 1.50 GiB (1,611,661,312 B) > 1.00 GiB (1,073,741,824 B)",
        "live at the peak: 1.50 GiB at test_steps.py:7 body",
    ):
        assert json.dumps(text)[1:-1].replace(">", "\\u003e") in page  # as the page embeds its data


@pytest.mark.parametrize(
    "placement",
    [
        "decorator",
        "applymarker",
        "plugin",
    ],
)
def test_max_memory_fails_however_the_marker_arrives(pytester, placement):
    marker = 'pytest.mark.gpu_budget(max_memory="1 MiB")'
    pytester.makepyfile(
        gpuprof_adopt=f"""
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                item.add_marker({marker})
        """,
        test_alloc=f"""
        import pytest

        {"@" + marker if placement == "decorator" else ""}
        def test_alloc(gpuprof, gpu_workload, request):
            {"request.applymarker(" + marker + ")" if placement == "applymarker" else "pass"}
            def body():
                buffer = gpu_workload.alloc(2 << 20)
                del buffer
            gpuprof.measure(body, rounds=1, warmup=0)
        """,
    )
    pytester.syspathinsert()
    extra = ["-p", "gpuprof_adopt"] if placement == "plugin" else []
    result = pytester.runpytest(*extra, "--gpu-budget")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*memory.peak_bytes 2.0 MiB (2,097,152 B) > 1.0 MiB (1,048,576 B) (max_memory)*"])


def test_max_leaked_bytes_names_the_step_that_kept_memory(pytester):
    pytester.makeconftest(KEPT)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(max_leaked_bytes=0)
        def test_cache(gpuprof, gpu_workload, kept):
            def body():
                with gpuprof.step("cache"):
                    kept.append(gpu_workload.alloc(4096))
            gpuprof.measure(body, rounds=1, warmup=0)
        """
    )
    result = pytester.runpytest("--gpu-budget")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memory.leaked_bytes 4.0 KiB (4,096 B) > 0 B (0 B) (max_leaked_bytes)*",
            "*not freed by the end of the test's call: 4.0 KiB by step alloc, largest at test_max_leaked_bytes_names_the*",
        ]
    )


def test_a_bad_size_in_pyproject_is_a_usage_error(pytester):
    pytester.makepyprojecttoml('[tool.gpuprof.budget]\nmax_memory = "2 GB of it"\n')
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--gpu-budget")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*max_memory = '2 GB of it': not a size*"])


SHRINK = """
import pytest
from hypothesis import given, settings
from pytest_gpuprof.strategies import buffer_sizes

@pytest.mark.gpu_budget(max_memory=THRESHOLD - 1)
@settings(settings.get_profile("gpuprof"), max_examples=60, database=None)
@given(size=buffer_sizes(1 << 10, 128 << 20))
def test_alloc(gpuprof, gpu_workload, size):
    def body():
        buffer = gpu_workload.alloc(size)
        del buffer
    gpuprof.measure(body, rounds=1, warmup=0)
"""


@pytest.mark.parametrize("threshold", [24_000_000, 64 * MIB + 1])
def test_a_memory_budget_shrinks_to_the_exact_threshold(pytester, threshold):
    """Deterministic, so exact: the smallest breaching size is the threshold itself."""
    pytester.makepyfile(SHRINK.replace("THRESHOLD", str(threshold)))
    result = pytester.runpytest("--gpu-budget", "--hypothesis-seed=1")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "Flaky" not in out
    assert int(re.search(r"size=(\d+)", out)[1]) == threshold


def test_a_counters_only_source_beside_a_counting_one_keeps_places_and_counts_leaks_by_its_counters():
    program = [("enter", "load"), ("alloc", 300), ("exit", 0)]
    log, steps, _, _ = replay(program)
    mixed = MemoryLog("torch+cupy", log.marks, log.allocations, None, every=False)
    got, _ = memory_mod.compute(mixed, steps)
    assert [(h.nbytes, h.step) for h in got.largest] == [(300, "load")]
    assert got.leaked_bytes == 300  # the counters' end against their start


class FakeCupy:
    """CuPy's pool and memory-hook shapes, as the tracker uses them."""

    def __init__(self):
        self.used, self.hooks = 0, []
        pool = type("Pool", (), {"used_bytes": lambda _: self.used, "total_bytes": lambda _: 1 << 30})()
        fake = self

        class MemoryHook:
            def __enter__(self):
                fake.hooks.append(self)

            def __exit__(self, *exc):
                fake.hooks.remove(self)

        self.get_default_memory_pool = lambda: pool
        self.cuda = type("cuda", (), {"memory_hook": type("memory_hook", (), {"MemoryHook": MemoryHook})})

    def malloc(self, ptr, size):
        self.used += size
        for hook in self.hooks:
            hook.malloc_postprocess(device_id=0, size=size, mem_size=size, mem_ptr=ptr, pmem_id=0)

    def free(self, ptr, size):
        self.used -= size
        for hook in self.hooks:
            hook.free_postprocess(device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=0)


def test_cupy_is_read_at_the_edges_until_a_memory_budget_asks_for_each_allocation(monkeypatch):
    """Without a memory gate CuPy's pool is read at the marks (its hook would slow every
    allocation); with one, the hook sees the peak between two edges, and where it was made."""
    from pytest_gpuprof.capture.memory import Discovery, MemoryTracker

    cupy = FakeCupy()
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    tracker = MemoryTracker(Discovery())
    for hooked in (False, True):
        first = tracker.mark(0)
        cupy.malloc(1, 1000)  # a peak between two edges
        cupy.free(1, 1000)
        log = tracker.log(first, tracker.mark(1))
        got, _ = memory_mod.compute(log, ())
        assert cupy.hooks == ([cupy.hooks[0]] if hooked else [])
        assert got.peak_bytes == (1000 if hooked else 0)
        assert (got.note or "").startswith("CuPy's pool read at the edges") != hooked
        tracker.see_each()
    tracker.close()
    assert cupy.hooks == []


GROWING = """
import os

def test_step(gpuprof, gpu_workload):
    size = int(os.environ["SIZE"])
    def body():
        with gpuprof.step("train"):
            activations = gpu_workload.alloc(size)
            del activations
    gpuprof.measure(body, rounds=5, warmup=0)
"""


@pytest.mark.parametrize("path", ["memory.peak_bytes", "steps.train.memory_peak_bytes"])
def test_a_memory_gate_fails_a_pull_request_that_raises_the_peak(pytester, monkeypatch, path):
    """A 20% larger peak against the stored baseline: a regression that fails the test; the
    same peak passes. Deterministic: the host backend's pool counts every byte."""
    pytester.makepyfile(GROWING)
    monkeypatch.setenv("SIZE", str(10 * MIB))
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=1)
    gate = (f"--gpu-compare-fail={path}:+10%", "--gpu-compare=main", "--gpu-report=r.json")
    pytester.runpytest(*gate).assert_outcomes(passed=1)
    monkeypatch.setenv("SIZE", str(12 * MIB))
    result = pytester.runpytest(*gate)
    result.assert_outcomes(failed=1)
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert test["verdict"] == f"FAIL: regression {path}"
    result.stdout.fnmatch_lines([f"*{path}: baseline 10,485,760 B -> 12,582,912 B (+2,097,152 B, +20.0%*regression*"])


def test_the_html_page_says_the_peak_of_every_measured_test_not_only_of_a_breach(pytester):
    pytester.makepyfile(
        """
        def test_holds(gpuprof, gpu_workload):
            def body():
                with gpuprof.step("load"):
                    buffer = gpu_workload.alloc(3 << 20)
                del buffer
            gpuprof.measure(body, rounds=1, warmup=0)
        """
    )
    result = pytester.runpytest("--gpu-html=r.html")
    result.assert_outcomes(passed=1)
    page = (pytester.path / "r.html").read_text()
    assert "device memory: peak 3.0 MiB over the window's start in step load" in page


def test_a_window_that_allocated_nothing_says_no_memory_line_on_its_page():
    from pytest_gpuprof.output.text import explain_memory

    log, steps, _, _ = replay([("enter", "prepare"), ("exit", 0)])
    got, _ = memory_mod.compute(log, steps)
    assert got.peak_bytes == 0 and got.peak_step is None
    m = metrics.Metrics(1.0, 1.0, 0.0, 1.0, 1.0, 1.0, None, None, 0.0, 0.0, 1, "host", memory=got)
    assert explain_memory(m, [], always=True) == []


TOP = """
import pytest

def test_loop(gpuprof, gpu_workload):
    def body():
        with gpuprof.step("load"):
            batch = gpu_workload.alloc(3 << 20)
        with gpuprof.step("forward"):
            activations = [gpu_workload.alloc(1 << 20) for _ in range(4)]
            weights = gpu_workload.alloc(2 << 20)
        del batch, activations, weights
    gpuprof.measure(body, rounds=1, warmup=0)

@pytest.mark.gpu_budget(max_memory="8 MiB")
def test_over(gpuprof, gpu_workload):
    def body():
        big = gpu_workload.alloc(9 << 20)
        del big
    gpuprof.measure(body, rounds=1, warmup=0)
"""


def test_memory_top_lists_the_places_live_at_each_peak_and_nothing_without_it(pytester):
    pytester.makepyfile(test_top=TOP)
    plain = pytester.runpytest("--gpu-budget", "--gpu-report=plain.json")
    plain.assert_outcomes(passed=1, failed=1)
    assert "--gpu-memory-top" not in plain.stdout.str()
    result = pytester.runpytest("--gpu-budget", "--gpu-memory-top=2", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "where the device memory was at each test's peak (--gpu-memory-top):",
            "test_top.py::test_loop: device memory peak 9.0 MiB (host), the 2 largest of 3 places live then:",
            # a comprehension is a function of its own before Python 3.12
            "  4.0 MiB in 4 allocations at test_top.py:8 * > pytest_gpuprof/measure/workload.py:alloc (step alloc)",
            "  3.0 MiB at test_top.py:6 body > pytest_gpuprof/measure/workload.py:alloc (step alloc)",
            "test_top.py::test_over: device memory peak 9.0 MiB (host), the 1 largest of 1 places live then:",
        ]
    )
    # the failing test's own report section lists them too
    section = result.stdout.str().split("Captured gpuprof call")[-1]
    assert "9.0 MiB at test_top.py:16 body" in section
    tests = {t["nodeid"]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    sites = tests["test_top.py::test_loop"]["metrics"]["memory"]["sites"]
    assert sum(s["bytes"] for s in sites) == tests["test_top.py::test_loop"]["metrics"]["memory"]["peak_bytes"]
    assert [s.get("count", 1) for s in sites] == [4, 1, 1]


def test_memory_top_must_be_a_whole_number(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--gpu-memory-top=-1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--gpu-memory-top*"])


def test_the_html_page_draws_the_device_memory_held_with_its_peak(pytester):
    from plugin_runs import page_data_of

    from pytest_gpuprof.analysis.lanes import MEMORY

    pytester.makepyfile(test_top=TOP)
    result = pytester.runpytest("--gpu-html=page.html", "-k", "test_loop")
    result.assert_outcomes(passed=1)
    (test,) = page_data_of((pytester.path / "page.html").read_text())["tests"]
    (memory,) = [c for c in test["counters"] if c["name"] == MEMORY]
    held = [v for _, v in memory["points"]]
    assert memory["unit"] == "MiB" and max(held) == 9.0 and held[0] == held[-1] == 0.0
    assert test["steps"]["load"]["memory_peak_bytes"] == 3 << 20  # the steps table's memory column


def test_a_steps_max_leaked_bytes_fails_the_step_that_kept_memory_and_passes_one_that_freed_it(pytester):
    pytester.makeconftest(KEPT)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(steps={"cache": {"max_leaked_bytes": 0}, "scratch": {"max_leaked_bytes": 0}})
        def test_cache(gpuprof, gpu_workload, kept):
            def body():
                with gpuprof.step("scratch"):
                    buffer = gpu_workload.alloc(8192)
                    del buffer
                with gpuprof.step("cache"):
                    kept.append(gpu_workload.alloc(4096))
            gpuprof.measure(body, rounds=1, warmup=0)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*steps.cache.leaked_bytes 4.0 KiB (4,096 B) > 0 B (0 B) (steps.cache.max_leaked_bytes)*"]
    )
    assert "steps.scratch" not in "\n".join(line for line in result.stdout.lines if "max_leaked_bytes)" in line)
