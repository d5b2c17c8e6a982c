"""PyTorch's allocator read through its history (``capture.torch_memory``), on a fake of
PyTorch's memory API that keeps a history as the caching allocator does: the replay of its
events against a brute force, the figures of a window through the tracker and the analysis,
the places of what was live at the peak and of what leaked, and the framework's own peak
counter left alone (the fake refuses a reset)."""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import memory as memory_mod
from pytest_gpuprof.analysis.model import Span
from pytest_gpuprof.capture import memory, torch_memory
from pytest_gpuprof.capture.stacks import Places

MIB = 1 << 20


class FakeMemory:
    """``torch.cuda.memory``'s history calls over a fake allocator: each allocation and free
    becomes a trace entry (with the caller's frames where stacks are on), tagged with the
    metadata set last, stamped with the wall clock in microseconds."""

    def __init__(self, tagged: bool = True) -> None:
        self.trace: list[dict] = []
        self.enabled = False
        self.stacks = False
        self.metadata = ""
        self.allocated = 0
        self.reserved = 0
        self.peak = 0  # the framework's own peak counter, which the plugin must leave alone
        self._address = itertools.count(4096, 4096)
        self._clock = itertools.count(1_000_000)
        if tagged:
            self._set_memory_metadata = self._set

    def _set(self, metadata: str) -> None:
        self.metadata = metadata

    def _record_memory_history(self, enabled, context=None, stacks="all", max_entries=0) -> None:
        self.enabled = enabled is not None
        self.stacks = context is not None
        if not self.enabled:
            self.trace.clear()

    def _snapshot(self) -> dict:
        return {"segments": [], "device_traces": [list(self.trace)]}

    def now_us(self) -> int:
        return next(self._clock)

    def _event(self, action: str, addr: int, size: int, frames: list[dict]) -> None:
        if self.enabled:
            event = {"action": action, "addr": addr, "size": size, "time_us": self.now_us()}
            if self.metadata:
                event["user_metadata"] = self.metadata
            if self.stacks:
                event["frames"] = frames
            self.trace.append(event)

    def alloc(self, size: int, where: tuple[str, int, str] = ("/work/test_x.py", 10, "body")) -> int:
        address = next(self._address)
        if self.allocated + size > self.reserved:  # the pool grows by a segment of its own
            grow = self.allocated + size - self.reserved
            self._event("segment_alloc", address + (1 << 40), grow, [])
            self.reserved += grow
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        frames = [{"filename": where[0], "line": where[1], "name": where[2]}]
        self._event("alloc", address, size, frames)
        return address

    def free(self, address: int, size: int) -> None:
        self.allocated -= size
        self._event("free_requested", address, size, [])
        self._event("free_completed", address, size, [])


def fake_torch(mem: FakeMemory) -> SimpleNamespace:
    def stats(device: int) -> dict:
        return {
            "allocated_bytes": {"all": {"current": mem.allocated, "peak": mem.peak}},
            "reserved_bytes": {"all": {"current": mem.reserved}},
        }

    def reset(device: int | None = None) -> None:
        raise AssertionError("the plugin reset PyTorch's peak counters")

    cuda = SimpleNamespace(
        memory=mem,
        memory_stats_as_nested_dict=stats,
        reset_peak_memory_stats=reset,
        is_initialized=lambda: True,
        current_device=lambda: 0,
    )
    return SimpleNamespace(cuda=cuda)


