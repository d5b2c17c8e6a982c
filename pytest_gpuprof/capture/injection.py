"""The native programs a test starts: traced by a CUPTI injection library
(``_native/inject.c``) that the CUDA driver loads into each process that starts CUDA while
``CUDA_INJECTION64_PATH`` names it, as Nsight Systems traces a process tree.

``library()`` builds it on first use where a C compiler and CUPTI's headers are found and
keeps it in the user's cache, keyed by everything that went into it; where it cannot be
built it says why, and the windows say that native children were not traced. ``read``
turns the records a native child wrote into ``DeviceWork`` rows.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from pytest_gpuprof.analysis.device_work import NO_SPAN, ROW, DeviceWork
from pytest_gpuprof.analysis.model import KINDS

SOURCE = Path(__file__).resolve().parents[1] / "_native" / "inject.c"
INJECTION = "CUDA_INJECTION64_PATH"
# the pid of a Python child whose start-up hook records it with cupti-python: the library
# leaves that process alone (one CUPTI subscriber a process)
PYTHON_PID = "PYTEST_GPUPROF_PYTHON_PID"


@functools.cache
def library() -> tuple[Path | None, str]:
    """The built library and how it was had, or ``None`` and why it cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        return None, "no C compiler (cc, gcc, clang or $CC) to build the injection library"
    found = cuda_dirs()
    if found is None:
        return (
            None,
            "CUPTI's headers (cupti.h with cuda.h) not found under $CUDA_HOME, /usr/local/cuda or NVIDIA's wheels",
        )
    includes, lib = found
    header = next(d / "cupti_activity.h" for d in includes if (d / "cupti_activity.h").exists())
    layouts = newest_layouts(header.read_text(errors="replace"))
    if layouts is None:
        return None, f"{header}: no kernel, memcpy or memset record layout found"
    flags = [f"-DGPUPROF_{k}={v}" for k, v in layouts.items()]
    command = [compiler, "-shared", "-fPIC", "-O2", *flags, *(f"-I{d}" for d in includes), str(SOURCE)]
    # the library by its path: NVIDIA's wheels ship libcupti.so.13 without the bare name -lcupti needs
    cupti = min(lib.glob("libcupti.so*"), key=lambda f: (len(f.name), f.name))
    command += [str(cupti), f"-Wl,-rpath,{lib}", "-pthread"]
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *command]).encode()).hexdigest()[:16]
    target = cache_folder() / f"libgpuprof-inject-{key}.so"
    why = private_folder(target.parent)
    if why is not None:
        return None, why
    if trusted(target, key):
        return target, f"built at {target}"
    fd, tmp = tempfile.mkstemp(prefix=".inject.", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([*command, "-o", tmp], capture_output=True, text=True, timeout=120)
        built = Path(tmp).read_bytes()
        if done.returncode != 0 or built[:4] != b"\x7fELF":
            last = (done.stderr.strip().splitlines() or ["no library written"])[-1]
            return None, f"building the injection library failed ({compiler}): {last}"
        # what was built from this source, by its digest: a library later put in its place is never loaded
        _seal(target, key, hashlib.sha256(built).hexdigest())
        os.replace(tmp, target)  # whole or not at all: two workers may build it at once
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building the injection library failed: {e}"
    finally:
        Path(tmp).unlink(missing_ok=True)
    if not trusted(target, key):
        return None, f"{target}: changed as it was built (another process of another build?): not loaded"
    return target, f"built at {target}"


def private_folder(folder: Path) -> str | None:
    """Why ``folder`` is no place to load a library from (made private where it is not
    there): a link, another user's, or writable by others; ``None`` where it is fine."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError as e:
        return f"{folder}: cannot make the injection library's folder ({e.strerror})"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return f"{folder}: not a folder (a link?): the injection library is not built or loaded there"
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{folder}: another user owns it or may write in it: the injection library is not loaded from it"
    return None


def _seal_path(target: Path, key: str) -> Path:
    return target.with_name(f"{target.name}.{key}.sha256")


def _seal(target: Path, key: str, digest: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".seal.", dir=target.parent)
    with os.fdopen(fd, "w") as out:
        out.write(digest)
    os.replace(tmp, _seal_path(target, key))


def trusted(target: Path, key: str) -> bool:
    """Whether ``target`` is the library this source built here: a file of this user's
    that no one else can write, whose digest is the one recorded when it was built."""
    try:
        info = os.lstat(target)
        seal = _seal_path(target, key).read_text().strip()
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    return hashlib.sha256(target.read_bytes()).hexdigest() == seal


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-gpuprof"


def cuda_dirs() -> tuple[list[Path], Path] | None:
    """The include folders holding ``cupti.h`` and ``cuda.h``, and the folder of
    ``libcupti.so``: from one CUDA installation or NVIDIA's wheels, the first found."""
    for root in _roots():
        includes = [d for d in _includes(root) if d.is_dir()]
        cupti = next((d for d in includes if (d / "cupti.h").exists()), None)
        cuda = next((d for d in includes if (d / "cuda.h").exists()), None)
        lib = next((d for d in _libs(root) if any(d.glob("libcupti.so*"))), None)
        if cupti is not None and cuda is not None and lib is not None:
            return list(dict.fromkeys([cupti, cuda])), lib
    return None


def _roots() -> Iterable[Path]:
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(name):
            yield Path(os.environ[name])
    yield Path("/usr/local/cuda")
    for entry in sys.path:  # NVIDIA's wheels: nvidia/cuda_cupti, nvidia/cu13, ...
        nvidia = Path(entry or ".") / "nvidia"
        if nvidia.is_dir():
            yield nvidia


def _includes(root: Path) -> Iterable[Path]:
    yield root / "include"
    yield root / "extras" / "CUPTI" / "include"
    yield from root.glob("targets/*/include")
    yield from root.glob("*/include")


def _libs(root: Path) -> Iterable[Path]:
    for name in ("lib64", "lib", "extras/CUPTI/lib64"):
        yield root / name
    yield from root.glob("targets/*/lib")
    yield from root.glob("*/lib")


def newest_layouts(header: str) -> dict[str, str] | None:
    """The newest record struct the header declares for kernels, copies and memsets
    (CUPTI keeps the older ones for old code; the library fills in the newest)."""
    out = {}
    for key, stem in (("KERNEL", "Kernel"), ("MEMCPY", "Memcpy"), ("MEMSET", "Memset")):
        versions = [int(v or 1) for v in re.findall(rf"\}}\s*CUpti_Activity{stem}(\d*)\s*;", header)]
        if not versions:
            return None
        newest = max(versions)
        out[key] = f"CUpti_Activity{stem}{newest if newest > 1 else ''}"
    return out


def read(path: Path, pid: int) -> DeviceWork:
    """The device work a native child wrote (``inject.c``'s lines), its streams its own."""
    names: dict[str, int] = {}
    rows = []

    def row(
        kind: str,
        start: str,
        end: str,
        stream: str,
        name: str,
        nbytes: str = "0",
        pageable: bool = False,
        geometry: tuple[str, ...] = ("0", "0", "0", "0"),
    ) -> None:
        # ``ROW``'s fields in order; the thread and time that issued it are not known
        code = names.setdefault(name, len(names))
        streams = (pid << 32) | int(stream)  # streams of its own
        rows.append(
            (
                KINDS.index(kind),
                int(start),
                int(end),
                streams,
                code,
                int(nbytes),
                pageable,
                NO_SPAN,
                0,
                0,
                *map(int, geometry),
            )
        )

    for line in path.read_text(errors="replace").splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "k":
            start, end, stream, blocks, threads, registers, shared, name = rest.split(" ", 7)
            row("kernel", start, end, stream, name, geometry=(blocks, threads, registers, shared))
        elif tag == "c":
            start, end, stream, nbytes, copy_kind, pageable = rest.split(" ")
            row("memcpy", start, end, stream, copy_kind, nbytes, pageable == "1")
        elif tag == "m":
            start, end, stream, nbytes = rest.split(" ")
            row("memset", start, end, stream, "memset", nbytes)
    return DeviceWork(np.array(rows, dtype=ROW), list(names))
