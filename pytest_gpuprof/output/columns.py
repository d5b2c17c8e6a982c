"""The terminal table's shape (``--gpu-columns``, ``--gpu-sort``, ``--gpu-group-by``) and
the CSV file (``--gpu-csv``): a column is one of the table's own or any metric's path.

A row is a test's reported window (or one of its other breaching windows): its cells as
the default table writes them, and its figures by path (``Metrics.flat``), from which any
other column is written. A figure the window has none of reads ``-``, never 0.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.metrics import UNATTRIBUTED
from pytest_gpuprof.analysis.names import fit
from pytest_gpuprof.output.text import human_bytes, ms, pct

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.verdict.record import GpuRecord


class Own(NamedTuple):
    """A column of the table's own: its name (``--gpu-columns``), heading, cell from a
    record and a window's figures (``name``: the row's own, for a window other than the
    reported one), and whether it is text (left-aligned) rather than a figure."""

    name: str
    heading: str
    cell: Callable[[GpuRecord, Metrics, str | None], str]
    text: bool = False


def cause(m: Metrics) -> str:
    """The largest idle cause; for unattributed idle, the host code that most explains it."""
    top = max((c for c in m.idle_by_step() if c[1] > 0), key=lambda c: c[1], default=(UNATTRIBUTED, 0.0))
    if top[1] <= 0:
        return "-"
    said = f"{top[0]} {top[1]:.1f} ms"
    if top[0] == UNATTRIBUTED and m.idle_by_code and m.unattributed_ms:
        where, spent = m.idle_by_code[0]
        said += f", {spent / m.unattributed_ms:.0%} in {where}"
    return fit(said)  # a column, not a paragraph: the JSON and the message keep it whole


# the default table's columns, in its order: a new one is one row
OWN = (
    Own("test", "test", lambda r, m, name: name or r.nodeid, text=True),
    Own("wall_ms", "wall ms", lambda r, m, _: f"{m.wall_ms:.1f}"),
    Own("utilization", "util", lambda r, m, _: pct(m.utilization)),
    Own("reported_utilization", "reported", lambda r, m, _: pct(m.reported_utilization)),
    Own("overhead_ms", "overhead ms", lambda r, m, _: ms(m.overhead_ms)),
    Own("cause", "largest idle cause", lambda r, m, _: cause(m), text=True),
    Own("verdict", "verdict", lambda r, m, _: r.status, text=True),
)
NAMED = tuple(c.name for c in OWN)
HEADINGS = tuple(c.heading for c in OWN)
_TEXT = {c.name for c in OWN if c.text}


def cells(record: GpuRecord, m: Metrics, name: str | None = None) -> list[str]:
    """A row's cells of the table's own columns."""
    return [c.cell(record, m, name) for c in OWN]


GROUPS = ("module", "class", "param", "name")


class ColumnError(ValueError):
    """A column, sort key or group that names nothing."""


def check_metric(name: str) -> str:
    if descriptors.lookup(name) is None:
        raise ColumnError(
            f"{name!r} names no metric; a metric's path is one of the report's (kernel_ms, sm_utilization, "
            "steps.NAME.idle_ms, memory.peak_bytes, nvml.power_w...)"
        )
    return name


def parse_columns(text: str) -> tuple[str, ...]:
    """``test,utilization,kernel_ms``: the table's own columns and metrics' paths, in order;
    the test's id first where it was left out (a row must say whose it is)."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise ColumnError(f"no column named; the table's own are {', '.join(NAMED)}, besides any metric's path")
    for name in names:
        if name not in NAMED:
            check_metric(name)
    return tuple(names) if "test" in names else ("test", *names)


def check_sort(value: str) -> str:
    return value if value == "name" else check_metric(value)


def heading(column: str) -> str:
    return HEADINGS[NAMED.index(column)] if column in NAMED else column


def cell(column: str, row: Sequence[str], flat: Mapping[str, float]) -> str:
    if column in NAMED:
        return row[NAMED.index(column)]
    return figure(column, flat.get(column))


