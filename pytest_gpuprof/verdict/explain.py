"""Why a test's wall time changed between two runs, from their report entries alone.

A window's wall time is its kernel time (the union of its kernels) plus its kernel-idle
time, and the idle is charged to the steps that caused it plus what no step holds
(``unattributed_ms``). So the change of wall time splits exactly:

    d wall = d kernel_ms + sum over steps of d idle_ms + d unattributed_ms

and each term is a cause: the kernel time split over the kernels by their own totals
(appeared, vanished, replaced in one step, slower in cycles or only by the SM clock, more
or fewer launches, another geometry), each step's idle (its copies' bytes, rate and memory;
overlap lost; the step where the host now waits), and the idle no step holds (the host code
whose idle grew). Shares are of the wall time's change; what the terms do not sum to
(rounding, a window cut differently) is shown as unexplained. Beside the wall: the device
memory kept past the call, and what a record cannot tell. ``pooled``: over ``ab``'s pairs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Cause", "Explanation", "explain", "pooled"]

# a change smaller than this (ms) is no cause
FLOOR_MS = 1e-6
# the causes a run of pairs keeps of each pair, largest first (``kept``): a test of many
# kernels moves each by its noise, and a pair keeps a few numbers a test, not its report
KEPT = 20
# the causes a regressed test's lines show (the JSON keeps every one)
WHY_SHOWN = 3
# copies of the same bytes and memory whose rate fell under this part of what it was are slower
SLOWER_COPIES = 0.8
# copies whose step's idle grew by this part of their own time ran beside kernels, now alone
OVERLAP_LOST = 0.25
# a kernel whose cycles (time x SM clock) moved less than this took the same work
SAME_CYCLES = 0.02


@dataclass(frozen=True, slots=True)
class Cause:
    """One cause: what, its size in ms (worse positive), and what shows it."""

    what: str
    ms: float
    evidence: str
    path: str = ""  # the figure whose rounds show it (a metric's path), where one does


@dataclass(frozen=True, slots=True)
class Memory:
    """The change of a test's device memory: its peak, what it kept past the call
    (allocated and not freed by the window's end), and each place that kept it (the code
    that allocated it and its step), before and after, the largest change first."""

    peak_before: int
    peak_after: int
    kept_before: int
    kept_after: int
    places: tuple[tuple[str, int, int], ...]  # (where and step, bytes before, bytes after)

    def lines(self) -> list[str]:
        out = [
            f"  device memory: peak {_mib(self.peak_before)} -> {_mib(self.peak_after)}, kept past the call "
            f"{_mib(self.kept_before)} -> {_mib(self.kept_after)}"
        ]
        change = self.kept_after - self.kept_before
        for where, before, after in self.places:
            share = f" ({(after - before) / change:.0%} of the change)" if change else ""
            out.append(f"    kept by {where}: {_mib(before)} -> {_mib(after)}{share}")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f: getattr(self, f) for f in ("peak_before", "peak_after", "kept_before", "kept_after")}
        return out | {"places": [{"where": w, "before": b, "after": a} for w, b, a in self.places]}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True, slots=True)
class Explanation:
    nodeid: str
    before_ms: float
    after_ms: float
    causes: tuple[Cause, ...]  # largest first
    unexplained_ms: float
    # the change of the device memory it held: its peak, then each step's part of the
    # memory kept past the call (bytes; ``Memory``)
    memory: Memory | None = None
    # what one of the two records cannot tell (an older record, a source that sees less)
    unjudged: tuple[str, ...] = ()

    @property
    def change_ms(self) -> float:
        return self.after_ms - self.before_ms

    def share(self, cause: Cause) -> float | None:
        return cause.ms / self.change_ms if abs(self.change_ms) > FLOOR_MS else None

    def wall(self) -> str:
        """``wall 6.796 -> 7.196 ms (+0.400 ms)``."""
        return f"wall {self.before_ms:.3f} -> {self.after_ms:.3f} ms ({self.change_ms:+.3f} ms)"

    def lines(self, top: int | None = None) -> list[str]:
        """The test's change of wall time, then its causes (``top``: the largest so many)."""
        out = [f"{self.nodeid}: {self.wall()}"]
        for c in self.causes[:top]:
            share = self.share(c)
            shown = f" ({share:.0%} of the change)" if share is not None else ""
            out.append(f"  {c.what}: {c.ms:+.3f} ms{shown}; {c.evidence}")
        if top is not None and len(self.causes) > top:
            out.append(f"  and {len(self.causes) - top} smaller causes")
        if abs(self.unexplained_ms) > 1e-3:
            out.append(f"  unexplained: {self.unexplained_ms:+.3f} ms")
        if self.memory is not None:
            out += self.memory.lines()
        if self.unjudged:
            out.append(f"  not judged: {'; '.join(self.unjudged)}")
        return out

    def kept(self) -> Explanation:
        """The explanation with its ``KEPT`` largest causes, the rest unexplained."""
        causes = self.causes[:KEPT]
        unexplained = self.unexplained_ms + sum(c.ms for c in self.causes[KEPT:])
        return Explanation(self.nodeid, self.before_ms, self.after_ms, causes, unexplained, self.memory, self.unjudged)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "before_ms": self.before_ms,
            "after_ms": self.after_ms,
            "causes": [
                {"what": c.what, "ms": c.ms, "share": self.share(c), "evidence": c.evidence} for c in self.causes
            ],
            "unexplained_ms": self.unexplained_ms,
            **({"memory": self.memory.to_dict()} if self.memory is not None else {}),
            **({"unjudged": list(self.unjudged)} if self.unjudged else {}),
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
        clock = _by_clock(before, after, b, a)
        if clock is not None:
            kind, evidence = f"{kind} only by the SM clock", [*evidence, clock]
        if lb and la and (lb.get("blocks"), lb.get("threads")) != (la.get("blocks"), la.get("threads")):
            kind = "launch geometry changed"
            evidence.append(f"grid {lb.get('blocks')}x{lb.get('threads')} -> {la.get('blocks')}x{la.get('threads')}")
        out.append(Cause(f"kernel {name} {kind}", d * scale, "; ".join(evidence), f"kernels.{name}.total_ms"))
    return _renamed(out, launches_b, launches_a)


