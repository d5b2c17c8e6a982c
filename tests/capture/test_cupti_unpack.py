"""Reading CUPTI activity buffers from their bytes, against records built field by field."""

from __future__ import annotations

import ctypes
import enum
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.capture.cupti_records import records_of, unpack
from pytest_gpuprof.capture.cupti_trace import CuptiCapture

# Shaped like cupti-python's record dtypes: the kind first, fields at fixed offsets.
KERNEL = np.dtype(
    {
        "names": ["kind", "start", "end", "stream_id", "name", "correlation_id"],
        "formats": ["<u4", "<u8", "<u8", "<u4", "<u8", "<u4"],
        "offsets": [0, 16, 24, 48, 104, 56],
        "itemsize": 216,
    }
)
MEMCPY = np.dtype(
    {
        "names": ["kind", "copy_kind", "src_kind", "dst_kind", "bytes", "start", "end", "stream_id", "correlation_id"],
        "formats": ["<u4", "u1", "u1", "u1", "<u8", "<u8", "<u8", "<u4", "<u4"],
        "offsets": [0, 4, 5, 6, 8, 16, 24, 40, 48],
        "itemsize": 72,
    }
)
MEMSET = np.dtype(
    {
        "names": ["kind", "bytes", "start", "end", "stream_id", "correlation_id"],
        "formats": ["<u4", "<u8", "<u8", "<u8", "<u4", "<u4"],
        "offsets": [0, 8, 16, 24, 40, 48],
        "itemsize": 64,
    }
)
API = np.dtype(
    {
        "names": ["kind", "cbid", "start", "end", "process_id", "thread_id", "correlation_id"],
        "formats": ["<u4", "<u4", "<u8", "<u8", "<u4", "<u4", "<u4"],
        "offsets": [0, 4, 8, 16, 24, 28, 32],
        "itemsize": 40,
    }
)
# CUpti_ActivityMarker2, as cupti-python 13.0.1 lays it out (the object id's thread part only)
MARKER = np.dtype(
    {
        "names": ["kind", "flags_", "timestamp", "id", "object_kind", "object_id", "pad", "name", "domain"],
        "formats": [
            "<i4",
            "<i4",
            "<u8",
            "<u4",
            "<i4",
            np.dtype({"names": ["pt"], "formats": [[("process_id", "<u4"), ("thread_id", "<u4")]], "itemsize": 12}),
            "<u4",
            "<i8",
            "<i8",
        ],
        "offsets": [0, 4, 8, 16, 20, 24, 36, 40, 48],
        "itemsize": 56,
    }
)
LAYOUTS = {
    10: ("kernel", KERNEL),
    1: ("memcpy", MEMCPY),
    2: ("memset", MEMSET),
    5: ("api", API),
    4: ("api", API),
    12: ("marker", MARKER),
}
NAMES = {0: "", 0x1000: "gemm", 0x2000: "fft"}
COPY_NAMES = {1: "HTOD", 2: "DTOH"}
PAGEABLE = 1

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**63 - 1)  # CUPTI's timestamps: nanoseconds since 1970
kernel = st.tuples(st.just(10), u64, u64, u32, st.sampled_from(sorted(NAMES)), u32)
memcpy = st.tuples(
    st.just(1), st.sampled_from([1, 2, 9]), st.integers(0, 3), st.integers(0, 3), u64, u64, u64, u32, u32
)
memset = st.tuples(st.just(2), u64, u64, u64, u32, u32)
api = st.tuples(st.sampled_from([4, 5]), u32, u64, u64, u32, u32, u32)
record = st.one_of(kernel, memcpy, memset, api)
# kinds mixed record by record, in runs long enough for the walk to look ahead, and two
# kinds in turn (a call's record, then its kernel's)
records = st.one_of(
    st.lists(record, min_size=1, max_size=40),
    st.lists(st.tuples(record, st.integers(1, 300)), min_size=1, max_size=5).map(
        lambda runs: [r for r, count in runs for _ in range(count)]
    ),
    st.lists(st.tuples(record, record, st.integers(1, 200), record), min_size=1, max_size=4).map(
        lambda turns: [r for a, b, count, odd in turns for r in [a, b] * count + [odd]]
    ),
)


def pack(fields: list[tuple[int, ...]]) -> bytes:
    """The records packed one after another, as in a CUPTI buffer."""
    return b"".join(np.array([f], dtype=LAYOUTS[f[0]][1]).tobytes() for f in fields)


