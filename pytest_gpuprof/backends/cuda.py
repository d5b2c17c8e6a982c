"""The ``cuda`` backend (CuPy), filled in below."""

from __future__ import annotations


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
