"""A lock per device, so that a test's windows never share their GPU with device work of
another process of this plugin: xdist workers, or another pytest run on the same host.

An advisory ``flock`` on one file per device, keyed by what identifies the device on
this host (a GPU's UUID), in a sticky folder every user of the host shares, as ``/tmp``
itself. The kernel drops the lock when its holder exits, however it exits (SIGKILL
included), so a dead worker never leaves a GPU locked. Starting a process's backend (a
CUDA context, CUPTI) is device work that must not land in another's window, but it does
not disturb another start: starts take the lock shared (``starting``).

Another user of the host is trusted with nothing (docs/design.md, "Threat model"):

- the folder is used only when it is a real folder (no link), and sticky where another
  user owns it or may write in it; otherwise it is refused with one line;
- the lock file is opened without following a link (``O_NOFOLLOW``), checked to be a
  regular file with one name, and never written: a planted link or hard link gets no byte;
- who holds the device is read from the kernel (``/proc/locks``: the holder's pid, its
  user) and from a file of the holder's own user (its test), never from a shared file;
- anyone who can read the lock file can take it and hold it: so a wait is said at once,
  naming the holder, and again every ``SAY_EVERY_S``, and it ends after the lock timeout
  (``--gpu-lock-timeout``) with an error that names the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from pytest_gpuprof.analysis.names import clean

# one folder for every user of the host: sticky and world-writable, as /tmp itself
LOCKS = Path(tempfile.gettempdir()) / "pytest-gpuprof-locks"
# "KEY PID" while process PID holds device KEY: the processes it starts (a pytest inside a
# test, a training script) inherit it, and take turns among themselves on a lock of their
# own under that hold instead of waiting for the parent, which waits for them
HELD = "PYTEST_GPUPROF_HELD"
# how often a wait is said again
SAY_EVERY_S = 30.0


class LockError(OSError):
    """A lock folder or file another user could have planted, refused; or a wait that ran
    out: the message is the one line the run shows."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_folder(folder: Path) -> None:
    """``folder`` as a place for the locks of every user: made sticky and world-writable
    where it is not there; where it is, a real folder that no other user can swap files
    in (sticky, or ours and writable by us alone)."""
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    else:
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)  # the mkdir mode passes through the umask
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise LockError(f"{folder}: not a folder (a link or a file another user may have planted): refusing to use it")
    sticky = bool(info.st_mode & stat.S_ISVTX)
    others_write = bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    ours = info.st_uid == os.geteuid()
    if not sticky and (others_write or not ours):
        raise LockError(
            f"{folder}: owned by {_user(info.st_uid)} with mode {stat.S_IMODE(info.st_mode):o}: another user could "
            "swap its files: refusing to use it (remove it, or point TMPDIR elsewhere)"
        )


