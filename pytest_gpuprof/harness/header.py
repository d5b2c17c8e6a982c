"""The session header's lines: which backend and why, the device, what reads it (CUPTI,
NVML, GPM, child processes), and how budgets are applied."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from pytest_gpuprof.analysis.model import GIB
from pytest_gpuprof.analysis.sources import CUPTI
from pytest_gpuprof.harness import xdist
from pytest_gpuprof.harness.touch import NOT_STARTED

if TYPE_CHECKING:
    from pytest_gpuprof.harness.runtime import DeviceRuntime


def header(runtime: DeviceRuntime) -> list[str]:
    """The lines pytest prints under its own header (and a late-started run in the summary)."""
    if not runtime.chosen:
        return [NOT_STARTED]
    s = runtime.settings
    lines = [f"gpuprof: backend {runtime.kind.name} ({runtime.backend_reason})"]
    if runtime.placed is not None:
        lines.append(runtime.placed.describe(xdist.of(runtime.config).worker or "?"))
    if runtime.kind.gpu and not runtime.runs_tests:
        why = "--collect-only" if runtime.config.option.collectonly else "each pytest-xdist worker starts its own"
        lines.append(f"gpuprof: device not started here ({why})")
    elif runtime.kind.gpu:
        info = runtime.backend.info()
        lines.append(
            f"gpuprof: device {info.index} {info.name}, {info.memory_bytes / GIB:.0f} GiB, "
            f"driver {info.driver}, PCIe {info.pcie}"
        )
        lines.append(
            f"gpuprof: truth {runtime.backend.source.kind.name}; CUPTI {runtime.backend.source.status()}; NVML {runtime.nvml_status()}; "
            f"GPM {runtime.gpm_status}"
        )
        if s.children and runtime.backend.source.kind == CUPTI:
            lines.append(_children_line())
    else:
        clock = (
            "virtual clock (kernels and copies take exactly the time asked, host code none)"
            if s.host_clock == "virtual"
            else "real clock (figures vary with this machine's load: --gpu-host-clock=virtual, or "
            'host_clock = "virtual" in [tool.gpuprof], for CPU-only CI)'
        )
        lines.append(
            f"gpuprof: device host CPU ({platform.machine()}): workloads run on CPU threads, {clock}, "
            "truth 'host'; CUPTI off (no GPU); NVML off (no GPU)"
        )
    mode = "enforced (--gpu-budget)" if s.enforce else "reported as warnings (no --gpu-budget)"
    if s.disabled:
        mode = "off: --gpu-disable runs the code once and measures and judges nothing"
    where = f"; config {s.pyproject}" if s.pyproject else ""
    lines.append(f"gpuprof: budgets {mode}; rounds {s.rounds}, warmup {s.warmup}{where}")
    return lines


def _children_line() -> str:
    from pytest_gpuprof.capture import injection

    library, how = injection.library()
    native = f"native ones by the injection library ({how})" if library else f"native ones not traced ({how})"
    return f"gpuprof: the processes a test starts: Python ones traced by their start-up hook, {native}"
