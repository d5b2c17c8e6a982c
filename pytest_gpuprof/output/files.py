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
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# a partial file's name: ``TMP_PREFIX`` + random + ``.tmp``, in the folder of its target
TMP_PREFIX = ".gpuprof."


@contextlib.contextmanager
def written(folder: Path, text: str) -> Iterator[Path]:
    """``text`` in a temporary file of ``folder``, on disk; removed when the block ends
    unless the block renamed it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=folder)
    tmp = Path(name)
    try:
        umask = os.umask(0)  # mkstemp makes the file private; these are ordinary files
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        # a name read from the user's code may hold a lone surrogate: written escaped
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, replacing what was there; through a symbolic link, to
    its target (the link stays). A device node, FIFO or socket is refused, not replaced."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, f"{path}: not a regular file; refusing to replace it")
    with written(path.parent, text) as tmp:
        os.replace(tmp, path)


def json_text(data: dict[str, Any]) -> str:
    """A report as every file of it is written: the JSON report, a baseline, a merge."""
    return json.dumps(data, indent=1) + "\n"


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json_text(data))
