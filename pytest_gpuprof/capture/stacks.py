"""Sampled Python stacks: where each thread of the host is, every ``period`` seconds,
while a test is measured (``analysis.host_code`` charges them against the idle).

A background thread with SIGINT blocked reads ``sys._current_frames()`` and cuts each
stack to what explains it: the innermost frame of the user's code (outside the standard
library, site-packages and this plugin) and the library function it called
(``_called``), as in ``test_train.py:17 epoch > torch/utils/data/dataloader.py:_next_data``.
A stack with no user frame is named by its innermost function. Strings are built once
per place.

The plugin's own threads (NVML, the host backend's device threads) are not sampled.
"""

from __future__ import annotations

import bisect
import functools
import gc
import os
import signal
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, FrameType

from pytest_gpuprof.analysis.model import HostSample

# 1 ms between rounds (docs/performance-log.md: its cost on the H200)
PERIOD_S = 0.001
# threads of the plugin itself, by name
OWN_THREADS = ("gpuprof-nvml", "gpuprof-host-", "gpuprof-stacks")
_PLUGIN = str(Path(__file__).resolve().parents[1])


@functools.cache
def library_roots() -> tuple[str, ...]:
    """Folders whose code is a library's, not the user's: the standard library,
    site-packages and this plugin (once a process: sysconfig takes milliseconds to ask)."""
    roots = {_PLUGIN}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(str(Path(path).resolve()))
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(str(Path(path).resolve()))
    return tuple(sorted(roots, key=len, reverse=True))


class Places:
    """A frame's file seen as the user's or a library's, and the name a person reads."""

    def __init__(self, roots: tuple[str, ...] | None = None, here: str | None = None) -> None:
        self._roots = roots if roots is not None else library_roots()
        self._here = here if here is not None else os.getcwd()
        self._files: dict[str, tuple[bool, str]] = {}
        self._places: dict[tuple[CodeType, int, CodeType | None], str] = {}
        self._tops: dict[CodeType, str] = {}

    def _file(self, filename: str) -> tuple[bool, str]:
        """Whether ``filename`` is the user's, and how it is shown: a library's relative
        to its root (``torch/utils/data/dataloader.py``), the user's to the working folder."""
        known = self._files.get(filename)
        if known is not None:
            return known
        if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
            known = (False, filename)
        else:
            path = os.path.realpath(filename)
            root = next((r for r in self._roots if path.startswith(r + os.sep)), None)
            if root is None and ("site-packages" in path or "dist-packages" in path):
                root = path[: path.rindex("-packages") + len("-packages")]
            if root is not None:
                known = (
                    False,
                    os.path.relpath(path, root) if root != _PLUGIN else "pytest_gpuprof/" + os.path.relpath(path, root),
                )
            else:
                shown = (
                    os.path.relpath(path, self._here)
                    if path.startswith(self._here + os.sep)
                    else os.path.basename(path)
                )
                known = (True, shown)
        self._files[filename] = known
        return known

    def of(self, frame: FrameType) -> str:
        """The place a thread's stack (``frame``: its innermost) stands for."""
        below: list[CodeType] = []  # the library frames under the user's, innermost first
        at: FrameType | None = frame
        while at is not None:
            code = at.f_code
            if self._file(code.co_filename)[0]:
                break
            below.append(code)
            at = at.f_back
        if at is None:
            code = frame.f_code
            top = self._tops.get(code)
            if top is None:
                top = self._tops[code] = f"{self._file(code.co_filename)[1]}:{code.co_name}"
            return top
        under = _called(below)
        key = (at.f_code, at.f_lineno, under)
        place = self._places.get(key)
        if place is None:
            code = at.f_code
            place = f"{self._file(code.co_filename)[1]}:{at.f_lineno} {code.co_name}"
            if under is not None:
                place += f" > {self._file(under.co_filename)[1]}:{under.co_name}"
            self._places[key] = place
        return place

    def of_frames(self, frames: Sequence[tuple[str, int, str]]) -> str:
        """The place a recorded stack stands for (``frames``: file, line, function, innermost
        first, as an allocator's history keeps them): the user's innermost frame, with the
        library function it called; the innermost frame's function where none is the user's."""
        for i, (filename, line, name) in enumerate(frames):
            mine, shown = self._file(filename)
            if not mine:
                continue
            place = f"{shown}:{line} {name}"
            if i > 0:
                lib_file, _, lib_name = frames[i - 1]
                place += f" > {self._file(lib_file)[1]}:{lib_name}"
            return place
        if not frames:
            return "(no Python frame)"
        filename, _, name = frames[0]
        return f"{self._file(filename)[1]}:{name}"


