"""The metrics of docs/design.md, computed from a ``Timeline``: pure functions, no I/O.

Utilization is kernel time over wall time, where kernel time is the length of the union
of kernel intervals inside the window. Which step issued each piece of device work, and
which step each kernel-idle stretch is charged to, is ``attribution``'s (docs/design.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pytest_gpuprof.analysis import attribution, host_code, sm_metrics, whatif
from pytest_gpuprof.analysis import descriptors as d
from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis import memory as memory_mod
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.memory import MemoryMetrics
from pytest_gpuprof.analysis.model import NS_PER_MS, UNATTRIBUTED, Truth
from pytest_gpuprof.analysis.nvml_metrics import NvmlMetrics, nvml_metrics
from pytest_gpuprof.analysis.processes import ProcessFigures
from pytest_gpuprof.analysis.sm_metrics import KernelSummary
from pytest_gpuprof.analysis.sources import kind_of
from pytest_gpuprof.analysis.stats import Summary
from pytest_gpuprof.analysis.step_metrics import StepMetrics, declared_against_copied, step_metrics
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.analysis.whatif import Prediction


@dataclass(frozen=True, slots=True)
class Metrics:
    """The figures of one window, or the per-metric medians over rounds (``rounds`` set)."""

    wall_ms: float
    kernel_ms: float | None
    copy_ms: float | None
    busy_ms: float | None
    utilization: float | None
    busy_utilization: float | None
    reported_utilization: float | None
    discrepancy: float | None
    overhead_ms: float | None
    unattributed_ms: float | None
    kernels: int
    truth: Truth
    steps: Mapping[str, StepMetrics] = field(default_factory=dict)
    nvml: NvmlMetrics | None = None
    rounds: Mapping[str, Summary] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # why the device figures are None: the source saw none of the window's device work
    unseen: str | None = None
    # predicted wall and utilization by scenario (``whatif``): overlap:STEP, pinned:STEP
    what_if: Mapping[str, Prediction] = field(default_factory=dict)
    # kernel time weighted by the SMs the grids covered, over the wall (``sm_metrics``)
    sm_utilization: float | None = None
    sm_unseen: str | None = None  # why it is None
    top_kernels: tuple[KernelSummary, ...] = ()
    # NVML GPM over the window: sm_active, sm_occupancy, tensor_active, dram_bw_util
    gpm: Mapping[str, float] | None = None
    # each kernel's time in the window by mangled name (the top ones, the rest as OTHER_KERNELS)
    kernel_totals: Mapping[str, float] = field(default_factory=dict)
    # what the host ran during the unattributed idle (ms by place, largest first; ``None``
    # where the host was not sampled)
    idle_by_code: tuple[tuple[str, float], ...] | None = None
    # device memory over the window (``analysis.memory``); why it is None
    memory: MemoryMetrics | None = None
    memory_unseen: str | None = None
    # the processes whose device work the window holds, the test's own first (``processes``)
    processes: tuple[ProcessFigures, ...] = ()
    # the runner's speed just before the window (``capture.probe``): ``None`` where not timed
    runner_probe_ms: float | None = None

    def flat(self) -> dict[str, float]:
        """Every comparable numeric metric under its public path (``steps.upload.idle_ms``...)."""
        out: dict[str, float] = {}
        for prefix, owner, scope in self._owners():
            for name in d.names(scope):
                value = owner.get(name) if isinstance(owner, Mapping) else getattr(owner, name)
                if value is not None:
                    out[prefix + name] = float(value)
        return out

    def _owners(self) -> list[tuple[str, Any, d.Scope]]:
        """Where each scope's values live, with the prefix of their paths."""
        owners: list[tuple[str, Any, d.Scope]] = [("", self, "window")]
        owners += [(f"steps.{name}.", figures, "step") for name, figures in self.steps.items()]
        if self.nvml is not None:
            owners.append(("nvml.", self.nvml, "nvml"))
        if self.gpm is not None:
            owners.append(("gpm.", self.gpm, "gpm"))
        owners += [(f"kernels.{name}.", {"total_ms": ms}, "kernel") for name, ms in self.kernel_totals.items()]
        owners += [(f"what_if.{name}.", p, "what_if") for name, p in self.what_if.items()]
        if self.memory is not None:
            owners.append(("memory.", self.memory, "memory"))
        return owners

    def idle_by_step(self) -> list[tuple[str, float]]:
        """Kernel-idle time per step, largest first, ``unattributed`` last (none where unseen)."""
        if self.unattributed_ms is None:
            return []
        charged = sorted(
            ((name, s.idle_ms) for name, s in self.steps.items() if s.idle_ms),
            key=lambda item: -item[1],
        )
        return [*charged, (UNATTRIBUTED, self.unattributed_ms)]

    def to_dict(self) -> dict[str, object]:
        return {
            **{name: getattr(self, name) for name in d.names("window", comparable=False)},
            "truth": self.truth,
            "steps": {name: s.to_dict() for name, s in self.steps.items()},
            **({"nvml": self.nvml.to_dict()} if self.nvml is not None else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"unseen": self.unseen} if self.unseen else {}),
            **({"what_if": {k: p.to_dict() for k, p in self.what_if.items()}} if self.what_if else {}),
            **({"sm_unseen": self.sm_unseen} if self.sm_unseen else {}),
            **({"top_kernels": [k.to_dict() for k in self.top_kernels]} if self.top_kernels else {}),
            **({"gpm": dict(self.gpm)} if self.gpm is not None else {}),
            **({"kernel_totals": dict(self.kernel_totals)} if self.kernel_totals else {}),
            **(
                {"idle_by_code": [{"where": where, "ms": ms} for where, ms in self.idle_by_code]}
                if self.idle_by_code is not None
                else {}
            ),
            **({"memory": self.memory.to_dict()} if self.memory is not None else {}),
            **({"memory_unseen": self.memory_unseen} if self.memory_unseen else {}),
            **({"processes": [p.to_dict() for p in self.processes]} if self.processes else {}),
        }


