"""What a gate decided of a test, and of the run: nothing passes blind (docs/gates.md,
"Undecided").

A gated comparison is ``undecided`` where it cannot tell its threshold apart from the noise
it measured:

- a move past the threshold that the spread between runs, or the rounds, explain
  (the change's finding ``inconclusive``);
- a spread between runs that hides a change of the threshold's size (``Change.blind``);
- rounds that can never reach a finding (``Change.inert``), the spread unknown or not;
- a baseline entry that could not be compared (``not compared``).

Each undecided test is named with why and what would decide it, and counted beside the
regressions and the unchanged: in the terminal's last lines, the step summary's headline,
JUnit properties and the JSON report's ``gate`` object. A move that is large against its
threshold comes first, with its size. Pure: plain data in, plain data out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_gpuprof.analysis.descriptors import is_fraction
from pytest_gpuprof.analysis.run_spread import POWER, tolerance_factor
from pytest_gpuprof.verdict.change import Change, formatter, rounds_needed
from pytest_gpuprof.verdict.compare import kernel_names
from pytest_gpuprof.verdict.comparison import Comparison

Decision = Literal["regression", "undecided", "improvement", "unchanged", "new", "ungated"]
# ``gpuprof ab``'s interval of one look: 96%, each end a one-sided 98% bound, so that no
# change is called a regression 2% of the time at most (``verdict.paired``)
AB_CONFIDENCE = 0.98
# the most pairs or saved runs a line suggests: past it, "more than" that
MOST = 200


@dataclass(frozen=True, slots=True)
class Undecided:
    """One gated figure a comparison could not decide: what, why, what would decide it, and
    how far its median moved in units of its threshold (toward worse; ``None``: not moved,
    or not measured)."""

    what: str
    why: str
    decide: str
    moved: float | None = None

    def line(self) -> str:
        return f"{self.what}: {self.why}; {self.decide}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.what, "why": self.why, "decide": self.decide, "moved": self.moved}


def decision(comparison: Comparison) -> tuple[Decision, tuple[Undecided, ...]]:
    """The test's decision under its gating expressions, and what left it undecided."""
    if not comparison.gating:
        return "ungated", ()
    if comparison.status == "new":
        return "new", ()
    if comparison.status == "not compared":
        why = comparison.why_not or "its baseline entry could not be compared"
        return "undecided", (Undecided("baseline", why, "save a new baseline (--gpu-save) from a passing run"),)
    if comparison.regressed:
        return "regression", ()
    gates = {t.text for t in comparison.gating}
    gated = [c for c in comparison.changes if c.threshold.text in gates]
    names = kernel_names(gated)
    undecided = [u for c in gated if (u := undecided_change(c, names)) is not None]
    if undecided:
        return "undecided", tuple(sorted(undecided, key=lambda u: -(u.moved or 0.0)))
    if any(c.finding == "improvement" for c in gated):
        return "improvement", ()
    return "unchanged", ()


def undecided_change(c: Change, names: Mapping[str, str] | None = None) -> Undecided | None:
    """Why ``c`` (a gated change) decides nothing, or ``None`` where it decided."""
    what = c.label(names)
    moved = _moved(c)
    if c.finding == "absent":
        return Undecided(what, "measured in neither the baseline nor this run", "measure it, or drop the gate")
    if c.inert:
        need = rounds_needed(max(c.samples))
        why = f"--gpu-compare-fail={c.threshold.text} cannot fail this test: {c.inert_cause()}"
        return Undecided(what, why, f"needs {need} or more rounds a side", moved)
    if c.finding == "inconclusive":
        size = f"moved {_times(moved)} the threshold {c.threshold.text}"
        if c.unconfirmed:
            why = f"{size}, but not confirmed: {c.unconfirmed}"
            return Undecided(what, why, f"more fresh runs (--gpu-compare-confirm), or {_more(c)}", moved)
        if c.spread is not None and c.spread.sd is None:
            runs = "no saved run" if c.spread.runs == 0 else f"{c.spread.runs} saved run"
            why = f"{size}, but the spread between runs is unknown ({runs}: one process's rounds are no evidence)"
            return Undecided(what, why, "save 2 or more runs of the baseline, or use gpuprof ab", moved)
        if c.spread is not None and c.spread.changed is not None and c.spread.explains(c.current or 0.0, _sign(c)):
            return Undecided(what, f"{size}, but {c.spread.explains(c.current or 0.0, _sign(c))}", _more(c), moved)
        if c.spread is not None and c.spread.sd is not None and not c.spread.beyond(c.current or 0.0, _sign(c)):
            return Undecided(what, f"{size}, within the spread between runs", _more(c), moved)
        held = c.spread.explains(c.current or 0.0, _sign(c)) if c.spread is not None else None
        if held is not None:
            return Undecided(what, f"{size}, but {held}", _more(c), moved)
        return Undecided(what, f"{size}, not clear over the rounds (p={c.p_value:.3g})", _more_rounds(c), moved)
    if c.blind:
        detectable = c.detectable
        shown = _size(c, detectable) if detectable is not None else "?"
        why = f"the spread between runs hides a change of the threshold {c.threshold.text} (smallest detectable change {shown})"
        return Undecided(what, why, _more(c), moved)
    return None


