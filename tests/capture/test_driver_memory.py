"""The driver's allocation calls as a memory source (``capture.driver_memory``), driven by a
stand-in for cupti-python that calls back as CUPTI does: a ``CUpti_CallbackData`` laid out
as CUDA's header declares it, pointing at each call's ``*_params`` struct."""

from __future__ import annotations

import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof.analysis import memory as memory_mod
from pytest_gpuprof.capture import driver_memory, jax_memory
from pytest_gpuprof.capture.memory import Discovery, MemoryTracker
from pytest_gpuprof.capture.memory_sources import Reading

CALLS = ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemMap", "cuMemFree_v2", "cuMemUnmap", "cuMemAllocAsync")


# compiled under a name that is no file of the user's, as the driver's C is no Python of
# theirs: the place of an allocation is then the user's line that led to the call
STAND_IN = """
import ctypes
import types

class FakeCupti:
    '''cupti-python's callback API, as far as the driver source uses it.'''

    ApiCallbackSite = types.SimpleNamespace(API_ENTER=0, API_EXIT=1)
    CallbackDomain = types.SimpleNamespace(DRIVER_API=1)
    driver_api_trace_cbid = types.SimpleNamespace(**{name: 100 + i for i, name in enumerate(CALLS)})

    def __init__(self, taken: bool = False):
        self.callback = None
        self.enabled: set[int] = set()
        self.taken = taken
        self._keep: list[object] = []  # the structs a call points at, alive through it
        self._next = 0x7F00_0000_0000

    def subscribe(self, callback, userdata):
        if self.taken:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.callback = callback
        return 7

    def enable_callback(self, enable, subscriber, domain, cbid):
        self.enabled.add(cbid)

    def unsubscribe(self, subscriber):
        self.callback = None

    def call(self, name: str, *words: int, result: int = 0, out: dict[int, int] | None = None) -> None:
        '''The driver running ``name``: its params struct of ``words`` (64-bit each), where
        ``out`` names the words that point at what the call writes (the new address, the
        pitch), and what it writes there on return.'''
        out = out or {}
        cells = [ctypes.c_uint64(0) for _ in out]
        params = (ctypes.c_uint64 * max(len(words), 1))(*words)
        for i, cell in zip(out, cells, strict=True):
            params[i] = ctypes.addressof(cell)
        returned = ctypes.c_int(result)
        data = (ctypes.c_uint64 * 9)()
        data[2] = ctypes.addressof(params)  # functionParams, 16 bytes in
        self._keep += [cells, params, returned, data]
        cbid = getattr(self.driver_api_trace_cbid, name)
        for site in (self.ApiCallbackSite.API_ENTER, self.ApiCallbackSite.API_EXIT):
            if site == self.ApiCallbackSite.API_EXIT:
                for cell, value in zip(cells, out.values(), strict=True):
                    cell.value = value
            record = types.SimpleNamespace(
                callback_site=site,
                ptr=ctypes.addressof(data),
                function_return_value=ctypes.addressof(returned),
                function_name=name,
            )
            if self.callback is not None and cbid in self.enabled:
                self.callback(None, self.CallbackDomain.DRIVER_API, cbid, record)

    def alloc(self, nbytes: int, name: str = "cuMemAlloc_v2", result: int = 0) -> int:
        self._next += 1 << 21
        self.call(name, 0, nbytes, result=result, out={0: self._next})
        return self._next

    def free(self, address: int, name: str = "cuMemFree_v2") -> None:
        self.call(name, address)
"""
_space: dict = {"CALLS": CALLS}
exec(compile(STAND_IN, "<cupti stand-in>", "exec"), _space)
FakeCupti = _space["FakeCupti"]


@pytest.fixture
def cupti():
    return FakeCupti()


def window(tracker, body):
    first = tracker.mark(0)
    body()
    log = tracker.log(first, tracker.mark(1))
    return memory_mod.compute(log, ())[0]


def test_each_allocation_is_counted_once_with_its_line_and_freed_by_address(cupti):
    tracker = MemoryTracker(lambda tick: [driver_memory.DriverSource(tick, cupti)] if not tracker.sources else [])
    tracker.mark(0)  # the source begins
    kept = []

    def body():
        a = cupti.alloc(100 << 20)
        kept.append(cupti.alloc(30 << 20))  # held to the end
        cupti.free(a)
        cupti.alloc(1 << 20, result=2)  # CUDA_ERROR_OUT_OF_MEMORY: nothing allocated
        cupti.free(0xDEAD)  # allocated before the source began: changes nothing

    got = window(tracker, body)
    assert got.peak_bytes == 130 << 20
    assert got.reserved_peak_bytes == 130 << 20
    assert got.leaked_bytes == 30 << 20
    assert [h.nbytes for h in got.largest] == [100 << 20, 30 << 20]
    assert got.largest[0].where.startswith("tests/capture/test_driver_memory.py:") and "body" in got.largest[0].where
    assert got.source == "driver" and "what was allocated before the test is not counted" in got.note
    tracker.close()
    assert cupti.callback is None  # unsubscribed


def test_virtual_memory_counts_where_it_is_mapped_and_pitched_memory_by_its_rows(cupti):
    tracker = MemoryTracker(lambda tick: [driver_memory.DriverSource(tick, cupti)] if not tracker.sources else [])
    tracker.mark(0)

    def body():
        cupti.call("cuMemMap", 0x3_0200_0000, 256 << 20, 0, 99, 0)  # ptr, size, offset, handle, flags
        cupti.call("cuMemAllocPitch_v2", 0, 0, 1000, 3, 4, out={0: 0x7E00_0000_0000, 1: 1024})  # 3 rows of 1024
        cupti.call("cuMemUnmap", 0x3_0200_0000, 256 << 20)

    got = window(tracker, body)
    assert got.peak_bytes == (256 << 20) + 3 * 1024
    assert got.leaked_bytes == 3 * 1024


