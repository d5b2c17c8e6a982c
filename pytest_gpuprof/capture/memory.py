"""Device memory over a window: what the framework's allocator held, marked at the
window's edges and at each step's, with each allocation's size and place where the
allocator tells them.

A ``MemoryTracker`` keeps ``Mark``s: at each, the bytes held now and the most held since
the mark before (and the same for what the process had reserved from the driver). The
sources are the allocators that a test's code uses:

- ``torch``: PyTorch's caching allocator (``torch.cuda.memory_stats``, its peak reset at
  each mark: exact per stretch between marks, no allocation seen one by one);
- ``cupy``: CuPy's pool, through a memory hook in the measuring thread (each allocation
  with its size and the line of the user's code that made it);
- ``host``: the host backend's pool, the same way.

``analysis.memory`` turns the marks of a window into its ``memory`` figures. A source
whose framework has not touched the device yet is not used; where none is, the window
says so, and ``memory`` reads "not measured", never 0.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

from pytest_gpuprof.analysis.model import Allocation, MemoryLog, MemoryMark
from pytest_gpuprof.capture.span_stack import current_span_id
from pytest_gpuprof.capture.stacks import Places


class MemorySource(Protocol):
    name: str
    cheap: bool  # read at every step's edge (else only at windows' edges, unless memory is gated)

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        """Held now, the most held since the last read (the allocation that reached it,
        where known), reserved now and the most reserved since the last read; the peaks
        start again from now."""
        ...

    def close(self) -> None: ...


class _Counted:
    """A source that sees each allocation and free: it keeps the running figures itself.
    ``tick``: the tracker's count, which orders allocations and marks alike."""

    name = "counted"
    sees_each = True
    cheap = True
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

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        with self._lock:
            out = (self.held, self.peak, self.peak_seq, self.reserved, self.reserved_peak)
            self.peak, self.peak_seq, self.reserved_peak = self.held, None, self.reserved
        return out

    def allocated(self, address: int, nbytes: int, reserved: int | None = None) -> None:
        where = self._places.of(sys._getframe(2))
        step = current_span_id()
        with self._lock:
            seq = self._tick()
            self.held += nbytes
            if self.held > self.peak:
                self.peak, self.peak_seq = self.held, seq
            if reserved is not None:
                self.reserved = reserved
                self.reserved_peak = max(self.reserved_peak or 0, reserved)
            self.allocations[address] = Allocation(seq, None, nbytes, where, step)

    def freed(self, address: int, nbytes: int) -> None:
        with self._lock:
            seq = self._tick()
            self.held -= nbytes
            live = self.allocations.pop(address, None)
            if live is not None:
                self.done.append(live._replace(end_seq=seq))

    def taken(self, lo: int, hi: int) -> list[Allocation]:
        """The allocations made between the marks ``lo`` and ``hi``, freed or live."""
        with self._lock:
            return [a for a in (*self.done, *self.allocations.values()) if lo <= a.seq <= hi]

    def forget(self) -> None:
        """Drop the freed allocations: no window will ask for them again."""
        with self._lock:
            self.done.clear()

    def close(self) -> None:
        pass


class HostSource(_Counted):
    """The host backend's pool: it calls ``allocated``/``freed`` itself."""

    name = "host"

    def __init__(self, tick: Callable[[], int], pool: Any) -> None:
        super().__init__(tick, pool.in_use)
        self._pool = pool
        pool.observer = self

    def close(self) -> None:
        self._pool.observer = None


