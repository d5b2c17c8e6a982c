"""The host backend's device memory: a caching pool of numpy blocks, and the data the
uploads copy."""

from __future__ import annotations

import os
import threading
import weakref
from collections import defaultdict
from typing import Any

import numpy as np

# the uploads' source data (``filled``), each byte FILL
FILL = 7
_FILLED: np.ndarray | None = None


class HostBuffer:
    """Device memory of the host backend; returns to the pool when dropped."""

    __slots__ = ("__weakref__", "array", "nbytes")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.nbytes = array.nbytes


class Pool:
    """A caching allocator: freed blocks wait for reuse until ``trim``."""

    def __init__(self, *, premap: bool) -> None:
        self._premap = premap  # the real clock: map new blocks at once
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = defaultdict(list)
        self.in_use = 0
        # told of each allocation and free while a test's memory is tracked (``capture.memory``)
        self.observer: Any = None

    def alloc(self, nbytes: int) -> HostBuffer:
        with self._lock:
            blocks = self._free.get(nbytes)
            array = blocks.pop() if blocks else None
        if array is None:
            # A GPU allocator maps device memory when it allocates; here the first write
            # would map the pages, inside whichever copy came first: on the real clock, map
            # them now (the virtual clock writes none: its zeros stay unmapped)
            array = np.zeros(nbytes, dtype=np.uint8)
            if self._premap:
                array[:: os.sysconf("SC_PAGE_SIZE") if nbytes else 1] = 0
        with self._lock:
            self.in_use += nbytes
        buffer = HostBuffer(array)
        weakref.finalize(buffer, self._release, array)
        if (observer := self.observer) is not None:
            observer.allocated(id(array), nbytes)
        return buffer

    def _release(self, array: np.ndarray) -> None:
        with self._lock:
            self._free[array.nbytes].append(array)
            self.in_use -= array.nbytes
        if (observer := self.observer) is not None:
            observer.freed(id(array), array.nbytes)

    def trim(self) -> None:
        with self._lock:
            self._free.clear()


def filled(nbytes: int) -> np.ndarray:
    """The uploads' source on the real clock: the user's data already sits in host memory before an upload.
    One filled source is kept (not one per size: sizes may be many and large) so that the
    copy, not the filling, is what gets timed: the latest that was not smaller than what
    an upload needs, whose first ``nbytes`` serve the smaller ones. One for the process,
    only ever read, so every backend of it (a pytester run's) shares it."""
    global _FILLED
    src = _FILLED
    if src is None or src.nbytes < nbytes:
        src = np.full(nbytes, FILL, dtype=np.uint8)
        src.flags.writeable = False
        _FILLED = src
    return src[:nbytes]
