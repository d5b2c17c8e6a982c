"""What besides the code changes a kernel's time, as a baseline records it: the frameworks
and libraries the process loaded (never imported here), the CUDA runtime, the GPU's power
limit, the GPU itself (its UUID, hashed) and the host backend's clock. A comparison across a
changed environment names what changed (``baselines.gate.changed``)."""

from __future__ import annotations

import hashlib
import sys


def loaded_versions() -> dict[str, str]:
    """The versions of the kernel libraries this process has loaded (none is imported)."""
    out: dict[str, str] = {}
    modules = sys.modules
    torch = modules.get("torch")
    if torch is not None:
        out["torch"] = str(getattr(torch, "__version__", "?"))
        version = getattr(torch, "version", None)
        if getattr(version, "cuda", None):
            out["torch CUDA"] = str(version.cuda)  # type: ignore[union-attr]
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # a build without cuDNN
            cudnn = None
        if cudnn:
            out["cuDNN"] = str(cudnn)
    for name, label in (("triton", "Triton"), ("jax", "JAX"), ("jaxlib", "jaxlib"), ("cupy", "CuPy")):
        module = modules.get(name)
        if module is not None and getattr(module, "__version__", None):
            out[label] = str(module.__version__)
    cupy = modules.get("cupy")
    if cupy is not None:
        try:
            out["CUDA runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
            out["cuBLAS"] = str(cupy.cuda.cublas.getVersion(cupy.cuda.device.get_cublas_handle()))
        except Exception:  # no device, or a CuPy without them
            pass
    return out


def device_facts(cuda_index: int) -> dict[str, str]:
    """The GPU's hashed UUID and its enforced power limit, from NVML (nothing where NVML is
    not there)."""
    from pytest_gpuprof.capture import nvml

    out: dict[str, str] = {}
    uuid = nvml.uuid(cuda_index)
    if uuid:
        out["GPU"] = hashlib.sha256(uuid.encode()).hexdigest()[:12]
    try:
        pynvml = nvml.nvml_library()
        limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(nvml.device_handle(pynvml, cuda_index))
        out["power limit"] = f"{limit / 1000:.0f} W"
    except Exception:
        pass
    return out
