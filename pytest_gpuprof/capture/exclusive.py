"""A lock per device, so that a test's windows never share their GPU with device work of
another process of this plugin: xdist workers, or another pytest run on the same host.

An advisory ``flock`` on one file per device, keyed by what identifies the device on
this host (a GPU's UUID), in a folder every process of every user sees. The kernel drops
the lock when its holder exits, however it exits (SIGKILL included), so a dead worker
never leaves a GPU locked. The holder writes who it is into the file, so a waiter can say
whom it waited for. POSIX only, as CUDA's Linux is.

Starting a process's backend (a CUDA context, CUPTI) is device work that must not land in
another's window, but it does not disturb another start: starts take the lock shared
(``starting``), so the workers of a run start side by side, and a window waits for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# one folder for every user of the host: sticky and world-writable, as /tmp itself
LOCKS = Path(tempfile.gettempdir()) / "pytest-gpuprof-locks"
# "KEY PID" while process PID holds device KEY: the processes it starts (a pytest inside a
# test, a training script) inherit it, and take turns among themselves on a lock of their
# own under that hold instead of waiting for the parent, which waits for them
HELD = "PYTEST_GPUPROF_HELD"


class DeviceLock:
    """The exclusive hold of one device: ``acquire`` blocks until no other process of
    this plugin holds it and returns how long that took."""

    def __init__(self, key: str, folder: Path = LOCKS) -> None:
        self.key = key
        self.path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.lock"
        self._fd: int | None = None
        self._inherited: str | None = None  # HELD as this process found it

    def _path(self) -> Path:
        """The lock's file: the device's own, or, where a process up this one's tree holds
        the device, one of its own under that hold (``HELD``)."""
        path = self.path
        key, _, holder_pid = os.environ.get(HELD, "").partition(" ")
        if key == self.key and holder_pid.isdigit():  # anything else is not this plugin's hold
            path = path.with_name(f"{path.stem}.under-{holder_pid}.lock")
        folder = path.parent
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            try:
                folder.chmod(0o1777)
            except OSError:
                pass  # made by another user, who set its mode
        return path

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, who: str) -> tuple[float, str]:
        """Hold the device; ``who`` is written for waiters to read. Returns the time waited
        (ms) and, where it waited, whom for (as the holder wrote itself)."""
        if self._fd is not None:
            return 0.0, ""
        self._inherited = os.environ.get(HELD)
        fd = os.open(self._path(), os.O_RDWR | os.O_CREAT, 0o666)
        start = time.perf_counter_ns()
        holder = ""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            fcntl.flock(fd, fcntl.LOCK_EX)
        waited_ms = (time.perf_counter_ns() - start) / 1e6
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {who}".encode(), 0)
        self._fd = fd
        os.environ[HELD] = f"{self.key} {os.getpid()}"
        return waited_ms, holder

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if self._inherited is None:
                os.environ.pop(HELD, None)
            else:
                os.environ[HELD] = self._inherited
            os.ftruncate(fd, 0)  # a waiter then reads no holder that has gone
            os.close(fd)  # closing the descriptor drops the lock

    @contextlib.contextmanager
    def starting(self) -> Iterator[float]:
        """Hold the device shared while this process starts its backend: beside other
        processes starting theirs, never beside a window. Yields the time waited (ms).
        Not for a process that holds the device already (its own hold would block it)."""
        if self._fd is not None:
            raise RuntimeError("starting() while this process holds the device: it would wait for itself")
        fd = os.open(self._path(), os.O_RDWR | os.O_CREAT, 0o666)
        start = time.perf_counter_ns()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield (time.perf_counter_ns() - start) / 1e6
        finally:
            os.close(fd)
