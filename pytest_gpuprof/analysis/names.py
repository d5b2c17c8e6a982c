"""Kernel names as a person reads them: C++ symbols demangled by the C++ runtime's own
demangler (``__cxa_demangle`` of libstdc++), as Nsight Systems shows them.

The mangled name stays beside it (``KernelSummary.mangled``) for matching across runs. A
name that is not a C++ symbol (``fft``, ``sm80_xmma_gemm_...``), or a machine without
libstdc++, keeps the name as it came.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _demangler() -> Any:
    path = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    demangle = library.__cxa_demangle
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_int),
    ]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return demangle, free


@functools.lru_cache(maxsize=4096)
def readable(name: str) -> str:
    """``name`` demangled where it is a C++ symbol, else as it is."""
    if not name.startswith("_Z"):
        return name
    found = _demangler()
    if found is None:
        return name
    demangle, free = found
    status = ctypes.c_int(0)
    out = demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        free(out)
