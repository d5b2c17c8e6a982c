"""CUPTI activity capture through ``cupti-python``: what the device did, in the host clock.

Kernel, memcpy and memset records are kept between ``drain`` calls, whatever library
(cuBLAS, cuFFT, CuPy) launched the work. Records carry their CUPTI stream id, by which a
copy is matched to the step that ran on its stream (``stream_id``).

CUPTI hands over full buffers on its own thread, in the middle of a measured window as
well. cupti-python builds a Python object for every record before its callback runs
(about 60 us a record on the H200, holding the GIL), so a window of many launches would
measure the profiler. The capture therefore registers its own buffer callbacks with the
libcupti that cupti-python loaded (``cupti_buffers.RawBuffers``, through ``ctypes``): the completed
callback only files the buffer away, and the records are read with numpy when the window
is drained, after its end (``unpack``). cupti-python does everything else (enable, flush,
timestamps, record dtypes). Where that library cannot be found, the capture falls back to
cupti-python's objects, and the header says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import statistics
import threading
import time
from typing import Any

import numpy as np

from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import RECORDS_LOST, DeviceInterval, Span
from pytest_gpuprof.capture.cupti_buffers import BUFFER_BYTES, RawBuffers
from pytest_gpuprof.capture.cupti_records import CALL, Markers, Record, calls_of, from_objects, records_of, unpack

# API calls kept from one drain to the next, waiting for the records of their device work
KEPT_CALLS = 100_000
# The driver calls recorded: those that issue device work, the step mark, and the kernel
# name lookup that CUDA 13's runtime makes inside each launch (PyTorch's launches are not
# recorded themselves: that call names their thread and time). Every other driver call
# (PyTorch makes ten ``cuDevicePrimaryCtxGetState`` an iteration) is switched off.
RECORDED_CALLS = re.compile(r"^cu(Launch\w*|Memcpy\w*|Memset\w*|GraphLaunch\w*|KernelGetName|DriverGetVersion)$")
# NVTX hands its calls to the library this names (read at a process's first NVTX call)
NVTX_INJECTION = "NVTX_INJECTION64_PATH"


def start(*, nvtx: bool = True) -> tuple[CuptiCapture | None, str]:
    """A running capture and 'live (how records are read)', or ``None`` and why CUPTI is off.
    ``nvtx``: record NVTX ranges (as steps)."""
    try:
        from cupti import cupti
    except ImportError:
        return None, "off (cupti-python is not installed: pip install 'pytest-gpuprof[cuda13]')"
    except Exception as e:
        return None, f"off (cupti-python failed to load: {e})"
    try:
        capture = CuptiCapture(cupti, library=libcupti, nvtx=nvtx)
    except Exception as e:  # taken by another profiler, no permission, version mismatch
        return None, f"off (CUPTI refused: {e})"
    return capture, f"live ({capture.reading})"


def libcupti() -> ctypes.CDLL:
    """The libcupti that this process already loaded (cupti-python's), else the system's."""
    return ctypes.CDLL(libcupti_path())


def libcupti_path() -> str:
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcupti.so" in line}
    if len(paths) == 1:
        return paths.pop()
    found = ctypes.util.find_library("cupti")
    if found is None or paths:
        raise OSError(f"which libcupti cupti-python uses is unclear: loaded {sorted(paths)}, found {found}")
    return found


def inject_nvtx(path: str) -> tuple[bool, str]:
    """Point NVTX at ``path`` (the libcupti loaded), so that CUPTI records the ranges of
    every library that makes its first NVTX call from now on: whether it did, and what the
    header says."""
    given = os.environ.get(NVTX_INJECTION)
    if given and os.path.realpath(given) != os.path.realpath(path):
        return False, (
            f"NVTX ranges not recorded: {NVTX_INJECTION}={given} names another library than the libcupti "
            f"in use ({path})"
        )
    os.environ[NVTX_INJECTION] = path
    return True, (
        "NVTX ranges as steps (a library that made its first NVTX call before the backend started, "
        "in a conftest or at import, is not seen)"
    )


class CuptiCapture:
    def __init__(
        self, cupti: Any, library: Any = None, *, correlate: bool = True, marker: Any = None, nvtx: bool = False
    ) -> None:
        """``library``: a function returning libcupti (``ctypes``) to receive buffers from
        CUPTI directly; without it, or where it fails, cupti-python's objects are read.
        ``correlate``: also record the driver calls that issued the work (buffers only);
        ``marker``: a function making the recorded call that marks a step's edge (by
        default ``cuDriverGetVersion``); ``nvtx``: record NVTX ranges (buffers only)."""
        self._cupti = cupti
        kinds = cupti.ActivityKind
        self._kernel, self._memcpy, self._memset = kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET
        self._kinds = {self._kernel: "kernel", self._memcpy: "memcpy", self._memset: "memset"}
        self._pageable = int(cupti.ActivityMemoryKind.PAGEABLE)
        self._copy_names = {int(k): k.name for k in cupti.ActivityMemcpyKind}
        self._layouts: dict[int, tuple[str, np.dtype]] = {}
        try:
            self._layouts = {
                int(self._kernel): ("kernel", cupti.activity_kernel10_dtype),
                int(self._memcpy): ("memcpy", cupti.activity_memcpy6_dtype),
                int(self._memset): ("memset", cupti.activity_memset4_dtype),
                # runtime and driver API records, where something enables them: walked over
                int(kinds.RUNTIME): ("api", cupti.activity_api_dtype),
                int(kinds.DRIVER): ("api", cupti.activity_api_dtype),
            }
        except AttributeError:  # a cupti-python without these record versions: read the objects
            pass
        self._names: dict[int, str] = {}  # kernel name pointer -> name (CUPTI shares one per kernel)
        self._lock = threading.Lock()
        self._records: list[Record] = []
        # how each delivered buffer was read: from CUPTI's buffer, as cupti-python's objects,
        # or not at all (bytes not laid out as the record dtypes say: its records are lost)
        self.deliveries = {"buffers": 0, "objects": 0, "unreadable": 0}
        self.dropped: int | None = 0  # every record CUPTI dropped; None: a count could not be read
        self.offset_ns = self._clock_offset()  # also loads libcupti, which ``library`` looks for
        self._raw: RawBuffers | None = None
        self.reading = "cupti-python's record objects, ~60 us a record"
        if library is not None and self._layouts:
            try:
                self._raw = RawBuffers(library())
                self.reading = "records read from CUPTI's buffers"
            except Exception as e:
                self.reading += f": CUPTI's buffers could not be taken directly ({e})"
        if self._raw is None:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._enabled = [self._kernel, self._memcpy, self._memset]
        # the launch and copy calls of unmatched device records wait here for the next drain
        self._calls = np.zeros(0, dtype=CALL)
        self._mark = marker
        self.correlating = correlate and self._raw is not None and self._trace_calls()
        self.markers = Markers()  # NVTX ranges, from the marker records
        self.nvtx = "NVTX off (--gpu-nvtx=off)"
        if nvtx and self._raw is not None:
            self.nvtx = self._trace_ranges()
        for kind in self._enabled:
            cupti.activity_enable(kind)

    def _trace_calls(self) -> bool:
        """Record driver API calls with the calling thread's system id: the record of a
        launch names the thread and time of the call that issued the kernel.

        Only driver calls: CUPTI 13.0 records no runtime calls of PyTorch's bundled CUDA
        runtime, and per-function selection is ignored once the kind is on (both seen on
        the H200, docs/performance-log.md). Work whose own call is not recorded (a runtime
        launch, a copy) lies, by its correlation id, between two recorded calls; the steps
        mark their edges with a driver call (``mark``), so two neighbours on one thread
        name the step that issued it."""
        cupti = self._cupti
        try:
            if self._mark is None:
                self._mark = _driver_mark()
            cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)  # = threading.get_native_id()
            cupti.activity_enable(cupti.ActivityKind.DRIVER)
        except Exception as e:
            self.reading += f"; launches not tied to steps ({e})"
            return False
        self._enabled.append(cupti.ActivityKind.DRIVER)
        self.reading += "; launches tied to the steps that issued them"
        self._mark_call = int(cupti.driver_api_trace_cbid.cuDriverGetVersion)
        try:
            off = record_only_work_calls(cupti)
        except Exception as e:
            self.reading += f" (every driver call recorded: switching some off failed: {e})"
        else:
            self.reading += f" (driver calls recorded: launches, copies, memsets, kernel names; {off} others off)"
        return True

    @property
    def kinds(self) -> list[Any]:
        """The activity kinds this capture enabled."""
        return list(self._enabled)

    def _trace_ranges(self) -> str:
        """Record NVTX ranges: CUPTI's marker records, through NVTX's injection."""
        cupti = self._cupti
        try:
            layout = cupti.activity_marker2_dtype
            path = libcupti_path()
        except Exception as e:
            return f"NVTX ranges not recorded ({e})"
        injected, status = inject_nvtx(path)
        if injected:
            self._layouts[int(cupti.ActivityKind.MARKER)] = ("marker", layout)
            self._enabled.append(cupti.ActivityKind.MARKER)
        return status

    def mark(self) -> None:
        """A recorded driver call at a step's edge (about 1 us): bounds the correlation ids
        of the work issued inside the step."""
        self._mark()

    def _clock_offset(self) -> int:
        """CUPTI timestamp minus ``perf_counter_ns``: median over reads bracketed tightly."""
        samples = []
        for _ in range(101):
            before = time.perf_counter_ns()
            stamp = self._cupti.get_timestamp()
            after = time.perf_counter_ns()
            samples.append(stamp - (before + after) // 2)
        return int(statistics.median(samples))

    # cupti-python's callbacks: the fallback
    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        # Records are only valid inside this callback: copy them out now.
        if not activities:
            return
        kept = self._from_objects(activities)
        self.deliveries["objects"] += 1
        with self._lock:
            self._records.extend(kept)

    def _from_buffers(self) -> DeviceWork:
        """The device work in the buffers CUPTI filled since the last drain, in the host clock,
        each tied to the call that issued it where that call was recorded."""
        assert self._raw is not None
        filled = self._raw.take()
        every: list[dict[str, np.ndarray]] = []
        try:
            for memory, valid in filled:
                tables = unpack(np.frombuffer(memoryview(memory).cast("B"), dtype=np.uint8, count=valid), self._layouts)
                if tables is None:
                    self.deliveries["unreadable"] += 1
                    continue
                self.deliveries["buffers"] += 1
                every.append(tables)
        finally:
            self._raw.give_back(filled)
        for tables in every:
            if "marker" in tables:
                self.markers.add(tables["marker"], self.offset_ns)
        calls = self._calls
        if self.correlating:
            calls = np.concatenate(
                [calls, *(calls_of(t["api"], self.offset_ns, self._mark_call) for t in every if "api" in t)]
            )
            calls = calls[np.argsort(calls["correlation_id"], kind="stable")]
        kept: list[DeviceWork] = []
        last = 0
        for tables in every:
            kernels = tables.get("kernel")
            if kernels is not None:
                for pointer in set(kernels["name"].tolist()) - self._names.keys():
                    self._names[pointer] = ctypes.string_at(pointer).decode(errors="replace") if pointer else ""
            kept.append(records_of(tables, self._names, self._copy_names, self._pageable, self.offset_ns, calls))
            if self.correlating:
                last = max(
                    [
                        last,
                        *(
                            int(t["correlation_id"].max())
                            for k, t in tables.items()
                            if k not in ("api", "marker") and len(t)
                        ),
                    ]
                )
        # the calls of work not read yet (and the neighbour before them) wait for the next drain
        self._calls = calls[max(int(np.searchsorted(calls["correlation_id"], last)) - 1, 0) :][-KEPT_CALLS:]
        return DeviceWork.join(kept)

    def _from_objects(self, activities: list[Any]) -> list[Record]:
        return from_objects(activities, self._kinds, self._pageable, self._copy_names)

    def ranges(self) -> tuple[list[Span], list[Span]]:
        """The NVTX ranges that ended since the last call, and those open now (their end
        is their start), as drained."""
        return self.markers.take()

    def stream_id(self, context: int, stream: int) -> int:
        """CUPTI's id of a CUDA stream handle, as activity records name it."""
        return int(self._cupti.get_stream_id_ex(context, stream, 0))

    def _flush(self) -> DeviceWork:
        """Everything CUPTI recorded until now, in the host clock."""
        self._cupti.activity_flush_all(1)  # forced: hands over partly filled buffers too
        with self._lock:
            records, self._records = self._records, []
        offset = self.offset_ns
        objects = DeviceWork.of(
            DeviceInterval(kind, start - offset, end - offset, stream, name, nbytes, pageable)
            for kind, start, end, stream, name, nbytes, pageable in records
        )
        if self._raw is None:
            return objects
        return DeviceWork.join([objects, self._from_buffers()])

    def drain(self) -> tuple[DeviceWork, list[str]]:
        """Flush CUPTI's buffers; every record since the last drain, in the host clock."""
        unreadable = self.deliveries["unreadable"]
        out = self._flush()
        notes = []
        dropped = self._dropped()
        if isinstance(dropped, str):  # unknown is never zero: a loss would go unseen
            self.dropped = None
            notes.append(f"CUPTI's count of dropped records could not be read ({dropped}): a loss would go unseen")
        elif dropped:
            self.dropped = None if self.dropped is None else self.dropped + dropped
            notes.append(f"{RECORDS_LOST}CUPTI dropped {dropped:,} activity records, so device time is undercounted")
        if self.deliveries["unreadable"] > unreadable:
            lost = self.deliveries["unreadable"] - unreadable
            notes.append(f"{RECORDS_LOST}{lost} CUPTI buffer(s) not laid out as the record types say")
        return out, notes

    def _dropped(self) -> int | str:
        """Records CUPTI dropped since the last call (its count restarts when read), or why
        the count could not be read."""
        count = np.zeros(1, dtype=np.uint64)
        try:
            self._cupti.activity_get_num_dropped_records(0, 0, count.ctypes.data)
        except Exception as e:  # cupti-python's errors, or a binding without the call
            return f"{type(e).__name__}: {e}"[:200]
        return int(count[0])

    def reset(self) -> None:
        """Forget everything recorded so far (a test starts): the ranges that ended too;
        those still open stay open."""
        self._flush()
        self.markers.take()

    def stop(self) -> None:
        self._flush()
        for kind in self._enabled:
            self._cupti.activity_disable(kind)


def record_only_work_calls(cupti: Any) -> int:
    """Switch off the driver API records of every function but ``RECORDED_CALLS``; how
    many were switched off. Called after the DRIVER kind is enabled: per-function choices
    made before it are overridden by it."""
    off = 0
    for name, cbid in cupti.driver_api_trace_cbid.__members__.items():
        if name not in ("INVALID", "SIZE", "FORCE_INT") and not RECORDED_CALLS.match(name):
            cupti.activity_enable_driver_api(int(cbid), 0)
            off += 1
    return off


def _driver_mark() -> Any:
    """``cuDriverGetVersion`` of the process's libcuda through ``ctypes``: a driver call
    that CUPTI records and that libraries seldom make. Called with the GIL held
    (``PyDLL``): a call of a microsecond needs no release, and a release at every step edge
    hands the GIL to whichever thread waits for it (the stack sampler, NVML's), on the
    measured thread's time."""
    cuda = ctypes.PyDLL("libcuda.so.1")
    version = ctypes.c_int()
    call, out = cuda.cuDriverGetVersion, ctypes.byref(version)
    return lambda: call(out)
