"""A window's figures per step: count, host time, idle charged, bytes and bandwidth of
the copies it issued, memory kind, and how full the GPU was while its kernels ran."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis import sm_metrics
from pytest_gpuprof.analysis.attribution import enclosing
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import NS_PER_MS, Span, copy_direction
from pytest_gpuprof.analysis.occupancy import SmLimits


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One host step's figures in a window."""

    count: int
    host_ms: float
    host_ms_max: float
    idle_ms: float | None
    bytes: int
    gbps: float | None
    pageable: bool
    sm_utilization: float | None = None
    # the idle charged to the step and to the steps nested in it (what its budget judges);
    # ``idle_ms`` is its own share, and the shares of all steps add up to ``overhead_ms``
    idle_ms_inclusive: float | None = None
    # the copies it issued, by direction (h2d, d2h, d2d, p2p): {bytes, gbps}
    copies: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    # the most device memory held while it was open, over the window's start (``analysis.memory``)
    memory_peak_bytes: int | None = None
    # allocated while it (or a step nested in it) was open, not freed by the window's end
    leaked_bytes: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def step_metrics(
    steps: Sequence[Span],
    work: Mapping[int, DeviceWork],
    charged: Mapping[str, float] | None,
    window: iv.Interval,
    sm: SmLimits | None = None,
    inclusive: Mapping[str, float] | None = None,
) -> dict[str, StepMetrics]:
    """Each step's figures; its bytes, bandwidth and memory kind from the copies it and
    the steps nested in it issued (``bytes=`` where it declared them and no copy of it was
    seen); ``inclusive``: the idle charged to each step with those nested in it."""
    outer = enclosing(steps)
    by_name: dict[str, list[Span]] = defaultdict(list)
    for span in steps:
        if _in_window(span, window, work):
            by_name[span.name].append(span)
    out: dict[str, StepMetrics] = {}
    for name in sorted(by_name):
        every = by_name[name]
        spans = _outermost(every)
        durations = [sum(e - s for s, e in iv.clip([(sp.start, sp.end)], window)) for sp in spans]
        issuers = {sp.span_id for sp in every} | {i for i, names in outer.items() if name in names}
        done = DeviceWork.join(work[i] for i in sorted(issuers) if i in work)
        every_copy = done.where(done.of_kind("memcpy"))
        directions = _directions(every_copy)
        # host-device copies (and those whose direction the source cannot tell) make the
        # step's bytes, bandwidth and memory kind; device-to-device ones never do
        copies = every_copy.where(np.isin(directions, ["h2d", "d2h", ""]))
        declared = [sp.bytes for sp in spans if sp.bytes is not None]
        copied = int(copies.rows["bytes"].sum())
        nbytes = copied if len(copies) else sum(declared)
        copy_ns = iv.length(copies.spans())
        host_ns = sum(durations)
        gbps: float | None = None
        if len(copies) and copy_ns > 0:
            gbps = copied / copy_ns  # bytes per ns is GB/s
        elif nbytes and host_ns > 0:
            gbps = nbytes / host_ns
        kernels = done.where(done.of_kind("kernel"))
        kernel_ns = int(kernels.inside(window).sum())
        step_sm = None
        if sm is not None and kernel_ns > 0:
            step_sm = sm_metrics.sm_weighted_ns(kernels, sm, window) / kernel_ns
        out[name] = StepMetrics(
            count=len(spans),
            host_ms=host_ns / NS_PER_MS,
            host_ms_max=max(durations, default=0) / NS_PER_MS,
            idle_ms=None if charged is None else charged.get(name, 0.0) / NS_PER_MS,
            idle_ms_inclusive=None if inclusive is None else inclusive.get(name, 0.0) / NS_PER_MS,
            bytes=nbytes,
            gbps=gbps,
            pageable=any(sp.pageable for sp in spans) or bool(copies.rows["pageable"].any()),
            sm_utilization=step_sm,
            copies=_by_direction(every_copy, directions),
        )
    return out


def _directions(copies: DeviceWork) -> np.ndarray:
    """Each copy's direction ("" where its name does not tell)."""
    by_name = np.array([copy_direction(n) or "" for n in copies.names] or [""], dtype=object)
    return by_name[copies.rows["name"]] if len(copies) else np.array([], dtype=object)


def _by_direction(copies: DeviceWork, directions: np.ndarray) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for direction in ("h2d", "d2h", "d2d", "p2p"):
        these = copies.where(directions == direction)
        if len(these):
            nbytes, ns = int(these.rows["bytes"].sum()), iv.length(these.spans())
            out[direction] = {"bytes": nbytes, "gbps": nbytes / ns if ns > 0 else None}
    return out


def declared_against_copied(steps: Sequence[Span], work: Mapping[int, DeviceWork], window: iv.Interval) -> list[str]:
    """A note for each step whose declared ``bytes=`` differ from what its copies moved."""
    declared: dict[str, int] = defaultdict(int)
    copied: dict[str, int] = defaultdict(int)
    for span in _outermost([s for s in steps if s.bytes is not None and _in_window(s, window, work)]):
        declared[span.name] += span.bytes or 0
    for span in steps:
        done = work.get(span.span_id)
        if done is not None:
            copied[span.name] += int(done.rows["bytes"][done.of_kind("memcpy")].sum())
    return [
        f"step {name!r} declared {nbytes:,} bytes (bytes=) but its copies moved {copied[name]:,}"
        for name, nbytes in sorted(declared.items())
        if copied[name] and copied[name] != nbytes
    ]


def _in_window(span: Span, window: iv.Interval, work: Mapping[int, DeviceWork]) -> bool:
    """Whether a step is the window's: it overlaps it, issued work in it, or took no time.
    A step that only touches an edge (the round before, on a clock where host code takes
    no time) is not."""
    return bool(iv.clip([(span.start, span.end)], window)) or span.start == span.end or span.span_id in work


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
