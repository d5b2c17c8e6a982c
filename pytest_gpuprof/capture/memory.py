"""Device memory over a window: what the test's allocators held, marked at the window's
edges and at each step's, with each allocation's size and place where the allocator tells
them.

A ``MemoryTracker`` keeps ``Mark``s: at each, the bytes held now and the most held since
the mark before (and the same for what the process had reserved from the driver). The
sources (``memory_sources``) are the allocators that a test's code uses, found as they come
into use (``Discovery``): PyTorch's, CuPy's, the host backend's pool; where JAX has started,
its allocator's statistics beside them (its own pool), or the driver's allocation calls
instead of them (its platform allocator, ``jax_memory``).

``analysis.memory`` turns the marks of a window into its ``memory`` figures. A source
whose framework has not touched the device yet is not used; where none is, the window
says so, and ``memory`` reads "not measured", never 0.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from pytest_gpuprof.analysis.memory import Live
from pytest_gpuprof.analysis.model import MemoryLog, MemoryMark
from pytest_gpuprof.capture import jax_memory
from pytest_gpuprof.capture.memory_sources import CupySource, HostSource, MemorySource, Reading
from pytest_gpuprof.capture.torch_memory import STRIDE, TorchSource

__all__ = ["Discovery", "MemorySource", "MemoryTracker", "tracker_for"]


class Discovery:
    """The frameworks' sources, each once its framework is loaded and, for PyTorch, has
    touched the device: a test that starts CUDA halfway through is counted from then."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.each = False  # see each allocation's place where the framework can tell
        self.unseen: str | None = None  # why no source can read the test's memory
        self.restart = False  # the sources found so far are to be dropped (JAX started)

    def forget_jax(self) -> None:
        """Look for JAX again at the next mark (a memory gate came after it was found)."""
        self._seen.discard("jax")
        self.unseen = None

    def __call__(self, tick: Callable[[], int]) -> list[MemorySource]:
        out: list[MemorySource] = []
        if "jax" not in self._seen and jax_memory.jax_started():
            self._seen.add("jax")
            source, self.unseen = jax_memory.for_jax(tick, gated=self.each)
            if not isinstance(source, jax_memory.JaxStats):
                # the driver sees JAX's arrays and the other frameworks' with them; or nothing is read
                self._seen |= {"torch", "cupy"}
                self.restart = True
                return [source] if source is not None else []
            out.append(source)  # JAX's own pool, beside the other frameworks'
        torch = sys.modules.get("torch")
        if "torch" not in self._seen and torch is not None and torch.cuda.is_initialized():
            self._seen.add("torch")
            try:
                out.append(TorchSource(torch, torch.cuda.current_device(), stacks=self.each))
            except Exception as e:  # a PyTorch without the allocator's history (before 2.1)
                self.unseen = f"PyTorch's allocator history could not be turned on ({type(e).__name__}: {e})"
        cupy = sys.modules.get("cupy")
        if "cupy" not in self._seen and cupy is not None:
            self._seen.add("cupy")
            out.append(CupySource(tick, cupy, self.each))
        return out


class _Edge(NamedTuple):
    """A mark as taken: each source's reading (a deferred source's comes at ``log``)."""

    seq: int
    time: int
    readings: tuple[Reading, ...]
    open: tuple[int, ...]


