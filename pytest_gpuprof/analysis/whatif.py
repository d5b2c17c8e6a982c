"""What a redesign would give, predicted from the window the run already has. Pure code.

The window is cut into units, one per instance of the step in question (each of its
steps, in the order its device work began). A unit runs from the start of that work to
the start of the next unit's; its time is the step's own device work (``A``) and the
rest (``B``: kernels, other steps, host time), where the part of the step's work that
the kernels waited for (its kernel-idle) is what the rest lost to it. Scenarios replay
the units:

- ``overlap:STEP``: the step's work on its own engine, as a two-stage pipeline (the
  kernels of unit i still wait for the step's work of unit i; the work of unit i+1 may
  run under the rest of unit i, one unit at a time on its engine): the flow shop
  ``a_i = a_{i-1} + A_i``, ``b_i = max(b_{i-1}, a_i) + B_i``.
- ``pinned:STEP``: a step whose copies read pageable memory, its copies at the pinned
  rate: the kernel-idle they caused shrinks with them.
- ``faster:STEP:F``: the step's kernels and the kernel-idle charged to it, F times shorter.

Kernels keep their time, so a prediction's utilization is the window's kernel time over
its predicted wall time. docs/design.md, "What if".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.descriptors import SCENARIO
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import NS_PER_MS, Span


@dataclass(frozen=True, slots=True)
class Prediction:
    wall_ms: float
    utilization: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the scenarios need of a measured window."""

    start: int
    end: int
    kernel_ns: int
    idle: Sequence[iv.Interval] | np.ndarray  # kernel-idle stretches, sorted and disjoint
    steps: Sequence[Span]
    work: Mapping[int, DeviceWork]  # device work by the span_id that issued it

    @property
    def wall(self) -> int:
        return self.end - self.start

    def predict(self, wall: float, kernel_ns: float | None = None) -> Prediction:
        kernels = self.kernel_ns if kernel_ns is None else kernel_ns
        wall = min(max(wall, kernels), self.wall)  # never longer than measured, never shorter than its kernels
        return Prediction(wall / NS_PER_MS, kernels / wall if wall > 0 else 0.0)


def defaults(window: Seen, charged: Mapping[str, float]) -> list[str]:
    """The scenarios worth computing: ``overlap`` for each step that holds kernel-idle and
    moved data on the device, ``pinned`` for those of them that read pageable memory;
    none for a window without kernels, whose utilization no redesign changes."""
    if window.kernel_ns <= 0:
        return []
    names = {s.span_id: s.name for s in window.steps}
    moving: dict[str, bool] = {}
    for span_id, done in window.work.items():
        name = names.get(span_id)
        moved = done.rows[~done.of_kind("kernel")]
        if len(moved) and name is not None and charged.get(name, 0) > 0:
            moving[name] = moving.get(name, False) or bool(moved["pageable"].any())
    return [f"overlap:{n}" for n in sorted(moving)] + [f"pinned:{n}" for n in sorted(moving) if moving[n]]


def predict(window: Seen, scenario: str, pinned_gbps: Callable[[], float] | None = None) -> Prediction | None:
    """The scenario's prediction, or ``None`` where it does not apply (no such step, no
    work of it, no pinned rate known, no kernels in the window)."""
    match = SCENARIO.match(scenario)
    if match is None:
        raise ValueError(f"what-if scenario {scenario!r}: expected overlap:STEP, pinned:STEP or faster:STEP:F")
    step = match["faster"] if match["faster"] is not None else match["step"]
    if step not in {s.name for s in window.steps}:
        ran = ", ".join(sorted({s.name for s in window.steps})) or "none"
        raise ValueError(f"what-if scenario {scenario!r}: no step {step!r} in the window; steps were: {ran}")
    if match["faster"] is not None and not float(match["factor"]) > 0:
        raise ValueError(f"what-if scenario {scenario!r}: the factor must be above 0 (faster:STEP:2 halves its time)")
    if window.kernel_ns <= 0:
        return None
    if match["faster"] is not None:
        return _faster(window, match["faster"], float(match["factor"]))
    units = _units(window, match["step"])
    if not units:
        return None
    if match["kind"] == "overlap":
        return _overlap(window, units)
    if pinned_gbps is None:
        return None
    return _pinned(window, units, pinned_gbps)