def _by_clock(before: Mapping[str, Any], after: Mapping[str, Any], total_b: float, total_a: float) -> str | None:
    """Where both runs' SM clocks are known and moved, and a kernel took the same cycles:
    what says that its time changed by the clock alone (a throttled or boosted card)."""
    clock_b = _number(before.get("nvml") or {}, "sm_clock_mhz")
    clock_a = _number(after.get("nvml") or {}, "sm_clock_mhz")
    if not (clock_b and clock_a and total_b and total_a) or abs(clock_a / clock_b - 1) < SAME_CYCLES:
        return None
    if abs((total_a * clock_a) / (total_b * clock_b) - 1) >= SAME_CYCLES:
        return None
    return f"SM clock {clock_b:.0f} -> {clock_a:.0f} MHz, its cycles the same within {SAME_CYCLES:.0%}"


def _renamed(causes: list[Cause], before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Cause]:
    """A kernel that vanished and one that appeared in the same step, each alone of its kind
    there, as one cause: a library choosing another kernel for the same call (a cuBLAS
    algorithm, TF32). Where the records name no step, a lone pair with as many launches.
    Said how it was matched."""
    gone = {c.what.removeprefix("kernel ").removesuffix(" vanished"): c for c in causes if c.what.endswith(" vanished")}
    new = {c.what.removeprefix("kernel ").removesuffix(" appeared"): c for c in causes if c.what.endswith(" appeared")}
    pairs = []
    for old_name in gone:
        step = before.get(old_name, {}).get("step")
        same = [n for n in new if step and after.get(n, {}).get("step") == step]
        rivals = [o for o in gone if step and before.get(o, {}).get("step") == step]
        if len(same) == 1 and len(rivals) == 1:
            pairs.append((old_name, same[0], f"matched by their step {step}"))
    count = before.get(next(iter(gone), ""), {}).get("count")
    if not pairs and len(gone) == 1 and len(new) == 1 and count is not None:
        (old_name,), (new_name,) = gone, new
        if count == after.get(new_name, {}).get("count"):
            pairs.append((old_name, new_name, f"matched by their launches ({count} each)"))
    out = list(causes)
    for old_name, new_name, how in pairs:
        g, n = gone[old_name], new[new_name]
        out = [c for c in out if c not in (g, n)]
        out.append(
            Cause(f"kernel {old_name} replaced by {new_name}", g.ms + n.ms, f"{how}; {g.evidence} and {n.evidence}")
        )
    return out


