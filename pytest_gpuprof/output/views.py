"""One test's result, typed: what this process measured, and the view of it that every
output reads and that travels from a pytest-xdist worker to the controller."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.timeline import Timeline
    from pytest_gpuprof.output.report import Machine
    from pytest_gpuprof.verdict.comparison import Comparison
    from pytest_gpuprof.verdict.entry import Entry
from pytest_gpuprof.verdict.record import GpuRecord


@dataclass
class TestResult:
    """A measured test in this process: its record (replaced whole at its tear-down, never
    written), the timeline of its primary window (the first breaching one, else the last),
    and its comparison with the baseline."""

    __test__ = False  # not a pytest test class

    record: GpuRecord
    timeline: Timeline | None
    comparison: Comparison | None = None  # None: no baseline compared with
    primary: int = 0  # the index of the window it is reported by
    # what the record's ending will say, gathered before its tear-down: the device memory
    # the test kept, and whether a breach's warning failed it (-W error)
    leaks: tuple[str, ...] = ()
    warned_as_error: bool = False


@dataclass(frozen=True)
class TestView:
    """A test as the outputs need it: its JSON report entry, its line of the summary
    table, its breach and comparison lines, the machine, and what each file the run
    writes keeps of it (``per_file``, by the file's name: the HTML page's data)."""

    __test__ = False

    test: Entry
    rows: list[list[str]]  # its reported window's, then each other breaching window's
    details: list[str]
    compare: list[str]
    machine: Machine
    per_file: dict[str, Any] = field(default_factory=dict)
    # each row's figures by metric path (``--gpu-columns``, ``--gpu-sort``)
    figures: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        # shallow: the fields are JSON data already (asdict's deep copy cost a ms a test)
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestView:
        return cls(**data)
