"""Reading CUPTI activity buffers from their bytes, against records built field by field."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.cupti_capture import records_of, unpack

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