def compute(timeline: Timeline, pinned_gbps: Callable[[], float] | None = None) -> Metrics:
    """All metrics of one window, device memory and the processes included."""
    return replace(_with_memory(timeline, _compute(timeline, pinned_gbps)), processes=timeline.processes)


def at_call_end(m: Metrics, live: memory_mod.Live) -> Metrics:
    """``m`` with its leaks as the test's call ends (``memory.at_call_end``): the window's
    and each step's; ``m`` itself where nothing it kept was freed since."""
    if m.memory is None:
        return m
    memory = memory_mod.at_call_end(m.memory, live)
    if memory is m.memory:
        return m
    leaks = memory.step_leaks
    steps = {
        name: s if leaks is None or s.leaked_bytes is None else replace(s, leaked_bytes=leaks.get(name, 0))
        for name, s in m.steps.items()
    }
    return replace(m, memory=memory, steps=steps)


def _with_memory(timeline: Timeline, m: Metrics) -> Metrics:
    memory, peaks = memory_mod.compute(timeline.memory, timeline.steps) if timeline.memory is not None else (None, {})
    if memory is None:
        return replace(m, memory_unseen=timeline.memory_unseen or NO_ALLOCATOR)
    leaks = memory.step_leaks
    steps = {
        name: replace(
            s, memory_peak_bytes=peaks.get(name, 0), leaked_bytes=None if leaks is None else leaks.get(name, 0)
        )
        for name, s in m.steps.items()
    }
    return replace(m, memory=memory, steps=steps)


def _compute(timeline: Timeline, pinned_gbps: Callable[[], float] | None = None) -> Metrics:
    """All metrics of one window; ``pinned_gbps``: the device's pinned copy rate, asked
    for only where a step read pageable memory (``what_if``'s ``pinned:STEP``)."""
    window = (timeline.start, timeline.end)
    wall = max(timeline.end - timeline.start, 0)
    reported = _bracketed(timeline)
    source = kind_of(timeline.truth)
    if not source.sees_kernels and not timeline.device:
        return _unseen(timeline, wall, reported)
    if wall <= 0:
        return _unseen(timeline, wall, None, EMPTY_WINDOW)
    device = timeline.device
    kernel_work = device.where(device.of_kind("kernel"))
    busy_ns = iv.covered_length(device.spans(), window)
    copy_ns = iv.covered_length(device.where(device.of_kind("memcpy")).spans(), window)
    ids = attribution.issuer_ids(timeline.steps, device)
    seen = _whatif_window(timeline, kernel_work, ids)
    kernel_ns = seen.kernel_ns
    moves = _moves(seen)
    transfers = _transfers(seen, moves)
    charged, unattributed = attribution.attribute_idle(timeline.steps, seen.idle, transfers)
    scenarios = {name: whatif.predict(seen, name, pinned_gbps) for name in whatif.defaults(seen, charged)}

    utilization = _ratio(kernel_ns, wall)
    launched = int(np.count_nonzero(kernel_work.inside(window)))
    reason = sm_metrics.unseen(kernel_work, timeline.sm, source.no_sms)
    steps = step_metrics(
        timeline.steps,
        seen.work,
        charged,
        window,
        timeline.sm if reason is None else None,
        attribution.inclusive_idle(timeline.steps, seen.idle, moves, charged),
    )
    return Metrics(
        wall_ms=wall / NS_PER_MS,
        kernel_ms=kernel_ns / NS_PER_MS,
        copy_ms=copy_ns / NS_PER_MS if source.sees_copies else None,  # not seen, never 0
        busy_ms=busy_ns / NS_PER_MS,
        utilization=utilization,
        busy_utilization=_ratio(busy_ns, wall),
        reported_utilization=reported,
        discrepancy=None if reported is None else reported - utilization,
        overhead_ms=(wall - kernel_ns) / NS_PER_MS,
        unattributed_ms=unattributed / NS_PER_MS,
        kernels=launched,
        truth=timeline.truth,
        steps=steps,
        nvml=nvml_metrics(timeline.samples, window),
        notes=_notes(timeline, seen, ids, launched),
        what_if={name: p for name, p in scenarios.items() if p is not None},
        sm_utilization=None if reason is not None else _sm_utilization(timeline, kernel_work, utilization),
        sm_unseen=reason,
        gpm=timeline.gpm,
        top_kernels=sm_metrics.top_kernels(
            kernel_work, timeline.sm, window, sm_metrics.kernel_steps(timeline.steps, device, ids)
        ),
        kernel_totals=sm_metrics.kernel_totals(kernel_work, window),
        idle_by_code=_idle_by_code(timeline, seen, transfers, unattributed),
    )


