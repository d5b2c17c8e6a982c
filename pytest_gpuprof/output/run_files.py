"""The files a run writes, each from the tests' views (``TestView``): the JSON report, the
HTML page, the CSV file and the CI step summary; a new format is one entry of ``FILES``
(and its option). Every file is written whole or not at all (``files``), the step summary
appended to."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_gpuprof.output.report import breach_details, row_figures, rows
from pytest_gpuprof.output.views import TestResult, TestView

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.timeline import Timeline
    from pytest_gpuprof.output.report import Machine
    from pytest_gpuprof.verdict.entry import Entry
    from pytest_gpuprof.verdict.record import GpuRecord
    from pytest_gpuprof.verdict.run_gate import RunGate


class Asked(Protocol):
    """Where the run's settings ask each file to go (None: not asked for)."""

    @property
    def report(self) -> Path | None: ...
    @property
    def html(self) -> Path | None: ...
    @property
    def csv(self) -> Path | None: ...


# waits under this are the lock changing hands, not worth a line
WAIT_NOTED_MS = 1.0


def waits(views: Mapping[str, TestView], shown: int = 3) -> str | None:
    """The line saying how long tests waited for their device (``--gpu-exclusive``), the
    longest named: outside every window, never in a figure."""
    waited = sorted(
        ((float(v.test.get("waited_ms", 0.0)), nodeid, v.test.get("waited_for", "")) for nodeid, v in views.items()),
        reverse=True,
    )
    waited = [w for w in waited if w[0] >= WAIT_NOTED_MS]
    if not waited:
        return None
    longest = "; ".join(
        f"{nodeid} {ms:.0f} ms" + (f" (for {who})" if who else "") for ms, nodeid, who in waited[:shown]
    )
    total = sum(ms for ms, _, _ in waited)
    return (
        f"gpuprof: {len(waited)} test(s) waited {total:.0f} ms in all for a device another process of this plugin "
        f"held (outside their windows); longest: {longest}"
    )


@dataclass(frozen=True, slots=True)
class Run:
    """What a file of the run is made from."""

    report: dict[str, Any]
    tests: list[Entry]
    machine: Machine
    views: Mapping[str, TestView]
    gate: RunGate | None = None  # what the gate decided of the run, where a test was gated


@dataclass(frozen=True, slots=True)
class File:
    """A file the run writes: where (from the settings; None: not asked for), its text, and
    how it is written (whole and atomically; the step summary appended to). ``per_test``:
    what it keeps of each test as the test ends (in its ``TestView``, which crosses from an
    xdist worker to the controller), where the report entry is not enough."""

    what: str
    where: Callable[[Asked], Path | None]
    render: Callable[[Run], str | Iterable[str]]
    append: bool = False
    per_test: Callable[[GpuRecord, Timeline | None], Any] | None = None

    @property
    def done(self) -> str:
        return "appended to" if self.append else "written to"

    def write(self, path: Path, text: str | Iterable[str]) -> None:
        if self.append:
            assert isinstance(text, str)
            with open(path, "a", encoding="utf-8", errors="backslashreplace") as f:
                f.write(text)
            return
        from pytest_gpuprof.output.files import write_atomic

        write_atomic(path, text)


def _json(run: Run) -> str:
    from pytest_gpuprof.output.files import json_text

    checked(run.report, "report")
    return json_text(run.report)


def checked(document: dict[str, Any], which: str) -> None:
    """Under ``PYTEST_GPUPROF_CHECK_SCHEMA=1`` (the suite sets it), a report or baseline
    that breaks its shipped JSON Schema is an error, not a file."""
    if os.environ.get("PYTEST_GPUPROF_CHECK_SCHEMA") == "1":
        from pytest_gpuprof.output.schema import validate

        validate(document, which)


def _html(run: Run) -> Iterator[str]:
    """The page, written as it is read: each test's part from the spool its process wrote
    it to (``_page``); the spools removed once read, or given up on."""
    from pytest_gpuprof.output.html import render_chunks

    parts = [v.per_file[HTML] for v in run.views.values() if v.per_file.get(HTML)]

    def read() -> Iterator[str]:
        for part in parts:
            with open(part["spool"], "rb") as f:
                f.seek(part["at"])
                yield f.read(part["size"]).decode("ascii")

    try:
        yield from render_chunks(read(), run.machine)
    finally:
        for spool in {part["spool"] for part in parts}:
            with contextlib.suppress(OSError):
                os.unlink(spool)
        _SPOOL.pop(os.getpid(), None)


# each process's spool of page parts (xdist's workers each have their own): a run of many
# tests keeps a few numbers a test in memory, not its page data (0.26 MB a 1,000-step test)
_SPOOL: dict[int, str] = {}


def _page(record: GpuRecord, timeline: Timeline | None) -> dict[str, Any]:
    """The test's part of the HTML page, spooled to a file of this process's: where it is."""
    import tempfile

    from pytest_gpuprof.output.html import embedded, page_data

    data = embedded(page_data(record, timeline)).encode("ascii")
    pid = os.getpid()
    if pid not in _SPOOL:
        fd, _SPOOL[pid] = tempfile.mkstemp(prefix="gpuprof-page-", suffix=".spool")
        os.close(fd)
    with open(_SPOOL[pid], "ab") as f:
        at = f.tell()
        f.write(data)
    return {"spool": _SPOOL[pid], "at": at, "size": len(data)}


def _step_summary(run: Run) -> str:
    from pytest_gpuprof.output.report import markdown_summary

    compare = [line for v in run.views.values() for line in v.compare]
    measured = [t for t in run.tests if "metrics" in t]
    return markdown_summary(measured, run.machine, compare, waits(run.views), run.gate)


def _csv(run: Run) -> str:
    from pytest_gpuprof.output.columns import csv_text

    return csv_text([row for v in run.views.values() for row in v.per_file.get(CSV, [])])


def _csv_rows(record: GpuRecord, _: Timeline | None) -> list[dict[str, Any]]:
    from pytest_gpuprof.output.report import window_rows

    return window_rows(record)


def _summary_path(_: Asked) -> Path | None:
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(summary) if summary else None


HTML = "HTML report"
CSV = "CSV file"
# every file a run can write: a new format is one entry (and its option in ``options``)
FILES = (
    File("JSON report", lambda s: s.report, _json),
    File(HTML, lambda s: s.html, _html, per_test=_page),
    File(CSV, lambda s: s.csv, _csv, per_test=_csv_rows),
    File("step summary", _summary_path, _step_summary, append=True),
)


def view(result: TestResult, compare: list[str], machine: Machine, files: Iterable[File]) -> TestView:
    """The test as every output reads it (``compare``: its lines against the baseline;
    ``files``: the run's files that keep something of each test)."""
    record = result.record
    return TestView(
        test=record.to_dict(),
        rows=rows(record),
        details=breach_details(record),
        compare=compare,
        machine=machine,
        per_file={f.what: f.per_test(record, result.timeline) for f in files if f.per_test is not None},
        figures=row_figures(record),
    )
