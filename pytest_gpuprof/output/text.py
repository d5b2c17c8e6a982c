"""How figures read: units, which metrics are fractions, and the budget message.

The one place for the sizes (GiB, MiB), the metrics shown as percentages, the units of a
breach (each metric's own, from its descriptor) and the text of a budget failure
(docs/design.md, "Budget failure message").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis.descriptors import is_fraction, lookup
from pytest_gpuprof.analysis.memory import PEAK
from pytest_gpuprof.analysis.model import GIB, MIB, UNATTRIBUTED

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.analysis.processes import ProcessFigures
    from pytest_gpuprof.verdict.budget import Breach


def ms(x: float | None) -> str:
    """Milliseconds with one decimal; None (not measured) -> '-'."""
    return "-" if x is None else f"{x:.1f}"


def human_bytes(n: float) -> str:
    """Binary units, as GPU memory is counted: 4.00 GiB, 64.0 MiB, 512 B."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal: 0.483 -> '48.3%'; None -> '-'."""
    return "-" if x is None else f"{100 * x:.1f}%"


def describe_breach(b: Breach) -> str:
    if b.kind == "missing":
        return f"{b.detail} ({b.key})"
    if b.kind == "forbid":
        return f'{b.metric.removesuffix(".pageable")} used pageable host memory (pageable = "forbid")'
    metric = lookup(b.metric)
    sign = "<" if b.kind == "min" else ">"
    if metric is not None and metric.unit == "bytes":
        value, limit_ = int(b.value), int(float(b.limit))
        # a figure known as a range only breaches with its least (or most): said so
        side = next((f"{w} " for w in ("at least", "at most") if b.detail.startswith(w + " ")), "")
        shown = f"{side}{human_bytes(value)} ({value:,} B) {sign} {human_bytes(limit_)} ({limit_:,} B)"
        return f"{b.metric} {shown} ({b.key})"
    fraction = is_fraction(b.metric)
    shown = pct(b.value) if fraction else f"{b.value:.1f}"
    limit = pct(float(b.limit)) if fraction else f"{float(b.limit):.1f}"
    unit = "" if fraction or metric is None else f" {metric.unit}"
    return f"{b.metric} {shown}{unit} {sign} {limit}{unit} ({b.key})"


def explain_memory(metrics: Metrics, breaches: Sequence[Breach], *, always: bool = False) -> list[str]:
    """Where the device memory went, where ``breaches`` hold one on memory (or ``always``,
    where it was measured): the peak, its step, what was live then, the leaks."""
    m = metrics.memory
    on_memory = any(b.metric.startswith("memory.") or b.metric.endswith("memory_peak_bytes") for b in breaches)
    if m is None or not (on_memory or (always and (m.peak_bytes or m.leaked_bytes or m.bounds))):
        return []
    step = f" in step {' > '.join((*m.peak_within, m.peak_step))}" if m.peak_step else ""
    reserved = f", {human_bytes(m.reserved_peak_bytes)} reserved" if m.reserved_peak_bytes is not None else ""
    peak = peak_shown(m.peak_bytes, m.bounds.get(PEAK))
    lines = [f"device memory: peak {peak} over the window's start{step}{reserved} ({m.source})"]
    if m.largest:
        lines.append(
            "live at the peak: "
            + "; ".join(
                f"{human_bytes(h.nbytes)} at {h.where}" + (f" (step {h.step})" if h.step else "") for h in m.largest
            )
        )
    if m.leaks:
        lines.append(
            "not freed by the end of the test's call: "
            + "; ".join(f"{human_bytes(h.nbytes)} by step {h.step or '(none)'}, largest at {h.where}" for h in m.leaks)
        )
    if m.note:
        lines.append(f"note: {m.note}")
    return lines


def peak_shown(peak: int | None, bounds: Sequence[int] | None) -> str:
    """A peak in bytes, or the range it is known to lie in (JAX's statistics)."""
    if peak is None and bounds is not None:
        lo, hi = human_bytes(bounds[0]), human_bytes(bounds[1])
        return f"between {lo} and {hi}" if lo != hi else f"{lo} (to within {bounds[1] - bounds[0]:,} B)"
    return human_bytes(peak) if peak is not None else "not measured"


