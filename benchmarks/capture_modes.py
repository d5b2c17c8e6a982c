"""What CUPTI's capture costs a launch, configuration by configuration: 50,000 one-element
``add_`` launches a round, timed untraced, under ``torch.profiler`` and with the plugin's
capture started by hand in each of its configurations.

Run on a CUDA machine with PyTorch, one process a mode (CUPTI is set up once a process):
``python benchmarks/capture_modes.py MODE``. Modes: ``none``, ``profiler``, ``kernels``
(kernel, copy and memset records), ``driver`` (and the driver calls the plugin records),
``driver-nokgn`` (without ``cuKernelGetName``), ``driver-markonly`` (only the step mark),
``driver-all`` (every driver call) and ``nvtx`` (``driver`` with NVTX ranges). Printed:
the median over 4 rounds, after 2, of the host time a launch, and what was recorded.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

LAUNCHES = 50_000
CALLS = {
    "driver-nokgn": r"^cu(Launch\w*|Memcpy\w*|Memset\w*|GraphLaunch\w*|DriverGetVersion)$",
    "driver-markonly": r"^cuDriverGetVersion$",
    "driver-all": r".",
}


def main(mode: str) -> None:
    import torch

    x = torch.zeros(1, device="cuda")

    def one_round() -> None:
        for _ in range(LAUNCHES):
            x.add_(1)
        torch.cuda.synchronize()

    capture, profiler = None, None
    if mode == "profiler":
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CUDA])
        profiler.__enter__()
    elif mode != "none":
        from cupti import cupti

        from pytest_gpuprof.capture import cupti_trace

        if mode in CALLS:
            cupti_trace.RECORDED_CALLS = re.compile(CALLS[mode])
        capture = cupti_trace.CuptiCapture(
            cupti, library=cupti_trace.libcupti, correlate=mode != "kernels", nvtx=mode == "nvtx"
        )
    for _ in range(2):
        one_round()
    per_launch = []
    for _ in range(4):
        start = time.perf_counter_ns()
        one_round()
        per_launch.append((time.perf_counter_ns() - start) / LAUNCHES / 1e3)
    out: dict[str, object] = {"mode": mode, "us_per_launch": round(statistics.median(per_launch), 3)}
    if capture is not None:
        work, _ = capture.drain()
        out |= {"reading": capture.reading, "intervals": len(work)}
        capture.stop()
    if profiler is not None:
        profiler.__exit__(None, None, None)
        out["cuda_events"] = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "mode",
        choices=("none", "profiler", "kernels", "driver", "driver-nokgn", "driver-markonly", "driver-all", "nvtx"),
    )
    main(parser.parse_args().mode)
