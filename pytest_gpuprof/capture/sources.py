"""The seam for what says what the device did: a capture source beside the device operations.

A backend runs the workloads' device work; its ``source`` says what the device did. A
source is a small object: what it can see (``kind``, declared in ``analysis.sources``, read
by the pure layer) and how its records are read (``begin``, ``drain``, ``ranges``; the
step-edge hooks where it needs them). ``TraceSource`` gives every hook a default, so a
source that reads a record stream implements ``drain`` and little else.

Adding one is one module and one registration line::

    sources.register(KIND, lambda backend: MySource(backend) if backend.name == "host" else None)

When a backend starts, the latest registered factory that returns a source for it wins; the
built-in ones (the host backend's own stamps; CUPTI or CUDA events, which the CUDA backend
reads itself) are registered first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import Span

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.occupancy import SmLimits
    from pytest_gpuprof.capture.backends.base import Backend


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


Factory = Callable[["Backend"], "TraceSource | None"]
_FACTORIES: list[Factory] = []


def register(kind: kinds.SourceKind, factory: Factory) -> Factory:
    """Offer a source to every backend started from now on: ``factory(backend)`` returns one
    for the backends it reads (or None); ``kind`` is what its windows' ``truth`` names."""
    kinds.register(kind)
    _FACTORIES.append(factory)
    return factory


def unregister(factory: Factory) -> None:
    if factory in _FACTORIES:
        _FACTORIES.remove(factory)


def attach(backend: Backend) -> TraceSource:
    """The source that reads ``backend``: the latest registered that takes it."""
    for factory in reversed(_FACTORIES):
        source = factory(backend)
        if source is not None:
            return source
    raise RuntimeError(f"no capture source reads the {backend.name} backend")
