"""The metrics of docs/design.md, computed from a ``Timeline``: pure functions, no I/O.

Utilization is kernel time over wall time, where kernel time is the length of the union
of kernel intervals inside the window. Every kernel-idle stretch is charged to the
innermost host step active on each thread at that moment, split evenly among the threads
that have one; what no step covers is ``unattributed``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from pytest_gpuprof import intervals as iv
from pytest_gpuprof.model import UNATTRIBUTED, DeviceInterval, Sample, Span, Timeline, Truth
from pytest_gpuprof.stats import Summary

NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One host step's figures in a window."""

    count: int
    host_ms: float
    host_ms_max: float
    idle_ms: float
    bytes: int
    gbps: float | None
    pageable: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NvmlMetrics:
    """What an observer of the hardware saw during the window."""

    util_mean: float | None
    power_mean_w: float | None
    power_max_w: float | None
    mem_used_max_bytes: int | None
    samples: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Metrics:
    """The figures of one window, or the per-metric medians over rounds (``rounds`` set)."""

    wall_ms: float
    kernel_ms: float
    copy_ms: float
    busy_ms: float
    utilization: float
    busy_utilization: float
    reported_utilization: float | None
    discrepancy: float | None
    overhead_ms: float
    unattributed_ms: float
    kernels: int
    truth: Truth
    steps: Mapping[str, StepMetrics] = field(default_factory=dict)
    nvml: NvmlMetrics | None = None
    rounds: Mapping[str, Summary] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def flat(self) -> dict[str, float]:
        """Every numeric metric under its public path (``steps.upload.idle_ms``...)."""
        out: dict[str, float] = {}
        for name in SCALARS:
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        for step, figures in self.steps.items():
            for key in STEP_SCALARS:
                value = getattr(figures, key)
                if value is not None:
                    out[f"steps.{step}.{key}"] = float(value)
        if self.nvml is not None:
            for key in NVML_SCALARS:
                value = getattr(self.nvml, key)
                if value is not None:
                    out[f"nvml.{key}"] = float(value)
        return out

    def get(self, path: str) -> float | None:
        """The value of a metric path, or ``None`` where this window has no such figure."""
        return self.flat().get(path)

    def idle_by_step(self) -> list[tuple[str, float]]:
        """Kernel-idle time per step, largest first, ``unattributed`` last."""
        charged = sorted(
            ((name, s.idle_ms) for name, s in self.steps.items() if s.idle_ms > 0),
            key=lambda item: -item[1],
        )
        return [*charged, (UNATTRIBUTED, self.unattributed_ms)]

    def to_dict(self) -> dict[str, object]:
        return {
            **{name: getattr(self, name) for name in SCALARS},
            "unattributed_ms": self.unattributed_ms,
            "kernels": self.kernels,
            "truth": self.truth,
            "steps": {name: s.to_dict() for name, s in self.steps.items()},
            **({"nvml": self.nvml.to_dict()} if self.nvml is not None else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
        }


SCALARS = (
    "wall_ms",
    "kernel_ms",
    "copy_ms",
    "busy_ms",
    "utilization",
    "busy_utilization",
    "reported_utilization",
    "discrepancy",
    "overhead_ms",
)
STEP_SCALARS = ("count", "host_ms", "host_ms_max", "idle_ms", "bytes", "gbps")
NVML_SCALARS = ("util_mean", "power_mean_w", "power_max_w", "mem_used_max_bytes")


def compute(timeline: Timeline) -> Metrics:
    """All metrics of one window."""
    window = (timeline.start, timeline.end)
    wall = max(timeline.end - timeline.start, 0)
    kernels = [(d.start, d.end) for d in timeline.device if d.kind == "kernel"]
    copies = [(d.start, d.end) for d in timeline.device if d.kind == "memcpy"]
    busy_spans = [(d.start, d.end) for d in timeline.device]
    kernel_union = iv.union(iv.clip(kernels, window))
    kernel_ns = sum(e - s for s, e in kernel_union)
    busy_ns = iv.covered_length(busy_spans, window)
    copy_ns = iv.covered_length(copies, window)

    idle = iv.gaps(kernel_union, window)
    charged, unattributed = attribute_idle(timeline.steps, idle)

    reported: float | None = None
    if timeline.regions:
        bracketed = iv.covered_length(((r.start, r.end) for r in timeline.regions), window)
        reported = _ratio(bracketed, wall)
    utilization = _ratio(kernel_ns, wall)
    return Metrics(
        wall_ms=wall / NS_PER_MS,
        kernel_ms=kernel_ns / NS_PER_MS,
        copy_ms=copy_ns / NS_PER_MS,
        busy_ms=busy_ns / NS_PER_MS,
        utilization=utilization,
        busy_utilization=_ratio(busy_ns, wall),
        reported_utilization=reported,
        discrepancy=None if reported is None else reported - utilization,
        overhead_ms=(wall - kernel_ns) / NS_PER_MS,
        unattributed_ms=unattributed / NS_PER_MS,
        kernels=len(iv.clip(kernels, window)),
        truth=timeline.truth,
        steps=_step_metrics(timeline.steps, timeline.device, charged, window),
        nvml=nvml_metrics(timeline.samples, window),
        notes=timeline.notes,
    )


def attribute_idle(steps: Sequence[Span], idle: Sequence[iv.Interval]) -> tuple[dict[str, float], float]:
    """Charge each idle stretch to the innermost step of each thread active then.

    ``idle`` is sorted and disjoint. Returns nanoseconds charged per step name and the
    nanoseconds no step covered; the two add up to the total idle length. The active
    steps change only where a step opens or closes: between two such points, the idle
    time inside is charged at once (a window can hold a hundred thousand idle stretches).
    """
    charged: dict[str, float] = defaultdict(float)
    unattributed = 0.0
    if not idle:
        return dict(charged), unattributed
    lo, hi = idle[0][0], idle[-1][1]
    relevant = [s for s in steps if s.end > lo and s.start < hi and s.end > s.start]
    opening: dict[int, list[Span]] = defaultdict(list)
    closing: dict[int, list[Span]] = defaultdict(list)
    points = {lo, hi}
    for span in relevant:
        opening[span.start].append(span)
        closing[span.end].append(span)
        points.update(p for p in (span.start, span.end) if lo < p < hi)
    ordered = sorted(points)
    before = _idle_before(idle, ordered)

    active: dict[int, list[Span]] = defaultdict(list)
    for span in relevant:
        if span.start < lo:
            active[span.thread].append(span)
    for i, a in enumerate(ordered[:-1]):
        for span in closing.get(a, ()):
            active[span.thread].remove(span)
        for span in opening.get(a, ()):
            if span.start >= lo:
                active[span.thread].append(span)
        stretch = before[i + 1] - before[i]
        if stretch <= 0:
            continue
        innermost = [max(lane, key=lambda s: (s.depth, s.start, s.name)) for lane in active.values() if lane]
        if not innermost:
            unattributed += stretch
            continue
        share = stretch / len(innermost)
        for span in innermost:
            charged[span.name] += share
    return dict(charged), unattributed


def _idle_before(idle: Sequence[iv.Interval], points: Sequence[int]) -> list[int]:
    """For each point, the idle time before it (``idle`` sorted and disjoint)."""
    spans = np.asarray(idle, dtype=np.int64)
    starts, ends = spans[:, 0], spans[:, 1]
    done = np.r_[0, np.cumsum(ends - starts)]  # idle in the first k stretches
    at = np.asarray(points, dtype=np.int64)
    k = np.searchsorted(ends, at, side="right")  # stretches over by then
    partial = np.where(k < len(starts), np.clip(at - starts[np.minimum(k, len(starts) - 1)], 0, None), 0)
    return (done[k] + partial).tolist()


def _step_metrics(
    steps: Sequence[Span],
    device: Sequence[DeviceInterval],
    charged: Mapping[str, float],
    window: iv.Interval,
) -> dict[str, StepMetrics]:
    copies_by_span = _copies_by_span(steps, device)
    by_name: dict[str, list[Span]] = defaultdict(list)
    for span in steps:
        if iv.clip([(span.start, span.end)], window) or span.start == span.end:
            by_name[span.name].append(span)
    out: dict[str, StepMetrics] = {}
    for name in sorted(by_name):
        every = by_name[name]
        spans = _outermost(every)
        durations = [sum(e - s for s, e in iv.clip([(sp.start, sp.end)], window)) for sp in spans]
        copies = [c for sp in every for c in copies_by_span.get(sp.span_id, ())]
        declared = [sp.bytes for sp in spans if sp.bytes is not None]
        copied = sum(c.bytes for c in copies)
        nbytes = sum(declared) if declared else copied
        copy_ns = iv.length((c.start, c.end) for c in copies)
        host_ns = sum(durations)
        gbps: float | None = None
        if copies and copy_ns > 0:
            gbps = copied / copy_ns  # bytes per ns is GB/s
        elif nbytes and host_ns > 0:
            gbps = nbytes / host_ns
        out[name] = StepMetrics(
            count=len(spans),
            host_ms=host_ns / NS_PER_MS,
            host_ms_max=max(durations, default=0) / NS_PER_MS,
            idle_ms=charged.get(name, 0.0) / NS_PER_MS,
            bytes=nbytes,
            gbps=gbps,
            pageable=any(sp.pageable for sp in spans) or any(c.pageable for c in copies),
        )
    return out


def _outermost(spans: Sequence[Span]) -> list[Span]:
    """The spans of one name less those nested in another of that name on their thread:
    a step that opens itself again (a helper called from a helper) counts once."""
    kept: list[Span] = []
    enclosing: dict[int, Span] = {}  # per thread, the last span kept
    for span in sorted(spans, key=lambda s: (s.thread, s.start, -s.end, s.depth)):
        outer = enclosing.get(span.thread)
        if outer is not None and span.depth > outer.depth and outer.start <= span.start and span.end <= outer.end:
            continue
        kept.append(span)
        enclosing[span.thread] = span
    return kept


def _copies_by_span(steps: Sequence[Span], device: Sequence[DeviceInterval]) -> dict[int, list[DeviceInterval]]:
    """Each copy under the step that launched it: by tag where the backend tagged it, else
    the innermost step on the copy's stream that was open when the copy started."""
    out: dict[int, list[DeviceInterval]] = defaultdict(list)
    on_stream: dict[int, list[Span]] = defaultdict(list)
    for span in steps:
        if span.stream is not None:
            on_stream[span.stream].append(span)
    for d in device:
        if d.kind != "memcpy":
            continue
        if d.span_id is not None:
            out[d.span_id].append(d)
            continue
        open_then = [s for s in on_stream.get(d.stream, ()) if s.start <= d.start <= s.end]
        if open_then:
            out[max(open_then, key=lambda s: (s.depth, s.start)).span_id].append(d)
    return out


def nvml_metrics(samples: Iterable[Sample], window: iv.Interval) -> NvmlMetrics | None:
    inside = [s for s in samples if window[0] <= s.time <= window[1]]
    if not inside:
        return None
    utils = [s.util for s in inside if s.util is not None]
    powers = [s.power_w for s in inside if s.power_w is not None]
    mems = [s.mem_used_bytes for s in inside if s.mem_used_bytes is not None]
    return NvmlMetrics(
        util_mean=sum(utils) / len(utils) if utils else None,
        power_mean_w=sum(powers) / len(powers) if powers else None,
        power_max_w=max(powers) if powers else None,
        mem_used_max_bytes=max(mems) if mems else None,
        samples=len(inside),
    )


def aggregate(rounds: Sequence[Metrics]) -> Metrics:
    """Per-metric medians over rounds, with every metric's ``Summary`` in ``rounds``."""
    if not rounds:
        raise ValueError("aggregate needs at least one round")
    paths: dict[str, list[float]] = defaultdict(list)
    for m in rounds:
        for path, value in m.flat().items():
            paths[path].append(value)
    summaries = {path: Summary.of(values) for path, values in paths.items()}

    def med(path: str, default: float = 0.0) -> float:
        return summaries[path].median if path in summaries else default

    def opt(path: str) -> float | None:
        return summaries[path].median if path in summaries else None

    last = rounds[-1]
    steps = {
        name: replace(
            figures,
            count=round(med(f"steps.{name}.count")),
            host_ms=med(f"steps.{name}.host_ms"),
            host_ms_max=med(f"steps.{name}.host_ms_max"),
            idle_ms=med(f"steps.{name}.idle_ms"),
            bytes=round(med(f"steps.{name}.bytes")),
            gbps=opt(f"steps.{name}.gbps"),
            pageable=any(name in m.steps and m.steps[name].pageable for m in rounds),
        )
        for name, figures in last.steps.items()
    }
    nvml = None
    if last.nvml is not None:
        mem = opt("nvml.mem_used_max_bytes")
        nvml = NvmlMetrics(
            util_mean=opt("nvml.util_mean"),
            power_mean_w=opt("nvml.power_mean_w"),
            power_max_w=opt("nvml.power_max_w"),
            mem_used_max_bytes=None if mem is None else round(mem),
            samples=sum(m.nvml.samples for m in rounds if m.nvml is not None),
        )
    unattributed = sorted(m.unattributed_ms for m in rounds)
    return Metrics(
        wall_ms=med("wall_ms"),
        kernel_ms=med("kernel_ms"),
        copy_ms=med("copy_ms"),
        busy_ms=med("busy_ms"),
        utilization=med("utilization"),
        busy_utilization=med("busy_utilization"),
        reported_utilization=opt("reported_utilization"),
        discrepancy=opt("discrepancy"),
        overhead_ms=med("overhead_ms"),
        unattributed_ms=float(Summary.of(unattributed).median),
        kernels=round(Summary.of([m.kernels for m in rounds]).median),
        truth=last.truth,
        steps=steps,
        nvml=nvml,
        rounds=summaries,
        notes=last.notes,
    )


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