class MemoryTracker:
    """Marks of the sources' figures at a window's edges and its steps' edges.

    ``open_steps``: the span ids of the steps open now (the span recorder's), which each
    mark keeps: the steps open over the stretch after it. The count that orders marks and
    allocations moves in strides (``STRIDE``), so that a source read back later (PyTorch's
    history) can number the allocations between two marks."""

    def __init__(
        self,
        sources: Callable[[Callable[[], int]], list[MemorySource]],
        open_steps: Callable[[], tuple[int, ...]] = tuple,
    ) -> None:
        self._count = itertools.count(0, STRIDE)
        self._lock = threading.Lock()
        self._discover: Callable[[Callable[[], int]], list[MemorySource]] | None = sources
        self.sources: list[MemorySource] = []
        self.open_steps = open_steps
        self._edges: list[_Edge] = []
        self._each = False
        self._since = 0  # the count from which the sources in use were read
        self.why: str | None = None  # why the last ``log`` read nothing

    def tick(self) -> int:
        return next(self._count)  # atomic under the GIL

    def see_each(self) -> None:
        """See each allocation's place where a source can, from now on: a memory budget
        needs the peaks between the edges and the allocations' places (CuPy's hook,
        PyTorch's stacks)."""
        self._each = True
        if isinstance(self._discover, Discovery):
            self._discover.each = True
            if self._discover.unseen == jax_memory.UNGATED:
                self._discover.forget_jax()  # found before the gate: followed from the next mark
        self.sources = [s.hooked(self.tick) if isinstance(s, (CupySource, TorchSource)) else s for s in self.sources]

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.sources)

    def mark(self, at: int, *, step: bool = False) -> int | None:
        """A mark at ``at`` (the edge's own stamp): each source read; its count, ``None``
        where no source is in use. ``step``: a step's edge (a window's otherwise)."""
        if self._discover is not None:
            self._found(self._discover(self.tick))
        if not self.sources:
            return None
        readings = tuple(s.read() for s in self.sources)
        seq = self.tick()
        for source in self.sources:
            source.edge(seq, step=step)
        with self._lock:
            self._edges.append(_Edge(seq, at, readings, self.open_steps()))
        return seq

    def _found(self, new: list[MemorySource]) -> None:
        """Take the sources discovery found; where JAX started, drop those read so far and
        their marks: the driver's calls count their memory again, or nothing can be read."""
        if isinstance(self._discover, Discovery) and self._discover.restart:
            self._discover.restart = False
            for source in self.sources:
                source.close()
            self.sources = []
            with self._lock:
                self._edges.clear()
            self._since = self.tick()
        self.sources += new

    def unseen(self, lo: int | None = None) -> str | None:
        """Why the memory from the mark ``lo`` on cannot be read (``None``: it can)."""
        why = self._discover.unseen if isinstance(self._discover, Discovery) else None
        failed = [f for f in (getattr(s, "failed", None) for s in self.sources) if f]
        if why is None and failed:
            why = failed[0]
        if why is None and lo is not None and lo < self._since:
            why = "JAX started on the device inside the window, which was read by other allocators until then"
        return why

    def log(self, lo: int | None = None, hi: int | None = None) -> MemoryLog | None:
        """The marks and allocations between the marks ``lo`` and ``hi`` (all kept ones
        where not given); ``None`` where no source was in use or the memory cannot be read
        (``why`` says why)."""
        with self._lock:
            edges = list(self._edges)
        settled = self._settle(edges)
        self.why = self.unseen(lo)
        if self.why is not None or not self.sources:
            return None
        lo = self._since if lo is None else lo
        hi = self.tick() if hi is None else hi
        marks = tuple(_combine(e, settled) for e in edges if lo <= e.seq <= hi)
        counted = [s for s in self.sources if s.sees_each]
        allocations = tuple(a for s in counted for a in s.taken(lo, hi)) if counted else None
        notes = [n for n in (getattr(s, "note", None) for s in self.sources) if n]
        every = len(counted) == len(self.sources)
        return MemoryLog(self.name, marks, allocations, "; ".join(notes) or None, every)

    def live(self) -> Live | None:
        """What the sources hold now, and which of their allocations are live (a test's
        call ends: ``analysis.memory.at_call_end``); ``None`` where none is in use or one
        cannot be read."""
        if not self.sources or self.unseen() is not None:
            return None
        seqs: set[int] | None = set()
        held = 0
        try:
            for source in self.sources:
                held += source.held_now()
                each = source.live_seqs()
                seqs = None if each is None or seqs is None else seqs | each
        except Exception:  # a framework gone (a test that shut it down): the window's own figures stand
            return None
        return Live(None if seqs is None else frozenset(seqs), held)

    def _settle(self, edges: list[_Edge]) -> list[dict[int, Reading] | None]:
        """Each source's readings by mark where it is read back later (PyTorch's history)."""
        opened = {e.seq: e.open for e in edges}

        def step_of(seq: int) -> int | None:
            return max(opened.get(seq, ()), default=None)  # the innermost: span ids grow inward

        return [s.settle(step_of) for s in self.sources]

    def forget(self) -> None:
        """No window open: what was marked is accounted for."""
        with self._lock:
            self._edges.clear()
        for source in self.sources:
            source.forget()

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.sources = []
        self._discover = None


def _combine(edge: _Edge, settled: list[dict[int, Reading] | None]) -> MemoryMark:
    """A mark from its sources' readings, summed: each source's own peak over what the
    others held (exact with one allocating source, an upper bound where two allocated in
    one stretch)."""
    # the sources only grow while edges are kept: ``settled`` is at least as long as ``readings``
    readings = [r if later is None else later.get(edge.seq, r) for r, later in zip(edge.readings, settled)]
    held = sum(r.held for r in readings)
    peak = max(r.peak + held - r.held for r in readings)
    # a source that knows its peak as a range only: the least the stretch's peak can be
    low = max((r.peak if r.peak_low is None else r.peak_low) + held - r.held for r in readings)
    reached = [r.peak_seq for r in readings if r.peak_seq is not None and r.peak + held - r.held == peak]
    reserved = [r.reserved for r in readings if r.reserved is not None]
    reserved_peaks = [r.reserved_peak for r in readings if r.reserved_peak is not None]
    return MemoryMark(
        edge.seq,
        edge.time,
        held,
        peak,
        reached[0] if reached else None,
        sum(reserved) if reserved else None,
        sum(reserved_peaks) if reserved_peaks else None,
        edge.open,
        low if low < peak else None,
    )


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