def as_array(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)


def expected(f: tuple[int, ...]) -> DeviceInterval:
    """One record read field by field, as the capture reads cupti-python's objects."""
    if f[0] == 10:
        return DeviceInterval("kernel", f[1], f[2], f[3], NAMES[f[4]], 0, False)
    if f[0] == 1:
        _, kind, src, dst, nbytes, start, end, stream, _ = f
        return DeviceInterval(
            "memcpy", start, end, stream, COPY_NAMES.get(kind, "copy"), nbytes, PAGEABLE in (src, dst)
        )
    return DeviceInterval("memset", f[2], f[3], f[4], "memset", f[1], False)


def device_work(fields: list[tuple[int, ...]]) -> list[DeviceInterval]:
    """What the capture keeps: device work, not the API records around it."""
    return [expected(f) for f in fields if f[0] not in (4, 5)]


@given(records)
def test_unpacked_records_match_field_by_field_reading(fields: list[tuple[int, ...]]) -> None:
    tables = unpack(as_array(pack(fields)), LAYOUTS)
    assert tables is not None
    got = records_of(tables, NAMES, COPY_NAMES, PAGEABLE)
    assert sorted(got, key=repr) == sorted(device_work(fields), key=repr)
    # runtime and driver calls share one table
    assert len(tables.get("api", ())) == sum(f[0] in (4, 5) for f in fields)


@given(records, st.data())
def test_bytes_not_laid_out_as_expected_are_refused(fields: list[tuple[int, ...]], data: st.DataObject) -> None:
    raw = pack(fields)
    wrong = data.draw(st.sampled_from(["truncated by a byte", "torn last record", "trailing zeros", "unknown kind"]))
    if wrong == "truncated by a byte":
        assert unpack(as_array(raw[:-1]), LAYOUTS) is None
    elif wrong == "torn last record":
        assert unpack(as_array(raw[:-8]), LAYOUTS) is None
    elif wrong == "trailing zeros":  # kind 0 is no record kind here
        assert unpack(as_array(raw + bytes(8)), LAYOUTS) is None
    else:
        assert unpack(as_array(raw), {k: v for k, v in LAYOUTS.items() if k != fields[-1][0]}) is None


class FakeCupti:
    """The parts of cupti-python the capture calls, over records packed in host memory."""

    ActivityKind = enum.IntEnum(
        "ActivityKind", {"CONCURRENT_KERNEL": 10, "MEMCPY": 1, "MEMSET": 2, "DRIVER": 4, "RUNTIME": 5, "MARKER": 12}
    )
    ActivityMemoryKind = enum.IntEnum("ActivityMemoryKind", {"PAGEABLE": PAGEABLE, "PINNED": 2})
    ActivityMemcpyKind = enum.IntEnum("ActivityMemcpyKind", {name: kind for kind, name in COPY_NAMES.items()})
    activity_kernel10_dtype, activity_memcpy6_dtype, activity_memset4_dtype = KERNEL, MEMCPY, MEMSET
    activity_api_dtype = API
    activity_marker2_dtype = MARKER
    ActivityThreadIdType = enum.IntEnum("ActivityThreadIdType", {"DEFAULT": 0, "SYSTEM": 1})
    runtime_api_trace_cbid = enum.IntEnum(
        "runtime_api_trace_cbid", {"cudaLaunchKernel_v7000": 211, "cudaGetDevice_v3020": 17}
    )
    driver_api_trace_cbid = enum.IntEnum(
        "driver_api_trace_cbid",
        {
            "INVALID": 0,
            "cuDriverGetVersion": 1,
            "cuCtxGetCurrent": 8,
            "cuKernelGetName": 20,
            "cuDevicePrimaryCtxGetState": 30,
            "cuLaunchKernel": 307,
            "cuMemcpyHtoDAsync_v2": 310,
        },
    )

    def __init__(self) -> None:
        self.completed: Any = None
        self.apis_on: dict[int, int] = {}

    def set_thread_id_type(self, kind: int) -> None: ...

    def activity_enable_runtime_api(self, cbid: int, enable: int) -> None:
        self.apis_on[cbid] = enable

    activity_enable_driver_api = activity_enable_runtime_api

    def get_timestamp(self) -> int:
        return time.perf_counter_ns()

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.completed = completed

    def activity_enable(self, kind: int) -> None: ...
    def activity_disable(self, kind: int) -> None: ...
    def activity_flush_all(self, flag: int) -> None: ...

    def activity_get_num_dropped_records(self, context: int, stream: int, out: int) -> None: ...


