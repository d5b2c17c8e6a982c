"""What a capture source is: what it can see (``kind``) and how its records are read.

Every hook but ``drain`` has a default, so a source that reads a record stream implements
``drain`` and little else; ``capture.sources`` registers sources and picks one per backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import Span

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.occupancy import SmLimits


class TraceSource:
    """What the device did, as this source records it; every hook but ``drain`` optional."""

    kind: kinds.SourceKind

    def status(self) -> str:
        """How the records are read, for the session's header ('live', or 'off (why)')."""
        return "live"

    def begin(self) -> None:
        """A test or window starts: forget what came before."""

    def drain(self) -> tuple[DeviceWork, list[str]]:
        """Everything the device finished since ``begin``/the last drain, and notes on gaps."""
        raise NotImplementedError

    def ranges(self) -> tuple[list[Span], list[Span]]:
        """NVTX ranges that ended since the last call (as steps), and those open now."""
        return [], []

    def open_span(self, span_id: int, stream: Any, *, copy: bool = False) -> Any:
        """A host step starts: tag the device work it launches; returns a token for
        ``close_span`` (``copy``: the step moves bytes)."""
        return None

    def close_span(self, token: Any) -> None:
        return None

    def stream_id(self, stream: Any) -> int | None:
        """The id that this source's device intervals give ``stream``."""
        return None

    def sm_limits(self) -> SmLimits | None:
        """The device's SMs, where this source's kernel records carry their geometry."""
        return None

    def close(self) -> None:
        return None