def _sm_utilization(timeline: Timeline, kernel_work: DeviceWork, utilization: float) -> float | None:
    """Kernel time weighted by the SMs each grid covered, over the wall (at most ``utilization``)."""
    if timeline.sm is None:
        return None
    window = (timeline.start, timeline.end)
    weighted = sm_metrics.sm_weighted_ns(kernel_work, timeline.sm, window)
    return min(utilization, _ratio(weighted, timeline.end - timeline.start))


def _bracketed(timeline: Timeline) -> float | None:
    """What the host's brackets (regions) claim: the share of the wall they cover."""
    if not timeline.regions:
        return None
    window = (timeline.start, timeline.end)
    return _ratio(iv.covered_length(((r.start, r.end) for r in timeline.regions), window), window[1] - window[0])


def _notes(timeline: Timeline, seen: whatif.Seen, ids: np.ndarray, launched: int) -> tuple[str, ...]:
    """The window's notes: the timeline's, then what the metrics found worth saying."""
    window = (timeline.start, timeline.end)
    found = (
        launch_bound_note(timeline.truth, launched, timeline.end - timeline.start),
        attribution.stepless_note(timeline.steps, timeline.device, ids, window),
        attribution.interleaved_note(timeline.steps),
    )
    return (
        *timeline.notes,
        *declared_against_copied(timeline.steps, seen.work, window),
        *(note for note in found if note),
    )


def _idle_by_code(
    timeline: Timeline, seen: whatif.Seen, transfers: Mapping[str, np.ndarray], unattributed: float
) -> tuple[tuple[str, float], ...] | None:
    """What the host ran during the unattributed idle, ms by place; None where not sampled."""
    if timeline.stacks is None:
        return None
    pieces = _host_pieces(timeline, seen, transfers) if unattributed > 0 else []
    return tuple((where, ns / NS_PER_MS) for where, ns in host_code.totals(pieces))


def _host_pieces(timeline: Timeline, seen: whatif.Seen, transfers: Mapping[str, np.ndarray]) -> list[host_code.Piece]:
    """The unattributed idle cut by the host's sampling rounds, with where the threads that
    issue device work (those with steps or device work, and the one that measured) were."""
    if not timeline.stacks:
        return []
    threads = {s.thread for s in timeline.steps} | set(np.unique(timeline.device.rows["thread"]).tolist())
    idle = attribution.unattributed(timeline.steps, seen.idle, transfers)
    return host_code.pieces(timeline.stacks, idle, (threads | {timeline.thread}) - {0})


def host_during_idle(timeline: Timeline) -> list[host_code.Piece]:
    """``idle_by_code``'s pieces, for drawing."""
    seen = _whatif_window(timeline)
    return _host_pieces(timeline, seen, _transfers(seen))


# CUPTI's kernel and driver records add 2.0-2.6 us to each launch on an H200 (against an
# untraced process, docs/performance-log.md): where kernels come one every 10 us or faster,
# that is a fifth of the window or more, and the window says so
LAUNCH_BOUND_US = 10.0
LAUNCH_BOUND_KERNELS = 1_000