OPS = st.lists(st.tuples(st.sampled_from(["alloc", "free", "async", "fail"]), st.integers(1, 1 << 30)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_held_and_peak_equal_a_replay_of_the_calls(ops):
    """Brute force: replay the calls on a dict of live allocations."""
    cupti = FakeCupti()
    tracker = MemoryTracker(lambda tick: [driver_memory.DriverSource(tick, cupti)] if not tracker.sources else [])
    tracker.mark(0)
    live: dict[int, int] = {}
    best = 0

    def body():
        nonlocal best
        for op, n in ops:
            if op == "free" and live:
                address = sorted(live)[n % len(live)]
                cupti.free(address, "cuMemFree_v2")
                del live[address]
            elif op in ("alloc", "async"):
                live[cupti.alloc(n, "cuMemAlloc_v2" if op == "alloc" else "cuMemAllocAsync")] = n
            elif op == "fail":
                cupti.alloc(n, result=1)
            best = max(best, sum(live.values()))

    got = window(tracker, body)
    assert got.peak_bytes == best
    assert got.leaked_bytes == sum(live.values())
    tracker.close()


def test_a_call_it_cannot_read_makes_the_memory_unsound_not_smaller(cupti):
    tracker = MemoryTracker(lambda tick: [driver_memory.DriverSource(tick, cupti)] if not tracker.sources else [])
    first = tracker.mark(0)
    cupti.callback(None, 1, 100, types.SimpleNamespace(callback_site=1, function_name="cuMemAlloc_v2"))
    assert tracker.log(first, tracker.mark(1)) is None
    assert tracker.why.startswith("a cuMemAlloc_v2 call could not be read")


@pytest.fixture
def jax(monkeypatch):
    """JAX with its CUDA backend started, as far as ``jax_started`` looks."""
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backends = {"cuda": object(), "cpu": object()}
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    return bridge


def test_jax_started_only_once_its_gpu_backend_is(jax):
    assert jax_memory.jax_started()
    jax._backends = {"cpu": object()}
    assert not jax_memory.jax_started()
    del jax._backends
    jax.backends_are_initialized = lambda: False
    assert not jax_memory.jax_started()


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({}, "JAX preallocated most of the device for its pool"),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "JAX's pool grows and never shrinks"),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc", "XLA_PYTHON_CLIENT_PREALLOCATE": "0"}, "JAX's pool grows"),
    ],
)
def test_jax_with_a_pool_reads_not_measured_with_the_way_to_measure_it(jax, monkeypatch, env, why):
    """The pool hides what JAX's code held: the window's memory is not measured, and the
    frameworks' sources found before JAX started (CuPy's, the plugin's own) are dropped, not
    read as the test's."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    discovery = Discovery()
    tracker = MemoryTracker(discovery)
    tracker.sources.append(FrozenSource())
    first = tracker.mark(0)
    assert tracker.log(first, tracker.mark(1)) is None
    assert tracker.why.startswith(why) and "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in tracker.why
    assert tracker.sources == []


def gated_tracker():
    """A test's tracker under a memory budget (``Profiler`` calls ``see_each`` at once)."""
    tracker = MemoryTracker(Discovery())
    tracker.see_each()
    return tracker


def test_jax_with_its_platform_allocator_is_read_from_the_driver(jax, monkeypatch, cupti):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    tracker = gated_tracker()
    got = window(tracker, lambda: cupti.call("cuMemMap", 0x3_0000_0000, 64 << 20, 0, 1, 0))
    assert got.source == "driver" and got.peak_bytes == 64 << 20
    tracker.close()


def test_jax_memory_is_followed_only_under_a_memory_budget_and_from_the_gates_next_window(jax, monkeypatch, cupti):
    """The callbacks cost each allocation some Python: a test that does not gate memory
    does not pay them, and reads "not measured" with the reason; a gate set later (by
    ``check`` or a budget added at run time) follows the calls from its next window."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    tracker = MemoryTracker(Discovery())
    first = tracker.mark(0)
    cupti.alloc(1 << 20)
    assert tracker.log(first, tracker.mark(1)) is None
    assert tracker.why == jax_memory.UNGATED and cupti.callback is None  # not subscribed
    tracker.see_each()
    got = window(tracker, lambda: cupti.alloc(3 << 20))
    assert got.source == "driver" and got.peak_bytes == 3 << 20
    tracker.close()


def test_jax_started_inside_a_window_leaves_that_window_not_measured(jax, monkeypatch, cupti):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    started = jax._backends
    jax._backends = {}
    tracker = gated_tracker()
    tracker.sources.append(FrozenSource())
    first = tracker.mark(0)
    jax._backends = started
    last = tracker.mark(1)
    assert tracker.log(first, last) is None
    assert "JAX started on the device inside the window" in tracker.why
    got = window(tracker, lambda: cupti.alloc(5 << 20))  # the next window is read from the driver
    assert got.source == "driver" and got.peak_bytes == 5 << 20
    tracker.close()


def test_another_subscriber_is_named_as_the_reason(jax, monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=FakeCupti(taken=True)))
    tracker = gated_tracker()
    first = tracker.mark(0)
    assert tracker.log(first, tracker.mark(1)) is None
    assert "MULTIPLE_SUBSCRIBERS" in tracker.why


class FrozenSource:
    """A framework's source that was in use before JAX started."""

    name, sees_each, note = "cupy", False, None
    closed = False

    def read(self):
        return Reading(10, 10)

    def edge(self, seq, *, step=False):
        pass

    def settle(self, step_of):
        return None

    def close(self):
        self.closed = True
