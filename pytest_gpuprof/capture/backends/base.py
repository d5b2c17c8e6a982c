"""What a backend is: the device operations the workloads are written against, and what
the device is (``DeviceInfo``). What the device did is a capture source's (``capture.sources``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pytest_gpuprof.analysis.model import GIB, MIB
from pytest_gpuprof.capture.clock import Clock
from pytest_gpuprof.capture.trace_source import TraceSource


@dataclass(frozen=True, slots=True)
class Kind:
    """What a kind of backend can do: the session asks this, never the backend's name."""

    name: Literal["cuda", "host"]
    # a GPU: numbered devices, a host-wide UUID, NVML and GPM to sample, CUPTI, traced children
    gpu: bool
    # the clocks it runs on (``--gpu-host-clock``); a virtual one makes figures load-free
    clocks: tuple[str, ...]
    # the workloads' default upload (the seed's 4 GiB partition on a GPU)
    upload_bytes: int
    # what a bandwidth calibration copies: 1 GiB reaches a PCIe Gen5 link's plateau, the
    # CPU plateaus far earlier
    calibration_bytes: int
    # kernel time per partition as a multiple of its measured pinned upload time. On a GPU,
    # the seed's proportions: ~86 ms of kernels per 4 GiB partition, whose upload takes
    # ~78 ms at the H200's 55 GB/s. On the host backend the copy engine and the kernels share
    # the same cores and memory bus, so copies slow down while kernels run; twice the upload
    # time keeps the two-lock pipeline kernel-bound there, as it is on the GPU.
    compute_per_upload: float

    def virtual(self, clock: str) -> bool:
        """Whether ``clock`` (``--gpu-host-clock``) runs this backend on virtual time."""
        return clock == "virtual" and "virtual" in self.clocks


CUDA = Kind(
    "cuda", gpu=True, clocks=("real",), upload_bytes=4 * GIB, calibration_bytes=1024 * MIB, compute_per_upload=1.1
)
HOST = Kind(
    "host",
    gpu=False,
    clocks=("real", "virtual"),
    upload_bytes=64 * MIB,
    calibration_bytes=64 * MIB,
    compute_per_upload=2.0,
)
KINDS: dict[str, Kind] = {kind.name: kind for kind in (CUDA, HOST)}


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
    """The device operations the workloads are written against; what the device did is its
    ``source``'s to say (``capture.sources``)."""

    @property
    def name(self) -> Literal["cuda", "host"]: ...

    # what it can do (``Kind``): what callers ask instead of its name
    kind: Kind

    default_stream: Any
    # the time of every stamp, and the locks, events and threads that wait on it
    clock: Clock
    # what says what the device did (``capture.sources.attach`` picks it when the backend starts)
    source: TraceSource

    def info(self) -> DeviceInfo: ...

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

    def close_stream(self, stream: Any) -> None: ...

    def close(self) -> None:
        """Stop the device work, then its source (which then has seen all of it)."""
        ...