def _sites(before: Mapping[str, Any], after: Mapping[str, Any], shown: int = 3) -> str:
    """The host code whose idle grew most (sampled stacks, ``idle_by_code``): file:line and
    its ms before -> after."""

    def of(m: Mapping[str, Any]) -> dict[str, float]:
        return {str(s.get("where")): _number(s, "ms") for s in m.get("idle_by_code") or () if isinstance(s, Mapping)}

    b, a = of(before), of(after)
    grown = sorted(((a.get(w, 0.0) - b.get(w, 0.0), w) for w in {*a, *b}), reverse=True)
    named = [f"{w} {b.get(w, 0.0):.3f} -> {a.get(w, 0.0):.3f} ms" for d, w in grown[:shown] if d > FLOOR_MS]
    return f"; grew in {', '.join(named)}" if named else ""


def _host_ms(steps: Mapping[str, Any], name: str) -> float:
    return _number(steps.get(name) or {}, "host_ms")


def _waiter(before: Mapping[str, Any], after: Mapping[str, Any], idle_in: str, grown: float) -> str | None:
    """The step whose host time grew most, by at least half of ``grown`` ms of idle in step
    ``idle_in``: where the host now waits for what idled the device (a new synchronization,
    or a wait that work beside it used to hide)."""
    if grown <= FLOOR_MS:
        return None
    waits = {n: _host_ms(after, n) - _host_ms(before, n) for n in after if n != idle_in}
    name = max(waits, key=lambda n: (waits[n], n), default=None)
    return name if name is not None and waits[name] >= grown / 2 else None


def _copy_ms(step: Mapping[str, Any]) -> float:
    """How long a step's copies took at their rate (bytes per ns is GB/s)."""
    gbps = _number(step, "gbps")
    return _number(step, "bytes") / gbps / 1e6 if gbps > 0 else 0.0


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
        same = _number(sb, "bytes") == _number(sa, "bytes") and bool(sb.get("pageable")) == bool(sa.get("pageable"))
        if copies_b and same and _number(sa, "gbps") < SLOWER_COPIES * _number(sb, "gbps"):
            what = f"copies in step {name} slower"
        elif copies_b and same and d > OVERLAP_LOST * _copy_ms(sb):
            what = f"overlap lost in step {name}"  # the same copies, at their rate, beside no kernel now
        elif copies_b != copies_a:
            what = f"copies in step {name}"
        if copies_b or copies_a:
            evidence += f"; copies {copies_b or 'none'} -> {copies_a or 'none'}"
        if name not in steps_b:
            what += " (a new step)"
        waiter = _waiter(steps_b, steps_a, name, d)
        if waiter is not None:
            what += f", waited for in step {waiter}" + (" (a new step)" if waiter not in steps_b else "")
            evidence += (
                f"; the host waited in step {waiter} {_host_ms(steps_a, waiter) - _host_ms(steps_b, waiter):+.3f} ms"
            )
        out.append(Cause(what, d, evidence, f"steps.{name}.idle_ms"))
    d = _number(after, "unattributed_ms") - _number(before, "unattributed_ms")
    if abs(d) > FLOOR_MS:
        said = "kernel-idle that no step held (host code between steps)" + _sites(before, after)
        out.append(Cause("idle in no step", d, said, "unattributed_ms"))
    return out


