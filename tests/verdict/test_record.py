"""A test's record: one type, frozen, made at the end of its call and once more at its
tear-down, never written in between."""

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.verdict.budget import Budget
from pytest_gpuprof.verdict.record import Compared, Ending, GpuRecord

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_gpuprof"


def _record(**kw):
    m = metrics.compute(Timeline(0, 10_000_000, "host", (), (), (DeviceInterval("kernel", 0, 4_000_000),), ()))
    return GpuRecord("t.py::test", m, Budget(), (), enforced=True, **kw)


def test_no_field_of_a_record_can_be_written():
    record = _record()
    for name in ("outcome", "metrics", "compared", "ending"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.ending.outcome = "failed"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.compared.gated = True  # type: ignore[misc]


def test_the_end_and_the_comparison_reach_the_verdict_and_the_json():
    ended = dataclasses.replace(
        _record(compared=Compared(regressions=("kernel_ms",), gated=True)),
        ending=Ending(outcome="failed", reruns=2, waited_ms=1.5, waited_for="pid 1", leaks=("1 KiB",)),
    )
    entry = ended.to_dict()
    assert (entry["outcome"], entry["reruns"], entry["waited_ms"], entry["waited_for"]) == ("failed", 2, 1.5, "pid 1")
    assert ended.verdict.regressions == ("kernel_ms",) and ended.verdict.leaks == ("1 KiB",)
    assert _record().status == "-" and ended.status != "-"


def test_a_record_is_made_in_one_place_and_ended_in_one_other():
    """The grep the house holds: ``GpuRecord(`` only where a test's call ends
    (``measure/record.py``), a record's ``ending`` only at its tear-down (``harness/session.py``),
    its ``compared`` only with its making."""
    made, ended, compared = [], [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        where = str(path.relative_to(PACKAGE))
        made += [where] * len(re.findall(r"\bGpuRecord\(", text))
        ended += [where] * len(re.findall(r"replace\([^)]*\bending=", text))
        compared += [where] * len(re.findall(r"replace\([^)]*\bcompared=", text))
    assert made == ["measure/record.py"]
    assert ended == ["harness/session.py"] and compared == ["measure/record.py"]
