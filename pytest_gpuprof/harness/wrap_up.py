"""What a run leaves behind: the terminal summary, the JSON report, the HTML page, the
baseline and the CI step summary, each from the tests' views (``output.views.TestView``).

Every file is written whole or not at all (``files``); one that cannot be written is a
line of the summary and makes the run fail, and the rest are still written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.harness.config import Settings
from pytest_gpuprof.output.text import memory_top
from pytest_gpuprof.output.views import TestView

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.timeline import Timeline
    from pytest_gpuprof.baselines.rule import RunFacts
    from pytest_gpuprof.verdict.record import GpuRecord
    from pytest_gpuprof.verdict.run_gate import RunGate

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


class Outputs:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # --gpu-trace: why the traces stopped being written (the first failure), if they did
        self.trace_failed: str | None = None
        # what was written, or could not be: lines of the summary
        self.written: list[str] = []

    @staticmethod
    def merged(
        views: Mapping[str, TestView], crashed: Mapping[str, str], machine: Callable[[], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every test once, in run order, and the machine: from this process or the workers."""
        tests = [v.test for v in views.values()]
        tests += [
            {"nodeid": nodeid, "outcome": "failed", "crashed": reason}
            for nodeid, reason in crashed.items()
            if nodeid not in views
        ]
        machines = [v.machine for v in views.values()]
        merged = dict(machines[0]) if machines else machine()
        environment: dict[str, Any] = {}
        for m in machines:  # each process's loaded libraries (xdist workers may differ)
            environment = {**m.get("environment", {}), **environment}
        if environment:
            merged["environment"] = environment
        devices = sorted({t["device"] for t in tests if "device" in t})
        if devices:
            merged["devices"] = devices
        return tests, merged

    def summary(
        self,
        tr: Any,
        views: Mapping[str, TestView],
        crashed: Mapping[str, str],
        *,
        title: str,
        header: list[str],
        compared_with: object,
    ) -> None:
        """The session's section of the terminal summary; ``header``: lines to repeat (a
        test started the backend after pytest printed the header)."""
        if not (views or crashed):
            for line in self.written:  # what was written, or could not be, for a run that measured nothing
                tr.write_line(line)
            return
        tr.section(title)
        for line in header:
            tr.write_line(line)
        every = list(views.values())
        shown, rest = self._shown(every)
        if shown:  # --gpu-summary=0: the count line alone, no header without rows
            for line in self._table(every, shown):
                tr.write_line(line)
        if rest:
            tr.write_line(rest)
        for nodeid, reason in crashed.items():
            tr.write_line(f"{nodeid}: lost: {reason}")
        _block(tr, "budget breaches and where the time went:", [line for i in shown for line in every[i].details])
        top = self.settings.memory_top
        _block(
            tr,
            "where the device memory was at each test's peak (--gpu-memory-top):",
            [line for nodeid, v in views.items() for line in memory_top(nodeid, v.test["metrics"], top)],
        )
        from pytest_gpuprof.verdict.run_gate import RunGate

        gate = RunGate.of(v.test for v in views.values())
        if compared_with is None and gate is not None:  # an xdist controller: its workers compared
            compared_with = gate.names_baseline()
        self._comparison(tr, views, compared_with)
        sharing = self._sharing_note(views)
        if sharing:
            tr.write_line(sharing)
        for line in self.written:
            tr.write_line(line)
        if self.settings.trace is not None:
            tr.write_line(f"gpuprof: one trace per test in {self.settings.trace} (open in ui.perfetto.dev)")
        if gate is not None:
            self._gate_lines(tr, gate)

    def _comparison(self, tr: Any, views: Mapping[str, TestView], compared_with: object) -> None:
        """The comparison with the baseline: its heading (why it was chosen, wrapped under it
        on one screen), each test's lines, the tests no gate held, a gate that gates nothing."""
        from pytest_gpuprof.verdict.comparison import NEW
        from pytest_gpuprof.verdict.decision import SHORT
        from pytest_gpuprof.verdict.thresholds import DEFAULT_THRESHOLDS

        compare = [line for v in views.values() for line in v.compare]
        heading, why = f"compared with baseline {compared_with}:", []
        if (
            not self._every_line(tr)
            and isinstance(compared_with, str)
            and len(heading) > SHORT
            and " (" in compared_with
        ):
            where, chosen = compared_with.split(" (", 1)  # one screen: why it was chosen under it, wrapped
            heading, why = f"compared with baseline {where}:", textwrap.wrap(f"({chosen}", SHORT - 2)
        _block(tr, heading, [f"  {line}" for line in [*why, *self._compared(tr, views)]])
        if not compare and compared_with is not None and self.settings.compare is not None:
            tr.write_line(f"gpuprof: compared with baseline {compared_with}")
        if new := sum(line.endswith(NEW) for line in compare):
            tr.write_line(f"gpuprof: {new} of {len(views)} tests ungated: {NEW}")
        if self.settings.compare is not None and not self.settings.compare_fail:
            tr.write_line(
                "gpuprof: nothing gates on these changes: give --gpu-compare-fail=EXPR (for example "
                f"--gpu-compare-fail={DEFAULT_THRESHOLDS}) to fail a test that clearly regressed"
            )

    def _every_line(self, tr: Any) -> bool:
        return bool(tr.config.option.verbose > 0 or self.settings.summary_rows is None)

    def _compared(self, tr: Any, views: Mapping[str, TestView]) -> list[str]:
        """The comparison block: every line under ``-v`` or ``--gpu-summary=all``; else one
        screen: each test that moved, with its decision and a short line a change
        (``verdict.decision.short_lines``), and the unchanged ones counted."""
        from pytest_gpuprof.verdict.decision import short_lines

        if self._every_line(tr):
            return [line for v in views.values() for line in v.compare]
        lines = [short_lines(v.test) for v in views.values() if v.compare]
        quiet = sum(not each for each in lines)
        out = [line for each in lines for line in each]
        if quiet:
            out.append(f"{quiet} test(s) unchanged (-v or --gpu-summary=all shows every line)")
        return out

    def _gate_lines(self, tr: Any, gate: RunGate) -> None:
        """The gate's last lines: the headline (baseline, tests by decision), each undecided
        test with why and what would decide it, and the count beside pytest's own."""
        tr.write_line("")
        for line in gate.undecided_lines():
            tr.write_line(f"gpuprof: {line}")
        tr.write_line(gate.headline())
        suite = gate.suite_line()
        if suite:
            tr.write_line(suite)
        if gate.undecided:
            if self.settings.compare_undecided == "warn":
                tr.write_line(
                    f"gpuprof: {len(gate.undecided)} gated test(s) undecided, passed with a warning; "
                    "--gpu-compare-undecided=fail fails them"
                )
            # pytest's last line counts them beside its own (``N undecided``)
            tr.stats.setdefault("undecided", []).extend(_Counted() for _ in gate.undecided)

    def _shown(self, every: list[TestView]) -> tuple[list[int], str | None]:
        """The tests the table shows, in its order (``--gpu-sort``, else failures first)."""
        from pytest_gpuprof.output.columns import order
        from pytest_gpuprof.output.report import first_rows

        s = self.settings
        tests = [v.test for v in every]
        ordered = None
        if s.sort is not None:
            ordered = order([t["nodeid"] for t in tests], [v.figures[0] if v.figures else {} for v in every], s.sort)
        return first_rows(tests, s.summary_rows, ordered)

    def _table(self, every: list[TestView], shown: list[int]) -> list[str]:
        from pytest_gpuprof.output import columns

        rows = [
            (every[i].test["nodeid"], row, every[i].figures[n] if n < len(every[i].figures) else {})
            for i in shown
            for n, row in enumerate(every[i].rows)
        ]
        return columns.table(rows, self.settings.columns or columns.NAMED, self.settings.group_by)

    def _sharing_note(self, views: Mapping[str, TestView]) -> str | None:
        waited = waits(views)
        workers = self.config.getoption("numprocesses", None)
        if not workers:
            return waited
        devices = sorted({v.test.get("device", 0) for v in views.values()})
        if len(devices) < int(workers):
            shared = f"gpuprof: {workers} xdist workers shared {len(devices)} device(s) {devices}"
            if not self.settings.exclusive:
                return f"{shared}: their timings overlap"
            if self.settings.host_clock == "virtual" and all(
                v.test["metrics"]["truth"] == "host" for v in views.values()
            ):
                return f"{shared}; on the host backend's virtual clock their figures do not depend on each other"
            return f"{shared}; each test that used one held it alone (--gpu-exclusive=auto)" + (
                f"\n{waited}" if waited else ""
            )
        return f"gpuprof: {workers} xdist workers on devices {devices}" + (f"\n{waited}" if waited else "")

    def write(
        self,
        views: Mapping[str, TestView],
        crashed: Mapping[str, str],
        machine: Callable[[], dict[str, Any]],
        facts: RunFacts,
        outcomes: Mapping[str, str] | None = None,
    ) -> bool:
        """Every file asked for (``FILES``) and the baseline, where the baseline rule lets
        the run be one (``baselines.rule``, from its ``facts``). False when one could not be
        written."""
        from pytest_gpuprof.baselines import rule

        s = self.settings
        partial = facts.cut_short
        if self.trace_failed is not None:
            self.written.append(self.trace_failed)
        asked = [(f, path) for f in FILES if (path := f.where(s)) is not None]
        if not asked and s.save is None:
            return self.trace_failed is None
        if not (views or crashed or s.configured):
            return True  # only the step summary asked for, and nothing measured: nothing to start for it
        from pytest_gpuprof.output.report import build_report, revision

        tests, merged = self.merged(views, crashed, machine)
        said = rule.judge(dataclasses.replace(facts, measured=len(tests)))
        report = build_report(tests, merged, revision(self.config.rootpath))
        self.config.hook.pytest_gpuprof_update_json(config=self.config, report=report)
        if partial:
            report["partial"] = partial
        if said.part:
            report["part"] = said.part
        if outcomes:
            report["outcomes"] = dict(outcomes)
        if not tests and partial:  # cut short: what was measured before it is said, not why
            report["note"] = f"the run {partial} before any test was measured"
        elif not tests:
            report["note"] = "nothing was measured: no test used gpuprof, gpu_workload or a gpu_budget marker"
        elif partial:
            report["note"] = f"the run {partial}: {len(tests)} test(s) measured before it ended"
        from pytest_gpuprof.verdict.run_gate import RunGate

        gate = RunGate.of(tests)
        if gate is not None:
            report["gate"] = gate.to_dict()
        run = Run(report, tests, merged, views, gate)
        ok = True
        for f, path in asked:
            try:
                f.write(path, f.render(run))
            except OSError as e:
                ok = False
                self.written.append(f"gpuprof: could not write the {f.what} {path}: {e.strerror or e}")
            else:
                self.written.append(f"gpuprof: {f.what} {f.done} {path}")
        if (name := s.save) is not None:
            ok = self._save(report, name, said.refused) and ok
        return ok

    def _save(self, report: dict[str, Any], name: str, refused: str | None) -> bool:
        """Store ``report`` as a baseline, unless ``refused`` says why this run may not be one
        (docs/design.md, "The baseline rule")."""
        if refused:
            self.written.append(f"gpuprof: no baseline saved: {refused}")
            return True
        from pytest_gpuprof.baselines.records import BaselineError
        from pytest_gpuprof.baselines.store import Store

        try:
            saved = Store(self.settings.storage).save(report, name, self.settings.run_id, check=checked)
        except BaselineError as e:  # the report itself is written: only the store failed
            self.written.append(f"gpuprof: could not save the baseline: {e}")
            return False
        of = f" ({report['part']})" if report.get("part") else ""
        self.written.append(f"gpuprof: baseline saved as {saved}{of}")
        return True


class _Counted:
    """An entry of pytest's ``terminalreporter.stats`` that its last line counts."""

    count_towards_summary = True
    when = "call"


@dataclass(frozen=True, slots=True)
class Run:
    """What a file of the run is made from."""

    report: dict[str, Any]
    tests: list[dict[str, Any]]
    machine: dict[str, Any]
    views: Mapping[str, TestView]
    gate: RunGate | None = None  # what the gate decided of the run, where a test was gated


@dataclass(frozen=True, slots=True)
class File:
    """A file the run writes: where (from the settings; None: not asked for), its text, and
    how it is written (whole and atomically; the step summary appended to). ``per_test``:
    what it keeps of each test as the test ends (in its ``TestView``, which crosses from an
    xdist worker to the controller), where the report entry is not enough."""

    what: str
    where: Callable[[Settings], Path | None]
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


def _summary_path(_: Settings) -> Path | None:
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


def _block(tr: Any, heading: str, lines: list[str]) -> None:
    """A section of the summary: a blank line, ``heading``, its lines; nothing without lines."""
    if lines:
        tr.write_line("")
        tr.write_line(heading)
        for line in lines:
            tr.write_line(line)
