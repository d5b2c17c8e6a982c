"""CUPTI activity capture through ``cupti-python``: what the device did, in the host clock.

Kernel, memcpy and memset records are kept between ``drain`` calls, whatever library
(cuBLAS, cuFFT, CuPy) launched the work. Records carry their CUPTI stream id, by which a
copy is matched to the step that ran on its stream (``stream_id``). Runtime and driver
API records, which would name the launching thread, are not traced: cupti-python turns
every record into a Python object, and API tracing costs ~100 us a launch that way.

CUPTI hands over full buffers on its own thread, in the middle of a measured window as
well, and the callback holds the GIL: reading each record's fields through cupti-python
costs ~25 us a record (measured on the H200), so 1,400 records stopped the threads that
launch kernels for ~35 ms. The callback therefore copies the buffer's bytes in one piece
and reads the fields with numpy (``unpack``), falling back to the objects only where the
bytes are not laid out as cupti-python's record dtypes say.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytest_gpuprof.model import DeviceInterval, DeviceKind

Record = tuple[DeviceKind, int, int, int, str, int, bool]

BUFFER_BYTES = 8 << 20


def start() -> tuple[CuptiCapture | None, str]:
    """A running capture and 'live', or ``None`` and why CUPTI is off."""
    try:
        from cupti import cupti
    except ImportError:
        return None, "off (cupti-python is not installed: pip install 'pytest-gpuprof[cuda13]')"
    except Exception as e:
        return None, f"off (cupti-python failed to load: {e})"
    try:
        return CuptiCapture(cupti), "live"
    except Exception as e:  # taken by another profiler, no permission, version mismatch
        return None, f"off (CUPTI refused: {e})"


class CuptiCapture:
    def __init__(self, cupti: Any) -> None:
        self._cupti = cupti
        kinds = cupti.ActivityKind
        self._kernel, self._memcpy, self._memset = kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET
        self._pageable = int(cupti.ActivityMemoryKind.PAGEABLE)
        self._copy_names = {int(k): k.name for k in cupti.ActivityMemcpyKind}
        self._layouts: dict[int, tuple[str, np.dtype]] = {}
        try:
            self._layouts = {
                int(self._kernel): ("kernel", cupti.activity_kernel10_dtype),
                int(self._memcpy): ("memcpy", cupti.activity_memcpy6_dtype),
                int(self._memset): ("memset", cupti.activity_memset4_dtype),
            }
        except AttributeError:  # a cupti-python without these record versions: read the objects
            pass
        self._names: dict[int, str] = {}  # kernel name pointer -> name (CUPTI shares one per kernel)
        self._lock = threading.Lock()
        self._records: list[Record] = []
        self.deliveries = {"bytes": 0, "objects": 0}  # how each delivered buffer was read
        self.dropped = 0
        self.offset_ns = self._clock_offset()
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._enabled = [self._kernel, self._memcpy, self._memset]
        for kind in self._enabled:
            cupti.activity_enable(kind)

    def _clock_offset(self) -> int:
        """CUPTI timestamp minus ``perf_counter_ns``: median over reads bracketed tightly."""
        samples = []
        for _ in range(101):
            before = time.perf_counter_ns()
            stamp = self._cupti.get_timestamp()
            after = time.perf_counter_ns()
            samples.append(stamp - (before + after) // 2)
        return int(statistics.median(samples))

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        # Records are only valid inside this callback: copy them out now.
        if not activities:
            return
        try:
            kept = self._from_bytes(activities) if self._layouts else None
        except Exception:  # a field not where the dtype says it is
            kept = None
        if kept is None:
            kept = self._from_objects(activities)
            self.deliveries["objects"] += 1
        else:
            self.deliveries["bytes"] += 1
        with self._lock:
            self._records.extend(kept)

    def _from_bytes(self, activities: list[Any]) -> list[Record] | None:
        first, last = activities[0], activities[-1]
        layout = self._layouts.get(int(last.kind))
        if layout is None:
            return None
        start = int(first.ptr)
        last_offset = int(last.ptr) - start
        raw = ctypes.string_at(start, last_offset + layout[1].itemsize)
        tables = unpack(raw, len(activities), last_offset, self._layouts)
        if tables is None:
            return None
        kernels = tables.get("kernel")
        if kernels is not None:
            for pointer in set(kernels["name"].tolist()) - self._names.keys():
                self._names[pointer] = ctypes.string_at(pointer).decode(errors="replace") if pointer else ""
        return records_of(tables, self._names, self._copy_names, self._pageable)

    def _from_objects(self, activities: list[Any]) -> list[Record]:
        kept: list[Record] = []
        for a in activities:
            kind = a.kind
            if kind == self._kernel:
                kept.append(("kernel", a.start, a.end, a.stream_id, a.name, 0, False))
            elif kind == self._memcpy:
                pageable = int(a.src_kind) == self._pageable or int(a.dst_kind) == self._pageable
                name = self._copy_names.get(int(a.copy_kind), "copy")
                kept.append(("memcpy", a.start, a.end, a.stream_id, name, a.bytes, pageable))
            elif kind == self._memset:
                kept.append(("memset", a.start, a.end, a.stream_id, "memset", a.bytes, False))
        return kept

    def stream_id(self, context: int, stream: int) -> int:
        """CUPTI's id of a CUDA stream handle, as activity records name it."""
        return int(self._cupti.get_stream_id_ex(context, stream, 0))

    def drain(self) -> tuple[list[DeviceInterval], list[str]]:
        """Flush CUPTI's buffers; every record since the last drain, in the host clock."""
        self._cupti.activity_flush_all(1)
        with self._lock:
            records, self._records = self._records, []
        offset = self.offset_ns
        out = [
            DeviceInterval(kind, start - offset, end - offset, stream, name, nbytes, pageable)
            for kind, start, end, stream, name, nbytes, pageable in records
        ]
        notes = []
        dropped = self._dropped()
        if dropped:
            self.dropped += dropped
            notes.append(f"CUPTI dropped {self.dropped} activity records: device time is undercounted")
        return out, notes

    def _dropped(self) -> int:
        import numpy as np

        count = np.zeros(1, dtype=np.uint64)
        try:
            self._cupti.activity_get_num_dropped_records(0, 0, count.ctypes.data)
        except Exception:
            return 0
        return int(count[0])

    def reset(self) -> None:
        """Forget everything recorded so far (a test starts)."""
        self._cupti.activity_flush_all(1)
        with self._lock:
            self._records.clear()

    def stop(self) -> None:
        self._cupti.activity_flush_all(1)
        for kind in self._enabled:
            self._cupti.activity_disable(kind)
        with self._lock:
            self._records.clear()


