"""GPU work in the processes a test starts: ``subprocess`` children, ``spawn`` and
``forkserver`` workers, ``torchrun``'s ranks, and native programs (``capture.injection``).

While a test runs, its children are told (``ENV``, a folder) to record their own device
work with CUPTI and write it there when they exit; ``PYTHONPATH`` leads them to this
package's ``_bootstrap/sitecustomize.py``, which does nothing unless ``ENV`` is set (as
coverage.py's start-up hook does), and then runs any ``sitecustomize`` of their own. Each
child writes ``PID.json`` as it starts (its command, ``RANK``, or why CUPTI refused it)
and, as it exits (``atexit``, ``SIGTERM`` as a pool's ``terminate()`` sends it, or
``os._exit``),
``PID.npz``: its kernels, copies and memsets in the host's monotonic clock, which every
process on the host shares (CUPTI's timestamps are paired with it in each process, as the
test's own are: the error is that pairing's, under a microsecond). A native program that
starts CUDA is traced by the injection library, which ``CUDA_INJECTION64_PATH`` names for
the test's children; it writes ``PID.json`` and ``PID.native`` the same way.

The test reads them at the end of each window (``ChildWatch.collect``): a child that
started and left no records was killed or crashed (its records are lost, and the window
says so) or still runs (its work is read when it exits, in a later window). A child started
with an environment of its own (``env=`` without ``os.environ``), or by ``fork``, or a
native program where the injection library is not in place, is not traced: the process
starts Python audits (``subprocess.Popen``, ``os.posix_spawn``, ``os.exec``,
``os.system``) tell the watch of those it can name, and the window lists each as not
seen, never as 0.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

ENV = "PYTEST_GPUPROF_CHILDREN"
BOOTSTRAP = str(Path(__file__).resolve().parents[1] / "_bootstrap")


@dataclass(frozen=True, slots=True)
class ChildRecord:
    """What one child left: its pid (``None`` where it was only seen starting), command,
    rank, and its device work (``None``: lost, not traced, or still running; ``why`` says which)."""

    pid: int | None
    command: str
    rank: int | None
    work: Any  # DeviceWork | None
    why: str | None = None
    started: int | None = None  # the host's monotonic clock, ns


class ChildWatch:
    """The parent's side, for one test: the folder its children write to, the environment
    that tells them, and what they left."""

    def __init__(self, native: tuple[Path | None, str] | None = None) -> None:
        """``native``: the injection library for native children and how it was had, or
        ``None`` and why not (``injection.library()`` where not given)."""
        self.folder = Path(tempfile.mkdtemp(prefix="gpuprof-children-"))
        self._saved: dict[str, str | None] | None = None
        self._native = native
        # why native children are not traced; None where the injection library traces them
        self.native_why: str | None = NATIVE
        # the processes started while told that no record will come from
        self._untraced: list[ChildRecord] = []

    @contextlib.contextmanager
    def told(self) -> Iterator[None]:
        """The test's children are traced while this is open."""
        self.tell()
        try:
            yield
        finally:
            self.untell()

    def tell(self) -> None:
        if self._saved is not None:
            return
        global _TOLD
        from pytest_gpuprof.capture import injection

        _TOLD = self
        _audit_starts()
        self._saved = {key: os.environ.get(key) for key in (ENV, "PYTHONPATH", injection.INJECTION)}
        os.environ[ENV] = str(self.folder)
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = BOOTSTRAP + (os.pathsep + path if path else "")
        library, how = self._native if self._native is not None else injection.library()
        other = os.environ.get(injection.INJECTION)
        if library is None:
            self.native_why = native_not_traced(how)
        elif other and Path(other) != library:
            self.native_why = native_not_traced(f"{injection.INJECTION} names another tool's library, {other}")
        else:
            os.environ[injection.INJECTION] = str(library)
            self.native_why = None

    def untell(self) -> None:
        if self._saved is None:
            return
        global _TOLD
        if _TOLD is self:
            _TOLD = None
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = None

    def collect(self) -> list[ChildRecord]:
        """Every child that started since the test began, with what it left."""
        import numpy as np

        from pytest_gpuprof.analysis.device_work import DeviceWork
        from pytest_gpuprof.capture import injection

        out = []
        for meta_path in sorted(self.folder.glob("*.json"), key=lambda p: int(p.stem)):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue  # being written: read at the next window
            pid = int(meta_path.stem)
            command, rank, started = str(meta.get("command", "?")), meta.get("rank"), meta.get("started")
            refused = meta.get("refused")
            records = self.folder / (f"{pid}.native" if meta.get("native") else f"{pid}.npz")
            why = None
            work = None
            if refused:
                why = f"not traced: {refused}"
            elif records.suffix == ".native" and records.exists():
                work = injection.read(records, pid)
            elif records.exists():
                with np.load(records, allow_pickle=False) as data:
                    work = DeviceWork(data["rows"], [str(n) for n in data["names"]])
            elif (failed := self.folder / f"{pid}.err").exists():
                why = f"its records could not be written ({failed.read_text(errors='replace')[:200]}): lost"
            elif _alive(pid):
                why = "still running: its device work is read when it exits"
            else:
                why = "killed or crashed before writing its records: lost"
            out.append(ChildRecord(pid, command, rank, work, why, started))
        out += self._untraced
        self._untraced = []
        return out

    def started(self, command: str, why: str) -> None:
        """A process started that will leave no records (the audit hook tells)."""
        self._untraced.append(ChildRecord(None, command[:300], None, None, why, time.perf_counter_ns()))

    def close(self) -> None:
        self.untell()
        shutil.rmtree(self.folder, ignore_errors=True)