def memory_top(nodeid: str, metrics: Mapping[str, Any], n: int) -> list[str]:
    """``--gpu-memory-top``: the ``n`` places of a test's code that held the most device
    memory at its peak (``metrics``: its JSON figures), or why none is known."""
    if n <= 0:
        return []
    memory = metrics.get("memory")
    if memory is None:
        return [f"{nodeid}: device memory not measured ({metrics.get('memory_unseen') or 'no allocator seen'})"]
    sites = memory.get("sites") or []
    peak = peak_shown(memory["peak_bytes"], (memory.get("bounds") or {}).get(PEAK))
    head = f"{nodeid}: device memory peak {peak} ({memory['source']})"
    if not sites:
        return [f"{head}: no allocation's place recorded ({memory.get('note') or 'none live at the peak'})"]
    shown = sites[:n]
    lines = [f"{head}, the {len(shown)} largest of {len(sites)} places live then:"]
    for site in shown:
        count = site.get("count", 1)
        step = f" (step {site['step']})" if site.get("step") else ""
        times = f" in {count} allocations" if count > 1 else ""
        lines.append(f"  {human_bytes(site['bytes'])}{times} at {site['where']}{step}")
    return lines


def explain(metrics: Metrics) -> list[str]:
    """Where the time went: the decomposition lines of a budget message."""
    rounds = f"  (medians of {_rounds(metrics)} rounds)" if _rounds(metrics) > 1 else ""
    if metrics.kernel_ms is None or metrics.overhead_ms is None or metrics.utilization is None:
        return [
            f"wall {_time_unit(metrics.wall_ms)(metrics.wall_ms)}; kernel time not measured{rounds}",
            *(f"note: {n}" for n in metrics.notes),
        ]
    t = _time_unit(metrics.wall_ms)
    lines = [
        f"wall {t(metrics.wall_ms)} = kernels {t(metrics.kernel_ms)} + kernel-idle {t(metrics.overhead_ms)}" + rounds
    ]
    lines.append(_idle_by_step(metrics, t))
    explained = host_in(metrics.idle_by_code, metrics.unattributed_ms)
    if explained:
        lines.append(f"{UNATTRIBUTED}, host in: {explained}")
    lines += _over_reported(metrics)
    if metrics.sm_utilization is not None and metrics.top_kernels:
        gpm = metrics.gpm or {}
        hardware = f" (GPM SM active {pct(gpm['sm_active'])})" if "sm_active" in gpm else ""
        lines.append(
            f"SM-weighted utilization {pct(metrics.sm_utilization)}{hardware}; top kernels: "
            + "; ".join(
                f"{k.short or k.name} x{k.count} {k.total_ms:.1f} ms, grid {k.blocks} x block {k.threads}, "
                f"SMs {pct(k.sm_coverage)}, occupancy {pct(k.occupancy)}"
                for k in metrics.top_kernels[:3]
            )
        )
    if metrics.what_if:
        from pytest_gpuprof.analysis.whatif import describe

        lines.append(
            "what if: "
            + "; ".join(
                f"{describe(name)} -> ~{pct(p.utilization)} (wall ~{p.wall_ms:.0f} ms)"
                for name, p in metrics.what_if.items()
            )
        )
    if metrics.processes:
        lines.append(_processes(metrics))
    # what the measurement itself missed (CUPTI records dropped or lost) or cannot tell
    lines += [f"note: {note}" for note in metrics.notes]
    return lines


def _time_unit(wall_ms: float) -> Callable[[float], str]:
    """How a window's times read: in ms, or in us where the whole window is under a
    millisecond (a 4 us window is ``wall 4.0 us``, not ``wall 0.0 ms``); one unit for
    every time of its lines."""
    if wall_ms < 1.0:
        return lambda x: f"{1000 * x:.1f} us"
    return lambda x: f"{x:.1f} ms"