def unpack(
    raw: bytes, count: int, last_offset: int, layouts: Mapping[int, tuple[str, np.dtype]]
) -> dict[str, np.ndarray] | None:
    """The ``count`` records packed in ``raw``, one structured array per kind of record.

    Each record starts with its kind (uint32) and is as long as its kind's dtype. ``None``
    when the walk meets an unknown kind or does not end on ``last_offset`` and the end of
    ``raw``: the bytes are not laid out as the dtypes say.
    """
    offsets: dict[int, list[int]] = {}
    offset = previous = 0
    for _ in range(count):
        if offset + 4 > len(raw):
            return None
        kind = int.from_bytes(raw[offset : offset + 4], "little")
        if kind not in layouts:
            return None
        offsets.setdefault(kind, []).append(offset)
        previous = offset
        offset += layouts[kind][1].itemsize
    if previous != last_offset or offset != len(raw):
        return None
    buffer = np.frombuffer(raw, dtype=np.uint8)
    tables = {}
    for kind, starts in offsets.items():
        name, dtype = layouts[kind]
        rows = buffer[np.asarray(starts)[:, None] + np.arange(dtype.itemsize)]
        tables[name] = rows.view(dtype).ravel()
    return tables


def records_of(
    tables: Mapping[str, np.ndarray], names: Mapping[int, str], copy_names: Mapping[int, str], pageable_kind: int
) -> list[Record]:
    """Records in the capture's tuple form from ``unpack``'s tables."""
    out: list[Record] = []
    for kind, t in tables.items():
        count = len(t)
        if kind == "kernel":
            labels = [names[pointer] for pointer in t["name"].tolist()]
            nbytes, pageable = [0] * count, [False] * count
        elif kind == "memcpy":
            labels = [copy_names.get(k, "copy") for k in t["copy_kind"].tolist()]
            nbytes = t["bytes"].tolist()
            pageable = ((t["src_kind"] == pageable_kind) | (t["dst_kind"] == pageable_kind)).tolist()
        else:
            labels, nbytes, pageable = ["memset"] * count, t["bytes"].tolist(), [False] * count
        columns = (t["start"].tolist(), t["end"].tolist(), t["stream_id"].tolist(), labels, nbytes, pageable)
        out += [(kind, *fields) for fields in zip(*columns, strict=True)]
    return out