def launch_bound_note(truth: Truth, kernels: int, wall_ns: int) -> str | None:
    """A note for a window so launch-bound under a tracing source that tracing slows it down."""
    cost = kind_of(truth).launch_cost
    if cost is None or kernels < LAUNCH_BOUND_KERNELS or wall_ns >= kernels * LAUNCH_BOUND_US * 1_000:
        return None
    return (
        f"{kernels:,} kernels, one every {wall_ns / kernels / 1_000:.1f} us: {cost}, so a window this "
        "launch-bound runs slower traced; --gpu-no-cupti gives its untraced wall time"
    )


NO_ALLOCATOR = "no allocator this plugin reads (PyTorch's, CuPy's, the host backend's) was in use in this process"


def _transfers(seen: whatif.Seen, moves: dict[int, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The copies and memsets of each step, by name: what idle is charged to device first
    (``moves``: ``_moves(seen)``, where the caller has it already)."""
    names = {s.span_id: s.name for s in seen.steps}
    transfers: dict[str, list[np.ndarray]] = defaultdict(list)
    for span_id, spans in (_moves(seen) if moves is None else moves).items():
        if span_id in names:  # tagged by a step outside the window: its work is nobody's here
            transfers[names[span_id]].append(spans)
    return {name: np.concatenate(spans) for name, spans in transfers.items()}


def _moves(seen: whatif.Seen) -> dict[int, np.ndarray]:
    """The copies and memsets of each step, by ``span_id``."""
    return {span_id: done.where(~done.of_kind("kernel")).spans() for span_id, done in seen.work.items()}


def idle_stretches(timeline: Timeline) -> list[attribution.Stretch]:
    """The window's kernel-idle time, cut into pieces with whom each is charged to: the
    same charges as ``compute``'s ``idle_ms`` and ``unattributed_ms``, for drawing."""
    seen = _whatif_window(timeline)
    return attribution.stretches(timeline.steps, seen.idle, _transfers(seen))


def what_if(timeline: Timeline, scenario: str, pinned_gbps: Callable[[], float] | None = None) -> Prediction | None:
    """One scenario's prediction for a measured window (``None`` where it does not apply)."""
    return whatif.predict(_whatif_window(timeline), scenario, pinned_gbps)


def overlap_schedule(timeline: Timeline, step: str) -> tuple[list[iv.Interval], list[iv.Interval]] | None:
    """The predicted timeline of ``overlap:STEP`` for a measured window (``whatif``)."""
    return whatif.overlap_schedule(_whatif_window(timeline), step)


def _whatif_window(timeline: Timeline, kernels: DeviceWork | None = None, ids: np.ndarray | None = None) -> whatif.Seen:
    """The window as attribution and the scenarios see it: kernel time, idle, work by step
    (``kernels``, ``ids``: the window's kernels and each row's issuer, where the caller has
    them already)."""
    window = (timeline.start, timeline.end)
    if kernels is None:
        kernels = timeline.device.where(timeline.device.of_kind("kernel"))
    kernel_union = iv.merged(kernels.spans(), window)
    return whatif.Seen(
        start=timeline.start,
        end=timeline.end,
        kernel_ns=int((kernel_union[:, 1] - kernel_union[:, 0]).sum()),
        idle=iv.holes(kernel_union, window),
        steps=timeline.steps,
        work=attribution.work_by_step(timeline.steps, timeline.device, ids),
    )


UNSEEN = (
    "the CUDA events at the steps' edges saw no device work in this window: the work ran on "
    "streams they were not recorded on, or there was none (CUPTI sees every stream)"
)


# a window of no host time has no utilization: a ratio over nothing is not 0%
EMPTY_WINDOW = "the window lasted 0 ms: no time to be busy or idle in"


def _unseen(timeline: Timeline, wall: int, reported: float | None, why: str = UNSEEN) -> Metrics:
    """A window whose source saw no device work (or that lasted no time): every device
    figure ``None``, not 0."""
    return Metrics(
        wall_ms=wall / NS_PER_MS,
        kernel_ms=None,
        copy_ms=None,
        busy_ms=None,
        utilization=None,
        busy_utilization=None,
        reported_utilization=reported,
        discrepancy=None,
        overhead_ms=None,
        unattributed_ms=None,
        kernels=0,
        truth=timeline.truth,
        steps=step_metrics(timeline.steps, {}, None, (timeline.start, timeline.end)),
        nvml=nvml_metrics(timeline.samples, (timeline.start, timeline.end)),
        notes=(*timeline.notes, f"utilization not measured: {why}"),
        unseen=why,
        sm_unseen=kind_of(timeline.truth).no_sms,
    )


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