class CupySource(_Counted):
    """CuPy's pool: read at the marks (``used_bytes``), and, where the test gates memory
    (``hook``), through a memory hook that sees each allocation. The hook costs each CuPy
    allocation a few microseconds of Python (a loop of small elementwise operations ran 2x
    slower on the H200: docs/performance.md), which would change the utilization being
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

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        # the pool grows only as it allocates and shrinks only when trimmed: what it
        # reserved is read at the marks, not at every allocation
        reserved = int(self._pool.total_bytes())
        if self._hook is None:
            used = int(self._pool.used_bytes())
            return used, used, None, reserved, reserved
        held, peak, peak_seq, before, _ = super().read()
        self.reserved = reserved
        return held, peak, peak_seq, reserved, max(reserved, before or 0)

    def hooked(self, tick: Callable[[], int]) -> CupySource:
        """This source, seeing each allocation from now on."""
        return self if self._hook is not None else CupySource(tick, self._cupy, True)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.__exit__(None, None, None)


UNSTEPPED = (
    "the steps' edges were not marked (PyTorch's counters cost about 40 us a read): a step's memory is not "
    "measured; a memory budget on the test marks them"
)
EDGES_ONLY = (
    "CuPy's pool read at the edges of windows and steps only: a peak between two edges is not seen "
    "(a memory budget on the test turns on CuPy's allocation hook, which sees each allocation)"
)


class TorchSource:
    """PyTorch's caching allocator on one device: its counters, the peaks reset at each read."""

    name = "torch"
    sees_each = False
    cheap = False
    note = (
        "PyTorch's allocator is read by its counters at each window's and step's edge (their peaks are "
        "reset there): its allocations' places are not seen"
    )

    def __init__(self, torch: Any, device: int) -> None:
        self._cuda = torch.cuda
        self._device = device
        self._cuda.reset_peak_memory_stats(device)

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        # the nested form: ``memory_stats`` flattens every counter in Python, ten times dearer
        stats = self._cuda.memory_stats_as_nested_dict(self._device)
        self._cuda.reset_peak_memory_stats(self._device)
        allocated, reserved = (
            stats.get("allocated_bytes", {}).get("all", {}),
            stats.get("reserved_bytes", {}).get("all", {}),
        )
        return (
            int(allocated.get("current", 0)),
            int(allocated.get("peak", 0)),
            None,
            int(reserved.get("current", 0)),
            int(reserved.get("peak", 0)),
        )

    def close(self) -> None:
        pass


class Discovery:
    """The frameworks' sources, each once its framework is loaded and, for PyTorch, has
    touched the device: a test that starts CUDA halfway through is counted from then."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.each = False  # see each allocation where the framework can tell (CuPy's hook)

    def __call__(self, tick: Callable[[], int]) -> list[MemorySource]:
        out: list[MemorySource] = []
        torch = sys.modules.get("torch")
        if "torch" not in self._seen and torch is not None and torch.cuda.is_initialized():
            self._seen.add("torch")
            out.append(TorchSource(torch, torch.cuda.current_device()))
        cupy = sys.modules.get("cupy")
        if "cupy" not in self._seen and cupy is not None:
            self._seen.add("cupy")
            out.append(CupySource(tick, cupy, self.each))
        return out


def jax_note() -> str | None:
    """What JAX's memory looks like from here, where JAX is loaded."""
    if "jax" not in sys.modules:
        return None
    if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() in ("false", "0"):
        return "JAX's allocations are not seen one by one: memory counts PyTorch's and CuPy's allocators only"
    return (
        "JAX preallocated most of the device for its pool (XLA_PYTHON_CLIENT_PREALLOCATE): a peak of what "
        "its code held is not seen, only the pool"
    )


