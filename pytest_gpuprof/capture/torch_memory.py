"""PyTorch's caching allocator, read through its own history, never through its peak
counters: a test that resets or reads ``torch.cuda.max_memory_allocated()`` sees the same
values with the plugin as without it.

``TorchSource`` turns on the allocator's history (``torch.cuda.memory._record_memory_history``)
while PyTorch is in use: the allocator appends each allocation, free and segment of the
driver's to a ring of its own, in C++ (no Python per allocation), with the Python stack that
made it where the test gates memory or asks for the top allocations. Each edge of a window
or step tags what follows it (``_set_memory_metadata``; on a PyTorch without it, the host's
wall clock, to the microsecond the allocator stamps). At a window's end the ring is read
once (``settle``), replayed from what the counters held at the window's start, and cut at
the edges: each stretch's peak, the allocation that reached it, what each allocation was
and where it came from. The ring is emptied once no window is open.

What it does not see: a window of more allocations than the ring holds. Its figures are then
"not measured", and the note says why; so are they wherever the replay does not reach what
the counters hold at a window's end (read there, outside the window), whatever the cause.
Allocations of other threads between two edges are placed by their tag like the rest.
The untagged way is the rougher: on an H100 (torch 2.11) the allocator's stamps ran a few
microseconds behind ``time.time_ns`` (docs/performance-log.md), so there an allocation made
within microseconds after an edge may be counted before it.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pytest_gpuprof.analysis.model import Allocation
from pytest_gpuprof.capture.memory_sources import Reading
from pytest_gpuprof.capture.stacks import Places

__all__ = ["RING", "TorchSource", "replay"]

RING = 1 << 20  # trace entries the allocator keeps (about 100-200 bytes each, in the host's memory)
TAG = "gpuprof:"
# the seqs of a stretch's replayed events: after its edge's seq, before the tracker's next
# (the tracker counts in strides of STRIDE: ``capture.memory``)
STRIDE = 1 << 20


_HELD = {"alloc": 1, "free_completed": -1}
_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def replay(
    events: Iterable[Mapping[str, Any]],
    edges: Sequence[int],
    start: tuple[int, int],
    *,
    place: Callable[[Sequence[Mapping[str, Any]]], str] | None = None,
    step_of: Callable[[int], int | None] = lambda _: None,
    live_at_end: dict[int, int] | None = None,
) -> tuple[dict[int, Reading], list[Allocation]]:
    """Each edge's reading and the allocations made, from the allocator's events in order.

    ``events``: the trace entries since the first edge, each with ``edge`` (the seq of the
    edge it followed) added; ``edges``: the edges' seqs in order; ``start``: what the
    allocator held and had reserved at the first edge. An allocation made after edge ``e``
    gets the seq ``e + i`` (its ``i``-th event there); its place comes from ``place`` (the
    stack's frames, innermost first) where given, its step from ``step_of(e)``. A free of
    memory allocated before the first edge lowers what is held and frees no allocation.
    ``live_at_end`` (where given, with ``place``) receives the address and seq of each
    allocation still live after the last edge."""
    held, reserved = start
    peak, peak_seq, reserved_peak = held, None, reserved
    readings: dict[int, Reading] = {edges[0]: Reading(held, held, None, reserved, reserved)}
    live: dict[int, Allocation] = {}
    made: list[Allocation] = []
    by_edge: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        by_edge[event["edge"]].append(event)
    for before, after in itertools.pairwise(edges):
        for i, event in enumerate(by_edge.get(before, ()), start=1):
            seq = before + min(i, STRIDE - 1)
            action, size = event["action"], int(event["size"])
            if action in _RESERVED:
                reserved += _RESERVED[action] * size
                reserved_peak = max(reserved_peak, reserved)
                continue
            if action not in _HELD:
                continue
            held += _HELD[action] * size
            address = int(event["addr"])
            if action == "alloc":
                if held > peak:
                    peak, peak_seq = held, seq
                if place is not None:
                    live[address] = Allocation(seq, None, size, place(event.get("frames") or ()), step_of(before))
            elif (gone := live.pop(address, None)) is not None:
                made.append(gone._replace(end_seq=seq))
        readings[after] = Reading(held, peak, peak_seq, reserved, reserved_peak)
        peak, peak_seq, reserved_peak = held, None, reserved
    if live_at_end is not None:
        live_at_end.update((address, a.seq) for address, a in live.items())
    return readings, [*made, *live.values()]


class TorchSource:
    """PyTorch's allocator on one device, from its history (the module docstring).
    ``stacks``: record where each allocation was made (a memory budget, ``--gpu-memory-top``):
    the allocator then takes the Python stack at each allocation, microseconds each."""

    name = "torch"

    def __init__(self, torch: Any, device: int, *, stacks: bool, places: Places | None = None) -> None:
        self._cuda = torch.cuda
        self._memory = torch.cuda.memory
        self._device = device
        self.sees_each = stacks
        self._places = places if places is not None else Places()
        self._tagged = hasattr(self._memory, "_set_memory_metadata")
        self.note: str | None = None
        self.failed: str | None = None
        self._start: tuple[int, int] | None = None  # the counters at the first edge since the ring was emptied
        self._edges: list[tuple[int, int]] = []  # (seq, wall-clock ns) of each edge since then
        self._made: list[Allocation] = []
        self._counted: dict[int, int] = {}  # what the counters held at a window's later edges, by seq
        self.now = time.time_ns  # the clock of the allocator's stamps, where it keeps no tag
        # what windows kept (address: seq), seen one by one: of rings emptied since (less what
        # the ring now saw freed), and of the ring now (its last replay's)
        self._carried: dict[int, int] = {}
        self._ring_live: dict[int, int] = {}
        self._on(stacks)

    def _on(self, stacks: bool) -> None:
        self._memory._record_memory_history(
            enabled="all", context="alloc" if stacks else None, stacks="python", max_entries=RING
        )

    def hooked(self, tick: Callable[[], int]) -> TorchSource:
        """This source, recording each allocation's stack from the next window on."""
        if not self.sees_each:
            self.sees_each = True
            self._on(True)
        return self

    def _counters(self) -> tuple[int, int]:
        # the nested form: ``memory_stats`` flattens every counter in Python, ten times dearer
        stats = self._cuda.memory_stats_as_nested_dict(self._device)
        return (
            int(stats.get("allocated_bytes", {}).get("all", {}).get("current", 0)),
            int(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)),
        )

    def read(self) -> Reading:
        """At an edge: the counters where this is the first edge since the ring was emptied
        (a window's start), else nothing yet: ``settle`` gives the edge's figures."""
        if self._start is None:
            held, reserved = self._start = self._counters()
            return Reading(held, held, None, reserved, reserved)
        return Reading(0, 0)

    def edge(self, seq: int, *, step: bool = False) -> None:
        """Tag what the allocator does from now on with the edge's ``seq``. At a window's
        edge after its first, the counters are read too: what the replay must reach."""
        if self._tagged:
            self._memory._set_memory_metadata(f"{TAG}{seq}")
        if not step and self._edges:
            self._counted[seq] = self._counters()[0]
        self._edges.append((seq, self.now()))

    def settle(self, step_of: Callable[[int], int | None]) -> dict[int, Reading]:
        """Each edge's figures since the ring was emptied, from the ring, replayed whole:
        a stretch still open is left for the next call."""
        if self._start is None or not self._edges:
            return {}
        try:
            trace = self._memory._snapshot()["device_traces"][self._device]
        except Exception as e:  # never into the test: its memory is "not measured", with why
            self.failed = f"PyTorch's allocator history could not be read ({type(e).__name__}: {e})"
            return {}
        if len(trace) >= RING:
            self.failed = (
                f"PyTorch's allocator history holds {RING:,} events and this window made more: "
                "the earliest were dropped, so its memory is not measured"
            )
        place = self._where if self.sees_each else None
        seqs = [s for s, _ in self._edges]
        self._freed(trace)
        self._ring_live = {}
        try:
            readings, self._made = replay(
                self._placed(trace), seqs, self._start, place=place, step_of=step_of, live_at_end=self._ring_live
            )
        except (KeyError, TypeError, ValueError) as e:  # a history of another shape: never into the test
            self.failed = f"PyTorch's allocator history could not be read ({type(e).__name__}: {e})"
            return {}
        for seq, held in self._counted.items():
            if seq in readings and readings[seq][0] != held:  # never a silently wrong figure
                self.failed = (
                    f"PyTorch's allocator history accounts for {readings[seq][0]:,} bytes held where its counters "
                    f"say {held:,}: its memory is not measured"
                )
        return readings

    def _placed(self, trace: Sequence[Mapping[str, Any]]) -> Iterable[dict[str, Any]]:
        """The events after the first edge, each with the seq of the edge it followed: its
        tag where the allocator kept one, else its stamp against the edges' clock."""
        seqs = {s for s, _ in self._edges}
        for event in trace:
            tag = event.get("user_metadata") or ""
            if tag.startswith(TAG):
                edge = int(tag[len(TAG) :])
                if edge in seqs:
                    yield {**event, "edge": edge}
                continue  # an edge of an earlier window: in the counters read at this one's start
            # the allocator stamps to the microsecond: an event of an edge's microsecond is after it
            stamp = int(event.get("time_us", 0))
            after = [s for s, ns in self._edges if ns // 1000 <= stamp]
            if after:
                yield {**event, "edge": after[-1]}

    def _where(self, frames: Sequence[Mapping[str, Any]]) -> str:
        return self._places.of_frames(
            [(str(f.get("filename", "?")), int(f.get("line", 0)), str(f.get("name", "?"))) for f in frames]
        )

    def taken(self, lo: int, hi: int) -> list[Allocation]:
        return [a for a in self._made if lo <= a.seq <= hi]

    def _freed(self, trace: Iterable[Mapping[str, Any]]) -> None:
        """Drop from what earlier rings' windows kept the allocations this ring saw freed (an
        address live then is freed before the allocator hands it out again)."""
        if self._carried:
            for event in trace:
                if event.get("action") == "free_completed":
                    self._carried.pop(int(event.get("addr", -1)), None)

    def held_now(self) -> int:
        return self._counters()[0]

    def live_seqs(self) -> frozenset[int] | None:
        """The windows' kept allocations still live: those of emptied rings that the ring now
        has not seen freed. ``None`` where allocations are not seen one by one, or a window's
        ring is still open (its later frees are not followed)."""
        if not self.sees_each or self._ring_live:
            return None
        if self._carried:
            self._freed(self._memory._snapshot()["device_traces"][self._device])
        return frozenset(self._carried.values())

    def forget(self) -> None:
        """No window open: empty the ring, and read the counters again at the next edge.
        What the windows kept is carried over, less what the ring saw freed."""
        if self._carried or self._ring_live:
            try:
                self._freed(self._memory._snapshot()["device_traces"][self._device])
            except Exception:  # unread, the kept allocations stand: their leak stays the window's
                pass
            self._carried.update(self._ring_live)
            self._ring_live = {}
        self._memory._record_memory_history(enabled=None)
        self._on(self.sees_each)
        self._start, self._edges, self._made, self._counted = None, [], [], {}
        if self._tagged:
            self._memory._set_memory_metadata("")

    def close(self) -> None:
        self._memory._record_memory_history(enabled=None)
        if self._tagged:
            self._memory._set_memory_metadata("")