# kernel names live as long as the process, as CUPTI's do
NAME_BUFFERS = {pointer: ctypes.create_string_buffer(name.encode()) for pointer, name in NAMES.items() if pointer}


def deliver(fields: list[tuple[int, ...]], capture: CuptiCapture, cupti: FakeCupti) -> None:
    """Hand the capture a buffer of these records, as cupti-python does: objects pointing into it."""
    real = {pointer: ctypes.addressof(buffer) for pointer, buffer in NAME_BUFFERS.items()}
    objects, raw = [], b""
    for f in fields:
        if f[0] == 10:
            f = (*f[:4], real.get(f[4], 0), *f[5:])
        offset = len(raw)
        raw += np.array([f], dtype=LAYOUTS[f[0]][1]).tobytes()
        objects.append((offset, f))
    memory = ctypes.create_string_buffer(raw, len(raw))
    base = ctypes.addressof(memory)
    activities = []
    for offset, f in objects:
        ptr = base + offset
        if f[0] == 10:
            name = ctypes.string_at(f[4]).decode() if f[4] else ""
            activities.append(SimpleNamespace(kind=10, ptr=ptr, start=f[1], end=f[2], stream_id=f[3], name=name))
        elif f[0] == 1:
            _, kind, src, dst, nbytes, start, end, stream, _ = f
            activities.append(
                SimpleNamespace(
                    kind=1,
                    ptr=ptr,
                    copy_kind=kind,
                    src_kind=src,
                    dst_kind=dst,
                    bytes=nbytes,
                    start=start,
                    end=end,
                    stream_id=stream,
                )
            )
        elif f[0] == 2:
            activities.append(SimpleNamespace(kind=2, ptr=ptr, bytes=f[1], start=f[2], end=f[3], stream_id=f[4]))
        else:
            activities.append(SimpleNamespace(kind=f[0], ptr=ptr))
    cupti.completed(activities)


class FakeLibrary:
    """libcupti's ``cuptiActivityRegisterCallbacks``, keeping the callbacks as CUPTI would."""

    def __init__(self) -> None:
        self.requested: Any = None
        self.completed: Any = None

    def cuptiActivityRegisterCallbacks(self, requested: Any, completed: Any) -> int:
        self.requested, self.completed = requested, completed
        return 0

    def fill(self, fields: list[tuple[int, ...]]) -> None:
        """Ask for a buffer through the real ctypes callback, write records, hand it back."""
        buffer, size, most = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        self.requested(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(most))
        assert buffer.value and buffer.value % 8 == 0
        raw = pack(with_real_names(fields))
        assert len(raw) <= size.value
        ctypes.memmove(buffer.value, raw, len(raw))
        self.completed(None, 0, buffer.value, size.value, len(raw))


