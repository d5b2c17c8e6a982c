"""What each capture source can see, by the name a window's ``truth`` carries.

The pure layer reads these capabilities, never a source's name: a window measured by a
source that sees no kernels is "not measured", a source that knows the SMs gives SM use, a
source that slows each launch notes launch-bound windows. Reports keep only the name, so
the built-in kinds are declared here, and a new source declares its own with ``register``
(``capture.sources`` registers the source that produces it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceKind:
    name: str
    # each kernel's own interval; else only the span between a step's edges (all of it
    # device time, kernels and waits not told apart)
    sees_kernels: bool = True
    # copies (or, where only edges are seen, the span of a step that moves bytes); else a
    # window's copy time is not seen, never 0
    sees_copies: bool = True
    # NVTX ranges become steps
    nvtx: bool = False
    # why SM use is not measured where the source gives no SM limits
    no_sms: str = "the source does not say which SMs a kernel used"
    # what tracing adds to each kernel launch, where it adds anything (the launch-bound note)
    launch_cost: str | None = None


CUPTI = SourceKind(
    "cupti",
    nvtx=True,
    no_sms="the device's SM limits are not known",
    launch_cost="CUPTI's tracing adds about 2 us to each launch (2.0-2.6 us on an H200)",
)
EVENTS = SourceKind(
    "events",
    sees_kernels=False,
    no_sms="CUDA events do not see kernels, only the span between a step's edges",
)
HOST = SourceKind("host", no_sms="the host backend runs on a CPU, which has no SMs")

_KINDS: dict[str, SourceKind] = {k.name: k for k in (CUPTI, EVENTS, HOST)}


def register(kind: SourceKind) -> SourceKind:
    """Declare a source's capabilities; a name is declared once (the same kind again is fine)."""
    known = _KINDS.setdefault(kind.name, kind)
    if known != kind:
        raise ValueError(f"capture source {kind.name!r} is declared twice, differently: {known} and {kind}")
    return kind


def kind_of(name: str) -> SourceKind:
    """The capabilities of the source named ``name``; a name never declared (a report from a
    source this process does not load) sees kernels and copies and nothing more."""
    return _KINDS.get(name) or SourceKind(name)
