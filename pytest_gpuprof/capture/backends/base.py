"""What a backend is: the device operations the workloads are written against, and what
the device is (``DeviceInfo``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import Span, Truth
from pytest_gpuprof.analysis.occupancy import SmLimits
from pytest_gpuprof.capture.clock import Clock


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the device is; bandwidths are measured (``gpu_device`` calibrates them)."""

    backend: Literal["cuda", "host"]
    index: int
    name: str
    memory_bytes: int
    driver: str = ""
    pcie_gen: int | None = None
    pcie_width: int | None = None
    # what identifies the device on this host, whatever CUDA_VISIBLE_DEVICES numbers it
    uuid: str = ""

    @property
    def pcie(self) -> str:
        return f"{self.pcie_gen}x{self.pcie_width}" if self.pcie_gen and self.pcie_width else "none"


class Backend(Protocol):
    """The device operations the workloads are written against."""

    @property
    def name(self) -> Literal["cuda", "host"]: ...

    @property
    def truth(self) -> Truth: ...

    default_stream: Any
    # the time of every stamp, and the locks, events and threads that wait on it
    clock: Clock

    def info(self) -> DeviceInfo: ...

    def cupti_status(self) -> str:
        """'live', or 'off (why)'."""
        ...

    def sm_limits(self) -> SmLimits | None:
        """The device's SMs, where it has them and its intervals carry kernel geometry."""
        ...

    def stream(self) -> Any:
        """A new stream; work on one stream runs in submission order."""
        ...

    def record(self, stream: Any) -> Any:
        """An event that completes when the stream's earlier work has."""
        ...

    def wait(self, stream: Any, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` on the device, not on the host."""
        ...

    def synchronize(self, stream: Any = None) -> None:
        """Block the host until ``stream`` (or the whole device) is idle."""
        ...

    def alloc(self, nbytes: int) -> Any:
        """Device memory from the pool."""
        ...

    def upload(self, nbytes: int, *, pinned: bool = True, stream: Any = None, out: Any = None) -> Any:
        """Copy ``nbytes`` host to device; asynchronous on ``stream`` when pinned."""
        ...

    def download(self, buffer: Any, *, stream: Any = None) -> Any:
        """Copy ``buffer`` device to host into pinned memory; asynchronous on ``stream``."""
        ...

    def prepare(self) -> None:
        """Get ready for ``compute`` (size its kernels) outside any measured window."""
        ...

    def compute(self, ms: float, *, kind: str = "fft", stream: Any = None) -> None:
        """Launch about ``ms`` of kernels on ``stream``; returns once launched."""
        ...

    def trim(self) -> None:
        """Release the pool's unused blocks to the device."""
        ...

    def memory_info(self) -> tuple[int, int]:
        """Free and total device memory, in bytes."""
        ...

    def memory_in_use(self) -> int:
        """Bytes held by live buffers of this backend's pool."""
        ...

    def begin(self) -> None:
        """Start keeping device intervals (a test or window starts)."""
        ...

    def drain(self) -> tuple[DeviceWork, list[str]]:
        """Everything the device finished since ``begin``/the last drain, and notes on gaps."""
        ...

    def ranges(self) -> tuple[list[Span], list[Span]]:
        """The NVTX ranges that ended since the last call (as steps at depth 0), and those
        open now (ending where they started); none where the backend sees no NVTX."""
        ...

    def open_span(self, span_id: int, stream: Any, *, copy: bool = False) -> Any:
        """A host step starts: tag the device work it launches; returns a token.

        ``copy``: the step moves bytes (where only its edges are seen, its device time
        counts as a copy, not as kernels)."""
        ...

    def close_span(self, token: Any) -> None: ...

    def stream_id(self, stream: Any) -> int | None:
        """The id that this backend's device intervals give ``stream``."""
        ...

    def close_stream(self, stream: Any) -> None: ...

    def close(self) -> None: ...
