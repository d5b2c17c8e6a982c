"""CUPTI's activity buffers, lent to CUPTI and taken back as raw memory (through the
libcupti that cupti-python loaded, with ``ctypes``): no record is read on CUPTI's thread."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

# Each buffer holds ~40,000 kernel records; a window that fills more gets more buffers.
BUFFER_BYTES = 8 << 20
# CUPTI wants 8-byte aligned buffers; ctypes arrays come from malloc (16-byte aligned).
_REQUESTED = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class RawBuffers:
    """CUPTI's activity buffers, handed to CUPTI and taken back as raw memory.

    The callbacks run on CUPTI's thread and only move a buffer between lists: no record
    is touched until ``take``. Buffers are recycled through ``give_back``.
    """

    def __init__(self, library: Any, size: int = BUFFER_BYTES) -> None:
        self.size = size
        self._lock = threading.Lock()
        # two at hand: CUPTI asks for one at once and another while it hands the first over
        self._free = [ctypes.create_string_buffer(size) for _ in range(2)]
        self._lent: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._filled: list[tuple[ctypes.Array[ctypes.c_char], int]] = []
        # kept as attributes: CUPTI calls them for as long as the process lives
        self._requested = _REQUESTED(self._on_requested)
        self._completed = _COMPLETED(self._on_completed)
        status = library.cuptiActivityRegisterCallbacks(self._requested, self._completed)
        if status != 0:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks returned {status}")

    def _on_requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        with self._lock:
            memory = self._free.pop() if self._free else ctypes.create_string_buffer(self.size)
            address = ctypes.addressof(memory)
            self._lent[address] = memory
        buffer[0] = address
        size[0] = self.size
        max_records[0] = 0  # as many as fit

    def _on_completed(self, context: int, stream: int, buffer: int, size: int, valid: int) -> None:
        with self._lock:
            memory = self._lent.pop(buffer, None)
            if memory is None:
                return
            if valid:
                self._filled.append((memory, valid))
            else:
                self._free.append(memory)

    def take(self) -> list[tuple[ctypes.Array[ctypes.c_char], int]]:
        """The buffers CUPTI filled since the last call, with their valid bytes."""
        with self._lock:
            filled, self._filled = self._filled, []
        return filled

    def give_back(self, buffers: list[tuple[ctypes.Array[ctypes.c_char], int]]) -> None:
        with self._lock:
            self._free.extend(memory for memory, _ in buffers)