def open_lock(path: Path) -> int:
    """The lock file, opened (made where it is not there) without following a link, and
    checked to be a regular file with one name; read-only: nothing is ever written to it."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o444)
    except OSError as e:
        raise LockError(
            f"{path}: cannot open the GPU lock ({e.strerror}): a link or another user's file? refused"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise LockError(
            f"{path}: not a plain file of its own (a link or a device another user may have planted): refused"
        )
    return fd


def _who_path(lock: Path, uid: int) -> Path:
    return lock.with_name(f"{lock.stem}.who-{uid}")


def write_who(lock: Path, text: str) -> None:
    """Say who holds the device in a file of this user's own (its test, for waiters of this
    user and others to read; empty once the hold ends); a file of that name another user
    planted is left alone."""
    path = _who_path(lock, os.geteuid())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text.encode(errors="backslashreplace"), 0)
    finally:
        os.close(fd)


def _holder_pid(fd: int, lock: Path) -> str | None:
    """The pid that holds the lock on ``lock`` (``fd``'s file), from the kernel's table."""
    info = os.fstat(fd)
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "->" in fields or len(fields) < 6 or not fields[1] == "FLOCK":
                continue
            if fields[5] == device or fields[5].endswith(f":{info.st_ino}"):
                return fields[4]
    return None


class Holder(NamedTuple):
    """Who holds a lock: its pid and user (from the kernel), and what its who-file says of
    the hold: the test, and the pytest run it belongs to (``run``: the run's id, shared by
    its xdist workers); what is unknown is ``None`` or ``""``."""

    pid: str | None
    uid: int | None = None
    test: str = ""
    run: str = ""


def _said_by(fd: int, lock: Path) -> Holder:
    """The lock's holder. Another user may have written its who-file: a claim, cleaned."""
    pid = _holder_pid(fd, lock)
    if pid is None:
        return Holder(None)
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return Holder(pid)
    try:
        said = _who_path(lock, uid).read_text(errors="replace")
    except OSError:
        return Holder(pid, uid)
    first, _, rest = said.partition("\n")
    prefix, _, what = first.strip().partition(": ")
    if prefix != f"pid {pid}":
        return Holder(pid, uid)
    run = next((line[4:].strip() for line in rest.splitlines() if line.startswith("run ")), "")
    # another user wrote it: no escape sequence of theirs reaches a terminal
    return Holder(pid, uid, clean(what[:300]), clean(run[:100]))


def holder_of(fd: int, lock: Path) -> str:
    """Who holds the lock on ``fd``'s file, from the kernel's table of locks: ``pid N (user
    U): TEST`` (the test as the holder's user wrote it, cleaned), or what could be read of it."""
    holder = _said_by(fd, lock)
    if holder.pid is None:
        return "a process this one cannot see"
    if holder.uid is None:
        return f"pid {holder.pid}"
    return f"pid {holder.pid} (user {_user(holder.uid)})" + (f": {holder.test}" if holder.test else "")


class _Taker:
    """A blocking ``flock`` of a second descriptor of ``fd``'s open file, in a helper thread:
    the lock it takes is ``fd``'s. ``got`` is set when it holds; ``cancel`` gives it up
    (its lock then goes with its last descriptor), ``finish`` ends it once it holds."""

    def __init__(self, fd: int, how: int) -> None:
        self._second = os.dup(fd)
        self._how = how
        self.got = threading.Event()
        self._guard = threading.Lock()
        self._done = self._cancelled = False
        self._thread = threading.Thread(target=self._take, name="gpuprof-device-lock", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._second, self._how)
        with self._guard:
            self._done = True
            if self._cancelled:
                os.close(self._second)
        self.got.set()

    def cancel(self) -> bool:
        """Give the wait up; ``False`` where it took the lock meanwhile (then ``finish``)."""
        with self._guard:
            if self._done:
                return False
            self._cancelled = True
            return True

    def finish(self) -> None:
        os.close(self._second)  # the lock stays with ``fd``: the same open file
        self._thread.join()  # it set ``got`` as its last step: no thread of the wait outlives it


class DeviceLock:
    """The exclusive hold of one device: ``acquire`` waits until no other process of
    this plugin holds it (saying so) and returns how long that took."""

    def __init__(
        self,
        key: str,
        folder: Path | None = None,
        timeout_s: float = 600.0,
        say: Callable[[str], None] | None = None,
        run: str | None = None,
    ) -> None:
        self.key = key
        self.path = (LOCKS if folder is None else folder) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.lock"
        self.timeout_s = timeout_s
        self.say = say or (lambda line: None)
        # the pytest run this process belongs to (its xdist workers share it): a sibling
        # worker's hold is waited for without the timeout, as a queue
        self.run = run
        # the line of a wait given up on: the session's later tests are refused with it at
        # once while the same hold lasts, instead of each waiting the timeout again
        self.gave_up: str | None = None
        self._fd: int | None = None
        self._held_path: Path | None = None
        self._inherited: str | None = None  # HELD as this process found it

    def _path(self) -> Path:
        """The lock's file: the device's own, or, where a process up this one's tree holds
        the device, one of its own under that hold (``HELD``)."""
        path = self.path
        key, _, holder_pid = os.environ.get(HELD, "").partition(" ")
        if key == self.key and holder_pid.isdigit():  # anything else is not this plugin's hold
            path = path.with_name(f"{path.stem}.under-{holder_pid}.lock")
        check_folder(path.parent)
        return path

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _wait(self, fd: int, path: Path, how: int) -> tuple[float, str]:
        """Take the lock on ``fd`` (``how``: shared or exclusive); a wait said at once and
        every ``SAY_EVERY_S``, ended by the timeout. The time waited (ms) and whom for.

        The wait is the kernel's own (a blocking ``flock`` in a helper thread, on a second
        descriptor of the same open file, so the lock it takes is ``fd``'s): polling would
        lose the device to a holder that lets go and takes it again between its tests."""
        start = time.monotonic()
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            self.gave_up = None  # the hold given up on is over
            return 0.0, ""
        except BlockingIOError:
            pass
        holder = holder_of(fd, path)
        if self.gave_up is not None:  # the hold this session gave up on, most likely: once is enough
            raise LockError(f"{self.gave_up}; refused at once: this session waited for it once already")
        self.say(f"gpuprof: waiting for GPU {self.key}, held by {holder}")
        taker = _Taker(fd, how)
        got = taker.got
        counted = start  # the timeout counts from here; a sibling worker's hold moves it on
        said = start
        while not got.wait(max(0.0, min(SAY_EVERY_S, self.timeout_s - (time.monotonic() - counted)))):
            now = time.monotonic()
            if now - counted >= self.timeout_s and self._sibling(fd, path):
                counted = now  # queued behind a worker of this run: no timeout on its own test
                if now - said >= SAY_EVERY_S or said == start:
                    said = now
                    self.say(
                        f"gpuprof: still waiting for GPU {self.key} ({now - start:.0f} s), held by a worker of this run"
                    )
                continue
            if now - counted >= self.timeout_s:
                if taker.cancel():
                    self.gave_up = (
                        f"gpuprof: waited {self.timeout_s:g} s for GPU {self.key}, held by "
                        f"{holder_of(fd, path)}: giving up (--gpu-lock-timeout, lock_timeout in [tool.gpuprof])"
                    )
                    raise LockError(self.gave_up)
                break
            said = now
            self.say(
                f"gpuprof: still waiting for GPU {self.key} ({now - counted:.0f} s of {self.timeout_s:g}), "
                f"held by {holder_of(fd, path)}"
            )
        taker.finish()
        self.gave_up = None  # the hold is over: a later one gets a wait of its own
        return (time.monotonic() - start) * 1000, holder

    def _sibling(self, fd: int, path: Path) -> bool:
        """Whether the holder is a worker of this same pytest run (its who-file says so, by
        the run's id): workers of one session queue for the device, they never time out on
        each other. Another user's file may claim it; it gains a wait, never a window."""
        if not self.run:
            return False
        holder = _said_by(fd, path)
        if holder.pid is None or holder.uid is None:  # the hold just ended: the helper takes it in a moment
            return True
        return holder.run == self.run and holder.uid == os.geteuid()

    def acquire(self, who: str) -> tuple[float, str]:
        """Hold the device; ``who`` is said to waiters. Returns the time waited (ms) and,
        where it waited, whom for."""
        if self._fd is not None:
            return 0.0, ""
        self._inherited = os.environ.get(HELD)
        path = self._path()
        fd = open_lock(path)
        try:
            waited_ms, holder = self._wait(fd, path, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        write_who(path, f"pid {os.getpid()}: {who}" + (f"\nrun {self.run}" if self.run else ""))
        self._fd, self._held_path = fd, path
        os.environ[HELD] = f"{self.key} {os.getpid()}"
        return waited_ms, holder

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if self._held_path is not None:
                write_who(self._held_path, "")  # a waiter then names no test that has gone
            if self._inherited is None:
                os.environ.pop(HELD, None)
            else:
                os.environ[HELD] = self._inherited
            os.close(fd)  # closing the descriptor drops the lock

    @contextlib.contextmanager
    def starting(self) -> Iterator[float]:
        """Hold the device shared while this process starts its backend: beside other
        processes starting theirs, never beside a window. Yields the time waited (ms).
        Not for a process that holds the device already (its own hold would block it)."""
        if self._fd is not None:
            raise RuntimeError("starting() while this process holds the device: it would wait for itself")
        path = self._path()
        fd = open_lock(path)
        try:
            waited_ms, _ = self._wait(fd, path, fcntl.LOCK_SH)
            yield waited_ms
        finally:
            os.close(fd)
