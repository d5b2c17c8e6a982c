"""What PyTorch's allocator history gives the plugin to place allocations between its
edges: whether entries carry ``_set_memory_metadata``'s tag, and whether their ``time_us``
stamps can order them against host stamps.

Run on a CUDA machine with PyTorch: ``python benchmarks/torch_history.py [--allocations N]``.
Printed: whether the tag API exists and each entry's fields, the Python frames of an
allocation recorded with stacks, and how many of N allocations were stamped before a host
``time.time_ns()`` taken just before each (with the median gap).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=2000, help="allocations to compare stamps on")
    args = parser.parse_args(argv)

    import torch
    import torch.cuda.memory as history

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    tagged = hasattr(history, "_set_memory_metadata")
    print(f"torch {torch.__version__}; _set_memory_metadata: {tagged}")
    history._record_memory_history(enabled="all", context=None, stacks="python", max_entries=100_000)
    if tagged:
        history._set_memory_metadata("gpuprof:0")
    a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del a
    for entry in history._snapshot()["device_traces"][0]:
        print({k: v for k, v in entry.items() if k != "frames"})

    history._record_memory_history(enabled=None)
    history._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=100_000)

    def site() -> torch.Tensor:
        return torch.empty(3 << 20, dtype=torch.uint8, device="cuda")

    kept = site()
    allocs = [e for e in history._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    print("frames of an allocation:", [(f["filename"], f["line"], f["name"]) for f in allocs[-1].get("frames", [])][:4])
    del kept

    history._record_memory_history(enabled=None)
    history._record_memory_history(enabled="all", context=None, stacks="python", max_entries=100_000)
    stamps = []
    for _ in range(args.allocations):
        stamps.append(time.time_ns())
        z = torch.empty(1 << 12, dtype=torch.uint8, device="cuda")
        del z
    allocs = [e for e in history._snapshot()["device_traces"][0] if e["action"] == "alloc"][-args.allocations :]
    gaps = [e["time_us"] - st / 1000 for st, e in zip(stamps, allocs, strict=True)]
    early = sum(g < 0 for g in gaps)
    print(
        f"allocations stamped before the host stamp just before them: {early} of {len(gaps)}; "
        f"median gap {statistics.median(gaps):.2f} us"
    )
    history._record_memory_history(enabled=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