def tracker(mem: FakeMemory, *, stacks: bool) -> memory.MemoryTracker:
    places = Places(roots=("/opt/libs",), here="/work")
    source = torch_memory.TorchSource(fake_torch(mem), 0, stacks=stacks, places=places)
    source.now = lambda: mem.now_us() * 1000  # the edges on the fake's clock: strictly ordered with its events
    tracker = memory.MemoryTracker(lambda tick: [source] if not tracker.sources else [])
    return tracker


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "clock"])
def test_a_window_reads_its_peak_steps_and_places_and_never_resets_the_counters(tagged):
    mem = FakeMemory(tagged)
    before = mem.alloc(100 * MIB)  # held before the window: not the window's
    t = tracker(mem, stacks=True)
    first = t.mark(0)
    a = mem.alloc(256 * MIB, ("/work/test_x.py", 11, "load"))
    t.mark(1, step=True)
    b = mem.alloc(512 * MIB, ("/work/test_x.py", 12, "train"))
    mem.free(b, 512 * MIB)
    mem.free(before, 100 * MIB)
    kept = mem.alloc(64 * MIB, ("/work/test_x.py", 13, "keep"))
    last = t.mark(2)
    log = t.log(first, last)
    assert log is not None and log.every
    m, _ = memory_mod.compute(log, [])
    assert m is not None
    assert m.peak_bytes == (256 + 512) * MIB  # over the 100 MiB held at the start
    assert m.leaked_bytes == (256 + 64) * MIB
    assert m.largest[0].nbytes == 512 * MIB and m.largest[0].where == "test_x.py:12 train"
    assert m.leaks == (memory_mod.Held((256 + 64) * MIB, "test_x.py:11 load", None),)
    assert m.reserved_peak_bytes == mem.reserved
    assert mem.peak == (100 + 256 + 512) * MIB  # its own counter, as without the plugin
    t.forget()
    mem.free(a, 256 * MIB)
    mem.free(kept, 64 * MIB)
    # the next window starts from the counters again
    again = t.mark(3)
    c = mem.alloc(8 * MIB)
    end = t.mark(4)
    m2, _ = memory_mod.compute(t.log(again, end), [])
    assert m2 is not None and m2.peak_bytes == 8 * MIB and m2.leaked_bytes == 8 * MIB
    mem.free(c, 8 * MIB)


def test_without_stacks_the_peak_is_exact_and_no_place_is_claimed():
    mem = FakeMemory()
    t = tracker(mem, stacks=False)
    first = t.mark(0)
    x = mem.alloc(3 * MIB)
    mem.free(x, 3 * MIB)
    last = t.mark(1)
    log = t.log(first, last)
    m, _ = memory_mod.compute(log, [])
    assert log.allocations is None and m.peak_bytes == 3 * MIB and m.largest == ()
    assert m.leaked_bytes == 0


def test_a_memory_gate_turns_on_the_stacks():
    mem = FakeMemory()
    t = tracker(mem, stacks=False)
    t.mark(0)
    assert not mem.stacks
    t.see_each()
    assert mem.stacks


def test_a_window_past_the_ring_is_not_measured(monkeypatch):
    monkeypatch.setattr(torch_memory, "RING", 3)
    mem = FakeMemory()
    t = tracker(mem, stacks=False)
    first = t.mark(0)
    for _ in range(2):
        mem.free(mem.alloc(MIB), MIB)
    assert t.log(first, t.mark(1)) is None
    assert "history holds 3 events" in (t.why or "")


def test_discovery_reads_pytorch_through_its_history(monkeypatch):
    mem = FakeMemory()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(mem))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    (source,) = memory.Discovery()(lambda: 0)
    assert isinstance(source, torch_memory.TorchSource) and mem.enabled
    source.close()
    assert not mem.enabled


# the program of a window: allocate, free a live allocation, mark an edge
programs = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 1000)),
        st.tuples(st.just("free"), st.integers(0, 30)),
        st.tuples(st.just("edge"), st.just(0)),
    ),
    max_size=40,
)


@given(programs, st.integers(0, 5000))
def test_replay_equals_a_brute_force_of_held_bytes(program, before):
    """Each edge's held bytes and the most held since the edge before, against the held
    bytes after every operation; what stays live, against the allocations never freed."""
    stride = torch_memory.STRIDE
    edges, events, live, heights = [0], [], {}, [[before]]
    held, address = before, itertools.count(1)
    for kind, arg in program:
        if kind == "edge":
            edges.append(edges[-1] + stride)
            heights.append([held])
            continue
        if kind == "alloc":
            at = next(address)
            live[at] = arg
            held += arg
            events.append({"action": "alloc", "addr": at, "size": arg, "edge": edges[-1], "frames": []})
        elif live:
            at = sorted(live)[arg % len(live)]
            size = live.pop(at)
            held -= size
            events.append({"action": "free_completed", "addr": at, "size": size, "edge": edges[-1]})
        heights[-1].append(held)
    edges.append(edges[-1] + stride)
    readings, made = torch_memory.replay(events, edges, (before, 0), place=lambda frames: "here")
    for i, (edge, seen) in enumerate(zip(edges[1:], heights)):
        assert readings[edge][0] == seen[-1], i
        assert readings[edge][1] == max(seen), i
    assert sorted(a.nbytes for a in made if a.end_seq is None) == sorted(live.values())


def test_a_recorded_stack_is_placed_at_the_users_innermost_frame():
    places = Places(roots=("/opt/libs",), here="/work")
    frames = [
        ("/opt/libs/torch/nn/modules/linear.py", 125, "forward"),
        ("/work/model.py", 40, "step"),
        ("/work/t.py", 3, "t"),
    ]
    assert places.of_frames(frames) == "model.py:40 step > torch/nn/modules/linear.py:forward"
    assert places.of_frames(frames[:1]) == "torch/nn/modules/linear.py:forward"
    assert places.of_frames([]) == "(no Python frame)"


