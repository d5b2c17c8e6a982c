"""Every kernel named as a person reads it, on loops nobody here wrote the kernels of:
PyTorch's conv training loop (cuDNN/CUTLASS), a CUDA-graph MLP (``torch.compile``), JAX's
jitted matmuls and CuPy's elementwise, reduction and cuBLAS kernels.

No kernel of the window keeps a mangled name; every short name is at most 80 characters
and unique within the window. Skipped where the framework is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_gpuprof.analysis import names
from pytest_gpuprof.analysis.names import SHORT, readable, short_names

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

CUPY = """
import cupy as cp

def make_round():
    x = cp.random.rand(2048, 2048, dtype=cp.float32)
    scale = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x", "scale2")

    def one_round():
        y = scale(cp.tanh(x) + x)
        z = (y @ y).sum(axis=0)
        cp.cumsum(z).max()
        cp.cuda.Device().synchronize()

    return one_round
"""


def _loop(name: str):
    from observer import LOOPS

    source = CUPY if name == "cupy" else LOOPS[name]
    pytest.importorskip({"cupy": "cupy", "jax": "jax"}.get(name, "torch"))
    namespace: dict = {}
    exec(source, namespace)
    return namespace["make_round"]()


@pytest.mark.parametrize("loop", ["cnn", "graph", "jax", "cupy"])
def test_no_kernel_keeps_its_mangled_name_and_short_names_are_unique(gpuprof, loop):
    one_round = _loop(loop)
    m = gpuprof.measure(one_round, rounds=2, warmup=2)
    kernels = sorted({d.name for d in gpuprof.windows[-1].timeline.device if d.kind == "kernel"})
    shown = short_names(kernels)
    mangled = [k for k in kernels if k.startswith("_Z")]
    runtime_gave_up = [k for k in mangled if names._cxa(k) is None]
    print(
        f"\n{loop}: {len(kernels)} kernels, {len(mangled)} C++ symbols, {len(runtime_gave_up)} libstdc++ cannot read "
        f"(longest {max(map(len, mangled), default=0)} characters); top: {[k.short for k in m.top_kernels]}"
    )
    assert kernels, "the loop ran no kernel the capture saw"
    assert [k for k in kernels if readable(k).startswith("_Z")] == []
    assert all(not k.name.startswith("_Z") and k.short == shown[k.mangled] for k in m.top_kernels)
    assert all(0 < len(s) <= SHORT for s in shown.values())
    assert len(set(shown.values())) == len(shown)
