"""Backends run device work and report what the device did, as ``DeviceWork``.

``host`` runs on the CPU (always available); ``cuda`` runs on CuPy and reads CUPTI
activity records or, failing that, CUDA events. Backends only produce timelines.
"""

from __future__ import annotations

from pytest_gpuprof.capture import sources
from pytest_gpuprof.capture.backends.base import CUDA, HOST, KINDS, Backend, DeviceInfo, Kind

__all__ = ["CUDA", "HOST", "KINDS", "Backend", "DeviceInfo", "Kind", "create", "cuda_device_count", "select"]


def select(asked: str, device: int) -> tuple[Kind, str]:
    """Which backend ``--gpu-backend=asked`` (auto, cuda or host) means here, and why;
    creates nothing."""
    if asked == HOST.name:
        return HOST, "asked for with --gpu-backend=host"
    from pytest_gpuprof.capture.backends import cuda

    reason = cuda.unavailable(device)
    if reason is None:
        return CUDA, f"CUDA device {device} is visible"
    if asked == CUDA.name:
        raise RuntimeError(f"--gpu-backend=cuda, but {reason}")
    return HOST, f"no CUDA device: {reason}"


def cuda_device_count() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def create(kind: Kind | str, device: int, *, cupti: bool, clock: str = "real", nvtx: bool = True) -> Backend:
    """The backend of ``kind`` (or its name), read by its own capture source or a registered
    one (``capture.sources``)."""
    backend: Backend
    if (KINDS[kind] if isinstance(kind, str) else kind) is CUDA:
        from pytest_gpuprof.capture.backends.cuda import CudaBackend

        backend = CudaBackend(device, cupti=cupti, nvtx=nvtx)
    else:
        from pytest_gpuprof.capture import clock as clocks
        from pytest_gpuprof.capture.backends.host import HostBackend

        backend = HostBackend(clocks.make(clock))
    try:
        registered = sources.attach(backend)
    except BaseException:
        backend.close()
        raise
    if registered is not None:
        backend.source = registered
    return backend
