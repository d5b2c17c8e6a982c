"""The ``cuda`` backend: CuPy streams, events, pool and kernels; device truth from CUPTI.

Device intervals come from CUPTI activity records (``truth = "cupti"``). Where CUPTI is
missing, taken by another profiler or switched off, they come from CUDA events recorded
at a step's edges (``truth = "events"``) on its ``stream=``, else on the stream the
calling thread's work goes to (PyTorch's or CuPy's current stream): a step's device time
is then the time between its two events, which cannot tell kernels from waits or see
work on other non-blocking streams. A window whose events saw nothing reports its device
figures as not measured, never as 0.

The backend runs the device work; what the device did is read by its ``source``
(``cuda_sources``): ``CuptiSource`` or ``EventsSource``, unless a registered source reads
it (``capture.sources``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Literal

import numpy as np

from pytest_gpuprof.capture.backends.base import CUDA, DeviceInfo
from pytest_gpuprof.capture.backends.cuda_kernels import KINDS, Kernel, Kernels
from pytest_gpuprof.capture.backends.cuda_sources import CuptiSource, EventsSource
from pytest_gpuprof.capture.clock import Clock, RealClock
from pytest_gpuprof.capture.trace_source import TraceSource


def unavailable(device: int) -> str | None:
    """Why CUDA device ``device`` cannot be used here, or ``None`` when it can."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'pytest-gpuprof[cuda13]')"
    except Exception as e:  # a broken CUDA install raises all sorts at import
        return f"CuPy failed to import: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"the CUDA runtime found no device ({e})"
    if count == 0:
        return "the CUDA runtime found no device"
    if not 0 <= device < count:
        return f"--gpu-device={device}, but only {count} device(s) are visible"
    return None


