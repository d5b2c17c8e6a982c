"""Files written whole or not at all: reports, pages, traces and baselines.

Each is written to a temporary file in the target's folder, flushed to disk, and then
given its name, so a reader sees the old file or the new one, never half of one. Every
file gets the ordinary mode (0666 less the umask).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# a partial file's name: ``TMP_PREFIX`` + random + ``.tmp``, in the folder of its target
TMP_PREFIX = ".gpuprof."
# a partial file older than this was left by a writer that was killed (a write takes
# seconds at most: no live writer's file is this old)
STALE_TMP_S = 15 * 60


@contextlib.contextmanager
def written(folder: Path, text: str | Iterable[str]) -> Iterator[Path]:
    """``text`` (or its pieces, written as they come) in a temporary file of ``folder``, on
    disk; removed when the block ends unless the block renamed it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=folder)
    tmp = Path(name)
    try:
        umask = os.umask(0)  # mkstemp makes the file private; these are ordinary files
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        # a name read from the user's code may hold a lone surrogate: written escaped
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            for piece in [text] if isinstance(text, str) else text:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """Write ``text`` to ``path``, replacing what was there; through a symbolic link, to
    its target (the link stays). A device node, FIFO or socket is refused, not replaced."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, f"{path}: not a regular file; refusing to replace it")
    with written(path.parent, text) as tmp:
        os.replace(tmp, path)
    if path.parent not in _CLEARED:  # once a folder a process: a trace a test writes many files to one
        _CLEARED.add(path.parent)
        clear_partial(path.parent)


# the folders whose killed writers' partial files this process has cleared (``write_atomic``)
_CLEARED: set[Path] = set()


def clear_partial(folder: Path, older_than_s: float = STALE_TMP_S) -> list[str]:
    """Remove the partial files that writers killed mid-write left in ``folder`` (their
    name and age tell them; a live writer's is seconds old); the names removed."""
    now, removed = time.time(), []
    with contextlib.suppress(OSError):
        for tmp in folder.glob(f"{TMP_PREFIX}*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.is_file() and not tmp.is_symlink() and now - tmp.lstat().st_mtime > older_than_s:
                    tmp.unlink()
                    removed.append(tmp.name)
    return removed


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes, where it is a regular file: a FIFO, device or socket is refused
    with an ``OSError`` naming what it is, never read (a FIFO with no writer blocks a read
    for good)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open blocks without it
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"is {kind}, not a report's file", os.fspath(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def json_text(data: dict[str, Any]) -> str:
    """A report as every file of it is written: the JSON report, a baseline, a merge."""
    return json.dumps(data, indent=1) + "\n"


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json_text(data))