def figure(path: str, value: float | None) -> str:
    """A figure as the table writes its kind: a percentage, bytes in binary units, ms."""
    if value is None:
        return "-"
    metric = descriptors.lookup(path)
    unit = metric.unit if metric is not None else None
    if unit == "fraction":
        return pct(value)
    if unit == "bytes":
        return human_bytes(value)
    if unit in ("count", "flag"):
        return f"{value:.0f}"
    return f"{value:.1f}" if unit == "ms" else f"{value:.4g}"


def order(nodeids: Sequence[str], flats: Sequence[Mapping[str, float]], sort: str) -> list[int]:
    """Indices by ``sort``: the test id, or a metric worst first (down for a floor, up for a
    time); tests without the figure last, by id."""
    if sort == "name":
        return sorted(range(len(nodeids)), key=lambda i: nodeids[i])
    metric = descriptors.lookup(sort)
    sign = -1.0 if metric is not None and metric.worse == "up" else 1.0

    def key(i: int) -> tuple[bool, float, str]:
        value = flats[i].get(sort)
        return (value is None, 0.0 if value is None else sign * value, nodeids[i])

    return sorted(range(len(nodeids)), key=key)


def group_of(nodeid: str, by: str) -> str:
    """The group a test is shown in: its module, class (else module), parameters' id or
    function name."""
    parts = nodeid.split("::")
    if by == "module":
        return parts[0]
    if by == "class":
        return "::".join(parts[:-1])
    function, _, params = parts[-1].partition("[")
    if by == "name":
        return function
    return params[:-1] if params else "(no parameters)"


def table(
    rows: Sequence[tuple[str, Sequence[str], Mapping[str, float]]],
    columns: Sequence[str] = NAMED,
    group_by: str | None = None,
) -> list[str]:
    """The table's lines: a heading, then each row (its test id, default cells, figures),
    under a line per group where ``group_by`` says so (groups in the order they first show)."""
    cells = [[heading(c) for c in columns]] + [[cell(c, row, flat) for c in columns] for _, row, flat in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]

    def line(r: list[str]) -> str:
        return "  ".join(
            v.ljust(w) if c in _TEXT else v.rjust(w) for c, v, w in zip(columns, r, widths, strict=True)
        ).rstrip()

    lines = [line(cells[0])]
    if group_by is None:
        return lines + [line(r) for r in cells[1:]]
    groups: dict[str, list[str]] = {}
    for (nodeid, _, _), r in zip(rows, cells[1:], strict=True):
        groups.setdefault(group_of(nodeid, group_by), []).append(line(r))
    for name, members in groups.items():
        lines.append(f"-- {group_by} {name} ({len(members)} row{'s' if len(members) > 1 else ''})")
        lines += members
    return lines


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """One row per test and window: its id, window, label, outcome and verdict, then every
    metric's path any row has (in the order they first appear; empty where a row has none)."""
    first = ["test", "window", "label", "outcome", "verdict"]
    paths: dict[str, None] = {}
    for row in rows:
        paths.update((k, None) for k in row if k not in first)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*first, *paths], restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def report_rows(
    tests: Sequence[Mapping[str, Any]], paths: Sequence[str]
) -> list[tuple[str, list[str], dict[str, float]]]:
    """The table's rows of a report's tests (``gpuprof show``): the default cells from each
    entry, and its figures at ``paths``."""
    from pytest_gpuprof.verdict.samples import value_at

    out = []
    for t in tests:
        m = t.get("metrics", {})
        wall = m.get("wall_ms")
        row = [
            t["nodeid"],
            "-" if wall is None else f"{wall:.1f}",
            pct(m.get("utilization")),
            pct(m.get("reported_utilization")),
            "-" if m.get("overhead_ms") is None else f"{m['overhead_ms']:.1f}",
            _cause(m),
            str(t.get("verdict", t.get("outcome", "-"))),
        ]
        figures = {p: v for p in paths if (v := value_at(m, p)) is not None}
        out.append((t["nodeid"], row, figures))
    return out


def _cause(m: Mapping[str, Any]) -> str:
    causes = [(name, s.get("idle_ms") or 0.0) for name, s in (m.get("steps") or {}).items()]
    causes.append(("unattributed", m.get("unattributed_ms") or 0.0))
    name, idle = max(causes, key=lambda c: c[1])
    return f"{name} {idle:.1f} ms" if idle > 0 else "-"