class CudaBackend:
    name: Literal["cuda"] = "cuda"
    kind = CUDA
    clock: Clock = RealClock()
    source: TraceSource

    def __init__(self, device: int, *, cupti: bool = True, nvtx: bool = True) -> None:
        import cupy

        self._cp = cupy
        self.index = device
        self._device = cupy.cuda.Device(device)
        with self._device:
            self._pool = cupy.get_default_memory_pool()
            self.default_stream = cupy.cuda.Stream(non_blocking=True)
        self._lock = threading.Lock()
        self._sources: dict[tuple[int, bool], Any] = {}
        self._kernels = Kernels(cupy, self._device)
        self._external: dict[int, Any] = {}
        capture, why = None, "off (--gpu-no-cupti)"
        if cupti:
            from pytest_gpuprof.capture import cupti_trace

            capture, why = cupti_trace.start(nvtx=nvtx)
        # unless a registered source reads it (``capture.sources``)
        self.source: TraceSource = CuptiSource(self, capture, why) if capture is not None else EventsSource(self, why)

    def info(self) -> DeviceInfo:
        cp = self._cp
        props = self.properties()
        driver = cp.cuda.runtime.driverGetVersion()
        from pytest_gpuprof.capture import nvml

        link = nvml.pcie_link(self.index)
        return DeviceInfo(
            backend="cuda",
            index=self.index,
            name=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
            memory_bytes=int(props["totalGlobalMem"]),
            driver=nvml.driver_version() or f"CUDA driver API {driver // 1000}.{driver % 1000 // 10}",
            pcie_gen=link[0] if link else None,
            pcie_width=link[1] if link else None,
            uuid=_uuid(props) or cp.cuda.Device(self.index).pci_bus_id,
        )

    def properties(self) -> dict[str, Any]:
        return dict(self._cp.cuda.runtime.getDeviceProperties(self.index))

    def context(self) -> int:
        """The device's CUDA context (what CUPTI's stream ids are scoped by)."""
        with self._device:
            return int(self._cp.cuda.driver.ctxGetCurrent())

    # streams and events
    def stream(self) -> Any:
        with self._device:
            return self._cp.cuda.Stream(non_blocking=True)

    def close_stream(self, stream: Any) -> None:
        with self._device:
            stream.synchronize()

    def _on(self, stream: Any) -> Any:
        return self.default_stream if stream is None else stream

    def record(self, stream: Any = None) -> Any:
        with self._device:
            event = self._cp.cuda.Event()
            event.record(self._on(stream))
            return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end))

    def wait(self, stream: Any, event: Any) -> None:
        with self._device:
            self._on(stream).wait_event(event)

    def synchronize(self, stream: Any = None) -> None:
        with self._device:
            if stream is None:
                self._device.synchronize()
            else:
                stream.synchronize()

    # memory
    def alloc(self, nbytes: int) -> Any:
        with self._device:
            return self._cp.empty(int(nbytes), dtype=self._cp.uint8)

    def trim(self) -> None:
        with self._device:
            self._pool.free_all_blocks()

    def memory_info(self) -> tuple[int, int]:
        with self._device:
            free, total = self._cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def memory_in_use(self) -> int:
        return int(self._pool.used_bytes())

    def _source(self, nbytes: int, pinned: bool) -> Any:
        # The user's data already sits in host memory before an upload: keep the source
        # of the latest size for each kind (pinned, pageable), so that the copy, not the
        # filling, is what gets timed.
        key = (nbytes, pinned)
        with self._lock:
            src = self._sources.get(key)
            if src is None:
                if pinned:
                    import cupyx

                    src = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
                else:
                    src = np.empty(nbytes, dtype=np.uint8)
                src.fill(7)
                self._sources = {k: v for k, v in self._sources.items() if k[1] != pinned}
                self._sources[key] = src
        return src

    def upload(self, nbytes: int, *, pinned: bool = True, stream: Any = None, out: Any = None) -> Any:
        with self._device:
            dst = out if out is not None else self.alloc(nbytes)
            dst[:nbytes].set(self._source(nbytes, pinned), stream=self._on(stream))
            return dst

    def download(self, buffer: Any, *, stream: Any = None) -> Any:
        import cupyx

        with self._device:
            host = cupyx.empty_pinned((buffer.nbytes,), dtype=np.uint8)
            buffer.get(stream=self._on(stream), out=host)
            return host

    # kernels
    def prepare(self) -> None:
        """Size every kernel kind now, so that no calibration lands inside a measured window."""
        for kind in KINDS:
            self._kernels.sizes(kind)

    def kernel_sizes(self, kind: str) -> tuple[Kernel, Kernel]:
        """The large and small kernel of ``kind`` that ``compute`` launches, with their
        calibrated device times."""
        return self._kernels.sizes(kind)

    def compute(self, ms: float, *, kind: str = "fft", stream: Any = None) -> None:
        large, small = self.kernel_sizes(kind)
        n_large = int(ms // large.ms)
        n_small = max(0, round((ms - n_large * large.ms) / small.ms))
        if n_large == 0 and n_small == 0:
            n_small = 1
        with self._device, self._on(stream):
            for _ in range(n_large):
                large.launch()
            for _ in range(n_small):
                small.launch()

    def current_stream(self) -> Any:
        """The stream the calling thread's own work goes to: PyTorch's current stream where
        PyTorch has started CUDA, else CuPy's (both the legacy default stream unless the
        code chose another, and that stream waits for every blocking stream)."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            ptr = int(torch.cuda.current_stream(self.index).cuda_stream)
        else:
            with self._device:
                ptr = int(self._cp.cuda.get_current_stream().ptr)
        if ptr == 0:
            return self._cp.cuda.Stream.null
        stream = self._external.get(ptr)
        if stream is None:
            stream = self._external[ptr] = self._cp.cuda.ExternalStream(ptr, self.index)
        return stream

    def close(self) -> None:
        try:
            self.synchronize()
        finally:
            self.source.close()
            self._pool.free_all_blocks()
            self._sources.clear()


def _uuid(props: dict[str, Any]) -> str:
    """The GPU's UUID from CUDA's device properties, as nvidia-smi prints it; "" where absent."""
    raw = props.get("uuid")
    if not isinstance(raw, bytes | bytearray) or len(raw) != 16:
        return ""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