def _called(below: list[CodeType]) -> CodeType | None:
    """The library function that stands for what the user's frame called (``below``: the
    library frames under it, innermost first): the one it called, or, where that is a
    dunder method (``__next__``, ``__iter__``), the nearest named function of the same
    file under it, past any decorator's wrapper from another file (``_next_data``)."""
    if not below:
        return None
    entry = below[-1]
    if not _dunder(entry.co_name):
        return entry
    named = (c for c in reversed(below) if c.co_filename == entry.co_filename and not _dunder(c.co_name))
    return next(named, entry)


def _time(sample: HostSample) -> int:
    return sample.time


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class StackSampler:
    """Samples every other thread's stack while armed (a profiler is live)."""

    def __init__(self, period_s: float | None = None) -> None:
        self.period_s = PERIOD_S if period_s is None else period_s
        self._places = Places()
        self._lock = threading.Lock()
        self._samples: list[HostSample] = []
        self._armed = 0
        self._wake = threading.Event()
        self._stopped = False
        self._natives: dict[int, int | None] = {}  # thread ident -> native id (None: not sampled)
        self.thread = threading.Thread(target=self._run, name="gpuprof-stacks", daemon=True)
        self.thread.start()

    def arm(self) -> None:
        with self._lock:
            self._armed += 1
            self._wake.set()

    def disarm(self) -> None:
        with self._lock:
            self._armed = max(self._armed - 1, 0)
            if not self._armed:
                self._wake.clear()
                self._samples.clear()

    def samples(self, lo: int, hi: int) -> list[HostSample]:
        """The samples taken in ``[lo, hi]`` (host clock, ns; kept in time order)."""
        with self._lock:
            first = bisect.bisect_left(self._samples, lo, key=_time)
            last = bisect.bisect_right(self._samples, hi, key=_time)
            return self._samples[first:last]

    def forget(self, before: int) -> None:
        """Drop the samples older than ``before`` (a window was cut and is kept)."""
        with self._lock:
            del self._samples[: bisect.bisect_left(self._samples, before, key=_time)]

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self.thread.join(timeout=1.0)

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # Ctrl-C belongs to the test
        own = threading.get_ident()
        while not self._stopped:
            self._wake.wait()
            if self._stopped:
                return
            taken = self._round(own)
            with self._lock:
                if self._armed:
                    self._samples.extend(taken)
            time.sleep(self.period_s)

    def _round(self, own: int) -> list[HostSample]:
        """One sample of every thread but ``own`` and the plugin's, stamped with one time."""
        now = time.perf_counter_ns()
        taken = []
        for ident, frame in _current_frames().items():
            if ident == own:
                continue
            native = self._natives.get(ident, 0)
            if native == 0:
                native = self._native(ident)
            if native is not None:
                taken.append(HostSample(now, native, self._places.of(frame)))
        return taken

    def _native(self, ident: int) -> int | None:
        """The native id of a thread to sample, ``None`` for the plugin's own threads."""
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        native = None
        if thread is not None and not thread.name.startswith(OWN_THREADS):
            native = thread.native_id
        if len(self._natives) > 10_000:
            self._natives.clear()
        self._natives[ident] = native
        return native


def _current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the collector held off where CPython needs it: before
    3.12 a collection that starts while it holds the thread list's lock can free an object
    that takes the lock again, and the process hangs with the GIL held (CPython gh-106883;
    seen here as a CI suite that stopped at 91% for good). Only where the collector was on,
    and back on whatever happens."""
    if sys.version_info >= (3, 12) or not gc.isenabled():
        return sys._current_frames()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        gc.enable()
