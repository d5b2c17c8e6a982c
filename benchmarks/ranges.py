"""The cost of one NVTX range (push and pop) to the code that makes it: untraced, with the
plugin's CUPTI capture without NVTX, and with NVTX ranges recorded as steps.

Run on a CUDA machine with PyTorch: ``python benchmarks/ranges.py``. Each mode runs in a
process of its own (NVTX reads its injection once, at the process's first NVTX call) and
times 200,000 ``torch.cuda.nvtx.range_push``/``range_pop`` pairs, best of 3.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PAIRS = 200_000


def child(mode: str) -> float:
    import torch

    capture = None
    if mode != "untraced":
        from pytest_gpuprof.capture import cupti_trace

        capture, status = cupti_trace.start(nvtx=mode == "nvtx")
        assert capture is not None, status
    torch.zeros(1, device="cuda")
    push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(PAIRS):
            push("step")
            pop()
        best = min(best, (time.perf_counter_ns() - start) / PAIRS / 1000)
        if capture is not None:
            capture.drain()
    if capture is not None:
        finished, _ = capture.ranges()
        print(f"ranges recorded in the last drain: {len(finished):,}", file=sys.stderr)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=("untraced", "cupti", "nvtx"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    for mode in ("untraced", "cupti", "nvtx"):
        out = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, check=True)
        us = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode:9s} {us:.3f} us a range (push + pop){'; ' + out.stderr.strip() if out.stderr.strip() else ''}")


if __name__ == "__main__":
    main()
