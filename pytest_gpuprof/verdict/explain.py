"""Why a test's wall time changed between two runs, from their report entries alone.

A window's wall time is its kernel time (the union of its kernels) plus its kernel-idle
time, and the idle is charged to the steps that caused it plus what no step holds
(``unattributed_ms``). So the change of wall time splits exactly:

    d wall = d kernel_ms + sum over steps of d idle_ms + d unattributed_ms

and each term is a cause: the kernel time split over the kernels by their own totals
(appeared, vanished, slower, faster; with their launch counts and geometry, before ->
after), each step's idle (its copies' bytes, rate and pinned or pageable memory, before ->
after, where it copies), and the idle no step holds. Shares are of the wall time's change;
what the terms do not sum to (rounding, a window cut differently) is shown as unexplained.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Cause", "Explanation", "explain", "pooled"]

# a change smaller than this (ms) is no cause
FLOOR_MS = 1e-6
# the causes a run of pairs keeps of each pair, largest first (``kept``): a test of many
# kernels moves each by its noise, and a pair keeps a few numbers a test, not its report
KEPT = 20
# the causes a regressed test's lines show (the JSON keeps every one)
WHY_SHOWN = 3


@dataclass(frozen=True, slots=True)
class Cause:
    """One cause: what, its size in ms (worse positive), and what shows it."""

    what: str
    ms: float
    evidence: str


@dataclass(frozen=True, slots=True)
class Explanation:
    nodeid: str
    before_ms: float
    after_ms: float
    causes: tuple[Cause, ...]  # largest first
    unexplained_ms: float

    @property
    def change_ms(self) -> float:
        return self.after_ms - self.before_ms

    def share(self, cause: Cause) -> float | None:
        return cause.ms / self.change_ms if abs(self.change_ms) > FLOOR_MS else None

    def lines(self, top: int | None = None) -> list[str]:
        head = f"{self.nodeid}: wall {self.before_ms:.3f} -> {self.after_ms:.3f} ms ({self.change_ms:+.3f} ms)"
        out = [head]
        for c in self.causes[:top]:
            share = self.share(c)
            shown = f" ({share:.0%} of the change)" if share is not None else ""
            out.append(f"  {c.what}: {c.ms:+.3f} ms{shown}; {c.evidence}")
        if top is not None and len(self.causes) > top:
            out.append(f"  and {len(self.causes) - top} smaller causes")
        if abs(self.unexplained_ms) > 1e-3:
            out.append(f"  unexplained: {self.unexplained_ms:+.3f} ms")
        return out

    def kept(self) -> Explanation:
        """The explanation with its ``KEPT`` largest causes, the rest unexplained."""
        causes = self.causes[:KEPT]
        unexplained = self.unexplained_ms + sum(c.ms for c in self.causes[KEPT:])
        return Explanation(self.nodeid, self.before_ms, self.after_ms, causes, unexplained)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "before_ms": self.before_ms,
            "after_ms": self.after_ms,
            "causes": [
                {"what": c.what, "ms": c.ms, "share": self.share(c), "evidence": c.evidence} for c in self.causes
            ],
            "unexplained_ms": self.unexplained_ms,
        }


def _number(table: Mapping[str, Any], key: str) -> float:
    value = table.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _kernels(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Cause]:
    """The kernel time's change, over the kernels by their own totals' changes (scaled so
    that they sum to the union's change: kernels that overlap count once)."""
    totals_b = before.get("kernel_totals") or {}
    totals_a = after.get("kernel_totals") or {}
    launches_b = {k["name"]: k for k in before.get("top_kernels") or () if isinstance(k, dict) and "name" in k}
    launches_a = {k["name"]: k for k in after.get("top_kernels") or () if isinstance(k, dict) and "name" in k}
    moved = {n: _number(totals_a, n) - _number(totals_b, n) for n in {*totals_b, *totals_a}}
    moved = {n: d for n, d in moved.items() if abs(d) > FLOOR_MS}
    union = _number(after, "kernel_ms") - _number(before, "kernel_ms")
    if not moved:
        return [Cause("kernel time", union, "no kernel's own total moved")] if abs(union) > FLOOR_MS else []
    scale = union / sum(moved.values()) if abs(sum(moved.values())) > FLOOR_MS else 1.0
    out = []
    for name, d in moved.items():
        b, a = _number(totals_b, name), _number(totals_a, name)
        kind = (
            "appeared"
            if name not in totals_b
            else "vanished"
            if name not in totals_a
            else "slower"
            if d > 0
            else "faster"
        )
        evidence = [f"total {b:.3f} -> {a:.3f} ms"]
        lb, la = launches_b.get(name, {}), launches_a.get(name, {})
        if lb and la and lb.get("count") != la.get("count"):
            kind = "more launches" if (la.get("count") or 0) > (lb.get("count") or 0) else "fewer launches"
            evidence.append(f"launches {lb.get('count')} -> {la.get('count')}")
        if lb and la and (lb.get("blocks"), lb.get("threads")) != (la.get("blocks"), la.get("threads")):
            evidence.append(f"grid {lb.get('blocks')}x{lb.get('threads')} -> {la.get('blocks')}x{la.get('threads')}")
        out.append(Cause(f"kernel {name} {kind}", d * scale, "; ".join(evidence)))
    return out


def _copies(step: Mapping[str, Any]) -> str:
    if not _number(step, "bytes"):
        return ""
    memory = "pageable" if step.get("pageable") else "pinned"
    return f"{_number(step, 'bytes') / 2**20:.1f} MiB at {_number(step, 'gbps'):.1f} GB/s, {memory}"


def _idle(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Cause]:
    """Each step's kernel-idle change, with its copies before and after, and the idle no
    step holds."""
    steps_b, steps_a = before.get("steps") or {}, after.get("steps") or {}
    out = []
    for name in sorted({*steps_b, *steps_a}):
        sb, sa = steps_b.get(name) or {}, steps_a.get(name) or {}
        d = _number(sa, "idle_ms") - _number(sb, "idle_ms")
        if abs(d) <= FLOOR_MS:
            continue
        evidence = f"idle {_number(sb, 'idle_ms'):.3f} -> {_number(sa, 'idle_ms'):.3f} ms"
        copies_b, copies_a = _copies(sb), _copies(sa)
        what = f"idle in step {name}"
        if copies_b != copies_a:
            what = f"copies in step {name}"
            evidence += f"; copies {copies_b or 'none'} -> {copies_a or 'none'}"
        if name not in steps_b:
            what += " (a new step)"
        out.append(Cause(what, d, evidence))
    d = _number(after, "unattributed_ms") - _number(before, "unattributed_ms")
    if abs(d) > FLOOR_MS:
        out.append(Cause("idle in no step", d, "kernel-idle that no step held (host code between steps)"))
    return out


def explain(before: Mapping[str, Any], after: Mapping[str, Any]) -> Explanation:
    """The change of one test's wall time between two report entries, split into causes."""
    mb, ma = before.get("metrics") or {}, after.get("metrics") or {}
    causes = [*_kernels(mb, ma), *_idle(mb, ma)]
    causes.sort(key=lambda c: -abs(c.ms))
    wall_b, wall_a = _number(mb, "wall_ms"), _number(ma, "wall_ms")
    unexplained = (wall_a - wall_b) - sum(c.ms for c in causes)
    return Explanation(str(after.get("nodeid", "")), wall_b, wall_a, tuple(causes), unexplained)


def pooled(nodeid: str, pairs: Sequence[Explanation]) -> Explanation:
    """Several pairs' explanations of one test as one (``gpuprof ab``, ``bisect``): each
    cause at its median over the pairs (0 in a pair without it), the wall times at theirs,
    each cause's evidence from the last pair that had it; the wall time after is the median
    before plus the median change. Medians do not add up: what the causes' medians leave of
    the median change is unexplained, and shown."""
    if not pairs:
        raise ValueError("no pair to explain")
    names = list(dict.fromkeys(c.what for e in pairs for c in e.causes))
    evidence = {c.what: c.evidence for e in pairs for c in e.causes if c.evidence}
    sized = {n: statistics.median([next((c.ms for c in e.causes if c.what == n), 0.0) for e in pairs]) for n in names}
    causes = sorted(
        (
            Cause(n, ms, f"median of {len(pairs)} pairs; last: {evidence.get(n, '-')}")
            for n, ms in sized.items()
            if abs(ms) > FLOOR_MS
        ),
        key=lambda c: -abs(c.ms),
    )
    before = statistics.median(e.before_ms for e in pairs)
    change = statistics.median(e.change_ms for e in pairs)
    return Explanation(nodeid, before, before + change, tuple(causes), change - sum(c.ms for c in causes))
