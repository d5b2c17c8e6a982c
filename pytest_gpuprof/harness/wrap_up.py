"""What a run leaves behind: the terminal summary, the files (``output.run_files``) and the
baseline, each from the tests' views (``output.views.TestView``).

A file that cannot be written is a line of the summary and makes the run fail, and the rest
are still written.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.harness.config import Settings
from pytest_gpuprof.output.run_files import FILES, Run, checked, waits
from pytest_gpuprof.output.text import memory_top
from pytest_gpuprof.output.views import TestView

if TYPE_CHECKING:
    from pytest_gpuprof.baselines.rule import RunFacts
    from pytest_gpuprof.output.report import Machine
    from pytest_gpuprof.verdict.entry import Entry
    from pytest_gpuprof.verdict.run_gate import RunGate


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
        views: Mapping[str, TestView], crashed: Mapping[str, str], machine: Callable[[], Machine]
    ) -> tuple[list[Entry], Machine]:
        """Every test once, in run order, and the machine: from this process or the workers."""
        tests = [v.test for v in views.values()]
        tests += [
            {"nodeid": nodeid, "outcome": "failed", "crashed": reason}
            for nodeid, reason in crashed.items()
            if nodeid not in views
        ]
        machines = [v.machine for v in views.values()]
        merged = machines[0].copy() if machines else machine()
        environment: dict[str, str] = {}
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
        machine: Callable[[], Machine],
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
        from pytest_gpuprof.output.git import revision
        from pytest_gpuprof.output.report import build_report

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


def _block(tr: Any, heading: str, lines: list[str]) -> None:
    """A section of the summary: a blank line, ``heading``, its lines; nothing without lines."""
    if lines:
        tr.write_line("")
        tr.write_line(heading)
        for line in lines:
            tr.write_line(line)
