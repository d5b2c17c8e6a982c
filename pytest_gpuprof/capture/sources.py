"""The seam for what says what the device did: a capture source beside the device operations.

A backend runs the workloads' device work; its ``source`` says what the device did. A
source is a small object: what it can see (``kind``, declared in ``analysis.sources``, read
by the pure layer) and how its records are read (``begin``, ``drain``, ``ranges``; the
step-edge hooks where it needs them). ``TraceSource`` gives every hook a default, so a
source that reads a record stream implements ``drain`` and little else.

Adding one is one module and one registration line::

    sources.register(KIND, lambda backend: MySource(backend) if not backend.kind.gpu else None)

When a backend starts, the latest registered factory that returns a source for it wins;
where none does, the backend keeps its own (the host backend's stamps; CUPTI or CUDA
events, which the CUDA backend reads itself).
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.capture.backends.base import Backend
from pytest_gpuprof.capture.trace_source import TraceSource

__all__ = ["Factory", "TraceSource", "attach", "register", "unregister"]


Factory = Callable[[Backend], "TraceSource | None"]
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


def attach(backend: Backend) -> TraceSource | None:
    """The registered source that reads ``backend`` (the latest that takes it); None: the
    backend's own reads it."""
    for factory in reversed(_FACTORIES):
        source = factory(backend)
        if source is not None:
            return source
    return None