class MemoryTracker:
    """Marks of the sources' figures at a window's edges and its steps' edges.

    ``open_steps``: the span ids of the steps open now (the span recorder's), which each
    mark keeps: the steps open over the stretch after it."""

    def __init__(
        self,
        sources: Callable[[Callable[[], int]], list[MemorySource]],
        open_steps: Callable[[], tuple[int, ...]] = tuple,
    ) -> None:
        self._count = itertools.count()
        self._lock = threading.Lock()
        self._discover: Callable[[Callable[[], int]], list[MemorySource]] | None = sources
        self.sources: list[MemorySource] = []
        self.open_steps = open_steps
        self.marks: list[MemoryMark] = []
        self._each = False
        self._skipped: list[int] = []  # the counts of the step edges not marked

    def tick(self) -> int:
        return next(self._count)  # atomic under the GIL

    def see_each(self) -> None:
        """See each allocation where a source can, and mark every step's edges, from now on:
        a memory budget needs the peaks between the edges, per step, and the allocations'
        places (CuPy's hook)."""
        self._each = True
        if isinstance(self._discover, Discovery):
            self._discover.each = True
        self.sources = [s.hooked(self.tick) if isinstance(s, CupySource) else s for s in self.sources]

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.sources)

    def mark(self, at: int, *, step: bool = False) -> int | None:
        """A mark at ``at`` (the edge's own stamp): each source read, summed; its count,
        ``None`` where no source is in use. A ``step``'s edge is marked only where every
        source reads cheaply or the test gates memory: PyTorch's counters cost about 40 us a
        read, which a step inside a window would add to the window's host time."""
        if self._discover is not None:
            self.sources += self._discover(self.tick)
        if not self.sources:
            return None
        if step and not self._each and not all(s.cheap for s in self.sources):
            self._skipped.append(self.tick())
            return None
        readings = [s.read() for s in self.sources]
        held = sum(r[0] for r in readings)
        # the stretch's peak: each source's own peak over the others' held (exact with one
        # allocating source, an upper bound where two allocated in one stretch)
        peak = max(r[1] + held - r[0] for r in readings)
        reached = [r[2] for r in readings if r[2] is not None and r[1] + held - r[0] == peak]
        reserved = [r[3] for r in readings if r[3] is not None]
        reserved_peaks = [r[4] for r in readings if r[4] is not None]
        seq = self.tick()
        mark = MemoryMark(
            seq,
            at,
            held,
            peak,
            reached[0] if reached else None,
            sum(reserved) if reserved else None,
            sum(reserved_peaks) if reserved_peaks else None,
            self.open_steps(),
        )
        with self._lock:
            self.marks.append(mark)
        return seq

    def log(self, lo: int | None = None, hi: int | None = None) -> MemoryLog | None:
        """The marks and allocations between the marks ``lo`` and ``hi`` (all kept ones
        where not given); ``None`` where no source was in use."""
        if not self.sources:
            return None
        lo = 0 if lo is None else lo
        hi = self.tick() if hi is None else hi
        with self._lock:
            marks = tuple(m for m in self.marks if lo <= m.seq <= hi)
            stepped = not any(lo <= seq <= hi for seq in self._skipped)
        counted = [s for s in self.sources if isinstance(s, _Counted) and s.sees_each]
        allocations = tuple(a for s in counted for a in s.taken(lo, hi)) if counted else None
        notes = [n for n in (jax_note(), *(getattr(s, "note", None) for s in self.sources)) if n]
        if not stepped:
            notes.append(UNSTEPPED)
        every = len(counted) == len(self.sources)
        return MemoryLog(self.name, marks, allocations, "; ".join(notes) or None, every, stepped)

    def forget(self) -> None:
        """No window open: what was marked is accounted for."""
        with self._lock:
            self.marks.clear()
            self._skipped.clear()
        for source in self.sources:
            if isinstance(source, _Counted):
                source.forget()

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.sources = []
        self._discover = None


def tracker_for(backend: Any) -> MemoryTracker:
    """A test's tracker: the host backend's pool where the backend has one that tells of
    its allocations, else the frameworks' allocators as they come into use."""
    pool = getattr(backend, "pool", None)
    if pool is not None and hasattr(pool, "observer"):
        return MemoryTracker(_once(lambda tick: [HostSource(tick, pool)]))
    return MemoryTracker(Discovery())


def _once(make: Callable[[Callable[[], int]], list[MemorySource]]) -> Callable[[Callable[[], int]], list[MemorySource]]:
    done = False

    def sources(tick: Callable[[], int]) -> list[MemorySource]:
        nonlocal done
        if done:
            return []
        done = True
        return make(tick)

    return sources
