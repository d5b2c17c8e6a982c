"""CUPTI activity capture through ``cupti-python``: what the device did, in the host clock.

Kernel, memcpy and memset records are kept between ``drain`` calls, whatever library
(cuBLAS, cuFFT, CuPy) launched the work. Records carry their CUPTI stream id, by which a
copy is matched to the step that ran on its stream (``stream_id``). Runtime and driver
API records, which would name the launching thread, are not traced: cupti-python turns
every record into a Python object, and API tracing costs ~100 us a launch that way.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from pytest_gpuprof.model import DeviceInterval

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
        self._lock = threading.Lock()
        self._records: list[tuple[Any, ...]] = []
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
        # Records are only valid inside this callback: copy the fields out now.
        kept: list[tuple[Any, ...]] = []
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
        with self._lock:
            self._records.extend(kept)

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