def _sign(c: Change) -> int:
    return c.threshold.direction


def _moved(c: Change) -> float | None:
    """The median's move toward worse, in thresholds."""
    if c.baseline is None or c.current is None:
        return None
    allowed = c.threshold.delta(c.baseline)
    if allowed <= 0:
        return None
    return _sign(c) * (c.current - c.baseline) / allowed


def _times(moved: float | None) -> str:
    return "?" if moved is None else f"{moved:.1f}x"


def _size(c: Change, value: float) -> str:
    if is_fraction(c.threshold.metric):
        return f"{100 * value:.2f}pt"
    relative = f" ({100 * value / abs(c.baseline):.1f}%)" if c.baseline else ""
    return f"{value:.3f}{relative}"


def _more_rounds(c: Change) -> str:
    return f"more rounds a side (--gpu-rounds; now {c.samples[0]} vs {c.samples[1]}), or {_more(c)}"


def _more(c: Change) -> str:
    """What would see a change of the threshold's size at this spread: pairs of
    ``gpuprof ab`` (each pair's difference has twice a run's variance), or more saved runs
    where the bound's factor, not the spread itself, is what hides it."""
    spread = c.spread
    if spread is None or spread.sd is None or c.baseline is None:
        return "more saved runs of the baseline (its spread between runs is unknown), or gpuprof ab"
    allowed = c.threshold.delta(c.baseline)
    pairs = ab_pairs_needed(spread.sd * math.sqrt(2), allowed)
    out = f"needs about {pairs} pairs of gpuprof ab" if pairs <= MOST else f"needs more than {MOST} pairs of gpuprof ab"
    runs = runs_needed(spread.sd, allowed)
    if runs is not None and runs > spread.runs:
        out += f", or {runs} saved runs (has {spread.runs})"
    wider = _threshold_seen(c)
    return out + (f", or a threshold of {wider} (what this spread can see)" if wider else "")


def _threshold_seen(c: Change) -> str | None:
    """The threshold, in the expression's own unit, that this spread lets a change of its
    size be seen at (``Spread.detectable``), rounded up."""
    spread, t = c.spread, c.threshold
    if spread is None or spread.detectable is None or c.baseline is None:
        return None
    sign = "+" if t.direction > 0 else "-"
    if t.unit == "%":
        if not c.baseline:
            return None
        amount = math.ceil(1000 * spread.detectable / abs(c.baseline)) / 10
    elif t.unit == "pt":
        amount = math.ceil(1000 * spread.detectable) / 10
    else:
        amount = math.ceil(1000 * spread.detectable) / 1000
    return f"{t.text.rsplit(':', 1)[0]}:{sign}{amount:g}{t.unit}"


def ab_pairs_needed(pair_sd: float, allowed: float) -> int:
    """The fewest pairs whose 96% interval, at a pair's spread ``pair_sd``, catches a true
    change of twice the threshold ``POWER`` of the time: its detectable distance past the
    threshold no wider than the threshold itself (``verdict.paired``'s rule); ``MOST + 1``
    where none up to ``MOST`` does."""
    from pytest_gpuprof.analysis.run_spread import t_quantile

    if allowed <= 0:
        return MOST + 1
    for n in range(2, MOST + 1):
        width = (t_quantile(AB_CONFIDENCE, n - 1) + t_quantile(POWER, n - 1)) * pair_sd / math.sqrt(n)
        if width <= allowed:
            return n
    return MOST + 1


def runs_needed(sd: float, allowed: float) -> int | None:
    """The fewest saved runs whose spread alone lets a change of the threshold's size be
    seen (``Spread.detectable`` within the threshold), at the spread ``sd``; ``None`` where
    no number of runs does: the spread itself, not its estimate, hides it."""
    from pytest_gpuprof.analysis.run_spread import t_quantile

    for n in (*range(3, 21), 30, 50):
        if (tolerance_factor(n) + t_quantile(POWER, n - 1) * math.sqrt(1 + 1 / n)) * sd <= allowed:
            return n
    return None


def lines(comparison: Comparison) -> list[str]:
    """The test's lines of a comparison, headed by what the gate decided where one judged
    it (``undecided`` for a blind pass as for a move the spread explains)."""
    decided = decision(comparison)[0]
    return comparison.lines(None if decided in ("ungated", "new") else decided)


# --- the run


def gate_entry(comparison: Comparison) -> dict[str, Any] | None:
    """The test's ``gate`` field of the JSON report: its decision and what left it
    undecided; ``None`` where no gating expression applied."""
    decided, undecided = decision(comparison)
    if decided == "ungated":
        return None
    out: dict[str, Any] = {"decision": decided, "undecided": [u.to_dict() for u in undecided]}
    if comparison.confirmed:
        out["confirmed_by"] = comparison.confirmed  # fresh runs its regressions were put to
    if comparison.explained is not None and comparison.regressed:
        out["explain"] = comparison.explained.to_dict()  # why its wall time changed
    return out


