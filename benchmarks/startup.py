"""What a process of the plugin pays to start on a GPU, phase by phase: the imports, the
backend (a CUDA context, CUPTI), the copy-rate calibration, the kernels' sizing, NVML and
GPM. Under ``--gpu-exclusive`` the phases that do device work run under the device's lock,
so with N xdist workers they are paid N times in turn; this says which phases those are.

python benchmarks/startup.py [--device 0] [--backend cuda|host]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any


def timed(label: str, fn: Callable[[], Any], rows: list[tuple[str, float]]) -> Any:
    start = time.perf_counter()
    out = fn()
    rows.append((label, 1e3 * (time.perf_counter() - start)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    args = parser.parse_args(argv)
    rows: list[tuple[str, float]] = []
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.capture.device import GpuDevice

    if args.backend == "cuda":
        timed("import cupy", lambda: __import__("cupy"), rows)
    backend = timed("backend (context, CUPTI)", lambda: backends.create(args.backend, args.device, cupti=True), rows)
    device = GpuDevice(backend, timed("device info", backend.info, rows))
    timed("calibrate upload", lambda: device.h2d_gbps, rows)
    timed("calibrate download", lambda: device.d2h_gbps, rows)
    timed("size the kernels", backend.prepare, rows)
    if args.backend == "cuda":
        from pytest_gpuprof.capture.gpm import Gpm
        from pytest_gpuprof.capture.nvml import NvmlSampler

        sampler = timed("NVML sampler", lambda: NvmlSampler.start(args.device, 20.0), rows)
        timed("GPM", lambda: Gpm.start(args.device), rows)
        if sampler is not None:
            sampler.stop()
    timed("close", backend.close, rows)
    for label, ms in rows:
        print(f"{label:28s} {ms:9.1f} ms")
    print(f"{'all':28s} {sum(ms for _, ms in rows):9.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