# the watch told now (one test at a time in a process), for the audit hook
_TOLD: ChildWatch | None = None
_AUDITED = False
_PYTHON = re.compile(r"(^|/)(python|pypy)[\d.]*$")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh"})


def native_not_traced(why: str) -> str:
    return f"a native program: not traced ({why}); its device work is not in this window"


NATIVE = native_not_traced("no injection library")
OWN_ENV = "started with an environment of its own (env= without os.environ): not traced"


def _audit_starts() -> None:
    """Listen, once a process (an audit hook stays), for the processes Python starts."""
    global _AUDITED
    if not _AUDITED:
        _AUDITED = True
        sys.addaudithook(_on_audit)


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if _TOLD is None or event not in _STARTS:
        return
    argv, env = _STARTS[event](args)
    why = untraced(argv, env, _TOLD.native_why)
    if why is not None:
        _TOLD.started(" ".join(argv), why)


def _argv(value: Any) -> list[str]:
    if isinstance(value, str | bytes | os.PathLike):
        return [os.fsdecode(value)]
    return [os.fsdecode(a) for a in value or ()]


# each audited way to start a process: its argv and environment (None: this one's)
_STARTS = {
    "subprocess.Popen": lambda a: (_argv(a[1]) or _argv(a[0]), a[3]),
    "os.posix_spawn": lambda a: (_argv(a[1]) or _argv(a[0]), a[2]),
    "os.exec": lambda a: (_argv(a[1]) or _argv(a[0]), a[2]),
    "os.system": lambda a: (["/bin/sh", "-c", os.fsdecode(a[0])], None),
}


def untraced(argv: list[str], env: Any, native: str | None = NATIVE) -> str | None:
    """Why a process started with ``argv`` and ``env`` will not be traced; None where it will
    (a Python interpreter, or a native program where the injection library is in place:
    ``native`` None, that inherits the told environment), as far as its command says."""
    if not argv:
        return None
    if env is not None and ENV not in env and os.fsencode(ENV) not in env:
        return OWN_ENV
    programs = [argv[0]]
    if os.path.basename(argv[0]) in _SHELLS and len(argv) >= 3 and argv[1] == "-c":
        programs = argv[2].split()  # a shell's command line: traced where it runs Python
    if any(_PYTHON.search(p) or os.path.realpath(p) == os.path.realpath(sys.executable) for p in programs):
        return None
    return native


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped) is not running
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# the child's side