def undecided_message(undecided: Sequence[Undecided], baseline: str) -> str:
    """A test's message where it is undecided: each figure, why, what would decide it."""
    return "\n".join([f"GPU gate undecided against baseline {baseline}:", *(f"  {u.line()}" for u in undecided)])


# the widest line of the terminal's short comparison (``short_lines``)
SHORT = 160
# the changes a test's short lines show at most; -v shows every line
SHORT_CHANGES = 4
# what the terminal shows of a test, by its decision, where it is not one of "unchanged"
_QUIET = ("unchanged", "ungated")


def short_lines(entry: Mapping[str, Any]) -> list[str]:
    """A test's lines of the terminal's short comparison, from its report entry: none for
    a test the gate left unchanged (the caller counts those), else its decision and each
    change that was not ``unchanged``, one line each of at most ``SHORT`` characters: the
    figure, before -> after, the change, the finding and how sure. The full lines stay in
    the JSON, the HTML and ``-v``."""
    nodeid = str(entry.get("nodeid"))
    baseline = entry.get("baseline") if isinstance(entry.get("baseline"), Mapping) else {}
    status = (baseline or {}).get("status")
    if status == "new":
        return [fit(f"{nodeid}: new (not in the baseline)")]
    if status == "not compared":
        return [fit(f"{nodeid}: not compared: {(baseline or {}).get('why_not') or '?'}")]
    gate = entry.get("gate") if isinstance(entry.get("gate"), Mapping) else None
    changes = [c for c in entry.get("comparisons") or () if isinstance(c, Mapping)]
    moved = [
        c for c in changes if c.get("finding") not in ("unchanged", "absent") or (c.get("gates") and c.get("inert"))
    ]
    decided = str(gate["decision"]) if gate is not None else ("changed" if moved else "ungated")
    if decided in _QUIET and not any(c.get("gates") and c.get("inert") for c in changes):
        return []
    moved.sort(key=lambda c: (not c.get("gates"), c.get("finding") != "regression"))
    out = [fit(f"{nodeid}: {decided}"), *(fit(f"    {_short(c)}") for c in moved[:SHORT_CHANGES])]
    if len(moved) > SHORT_CHANGES:
        out.append(f"    and {len(moved) - SHORT_CHANGES} more (-v shows every line)")
    return out + [fit(f"    {line}") for line in why_of(gate)]


def why_of(gate: Mapping[str, Any] | None, top: int = 3) -> list[str]:
    """A regressed test's largest causes of its change of wall time, from its ``gate``
    entry's ``explain``: ``why: kernel fft slower +0.400 ms (95% of +0.420 ms)``."""
    said = gate.get("explain") if isinstance(gate, Mapping) else None
    if not isinstance(said, Mapping):
        return []
    change = float(said.get("after_ms") or 0.0) - float(said.get("before_ms") or 0.0)
    out = []
    for c in list(said.get("causes") or ())[:top]:
        share = f"{c['share']:.0%} of " if isinstance(c.get("share"), float) else ""
        out.append(f"why: {c.get('what')} {float(c.get('ms') or 0.0):+.3f} ms ({share}{change:+.3f} ms)")
    return out


def _short(c: Mapping[str, Any]) -> str:
    """One change as the short comparison says it: ``kernel_ms 10.000 -> 11.020 (+10.2%):
    regression, p=0.004, past the runs' bound 10.350``."""
    label = str(c.get("line") or c.get("metric")).split(": ", 1)[0]
    before, after, finding = c.get("before"), c.get("after"), str(c.get("finding"))
    if finding in ("appeared", "vanished", "absent") or before is None or after is None:
        return str(c.get("line") or f"{label}: {finding}")
    fmt = formatter(str(c.get("metric")))  # as the full line writes it: 12,582,912 B, 41.87%
    relative = f" ({100 * (after - before) / before:+.1f}%)" if before else ""
    sure = [f"p={c['p']:.2g}"] if isinstance(c.get("p"), float) else []
    spread = c.get("between_runs") if isinstance(c.get("between_runs"), Mapping) else None
    if c.get("unconfirmed"):
        sure.append(f"not confirmed ({c['unconfirmed'].split(':')[0]})")
    elif spread is not None and spread.get("sd") is None:
        sure.append("spread between runs unknown")
    elif spread is not None and isinstance(spread.get("center"), float) and isinstance(spread.get("bound"), float):
        edge = spread["center"] + (spread["bound"] if after >= before else -spread["bound"])
        beyond = (after - edge) * (1 if after >= before else -1) > 0
        sure.append(f"{'past' if beyond else 'within'} the runs' bound {fmt(edge)}")
    if c.get("inert"):
        sure.append("gate inert")
    named = finding if c.get("gates") or finding != "regression" else "changed"
    return f"{label} {fmt(before)} -> {fmt(after)}{relative}: {named}" + (f", {', '.join(sure)}" if sure else "")


def fit(line: str) -> str:
    """A line cut to the short comparison's width, ``SHORT`` characters, its end marked."""
    return line if len(line) <= SHORT else line[: SHORT - 1] + "…"
