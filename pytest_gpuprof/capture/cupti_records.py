"""CUPTI's activity records read from their bytes with numpy: pure functions.

``unpack`` splits a buffer into one structured array per kind of record; ``calls_of``
and ``records_of`` turn them into the calls that issued work and the ``DeviceWork`` rows
of that work, in the host clock, each tied to its call (``_issuing_calls``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytest_gpuprof.analysis.device_work import NO_SPAN, ROW, DeviceWork
from pytest_gpuprof.analysis.model import KINDS, DeviceKind, Span
from pytest_gpuprof.analysis.nvtx import RANGE_IDS, range_name

# a record read from cupti-python's objects: kind, start, end, stream, name, bytes, pageable
Record = tuple[DeviceKind, int, int, int, str, int, bool]
# CUPTI_ACTIVITY_FLAG_MARKER_START and _END (cupti-python 13.0.1 names only the first)
MARKER_START, MARKER_END = 1 << 1, 1 << 2

# an API call, as the join needs it (sorted by correlation id): thread, host times of its
# start and end
# start and end, and whether it is a step's edge mark
CALL = np.dtype(
    [
        ("correlation_id", np.uint32),
        ("thread", np.int64),
        ("issued", np.int64),
        ("returned", np.int64),
        ("mark", np.bool_),
    ]
)
_KIND = struct.Struct("<I")  # every activity record starts with its kind


def unpack(raw: np.ndarray, layouts: Mapping[int, tuple[str, np.dtype]]) -> dict[str, np.ndarray] | None:
    """The records packed in ``raw`` (uint8), one structured array per kind of record.

    Each record starts with its kind (uint32) and is as long as its kind's dtype. Records
    come in patterns: long runs of one kind, or two kinds in turn (a launch call's record,
    then a kernel's). Once the last records repeat a pattern of one or two kinds, numpy
    reads the kinds at the pattern's stride ahead, and the pattern ends at the first that
    differs, so Python steps once a pattern rather than once a record. ``None`` when the
    walk meets an unknown kind or does not end exactly at the end of ``raw``: the bytes
    are not laid out as the dtypes say.
    """
    total = len(raw)
    words = raw[: total // 4 * 4].view(np.uint32)
    read_kind, data = _KIND.unpack_from, raw.data
    sizes = {kind: dtype.itemsize for kind, (_, dtype) in layouts.items()}
    pieces: dict[int, list[tuple[int, int, int]]] = {kind: [] for kind in layouts}  # (first, count, stride)
    seen: list[int] = []  # the kinds of the records so far
    offset = 0
    while offset < total:
        if offset % 4 or offset + 4 > total:
            return None
        (kind,) = read_kind(data, offset)
        itemsize = sizes.get(kind)
        if itemsize is None or offset + itemsize > total:
            return None
        pattern = [kind]
        if len(seen) >= 3 and seen[-3:] == [seen[-1], kind, seen[-1]] and seen[-1] != kind:
            pattern = [kind, seen[-1]]  # two kinds in turn: ..., k, j, k, j and now k
        elif not (len(seen) >= 4 and seen[-4:] == [kind] * 4):
            pattern = []
        count = _repeats(words, offset, [(k, sizes[k]) for k in pattern], total) if pattern else 0
        if count == 0:
            pattern, count = [kind], 1
        stride = sum(sizes[k] for k in pattern)
        shift = 0
        for k in pattern:
            _add(pieces[k], offset + shift, count, stride, sizes[k])
            shift += sizes[k]
        seen += pattern[-2:] * min(count, 2)
        del seen[:-4]
        offset += count * stride
    rows: dict[str, list[np.ndarray]] = {}  # kinds of one layout (runtime and driver calls) share a table
    for kind, kind_pieces in pieces.items():
        name, dtype = layouts[kind]
        rows.setdefault(name, []).extend(
            np.lib.stride_tricks.as_strided(raw[first:], shape=(count, dtype.itemsize), strides=(stride, 1))
            for first, count, stride in kind_pieces
        )
    dtypes = dict(layouts.values())
    # a copy: the buffer goes back to CUPTI
    return {name: np.concatenate(found).reshape(-1).view(dtypes[name]) for name, found in rows.items() if found}


def _repeats(words: np.ndarray, offset: int, pattern: list[tuple[int, int]], total: int) -> int:
    """How many times the records of ``pattern`` ((kind, size) in order) follow one another
    from ``offset``: numpy reads each kind a stride apart, looking further each time."""
    stride = sum(size for _, size in pattern)
    if stride % 4 or any(size % 4 for _, size in pattern):
        return 0
    fit, look = (total - offset) // stride, 64
    while True:
        n = min(fit, look)
        same = np.ones(n, dtype=bool)
        shift = 0
        for kind, size in pattern:
            same &= words[(offset + shift) // 4 :: stride // 4][:n] == kind
            shift += size
        breaks = np.flatnonzero(~same)
        if len(breaks) or n == fit:
            return int(breaks[0]) if len(breaks) else fit
        look *= 4


def _add(pieces: list[tuple[int, int, int]], first: int, count: int, stride: int, itemsize: int) -> None:
    """File ``count`` records of one kind; contiguous ones join the piece they follow."""
    if pieces and stride == itemsize:
        last_first, last_count, last_stride = pieces[-1]
        if last_stride == itemsize and last_first + last_count * itemsize == first:
            pieces[-1] = (last_first, last_count + count, itemsize)
            return
    pieces.append((first, count, stride))


def calls_of(api: np.ndarray, offset_ns: int = 0, mark: int | None = None) -> np.ndarray:
    """API records as ``CALL`` rows: correlation id, issuing thread, host time of the call,
    and whether it is a step's edge (``mark``: the callback id of the marking call)."""
    out = np.empty(len(api), dtype=CALL)
    out["mark"] = api["cbid"] == mark if mark is not None else False
    out["correlation_id"] = api["correlation_id"]
    out["thread"] = api["thread_id"]
    out["issued"] = api["start"].astype(np.int64) - offset_ns
    out["returned"] = api["end"].astype(np.int64) - offset_ns
    return out


def records_of(
    tables: Mapping[str, np.ndarray],
    names: Mapping[int, str],
    copy_names: Mapping[int, str],
    pageable_kind: int,
    offset_ns: int = 0,
    calls: np.ndarray | None = None,
) -> DeviceWork:
    """The device work in ``unpack``'s tables, in the host clock (CUPTI's minus ``offset_ns``):
    columns copied from column, no Python object per record.

    ``calls`` (``CALL`` rows sorted by correlation id) tie each record to the thread and
    time of the call that issued it (``_issuing_calls``).
    """
    parts = []
    for kind, t in tables.items():
        if kind not in KINDS:  # API records: not device work
            continue
        rows = np.zeros(len(t), dtype=ROW)
        rows["kind"] = KINDS.index(kind)
        rows["start"] = t["start"].astype(np.int64) - offset_ns
        rows["end"] = t["end"].astype(np.int64) - offset_ns
        rows["stream"] = t["stream_id"]
        rows["span_id"] = NO_SPAN
        rows["thread"], rows["issued"] = _issuing_calls(t, calls)
        if kind == "kernel":
            pointers, rows["name"] = _codes(t["name"])
            labels = [names[p] for p in pointers]
            for field, column in _geometry(t).items():
                rows[field] = column
        elif kind == "memcpy":
            copy_kinds, rows["name"] = _codes(t["copy_kind"])
            labels = [copy_names.get(k, "copy") for k in copy_kinds]
            rows["bytes"] = t["bytes"]
            rows["pageable"] = (t["src_kind"] == pageable_kind) | (t["dst_kind"] == pageable_kind)
        else:
            labels = ["memset"]
            rows["bytes"] = t["bytes"]
        parts.append(DeviceWork(rows, labels))
    return DeviceWork.join(parts)


def _codes(values: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The distinct values, and each value's index among them."""
    distinct, index = np.unique(values, return_inverse=True)
    return distinct.tolist(), index.reshape(-1)


def _issuing_calls(records: np.ndarray, calls: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The thread and host time at which each record's work was issued; 0 and 0 where
    that is not known.

    Its own call where it was recorded. Else the recorded calls just before and just
    after it in correlation order (ids count every call, recorded or not): when both are
    on one thread, the work was issued on that thread between them. Where the call after
    it marks a step's edge, no step opened or closed in between, and the midpoint of the
    gap stands for the time; any other call after it is one the launch made itself (CUDA
    13's runtime looks the kernel's name up inside each launch), and its time is the
    launch's: an NVTX range, which marks no edge, may have opened since the call before.
    """
    count = len(records)
    thread, issued = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    if calls is None or not len(calls):
        return thread, issued
    correlation, ids = records["correlation_id"], calls["correlation_id"]
    after = np.searchsorted(ids, correlation)  # the first call at or after each record
    own = ids[np.minimum(after, len(ids) - 1)] == correlation
    at = after[own]
    thread[own], issued[own] = calls["thread"][at], calls["issued"][at]
    rest = np.flatnonzero(~own)
    after = after[rest]
    inner = (after > 0) & (after < len(ids))
    rest, after = rest[inner], after[inner]
    same = calls["thread"][after - 1] == calls["thread"][after]
    rest, after = rest[same], after[same]
    thread[rest] = calls["thread"][after]
    midpoint = (calls["returned"][after - 1] + calls["issued"][after]) // 2
    issued[rest] = np.where(calls["mark"][after], midpoint, calls["issued"][after])
    return thread, issued


_GEOMETRY = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread")


def _geometry(kernels: np.ndarray) -> dict[str, np.ndarray]:
    """Blocks, threads per block, registers per thread and shared bytes per block of each
    kernel record, by ``ROW`` field (none where the record version lacks them)."""
    names = kernels.dtype.names or ()
    if not all(n in names for n in (*_GEOMETRY, "static_shared_memory", "dynamic_shared_memory")):
        return {}
    wide = {n: kernels[n].astype(np.int64) for n in _GEOMETRY}
    return {
        "blocks": wide["grid_x"] * wide["grid_y"] * wide["grid_z"],
        "threads": wide["block_x"] * wide["block_y"] * wide["block_z"],
        "registers": wide["registers_per_thread"],
        "shared": kernels["static_shared_memory"].astype(np.int64) + kernels["dynamic_shared_memory"].astype(np.int64),
    }


def from_objects(
    activities: list[Any], kinds: dict[Any, str], pageable: int, copy_names: dict[int, str]
) -> list[Record]:
    """Records from cupti-python's record objects (the fallback; valid only inside its
    callback): ``kinds`` maps the kernel, memcpy and memset activity kinds to their names."""
    kept: list[Record] = []
    for a in activities:
        kind = kinds.get(a.kind)
        if kind == "kernel":
            kept.append(("kernel", a.start, a.end, a.stream_id, a.name, 0, False))
        elif kind == "memcpy":
            paged = int(a.src_kind) == pageable or int(a.dst_kind) == pageable
            name = copy_names.get(int(a.copy_kind), "copy")
            kept.append(("memcpy", a.start, a.end, a.stream_id, name, a.bytes, paged))
        elif kind == "memset":
            kept.append(("memset", a.start, a.end, a.stream_id, "memset", a.bytes, False))
    return kept


class Markers:
    """NVTX ranges from CUPTI's marker records: a start (with the name) and an end of one
    id, on the thread that started it."""

    def __init__(self) -> None:
        self._ranges: list[Span] = []  # ended since the last ``take``
        self._open: dict[int, Span] = {}  # by marker id

    def add(self, markers: np.ndarray, offset_ns: int) -> None:
        """Pair ``markers`` (CUPTI's clock, ``offset_ns`` ahead of the host's)."""
        for flags, stamp, marker, thread, name, domain in zip(
            markers["flags_"].tolist(),
            markers["timestamp"].tolist(),
            markers["id"].tolist(),
            markers["object_id"]["pt"]["thread_id"].tolist(),
            markers["name"].tolist(),
            markers["domain"].tolist(),
            strict=True,
        ):
            at = stamp - offset_ns
            if flags & MARKER_START:
                message = ctypes.string_at(name).decode(errors="replace") if name else ""
                where = ctypes.string_at(domain).decode(errors="replace") if domain else ""
                self._open[marker] = Span(range_name(message, where), thread, at, at, span_id=RANGE_IDS + marker)
            elif flags & MARKER_END:
                opened = self._open.pop(marker, None)
                if opened is not None:
                    self._ranges.append(Span(opened.name, opened.thread, opened.start, at, span_id=opened.span_id))

    def take(self) -> tuple[list[Span], list[Span]]:
        """The ranges that ended since the last call (forgotten now), and those open."""
        finished, self._ranges = self._ranges, []
        return finished, list(self._open.values())