def explain(before: Mapping[str, Any], after: Mapping[str, Any]) -> Explanation:
    """The change of one test's wall time between two report entries, split into causes."""
    mb, ma = before.get("metrics") or {}, after.get("metrics") or {}
    causes = [_how_sure(c, before, after) for c in (*_kernels(mb, ma), *_idle(mb, ma))]
    causes.sort(key=lambda c: -abs(c.ms))
    wall_b, wall_a = _number(mb, "wall_ms"), _number(ma, "wall_ms")
    unexplained = (wall_a - wall_b) - sum(c.ms for c in causes)
    return Explanation(
        str(after.get("nodeid", "")), wall_b, wall_a, tuple(causes), unexplained, _memory(mb, ma), _unjudged(mb, ma)
    )


def _how_sure(cause: Cause, before: Mapping[str, Any], after: Mapping[str, Any]) -> Cause:
    """The cause with how sure its rounds make it: how many of the after run's rounds lie
    beyond every round of the run before, the way it moved (``3 of 5 rounds past the
    base's 4.000-4.012``)."""
    rounds_b = ((before.get("rounds") or {}).get(cause.path) or {}).get("samples") or []
    rounds_a = ((after.get("rounds") or {}).get(cause.path) or {}).get("samples") or []
    if rounds_b and rounds_a:
        low, high = min(rounds_b), max(rounds_b)
        past = sum(r > high for r in rounds_a) if cause.ms > 0 else sum(r < low for r in rounds_a)
        said = f"{past} of {len(rounds_a)} rounds past the base's {low:.3f}-{high:.3f}"
    elif rounds_a:  # a kernel that appeared: in how many rounds
        said = f"in {sum(r > 0 for r in rounds_a)} of {len(rounds_a)} rounds, in no round of the base"
    elif rounds_b:
        said = f"in no round now, in {sum(r > 0 for r in rounds_b)} of the base's {len(rounds_b)}"
    else:
        return cause
    return replace(cause, evidence=f"{cause.evidence}; {said}")


def _unjudged(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    """The causes one of the two records holds no facts for."""
    lacks = {
        "launches and geometry (no kernel summary)": "top_kernels",
        "each kernel's time (no kernel totals)": "kernel_totals",
        "device memory (not recorded)": "memory",
    }
    return tuple(said for said, key in lacks.items() if not (before.get(key) and after.get(key)))


def _memory(before: Mapping[str, Any], after: Mapping[str, Any]) -> Memory | None:
    """The change of the device memory a test held, where both runs' records know it."""
    b, a = before.get("memory") or {}, after.get("memory") or {}
    peak_b, peak_a = b.get("peak_bytes"), a.get("peak_bytes")
    if not isinstance(peak_b, int) or not isinstance(peak_a, int):
        return None
    kept_b, kept_a = int(b.get("leaked_bytes") or 0), int(a.get("leaked_bytes") or 0)
    if (peak_a, kept_a) == (peak_b, kept_b):
        return None
    places_b, places_a = _kept_places(b), _kept_places(a)
    places = [(w, places_b.get(w, 0), places_a.get(w, 0)) for w in {*places_b, *places_a}]
    places = sorted((p for p in places if p[1] != p[2]), key=lambda p: (-abs(p[2] - p[1]), p[0]))
    return Memory(peak_b, peak_a, kept_b, kept_a, tuple(places))


def _kept_places(memory: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for leak in memory.get("leaks") or ():
        if isinstance(leak, Mapping) and isinstance(leak.get("bytes"), int):
            where = f"step {leak.get('step') or '-'} at {leak.get('where') or '?'}"
            out[where] = out.get(where, 0) + leak["bytes"]
    return out


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