def _idle_by_step(metrics: Metrics, t: Callable[[float], str]) -> str:
    """The kernel-idle charged to each step, with a copy step's size, rate and memory;
    the rate that the budget gates (the rounds' median where there are rounds), so that
    a message gives one rate for one upload."""
    parts = []
    for name, idle_ms in metrics.idle_by_step():
        if name == UNATTRIBUTED:
            parts.append(f"{UNATTRIBUTED} {t(idle_ms)}")
            continue
        step = metrics.steps[name]
        detail = ""
        rounds = metrics.rounds.get(f"steps.{name}.gbps")
        gbps = rounds.median if rounds is not None else step.gbps
        if step.bytes and gbps is not None:
            size = (
                human_bytes(step.bytes)
                if step.count <= 1
                else f"{step.count} x {human_bytes(step.bytes // step.count)}"
            )
            detail = f" ({size} @ {gbps:.1f} GB/s, {'pageable' if step.pageable else 'pinned'})"
        parts.append(f"{name} {t(idle_ms)}{detail}")
    return "kernel-idle by step: " + ", ".join(parts)


def _over_reported(metrics: Metrics) -> list[str]:
    """What the brackets and NVML claimed against the kernels' own time."""
    assert metrics.utilization is not None
    nvml = metrics.nvml.util_mean if metrics.nvml is not None else None
    observers = []
    if metrics.reported_utilization is not None:
        observers.append(f"brackets report {pct(metrics.reported_utilization)}")
    if nvml is not None:
        observers.append(f"NVML {pct(nvml)}")
    if not observers:
        return []
    claimed = max(v for v in (metrics.reported_utilization, nvml) if v is not None)
    points = 100 * (claimed - metrics.utilization)
    verdict = f"instrumentation over-reports by {points:.1f} points" if points > 0 else "no over-report"
    return [" and ".join(observers) + f": {verdict}"]


def _processes(metrics: Metrics) -> str:
    """Each process whose device work the window holds; what was not seen says so."""

    def figures(p: ProcessFigures) -> str:
        if p.kernel_ms is None:
            return "not seen"
        copies = f"{p.copy_ms:.1f} ms" if p.copy_ms is not None else "not seen"
        return f"kernels {p.kernel_ms:.1f} ms, copies {copies}"

    return "processes: " + "; ".join(
        f"{f'pid {p.pid}' if p.pid else 'a process'} ({p.command[:40]}{f', rank {p.rank}' if p.rank is not None else ''}): {figures(p)}"
        for p in metrics.processes
    )


def host_in(
    idle_by_code: Sequence[tuple[str, float]] | None, unattributed_ms: float | None, shown: int = 3
) -> str | None:
    """What the host ran during the unattributed idle, largest first, each with its share
    of it: ``test_train.py:17 epoch > torch/utils/data/dataloader.py:_next_data 512.0 ms (91%), ...``."""
    named = [(where, ms_) for where, ms_ in idle_by_code or () if ms_ >= 0.05]  # shown as 0.1 ms or more
    if not named or not unattributed_ms:
        return None
    parts = [f"{where} {ms_:.1f} ms ({ms_ / unattributed_ms:.0%})" for where, ms_ in named[:shown]]
    return ", ".join(parts) + (", ..." if len(named) > shown else "")


def _rounds(metrics: Metrics) -> int:
    summary = metrics.rounds.get("wall_ms")
    return len(summary.samples) if summary else 1


def failure_message(
    breaches: Sequence[Breach],
    metrics: Metrics,
    *,
    lead: str = "GPU budget exceeded: ",
    window: tuple[str, int, int] | None = None,
    confirmations: int | None = None,
) -> str:
    """The one text of a breach: the breached limits, where the time went, and the
    context (which of the test's windows; the re-measurements that confirmed it inside
    a hypothesis example, with the buffers it moved)."""
    head = lead + "; ".join(describe_breach(b) for b in breaches)
    lines = [f"{head}  [truth: {metrics.truth}]", *explain(metrics)]
    lines += explain_memory(metrics, breaches)
    if window is not None:
        label, index, count = window
        lines.append(f"(window '{label}', {index + 1} of {count})")
    if confirmations is not None:
        moved = [(name, s.bytes) for name, s in metrics.steps.items() if s.bytes]
        if moved:
            lines.append("buffers: " + ", ".join(f"{name} {human_bytes(n)} ({n:,} B)" for name, n in moved))
        lines.append(f"(confirmed by {confirmations} more measurements)")
    return "\n  ".join(lines)
