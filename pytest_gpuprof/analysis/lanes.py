"""A window's timeline as drawable lanes: host threads, regions, kernels and copies per
stream, kernel-idle stretches with what they were charged to, NVML counters.

Both the Perfetto trace and the HTML report are drawn from these; pure functions.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pytest_gpuprof.analysis.metrics import host_during_idle, idle_stretches
from pytest_gpuprof.analysis.model import MIB
from pytest_gpuprof.analysis.names import readable, short_names
from pytest_gpuprof.analysis.occupancy import Geometry, coverage
from pytest_gpuprof.analysis.processes import ProcessFigures
from pytest_gpuprof.analysis.timeline import Timeline


@dataclass(frozen=True, slots=True)
class Item:
    start: int  # ns from the window start
    end: int
    label: str
    args: dict[str, Any] = field(default_factory=dict)
    count: int = 1


@dataclass(frozen=True, slots=True)
class Lane:
    name: str
    kind: str  # "step", "region", "kernel", "memcpy", "memset", "idle", "host"
    items: list[Item]


@dataclass(frozen=True, slots=True)
class Counter:
    name: str
    unit: str
    points: list[tuple[int, float]]


def build(timeline: Timeline) -> tuple[list[Lane], list[Counter]]:
    t0 = timeline.start
    lanes: list[Lane] = []
    threads: dict[int, list[Item]] = defaultdict(list)
    # a span of an earlier round ended before this window: not drawn; one still open at
    # its start is drawn from the start (a window has no negative time)
    for s in sorted(timeline.steps, key=lambda s: (s.start, s.depth)):
        if s.end <= t0:
            continue
        args: dict[str, Any] = {"depth": s.depth}
        if s.bytes is not None:
            args["bytes"] = s.bytes
        threads[s.thread].append(Item(max(s.start - t0, 0), s.end - t0, s.name, args))
    thread_names = {thread: f"host thread {i + 1}" for i, thread in enumerate(sorted(threads))}
    for thread, items in sorted(threads.items()):
        lanes.append(Lane(f"{thread_names[thread]}: steps", "step", items))
    regions = sorted((r for r in timeline.regions if r.end > t0), key=lambda r: r.start)
    if regions:
        lanes.append(
            Lane("regions (brackets)", "region", [Item(max(r.start - t0, 0), r.end - t0, r.name) for r in regions])
        )
    device: dict[tuple[str, int], list[Item]] = defaultdict(list)
    shown = short_names(d.name for d in timeline.device if d.name)
    for d in sorted(timeline.device, key=lambda d: d.start):
        args = {"name": readable(d.name)} if d.name and shown[d.name] != d.name else {}
        if d.bytes:
            args["bytes"] = d.bytes
            if d.end > d.start:
                args["GB/s"] = round(d.bytes / (d.end - d.start), 2)
            args["pageable"] = d.pageable
        if d.kind == "kernel" and d.threads > 0 and timeline.sm is not None:
            # the fraction of the SMs its grid covered: the page shades the kernel by it
            args["SMs"] = round(coverage(Geometry(d.blocks, d.threads, d.registers, d.shared), timeline.sm), 4)
        device[(d.kind, d.stream)].append(Item(d.start - t0, d.end - t0, shown[d.name] if d.name else d.kind, args))
    # a group of lanes per process, the test's own first: a child's streams carry its pid
    # in their high bits (``capture.children``)
    for (kind, stream), items in sorted(device.items(), key=lambda kv: (kv[0][1] >> 32, kv[0])):
        lanes.append(Lane(device_lane(kind, stream, timeline.processes), kind, items))
    idle = idle_items(timeline)
    if idle:
        lanes.append(Lane("kernel-idle, charged to", "idle", idle))
    host = host_items(timeline)
    if host:
        lanes.append(Lane("host code in unattributed idle", "host", host))
    counters = []
    for name, unit, key in (("NVML utilization", "%", "util"), ("NVML power", "W", "power_w")):
        points = [
            (s.time - t0, 100 * v if unit == "%" else v) for s in timeline.samples if (v := getattr(s, key)) is not None
        ]
        if points:
            counters.append(Counter(name, unit, points))
    memory = memory_counter(timeline)
    if memory is not None:
        counters.append(memory)
    return lanes, counters


MEMORY = "device memory held (a stretch's peak drawn at its end)"


def memory_counter(timeline: Timeline) -> Counter | None:
    """The device memory the window's code held over its start, at each edge of the window
    and its steps, in MiB; each stretch's peak is drawn at the stretch's end (where in the
    stretch it came is not known). A peak known as a range only (JAX's statistics) is
    drawn at its least: the most is the process's peak, which the stretch may not have held."""
    log = timeline.memory
    if log is None or len(log.marks) < 2:
        return None
    marks = sorted(log.marks, key=lambda m: m.seq)
    base, t0 = marks[0].held, timeline.start
    points = [(max(marks[0].time - t0, 0), 0.0)]
    for before, m in itertools.pairwise(marks):
        at = max(m.time - t0, 0)
        # flat until the edge (what happened between is known only as the stretch's peak)
        peak = m.peak if m.peak_low is None else m.peak_low
        points += [(at, (before.held - base) / MIB), (at, (peak - base) / MIB), (at, (m.held - base) / MIB)]
    return Counter(MEMORY, "MiB", points)


def device_lane(kind: str, stream: int, processes: tuple[ProcessFigures, ...]) -> str:
    """``kernels, stream 7``; on a process the test started, ``pid 812, rank 0: kernels,
    stream 7`` (short enough for the page's lane labels; its command is in ``processes``)."""
    pid = stream >> 32
    if not pid:
        return f"{kind}s, stream {stream}"
    rank = next((p.rank for p in processes if p.pid == pid), None)
    said = f"pid {pid}" if rank is None else f"pid {pid}, rank {rank}"
    return f"{said}: {kind}s, stream {stream & 0xFFFFFFFF}"


def idle_items(timeline: Timeline) -> list[Item]:
    """The kernel-idle stretches, each labelled with the step it is charged to most and
    every share (``charged_ms``): the charges of the metrics, drawn."""
    return [
        Item(
            s.start - timeline.start,
            s.end - timeline.start,
            s.cause,
            {"charged_ms": {name: round(ns / 1e6, 4) for name, ns in sorted(s.shares.items(), key=lambda kv: -kv[1])}},
        )
        for s in idle_stretches(timeline)
    ]


def host_items(timeline: Timeline) -> list[Item]:
    """What the host ran during the unattributed idle (sampled stacks), labelled with the
    place that took most of each piece; neighbours of one place are one item."""
    out: list[Item] = []
    for piece in host_during_idle(timeline):
        start, end = piece.start - timeline.start, piece.end - timeline.start
        label = max(piece.shares, key=lambda place: (piece.shares[place], place))
        last = out[-1] if out else None
        if last is not None and last.end == start and last.label == label:
            out[-1] = Item(last.start, end, label)
        else:
            out.append(Item(start, end, label))
    return out


def bucket(items: list[Item], span: int, buckets: int, noun: str = "items", *, by_label: bool = False) -> list[Item]:
    """At most about ``buckets`` items: those in the same 1/buckets of ``span`` are merged,
    keeping their count, so that tens of thousands of kernels stay drawable. ``by_label``
    merges only neighbours of the same label and keeps it (idle stretches keep the step
    they were charged to)."""
    if len(items) <= buckets or span <= 0:
        return items
    width = span / buckets
    out: list[Item] = []
    # runs of neighbours in one bucket (and of one label, by_label): one item each
    for _, run in itertools.groupby(
        items, key=lambda i: (min(buckets - 1, max(0, int(i.start // width))), i.label if by_label else None)
    ):
        first, *rest = run
        if not rest:
            out.append(first)
            continue
        count = first.count + sum(i.count for i in rest)
        end = max(first.end, max(i.end for i in rest))
        out.append(Item(first.start, end, first.label if by_label else f"{count} {noun}", {}, count))
    return out
