"""The allocators a ``MemoryTracker`` reads (``capture.memory``), one class each:

- ``torch_memory.TorchSource``: PyTorch's caching allocator, through its own history;
- ``CupySource``: CuPy's pool, through a memory hook in the measuring thread (each
  allocation with its size and the line of the user's code that made it);
- ``HostSource``: the host backend's pool, the same way;
- ``Counted``: what a source that sees each allocation and free keeps (``driver_memory``'s
  source is one).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pytest_gpuprof.analysis.model import Allocation
from pytest_gpuprof.capture.span_stack import current_span_id
from pytest_gpuprof.capture.stacks import Places


class Reading(NamedTuple):
    """A source's figures at a mark: held now, the most held since the mark before (the
    allocation that reached it, where known), reserved now and at most since then.
    ``peak_low``: where the source knows the stretch's peak only as a range (JAX's
    statistics), its least; ``peak`` is then its most."""

    held: int
    peak: int
    peak_seq: int | None = None
    reserved: int | None = None
    reserved_peak: int | None = None
    peak_low: int | None = None


class MemorySource(Protocol):
    name: str
    sees_each: bool  # each allocation seen, with its size and place (``taken``)

    def read(self) -> Reading:
        """Held now, the most held since the last read (the allocation that reached it,
        where known), reserved now and the most reserved since the last read; the peaks
        start again from now."""
        ...

    def taken(self, lo: int, hi: int) -> list[Allocation]:
        """The allocations made between the marks ``lo`` and ``hi``, freed or live."""
        ...

    def edge(self, seq: int, *, step: bool = False) -> None:
        """A mark was taken at ``seq`` (after ``read``); ``step``: a step's edge."""
        ...

    def settle(self, step_of: Callable[[int], int | None]) -> dict[int, Reading] | None:
        """The readings by mark of a source read back after the window (PyTorch's history),
        the allocations numbered by the mark they followed (``step_of``: its innermost step);
        ``None``: ``read`` gave them as the marks were taken."""
        ...

    def forget(self) -> None:
        """No window open: what was kept for one can go."""
        ...

    def held_now(self) -> int:
        """What the test's code holds now, as ``read``'s ``held`` counts it (no peak reset)."""
        ...

    def live_seqs(self) -> frozenset[int] | None:
        """The counts of the allocations live now (``None``: not seen one by one)."""
        ...

    def close(self) -> None: ...


class Counted:
    """A source that sees each allocation and free: it keeps the running figures itself.
    ``tick``: the tracker's count, which orders allocations and marks alike."""

    name = "counted"
    sees_each = True
    note: str | None = None

    def __init__(self, tick: Callable[[], int], held: int = 0) -> None:
        self._tick = tick
        self._lock = threading.Lock()
        self.held = self.peak = held
        self.peak_seq: int | None = None
        self.reserved: int | None = None
        self.reserved_peak: int | None = None
        self.allocations: dict[int, Allocation] = {}  # live ones by address, while tracked
        self.done: list[Allocation] = []
        self._places = Places()

    def read(self) -> Reading:
        with self._lock:
            out = Reading(self.held, self.peak, self.peak_seq, self.reserved, self.reserved_peak)
            self.peak, self.peak_seq, self.reserved_peak = self.held, None, self.reserved
        return out

    def allocated(self, address: int, nbytes: int, where: str | None = None) -> None:
        """``where``: the place that asked for it (else the caller's caller's frame's)."""
        where = where if where is not None else self._places.of(sys._getframe(2))
        step = current_span_id()
        with self._lock:
            seq = self._tick()
            self.held += nbytes
            if self.held > self.peak:
                self.peak, self.peak_seq = self.held, seq
            self.allocations[address] = Allocation(seq, None, nbytes, where, step)

    def freed(self, address: int, nbytes: int) -> None:
        with self._lock:
            seq = self._tick()
            self.held -= nbytes
            live = self.allocations.pop(address, None)
            if live is not None:
                self.done.append(live._replace(end_seq=seq))

    def edge(self, seq: int, *, step: bool = False) -> None:
        pass  # read as the marks are taken

    def settle(self, step_of: Callable[[int], int | None]) -> dict[int, Reading] | None:
        return None

    def taken(self, lo: int, hi: int) -> list[Allocation]:
        """The allocations made between the marks ``lo`` and ``hi``, freed or live."""
        with self._lock:
            return [a for a in (*self.done, *self.allocations.values()) if lo <= a.seq <= hi]

    def forget(self) -> None:
        """Drop the freed allocations: no window will ask for them again."""
        with self._lock:
            self.done.clear()

    def held_now(self) -> int:
        return self.held

    def live_seqs(self) -> frozenset[int] | None:
        if not self.sees_each:
            return None
        with self._lock:
            return frozenset(a.seq for a in self.allocations.values())

    def close(self) -> None:
        pass


class HostSource(Counted):
    """The host backend's pool: it calls ``allocated``/``freed`` itself."""

    name = "host"

    def __init__(self, tick: Callable[[], int], pool: Any) -> None:
        super().__init__(tick, pool.in_use)
        self._pool = pool
        pool.observer = self

    def close(self) -> None:
        self._pool.observer = None


class CupySource(Counted):
    """CuPy's pool: read at the marks (``used_bytes``), and, where the test gates memory
    (``hook``), through a memory hook that sees each allocation. The hook costs each CuPy
    allocation a few microseconds of Python (a loop of small elementwise operations ran 2x
    slower on the H200: docs/performance-log.md), which would change the utilization being
    measured, so it is on only where a memory budget needs it. CuPy's hooks are per thread:
    the hook sees the thread that runs the test."""

    name = "cupy"

    def __init__(self, tick: Callable[[], int], cupy: Any, hook: bool) -> None:
        self._cupy = cupy
        self._pool = cupy.get_default_memory_pool()
        super().__init__(tick, int(self._pool.used_bytes()))
        self.reserved = int(self._pool.total_bytes())
        self.sees_each = hook
        self.note = None if hook else EDGES_ONLY
        self._hook: Any = None
        if not hook:
            return
        source = self

        class Hook(cupy.cuda.memory_hook.MemoryHook):
            name = f"gpuprof-{id(self)}"  # unique: one per test, in the thread that runs it

            def malloc_postprocess(self, **call: Any) -> None:
                source.allocated(call["mem_ptr"], call["mem_size"])

            def free_postprocess(self, **call: Any) -> None:
                source.freed(call["mem_ptr"], call["mem_size"])

        self._hook = Hook()
        self._hook.__enter__()

    def read(self) -> Reading:
        # the pool grows only as it allocates and shrinks only when trimmed: what it
        # reserved is read at the marks, not at every allocation
        reserved = int(self._pool.total_bytes())
        if self._hook is None:
            used = int(self._pool.used_bytes())
            return Reading(used, used, None, reserved, reserved)
        counted = super().read()
        self.reserved = reserved
        return counted._replace(reserved=reserved, reserved_peak=max(reserved, counted.reserved or 0))

    def held_now(self) -> int:
        return self.held if self._hook is not None else int(self._pool.used_bytes())

    def hooked(self, tick: Callable[[], int]) -> CupySource:
        """This source, seeing each allocation from now on."""
        return self if self._hook is not None else CupySource(tick, self._cupy, True)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.__exit__(None, None, None)


EDGES_ONLY = (
    "CuPy's pool read at the edges of windows and steps only: a peak between two edges is not seen "
    "(a memory budget on the test turns on CuPy's allocation hook, which sees each allocation)"
)
