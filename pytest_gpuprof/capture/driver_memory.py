"""Device memory as the CUDA driver hands it out, for code whose allocator the plugin
cannot read: JAX (XLA), Numba, cuda-python.

A ``DriverSource`` subscribes to CUPTI's callbacks on the driver's allocation calls and
counts each one as it returns, in the thread that made it: its size, the line of the
user's code that caused it, the step open there. The runtime's ``cudaMalloc`` and
``cudaFree`` reach the driver's ``cuMemAlloc_v2`` and ``cuMemFree_v2`` (seen on the H200),
so the driver's calls alone see every allocation once. Virtual memory, as XLA allocates it,
is counted where it is backed: ``cuMemMap`` adds the mapped range, ``cuMemUnmap`` takes it
away. What the process allocated before the source began is not counted, and freeing it
changes nothing.

JAX under its platform allocator needs it (``jax_memory.for_jax``): each array its own
mapping. The callbacks cost each allocation some Python (a loop of small jitted steps ran
twice as long on the H200), so they are followed only where the test gates memory, as
CuPy's allocation hook is.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

from pytest_gpuprof.capture.memory_sources import Counted, Reading

# the driver's calls, by how their parameters give the address and the size (CUDA's
# ``*_params`` structs: each field a 64-bit word here)
_ALLOCS = (  # CUdeviceptr *dptr; size_t bytesize; ...
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
)
_PITCHED = ("cuMemAllocPitch_v2",)  # CUdeviceptr *dptr; size_t *pPitch; size_t width; size_t height; ...
_MAPS = ("cuMemMap",)  # CUdeviceptr ptr; size_t size; ...
_FREES = ("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemUnmap")  # CUdeviceptr ptr; ...
# CUpti_CallbackData: callbackSite, functionName, then functionParams at byte 16
_PARAMS_AT = 16

NOTE = (
    "read from the driver's allocation calls (cuMemAlloc, cuMemMap and kin): a pool counts as it grows, "
    "and what was allocated before the test is not counted"
)
OUTSIDE = "(a thread outside Python)"


def _word(address: int, index: int) -> int:
    return int(ctypes.c_uint64.from_address(address + 8 * index).value)


class DriverSource(Counted):
    """Each allocation the driver makes in this process while subscribed. It replaces the
    frameworks' sources (``memory.Discovery``): they would count the same memory again."""

    name = "driver"
    note = NOTE

    def __init__(self, tick: Callable[[], int], cupti: Any) -> None:
        super().__init__(tick, 0)
        self._cupti = cupti
        self._exit = int(cupti.ApiCallbackSite.API_EXIT)
        self.failed: str | None = None  # a call the source could not read: its figures are not sound
        names = cupti.driver_api_trace_cbid
        self._kinds = {int(getattr(names, n)): kind for kind, ns in _CALLS.items() for n in ns if hasattr(names, n)}
        self._subscriber = cupti.subscribe(self._called, None)
        try:
            domain = int(cupti.CallbackDomain.DRIVER_API)
            for cbid in self._kinds:
                cupti.enable_callback(1, self._subscriber, domain, cbid)
        except Exception:
            cupti.unsubscribe(self._subscriber)
            raise

    def _called(self, userdata: Any, domain: Any, cbid: int, data: Any) -> None:
        if data.callback_site != self._exit:
            return
        try:
            if ctypes.c_int.from_address(int(data.function_return_value)).value != 0:
                return  # the call failed: nothing was allocated or freed
            params = int(ctypes.c_void_p.from_address(int(data.ptr) + _PARAMS_AT).value or 0)
            kind = self._kinds.get(int(cbid))
            if kind == "free":
                live = self.allocations.get(address := _word(params, 0))  # none: made before the source began
                if live is not None:
                    self.freed(address, live.nbytes)
                return
            if kind == "alloc":
                address, nbytes = _word(_word(params, 0), 0), _word(params, 1)
            elif kind == "pitched":
                address, nbytes = _word(_word(params, 0), 0), _word(_word(params, 1), 0) * _word(params, 3)
            elif kind == "map":
                address, nbytes = _word(params, 0), _word(params, 1)
            else:
                return
            caller = sys._getframe(0).f_back  # None in a thread the driver called from outside Python
            self.allocated(address, nbytes, self._places.of(caller) if caller is not None else OUTSIDE)
        except Exception as e:  # never into the driver: the figures are said to be unsound instead
            self.failed = f"a {data.function_name} call could not be read ({e})"

    def read(self) -> Reading:
        counted = super().read()  # what the driver handed out is what the process reserved
        return counted._replace(reserved=counted.held, reserved_peak=counted.peak)

    def close(self) -> None:
        if self._subscriber is not None:
            self._cupti.unsubscribe(self._subscriber)
            self._subscriber = None


_CALLS = {"alloc": _ALLOCS, "pitched": _PITCHED, "map": _MAPS, "free": _FREES}
