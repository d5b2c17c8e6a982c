"""What each of the plugin's sources costs a loop, measured in one process: the sources are
switched on and off between blocks of rounds, in turn, so that the process's own state
(its CUDA graphs, its memory, the GPU's clocks) is the same for all of them.

Run on a CUDA machine with PyTorch and cupti-python: ``python benchmarks/interleaved.py
LOOP [--cycles N] [--profiler] [--early]``, LOOP one of ``benchmarks/observer.py``'s. Configurations:
``none``; ``kernels`` (CUPTI kernel, copy and memset records); ``cupti`` (everything the
plugin's capture enables: also the driver calls it records and NVTX's marker records);
``cupti+stacks`` (and the stack sampler armed); ``plugin`` (and NVML's sampler thread at
its default 20 ms); ``stacks`` and ``nvml`` alone. With ``--profiler``: ``none`` against
``torch.profiler`` (CUDA activity) instead, since the two cannot share CUPTI. With
``--early`` the sources are set up before the loop is built (as the plugin does: CUPTI
live while a model compiles and its CUDA graphs are captured), else after its warm-up.

Each block drains CUPTI (a forced flush) before it, drops its first round (the flush slows
the round after it) and keeps the median of the rest. Printed: per configuration, the
median over cycles of the blocks' medians, against ``none``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from observer import LOOPS

KEPT = {"graph": 8, "cnn": 4, "launches": 1, "pytorch": 4, "jax": 4}
CONFIGS = ["none", "kernels", "cupti", "cupti+stacks", "plugin", "stacks", "nvml"]


class Sources:
    """The plugin's capture, stack sampler and NVML sampler, each switched on by hand."""

    def __init__(self) -> None:
        from cupti import cupti

        from pytest_gpuprof.capture import cupti_trace
        from pytest_gpuprof.capture.stacks import StackSampler

        self.cupti = cupti
        self.record_only_work_calls = cupti_trace.record_only_work_calls
        self.capture = cupti_trace.CuptiCapture(cupti, library=cupti_trace.libcupti, nvtx=True)
        self.kinds = self.capture.kinds
        self.stacks = StackSampler()
        self.nvml: Any = None
        self.set("none")

    def set(self, config: str) -> None:
        from pytest_gpuprof.capture.nvml import NvmlSampler

        cupti, kinds = self.cupti, self.cupti.ActivityKind
        for kind in self.kinds:
            cupti.activity_disable(kind)
        if config == "kernels":
            for kind in (kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET):
                cupti.activity_enable(kind)
        elif config in ("cupti", "cupti+stacks", "plugin"):
            for kind in self.kinds:
                cupti.activity_enable(kind)
            self.record_only_work_calls(cupti)  # after the kind: it overrides earlier choices
        self.stacks.disarm()
        if config in ("cupti+stacks", "plugin", "stacks"):
            self.stacks.arm()
        if self.nvml is not None:
            self.nvml.stop()
            self.nvml = None
        if config in ("plugin", "nvml"):
            self.nvml = NvmlSampler.start(0, 20.0)
        self.capture.drain()


class Profiler:
    def __init__(self) -> None:
        self.profile: Any = None

    def set(self, config: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        if self.profile is not None:
            self.profile.__exit__(None, None, None)
            self.profile = None
        if config == "profiler":
            self.profile = profile(activities=[ProfilerActivity.CUDA])
            self.profile.__enter__()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop", choices=list(LOOPS))
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--profiler", action="store_true")
    parser.add_argument("--early", action="store_true")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which, comma-separated (none always)")
    args = parser.parse_args()
    sources: Sources | Profiler | None = None
    if args.early:
        sources = Profiler() if args.profiler else Sources()
        sources.set("profiler" if args.profiler else "plugin")
    namespace: dict = {}
    exec(LOOPS[args.loop], namespace)
    one_round = namespace["make_round"]()
    for _ in range(3):
        one_round()
    if sources is None:
        sources = Profiler() if args.profiler else Sources()
    chosen = ["none", *(c for c in args.configs.split(",") if c in CONFIGS and c != "none")]
    configs = ["none", "profiler"] if args.profiler else chosen
    blocks: dict[str, list[float]] = {c: [] for c in configs}
    for cycle in range(args.cycles):
        # in turn, the order reversed every other cycle: drift falls on all alike
        for config in configs if cycle % 2 == 0 else configs[::-1]:
            sources.set(config)
            one_round()  # the round after a flush (or a start) pays for it
            walls = []
            for _ in range(KEPT[args.loop]):
                start = time.perf_counter_ns()
                one_round()
                walls.append((time.perf_counter_ns() - start) / 1e6)
            blocks[config].append(statistics.median(walls))
    sources.set("none")
    base = statistics.median(blocks["none"])
    for config, medians in blocks.items():
        wall = statistics.median(medians)
        spread = f"{min(medians):.3f}-{max(medians):.3f}"
        out = {"loop": args.loop, "config": config, "wall_ms": round(wall, 3), "blocks": spread}
        print(json.dumps(out), f"{100 * (wall / base - 1):+.2f}%", flush=True)


if __name__ == "__main__":
    main()