def test_step_of_an_allocation_is_the_innermost_step_open_at_its_edge():
    mem = FakeMemory()
    t = tracker(mem, stacks=True)
    t.open_steps = lambda: (1, 2)
    first = t.mark(0)
    mem.alloc(MIB)
    t.open_steps = tuple
    last = t.mark(1)
    spans = [Span("outer", 0, 0, 10, depth=0, span_id=1), Span("inner", 0, 0, 10, depth=1, span_id=2)]
    m, _ = memory_mod.compute(t.log(first, last), spans)
    assert m.leaks[0].step == "inner"


def test_a_pytorch_without_the_history_reads_not_measured_with_the_reason(monkeypatch):
    mem = FakeMemory()
    torch = fake_torch(mem)
    torch.cuda.memory = SimpleNamespace()  # no _record_memory_history
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    t = memory.MemoryTracker(memory.Discovery())
    assert t.mark(0) is None
    assert "PyTorch's allocator history could not be turned on (AttributeError" in (t.unseen() or "")


def test_a_replay_that_misses_what_the_counters_hold_is_not_measured():
    """Events the replay cannot place (here: none carry a tag or a stamp after the edges)
    would read 0: the counters read at the window's end say otherwise, and the figure is
    "not measured", never a silently wrong one."""
    mem = FakeMemory(tagged=False)
    t = tracker(mem, stacks=False)
    first = t.mark(0)
    mem._clock = itertools.count(0)  # the allocator's stamps from now on before the edges'
    mem.alloc(5 * MIB)
    last = t.mark(1)
    assert t.log(first, last) is None
    assert "accounts for 0 bytes held where its counters say 5,242,880" in t.why


def test_a_history_that_cannot_be_read_is_not_measured_and_the_test_goes_on():
    mem = FakeMemory()
    t = tracker(mem, stacks=False)
    first = t.mark(0)
    mem.alloc(MIB)
    last = t.mark(1)
    mem._snapshot = lambda: {"segments": []}  # a PyTorch whose snapshot has no device_traces
    assert t.log(first, last) is None
    assert t.why.startswith("PyTorch's allocator history could not be read (KeyError")


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "clock"])
def test_what_a_window_kept_is_followed_past_the_emptied_ring_to_the_calls_end(tagged):
    """A leak is what the test still holds as its call ends: the window's kept tensors are
    followed through the rings emptied after it (a window between, an address handed out
    again) until the call's end reads them."""
    mem = FakeMemory(tagged)
    t = tracker(mem, stacks=True)
    first = t.mark(0)
    freed_later = mem.alloc(4 * MIB, ("/work/test_x.py", 11, "a"))
    kept = mem.alloc(2 * MIB, ("/work/test_x.py", 12, "b"))
    m, _ = memory_mod.compute(t.log(first, t.mark(1)), [])
    assert m is not None and m.leaked_bytes == 6 * MIB
    t.forget()
    mem.free(freed_later, 4 * MIB)
    between = t.mark(2)  # a window between: it allocates and frees, and the ring is emptied again
    mem.free(mem.alloc(16 * MIB), 16 * MIB)
    m2, _ = memory_mod.compute(t.log(between, t.mark(3)), [])
    assert m2 is not None and m2.leaked_bytes == 0
    t.forget()
    live = t.live()
    assert live is not None and live.seqs is not None
    assert memory_mod.at_call_end(m, live).leaked_bytes == 2 * MIB
    mem.free(kept, 2 * MIB)
    after = t.live()
    assert after is not None and memory_mod.at_call_end(m, after).leaked_bytes == 0


def test_without_stacks_the_calls_end_reads_the_counters():
    mem = FakeMemory()
    t = tracker(mem, stacks=False)
    first = t.mark(0)
    a = mem.alloc(4 * MIB)
    m, _ = memory_mod.compute(t.log(first, t.mark(1)), [])
    assert m is not None and m.leaked_bytes == 4 * MIB and m.kept is None
    t.forget()
    live = t.live()
    assert live is not None and live.seqs is None and live.held == 4 * MIB
    assert memory_mod.at_call_end(m, live).leaked_bytes == 4 * MIB
    mem.free(a, 4 * MIB)
    assert memory_mod.at_call_end(m, t.live()).leaked_bytes == 0