# processes multiprocessing starts for itself (``spawn``/``forkserver``), which do no device work
_HELPERS = ("from multiprocessing.resource_tracker import main",)


def start_in_child(folder: str) -> None:
    """Record this process's device work, and write it to ``folder`` as it exits."""
    from pytest_gpuprof.capture import cupti_trace, injection

    pid = os.getpid()
    argv = getattr(sys, "orig_argv", [sys.executable.rsplit("/", 1)[-1], *sys.argv])
    if any(helper in " ".join(argv) for helper in _HELPERS):
        return  # multiprocessing's own helper: never device work, and it outlives the test
    meta: dict[str, Any] = {"command": " ".join(argv)[:300], "started": time.perf_counter_ns()}
    if os.environ.get("RANK", "").isdigit():
        meta["rank"] = int(os.environ["RANK"])
    # set before CUPTI starts (which may start the driver): the injection library, where
    # the driver loads it here too, leaves this process to cupti-python
    os.environ[injection.PYTHON_PID] = str(pid)
    capture, status = cupti_trace.start(nvtx=False)
    if capture is None:
        del os.environ[injection.PYTHON_PID]
        if os.path.isfile(os.environ.get(injection.INJECTION, "")):
            return  # the injection library records this process where it starts CUDA
        meta["refused"] = status
    _write(Path(folder) / f"{pid}.json", json.dumps(meta).encode())
    if capture is None:
        return
    _finish_at_every_end(pid, folder, capture)


def _finish_at_every_end(pid: int, folder: str, capture: Any) -> None:
    """Write the records however this process ends, short of SIGKILL or a crash: a normal
    exit (``atexit``), ``SIGTERM`` (``Pool.terminate``, ``with Pool()``, a supervisor) and
    ``os._exit`` (what forked workers and some frameworks end with). A second SIGTERM while
    the records are being written waits for them; a failure to write them is written
    instead (``PID.err``), so that the test says why rather than "lost"."""
    state = {"done": False, "busy": False}

    def finish() -> None:
        if state["done"] or state["busy"] or os.getpid() != pid:  # once; not in a forked copy
            return
        state["busy"] = True
        try:
            _write_records(pid, folder, capture)
        except Exception as e:
            with contextlib.suppress(OSError):
                _write(Path(folder) / f"{pid}.err", f"{type(e).__name__}: {e}".encode())
        finally:
            state["done"], state["busy"] = True, False

    atexit.register(finish)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        if state["busy"]:
            return  # the records are being written: the first SIGTERM's handler ends the process
        finish()
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread: atexit only
        signal.signal(signal.SIGTERM, on_term)
    real_exit = os._exit

    def _exit(status: int) -> NoReturn:
        finish()
        real_exit(status)

    os._exit = _exit


def _write_records(pid: int, folder: str, capture: Any) -> None:
    import numpy as np

    work, _ = capture.drain()
    rows = work.rows.copy()
    rows["stream"] = (pid << 32) | (rows["stream"] & 0xFFFFFFFF)  # streams of its own
    rows["span_id"], rows["thread"], rows["issued"] = -1, 0, 0  # no step of the test's issued them
    if not own_folder(folder):
        return  # the test ended before this process did: no one reads it, and no one else may
    try:
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as out:  # O_EXCL, 0600
            np.savez(out, rows=rows, names=np.array(work.names, dtype=str))
        os.replace(out.name, Path(folder) / f"{pid}.npz")
    except OSError:
        pass


def own_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is still the test's: a real folder (no link) of this user's that
    no one else can write in, as ``mkdtemp`` made it. A process that outlives its test finds
    it gone, or re-made by someone else, and writes nothing."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _write(path: Path, data: bytes) -> None:
    """``data`` as ``path``, whole: a new file of its own (never opened through a link or
    over one that is there), then renamed; nothing where the folder is no longer the test's."""
    if not own_folder(path.parent):
        return
    fd, tmp = tempfile.mkstemp(prefix=f"{path.stem}.", suffix=".tmp", dir=path.parent)  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