def with_real_names(fields: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    real = {pointer: ctypes.addressof(buffer) for pointer, buffer in NAME_BUFFERS.items()}
    return [(*f[:4], real.get(f[4], 0), *f[5:]) if f[0] == 10 else f for f in fields]


@given(records)
def test_records_from_cuptis_buffers_and_from_objects_agree(fields: list[tuple[int, ...]]) -> None:
    library = FakeLibrary()
    raw_capture = CuptiCapture(FakeCupti(), library=lambda: library)
    assert raw_capture.reading.startswith("records read from CUPTI's buffers")
    raw_capture.offset_ns = 0  # each capture reads its own clock offset: compare records, not reads
    library.fill(fields)
    library.fill([])  # an empty buffer is no delivery
    by_buffers, notes = raw_capture.drain()
    assert raw_capture.deliveries == {"buffers": 1, "objects": 0, "unreadable": 0} and not notes

    cupti = FakeCupti()
    object_capture = CuptiCapture(cupti)  # no library: cupti-python's objects
    object_capture.offset_ns = 0
    deliver(fields, object_capture, cupti)
    deliver([], object_capture, cupti)
    by_objects, _ = object_capture.drain()
    assert object_capture.deliveries == {"buffers": 0, "objects": 1, "unreadable": 0}

    assert sorted(by_buffers, key=repr) == sorted(by_objects, key=repr)
    assert sorted((d.kind, d.name, d.bytes, d.pageable) for d in by_buffers) == sorted(
        (e[0], e[4], e[5], e[6]) for e in device_work(fields)
    )


def test_buffers_are_recycled_and_an_unreadable_one_is_reported():
    library = FakeLibrary()
    capture = CuptiCapture(FakeCupti(), library=lambda: library)
    record = (10, 5, 9, 1, 0x1000, 0)
    for _ in range(3):
        library.fill([record] * 100)
        (kernel, *more), _ = capture.drain()
        assert len(more) == 99 and kernel.name == "gemm"
    assert capture._raw is not None and len(capture._raw._free) == 2  # the same two buffers, over and over
    buffer, size, most = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    library.requested(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(most))
    ctypes.memmove(buffer.value, pack([record]) + bytes(8), 224)  # 8 bytes that are no record
    library.completed(None, 0, buffer.value, size.value, 224)
    intervals, notes = capture.drain()
    assert intervals == [] and capture.deliveries["unreadable"] == 1
    assert notes == ["records lost: 1 CUPTI buffer(s) not laid out as the record types say"]


def test_without_the_library_the_objects_are_read_and_the_header_says_why():
    def missing() -> Any:
        raise OSError("no libcupti loaded")

    capture = CuptiCapture(FakeCupti(), library=missing)
    assert capture._raw is None
    assert capture.reading.endswith("CUPTI's buffers could not be taken directly (no libcupti loaded)")


def test_device_work_is_tied_to_the_call_that_issued_it():
    cupti, library, marks = FakeCupti(), FakeLibrary(), []
    capture = CuptiCapture(cupti, library=lambda: library, marker=lambda: marks.append(1))
    assert capture.correlating and "launches tied to the steps" in capture.reading
    capture.mark()
    assert marks == [1]
    capture.offset_ns = 100
    # only the driver calls that issue work, the step mark and the kernel name lookup are recorded
    assert cupti.apis_on == {8: 0, 30: 0}
    launch = (4, 307, 1_000, 1_500, 1, 4242, 7)  # cuLaunchKernel on thread 4242, correlation 7
    library.fill([launch, (10, 5_000, 9_000, 1, 0x1000, 7)])
    # a copy (correlation 9) whose own call was not recorded, between two calls of thread
    # 4343, the second a step's mark (cuDriverGetVersion): issued between them
    library.fill([(1, 1, 2, 2, 64, 9_500, 9_900, 3, 9), (4, 20, 2_000, 2_100, 1, 4343, 8)])
    library.fill([(4, 1, 2_300, 2_500, 1, 4343, 10)])
    # correlation 12 lies between calls of two threads (10 and 13): not known
    library.fill([(10, 9_000, 9_500, 1, 0x2000, 12), (4, 1, 2_600, 2_700, 1, 4242, 13)])
    work, _ = capture.drain()
    by_name = {d.name: d for d in work}
    assert (by_name["gemm"].thread, by_name["gemm"].issued) == (4242, 900)
    assert (by_name["HTOD"].thread, by_name["HTOD"].issued) == (4343, (2_000 + 2_200) // 2)
    assert (by_name["fft"].thread, by_name["fft"].issued) == (0, 0)
    # a call whose work has not been read yet waits for the next drain
    library.fill([(4, 307, 3_000, 3_100, 1, 4242, 20)])
    assert capture.drain()[0] == []
    library.fill([(10, 10_000, 10_500, 1, 0x1000, 20)])
    (later,), _ = capture.drain()
    assert (later.thread, later.issued) == (4242, 2_900)
    # a launch whose own call is not recorded (PyTorch's), followed by the kernel name
    # lookup it made inside: issued when that lookup was, not halfway from the call before
    library.fill([(4, 20, 4_000, 4_100, 1, 4242, 30), (10, 11_000, 11_500, 1, 0x2000, 31)])
    library.fill([(4, 20, 6_000, 6_100, 1, 4242, 32)])
    (named,), _ = capture.drain()
    assert (named.thread, named.issued) == (4242, 5_900)


def test_nvtx_ranges_are_paired_by_id_and_named_by_domain(monkeypatch):
    from pytest_gpuprof.analysis.nvtx import RANGE_IDS
    from pytest_gpuprof.capture import cupti_records, cupti_trace

    monkeypatch.setattr(cupti_trace, "libcupti_path", lambda: "/opt/cuda/libcupti.so.13")
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    library = FakeLibrary()
    capture = CuptiCapture(FakeCupti(), library=lambda: library, marker=lambda: None, nvtx=True)
    assert capture.nvtx.startswith("NVTX ranges as steps")
    assert cupti_trace.os.environ["NVTX_INJECTION64_PATH"] == "/opt/cuda/libcupti.so.13"
    capture.offset_ns = 0
    text = {name: ctypes.create_string_buffer(name.encode()) for name in ("upload", "train", "mydomain")}
    at = {name: ctypes.addressof(b) for name, b in text.items()}
    start, end = cupti_records.MARKER_START, cupti_records.MARKER_END
    library.fill(
        [
            (12, start, 100, 1, 2, ((1, 77),), 0, at["upload"], 0),
            (12, start, 150, 2, 2, ((1, 77),), 0, at["train"], at["mydomain"]),
            (12, end, 180, 2, 2, ((1, 77),), 0, 0, 0),
            (12, 1, 190, 3, 2, ((1, 77),), 0, at["train"], 0),  # an instant mark: no range
        ]
    )
    capture.drain()
    finished, still_open = capture.ranges()
    assert [(r.name, r.thread, r.start, r.end, r.span_id) for r in finished] == [
        ("mydomain:train", 77, 150, 180, RANGE_IDS + 2)
    ]
    assert [(r.name, r.start) for r in still_open] == [("upload", 100)]
    library.fill([(12, end, 400, 1, 2, ((1, 77),), 0, 0, 0)])
    capture.drain()
    finished, still_open = capture.ranges()
    assert [(r.name, r.start, r.end) for r in finished] == [("upload", 100, 400)] and still_open == []
    # a test starts: the ranges that ended are forgotten, one still open stays open
    library.fill([(12, start, 500, 4, 2, ((1, 77),), 0, at["upload"], 0), (12, end, 600, 4, 2, ((1, 77),), 0, 0, 0)])
    library.fill([(12, start, 700, 5, 2, ((1, 77),), 0, at["train"], 0)])
    capture.reset()
    finished, still_open = capture.ranges()
    assert finished == [] and [r.name for r in still_open] == ["train"]


def test_nvtx_injection_already_naming_another_library_is_said_not_overridden(monkeypatch):
    from pytest_gpuprof.capture import cupti_trace

    monkeypatch.setattr(cupti_trace, "libcupti_path", lambda: "/opt/cuda/libcupti.so.13")
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    capture = CuptiCapture(FakeCupti(), library=FakeLibrary, marker=lambda: None, nvtx=True)
    assert "NVTX ranges not recorded" in capture.nvtx and "libToolsInjection64" in capture.nvtx
    assert cupti_trace.os.environ["NVTX_INJECTION64_PATH"] == "/opt/nsight/libToolsInjection64.so"


def test_two_kinds_in_turn_are_read_a_pattern_at_a_time(monkeypatch):
    from pytest_gpuprof.capture import cupti_records

    calls = []
    repeats = cupti_records._repeats
    monkeypatch.setattr(cupti_records, "_repeats", lambda *a: calls.append(a) or repeats(*a))
    fields = [(4, 307, 1, 2, 1, 7, i) for i in range(1000)]
    fields = [r for i, call in enumerate(fields) for r in (call, (10, i, i + 1, 1, 0x1000, i))]
    tables = unpack(as_array(pack(fields)), LAYOUTS)
    assert tables is not None and len(tables["api"]) == len(tables["kernel"]) == 1000
    assert tables["kernel"]["correlation_id"].tolist() == list(range(1000))
    assert len(calls) < 10  # not a step per record


def test_a_dropped_count_that_cannot_be_read_is_said_never_zero():
    """It read 0 when the call failed, so the "records lost" note vanished."""

    class Unreadable(FakeCupti):
        def activity_get_num_dropped_records(self, context: int, stream: int, out: int) -> None:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    capture = CuptiCapture(Unreadable(), library=FakeLibrary)
    _, notes = capture.drain()
    assert notes == [
        "CUPTI's count of dropped records could not be read (RuntimeError: CUPTI_ERROR_NOT_INITIALIZED): "
        "a loss would go unseen"
    ]
    assert capture.dropped is None

    class Dropping(FakeCupti):
        def activity_get_num_dropped_records(self, context: int, stream: int, out: int) -> None:
            ctypes.c_uint64.from_address(out).value = 7

    counted = CuptiCapture(Dropping(), library=FakeLibrary)
    _, notes = counted.drain()
    assert counted.dropped == 7 and "CUPTI dropped 7 activity records" in notes[0]