@dataclass(frozen=True, slots=True)
class _Unit:
    start: int
    end: int
    work: DeviceWork  # the step's copies and memsets
    a: int  # their device time
    waited: int  # the kernel-idle while they ran, inside the unit


def _units(window: Seen, step: str) -> list[_Unit]:
    every = (window.work.get(s.span_id) for s in window.steps if s.name == step)
    moved = [done.where(~done.of_kind("kernel")) for done in every if done is not None]
    moved = sorted((done for done in moved if len(done)), key=lambda done: int(done.rows["start"].min()))
    starts = [max(int(done.rows["start"].min()), window.start) for done in moved]
    units = []
    for i, done in enumerate(moved):
        lo, hi = starts[i], starts[i + 1] if i + 1 < len(moved) else window.end
        busy = iv.union(iv.clip(done.spans(), (window.start, window.end)))
        waited = sum(e - s for s, e in iv.intersect(iv.intersect(window.idle, busy), [(lo, hi)]))
        units.append(_Unit(lo, hi, done, sum(e - s for s, e in busy), waited))
    return units


def _overlap(window: Seen, units: Sequence[_Unit]) -> Prediction:
    _, rest = _flow_shop(units)
    return window.predict(rest[-1][1] - window.start)


def _flow_shop(units: Sequence[_Unit]) -> tuple[list[iv.Interval], list[iv.Interval]]:
    """The replayed units: the step's work on its engine, and the rest of each unit."""
    engine = rest = units[0].start
    work, others = [], []
    for unit in units:
        work.append((engine, engine + unit.a))
        engine += unit.a
        begin = max(rest, engine)
        rest = begin + (unit.end - unit.start - unit.waited)
        others.append((begin, rest))
    return work, others


def overlap_schedule(window: Seen, step: str) -> tuple[list[iv.Interval], list[iv.Interval]] | None:
    """``overlap:STEP`` as a timeline: the step's work, one unit after another on its own
    engine, and the rest of each unit after it (the HTML draws them beside the run's)."""
    units = _units(window, step)
    return _flow_shop(units) if units else None


def _pinned(window: Seen, units: Sequence[_Unit], pinned_gbps: Callable[[], float]) -> Prediction | None:
    if not any(u.work.rows["pageable"].any() for u in units):
        return None
    rate = pinned_gbps()  # bytes per ns
    saved = 0.0
    for unit in units:
        rows = unit.work.rows
        pinned = float(np.where(rows["pageable"], rows["bytes"] / rate, rows["end"] - rows["start"]).sum())
        if unit.a > 0:
            saved += unit.waited * max(0.0, 1 - pinned / unit.a)
    return window.predict(window.wall - saved)


def _faster(window: Seen, step: str, factor: float) -> Prediction | None:
    spans = [s for s in window.steps if s.name == step]
    if not spans or factor <= 0:
        return None
    done = DeviceWork.join(window.work[s.span_id] for s in spans if s.span_id in window.work)
    kernels = iv.length(done.where(done.of_kind("kernel")).spans())
    # the kernel-idle while one of the step's spans was open on its thread, or its work ran
    busy = iv.union(np.concatenate([np.array([(s.start, s.end) for s in spans]).reshape(-1, 2), done.spans()]))
    idle = sum(e - s for s, e in iv.intersect(window.idle, busy))
    cut = (1 - 1 / factor) * (kernels + idle)
    return window.predict(window.wall - cut, window.kernel_ns - (1 - 1 / factor) * kernels)


def describe(scenario: str) -> str:
    """How a scenario reads in a message: 'upload overlapped with compute'."""
    match = SCENARIO.match(scenario)
    if match is None:
        return scenario
    if match["faster"] is not None:
        return f"{match['faster']} {match['factor']}x faster"
    return f"{match['step']} overlapped with the kernels" if match["kind"] == "overlap" else f"{match['step']} pinned"
