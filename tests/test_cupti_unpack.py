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

from pytest_gpuprof.cupti_capture import CuptiCapture, records_of, unpack

# Shaped like cupti-python's record dtypes: the kind first, fields at fixed offsets.
KERNEL = np.dtype(
    {
        "names": ["kind", "start", "end", "stream_id", "name"],
        "formats": ["<u4", "<u8", "<u8", "<u4", "<u8"],
        "offsets": [0, 16, 24, 48, 104],
        "itemsize": 216,
    }
)
MEMCPY = np.dtype(
    {
        "names": ["kind", "copy_kind", "src_kind", "dst_kind", "bytes", "start", "end", "stream_id"],
        "formats": ["<u4", "u1", "u1", "u1", "<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 4, 5, 6, 8, 16, 24, 40],
        "itemsize": 72,
    }
)
MEMSET = np.dtype(
    {
        "names": ["kind", "bytes", "start", "end", "stream_id"],
        "formats": ["<u4", "<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 8, 16, 24, 40],
        "itemsize": 64,
    }
)
LAYOUTS = {10: ("kernel", KERNEL), 1: ("memcpy", MEMCPY), 2: ("memset", MEMSET)}
NAMES = {0: "", 0x1000: "gemm", 0x2000: "fft"}
COPY_NAMES = {1: "HTOD", 2: "DTOH"}
PAGEABLE = 1

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**63)
kernel = st.tuples(st.just(10), u64, u64, u32, st.sampled_from(sorted(NAMES)))
memcpy = st.tuples(st.just(1), st.sampled_from([1, 2, 9]), st.integers(0, 3), st.integers(0, 3), u64, u64, u64, u32)
memset = st.tuples(st.just(2), u64, u64, u64, u32)
records = st.lists(st.one_of(kernel, memcpy, memset), min_size=1, max_size=40)


def pack(fields: list[tuple[int, ...]]) -> tuple[bytes, int]:
    """The records packed one after another, and the offset of the last."""
    raw, last = b"", 0
    for f in fields:
        dtype = LAYOUTS[f[0]][1]
        last = len(raw)
        raw += np.array([f], dtype=dtype).tobytes()
    return raw, last


def expected(f: tuple[int, ...]) -> tuple[object, ...]:
    """One record read field by field, as the capture reads cupti-python's objects."""
    if f[0] == 10:
        return ("kernel", f[1], f[2], f[3], NAMES[f[4]], 0, False)
    if f[0] == 1:
        _, kind, src, dst, nbytes, start, end, stream = f
        return ("memcpy", start, end, stream, COPY_NAMES.get(kind, "copy"), nbytes, PAGEABLE in (src, dst))
    return ("memset", f[2], f[3], f[4], "memset", f[1], False)


@given(records)
def test_unpacked_records_match_field_by_field_reading(fields: list[tuple[int, ...]]) -> None:
    raw, last = pack(fields)
    tables = unpack(raw, len(fields), last, LAYOUTS)
    assert tables is not None
    got = records_of(tables, NAMES, COPY_NAMES, PAGEABLE)
    assert sorted(got, key=repr) == sorted((expected(f) for f in fields), key=repr)


@given(records, st.data())
def test_bytes_not_laid_out_as_expected_are_refused(fields: list[tuple[int, ...]], data: st.DataObject) -> None:
    raw, last = pack(fields)
    wrong = data.draw(
        st.sampled_from(["count", "last", "truncated", "unknown kind"]).filter(
            lambda w: w != "count" or len(fields) > 1
        )
    )
    if wrong == "count":  # fewer records than the buffer holds
        assert unpack(raw, len(fields) - 1, last, LAYOUTS) is None
    elif wrong == "last":
        assert unpack(raw, len(fields), last + 8, LAYOUTS) is None
    elif wrong == "truncated":
        assert unpack(raw[:-1], len(fields), last, LAYOUTS) is None
    else:
        assert unpack(raw, len(fields), last, {k: v for k, v in LAYOUTS.items() if k != fields[-1][0]}) is None


class FakeCupti:
    """The parts of cupti-python the capture calls, over records packed in host memory."""

    ActivityKind = enum.IntEnum("ActivityKind", {"CONCURRENT_KERNEL": 10, "MEMCPY": 1, "MEMSET": 2})
    ActivityMemoryKind = enum.IntEnum("ActivityMemoryKind", {"PAGEABLE": PAGEABLE, "PINNED": 2})
    ActivityMemcpyKind = enum.IntEnum("ActivityMemcpyKind", {name: kind for kind, name in COPY_NAMES.items()})
    activity_kernel10_dtype, activity_memcpy6_dtype, activity_memset4_dtype = KERNEL, MEMCPY, MEMSET

    def __init__(self) -> None:
        self.completed: Any = None

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


def deliver(fields: list[tuple[int, ...]], capture: CuptiCapture, cupti: FakeCupti, *, shift_last: int = 0) -> None:
    """Hand the capture a buffer of these records, as cupti-python does: objects pointing into it."""
    real = {pointer: ctypes.addressof(buffer) for pointer, buffer in NAME_BUFFERS.items()}
    objects, raw = [], b""
    for f in fields:
        if f[0] == 10:
            f = (*f[:4], real.get(f[4], 0))
        offset = len(raw)
        raw += np.array([f], dtype=LAYOUTS[f[0]][1]).tobytes()
        objects.append((offset, f))
    memory = ctypes.create_string_buffer(raw, len(raw))
    base = ctypes.addressof(memory)
    activities = []
    for i, (offset, f) in enumerate(objects):
        ptr = base + offset + (shift_last if i == len(objects) - 1 else 0)
        if f[0] == 10:
            name = ctypes.string_at(f[4]).decode() if f[4] else ""
            activities.append(SimpleNamespace(kind=10, ptr=ptr, start=f[1], end=f[2], stream_id=f[3], name=name))
        elif f[0] == 1:
            _, kind, src, dst, nbytes, start, end, stream = f
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
        else:
            activities.append(SimpleNamespace(kind=2, ptr=ptr, bytes=f[1], start=f[2], end=f[3], stream_id=f[4]))
    cupti.completed(activities)


@given(records, st.sampled_from([0, 8]))
def test_the_callback_reads_bytes_and_objects_alike(fields: list[tuple[int, ...]], shift_last: int) -> None:
    shift_last = shift_last if len(fields) > 1 else 0  # a lone record is the first one too
    cupti = FakeCupti()
    capture = CuptiCapture(cupti)
    deliver(fields, capture, cupti, shift_last=shift_last)
    deliver([], capture, cupti)  # an empty buffer is no delivery
    by_bytes, _ = capture.drain()
    # a last record not where the count of bytes says is read from the objects instead
    assert capture.deliveries == ({"bytes": 1, "objects": 0} if not shift_last else {"bytes": 0, "objects": 1})
    capture._layouts = {}  # as with a cupti-python without the record dtypes
    deliver(fields, capture, cupti)
    by_objects, _ = capture.drain()
    assert capture.deliveries["objects"] == 1 + bool(shift_last)
    assert sorted(by_bytes, key=repr) == sorted(by_objects, key=repr)
    assert sorted((d.kind, d.name, d.bytes, d.pageable) for d in by_bytes) == sorted(
        (e[0], e[4], e[5], e[6]) for e in map(expected, fields)
    )
