"""The capture-source seam: a new source is one module and one registration line."""

import json
import re

import pytest

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.analysis.metrics import launch_bound_note
from pytest_gpuprof.capture import backends, sources

# The one new module: a source that reads a record stream (here the host backend's own
# intervals, handed over as records the way a tracer's buffers would be) and keeps the kernels.
FAKE_RECORDS = """
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.analysis.sources import SourceKind
from pytest_gpuprof.capture.sources import TraceSource

KIND = SourceKind("fake-records", sees_copies=False)


class FakeRecords(TraceSource):
    kind = KIND

    def __init__(self, backend):
        self.records = []
        backend.on_interval = lambda i: self.records.append(
            {"kind": i.kind.upper(), "start": i.start, "end": i.end, "stream": i.stream, "name": i.name, "step": i.span_id}
        )

    @classmethod
    def reading(cls, backend):
        return cls(backend) if not backend.kind.gpu else None

    def begin(self):
        self.records = []

    def drain(self):
        out, self.records = self.records, []
        kernels = [
            DeviceInterval("kernel", r["start"], r["end"], r["stream"], r["name"], span_id=r["step"])
            for r in out
            if r["kind"] == "KERNEL"
        ]
        return DeviceWork.of(kernels), []

    def stream_id(self, stream):
        return stream.index
"""

# ... and the one registration line
CONFTEST = """
from pytest_gpuprof.capture import sources
from fake_records import KIND, FakeRecords

sources.register(KIND, FakeRecords.reading)
"""

USES_IT = """
def test_kernels_and_uploads(gpuprof, gpu_workload):
    def body():
        gpu_workload.upload(8 << 20)
        gpu_workload.compute(ms=3)
        gpu_workload.compute(ms=2)

    m = gpuprof.measure(body, rounds=2, warmup=0)
    print(f"FIGURES truth={m.truth} kernels={m.kernels} kernel_ms={m.kernel_ms} copy_ms={m.copy_ms}")
"""


@pytest.fixture
def registry(monkeypatch):
    """The registries as they are now, given back after the test (a pytester run in this
    process imports its conftest here)."""
    monkeypatch.setattr(sources, "_FACTORIES", list(sources._FACTORIES))
    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))


def test_a_registered_source_counts_the_kernels_of_its_record_stream(pytester, registry):
    pytester.makepyfile(fake_records=FAKE_RECORDS, test_it=USES_IT)
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    result = pytester.runpytest("-s", "--gpu-report=r.json", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    # two kernels a round, 5 ms on the virtual clock; the upload's copy is not the source's to
    # see: not seen, not 0
    result.stdout.fnmatch_lines(["*FIGURES truth=fake-records kernels=2 kernel_ms=5.0 copy_ms=None"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["tests"][0]["metrics"]["truth"] == "fake-records"


def test_without_the_registration_the_host_stamps_see_the_copies_too(pytester):
    pytester.makepyfile(test_it=USES_IT)
    result = pytester.runpytest("-s", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    figures = re.search(r"FIGURES truth=host kernels=2 kernel_ms=5.0 copy_ms=([\d.]+)", result.stdout.str())
    assert figures is not None, result.stdout.str()
    assert float(figures[1]) > 0


def test_the_latest_source_that_takes_a_backend_wins_and_one_that_declines_is_passed(registry):
    taken = []
    mine = kinds.SourceKind("mine")

    class Mine(sources.TraceSource):
        kind = mine

        def drain(self):
            raise AssertionError("not drained here")

    factory = sources.register(mine, lambda backend: taken.append(backend.name) or Mine())
    sources.register(kinds.SourceKind("declines"), lambda backend: None)
    backend = backends.create("host", 0, cupti=False, clock="virtual")
    try:
        assert isinstance(backend.source, Mine) and taken == ["host"]
        backend.compute(1.0)
        backend.synchronize()
        assert backend.on_interval is None  # the host's own stamps never started: nothing piles up
    finally:
        backend.close()
    sources.unregister(factory)
    backend = backends.create("host", 0, cupti=False, clock="virtual")
    try:
        assert backend.source.kind is kinds.HOST
    finally:
        backend.close()


def test_a_kind_is_declared_once():
    kinds.register(kinds.SourceKind("host", no_sms=kinds.HOST.no_sms))  # the same again is fine
    with pytest.raises(ValueError, match="'host' is declared twice, differently"):
        kinds.register(kinds.SourceKind("host", sees_copies=False))


def test_the_pure_layer_reads_capabilities_not_names():
    assert kinds.kind_of("events").sees_kernels is False
    assert kinds.kind_of("some later source") == kinds.SourceKind("some later source")
    # the launch-bound note belongs to a source that slows launches, whatever its name
    assert launch_bound_note("cupti", 5_000, 5_000 * 2_000) is not None
    assert launch_bound_note("host", 5_000, 5_000 * 2_000) is None
