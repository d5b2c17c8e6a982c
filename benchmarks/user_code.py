"""A PyTorch training loop measured by the plugin and by ``torch.profiler``, separately.

Run on a CUDA machine with PyTorch: ``python benchmarks/user_code.py``. The loop copies
6 pinned 64 MiB batches with ``to(non_blocking=True)`` and runs a forward and backward
pass on each. ``torch.profiler`` (its own CUPTI session, so in its own process) gives the
kernel total of one loop, as the mean over 3 loops after 1 warm-up; the plugin measures
the same loop in a child pytest (3 rounds after 1 warm-up) and reports its kernel time,
the upload's bandwidth and where the idle time went, with CUPTI and with its events
fallback (``--gpu-no-cupti``). One line per measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from child import env, pytest_command  # benchmarks/

LOOP = Path(__file__).with_name("torch_loop.py")  # the loop, in a module of its own

TEST = """
from torch_loop import make_loop


def test_training_loop(gpuprof):
    gpuprof.measure(make_loop(gpuprof.step), rounds=3, warmup=1)
"""


def torch_profiler() -> float:
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch_loop import make_loop  # this script's folder

    loop = make_loop(lambda name: contextlib.nullcontext())
    loop()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            loop()
    torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name]
    return sum(e.device_time for e in kernels) / 1000 / 3  # us -> ms, per loop


def plugin(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, LOOP.name).write_text(LOOP.read_text())
        Path(tmp, "test_loop.py").write_text(TEST)
        report = Path(tmp, "r.json")
        subprocess.run(
            pytest_command(f"--gpu-report={report}", *extra, tmp), check=True, capture_output=True, cwd=tmp, env=env()
        )
        (test,) = json.loads(report.read_text())["tests"]
        return test["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)  # torch.profiler's own process
    if parser.parse_args().torch:
        print(json.dumps(torch_profiler()))
        return
    out = subprocess.run([sys.executable, __file__, "--torch"], check=True, capture_output=True, text=True)
    reference = json.loads(out.stdout.strip().splitlines()[-1])
    for extra in ([], ["--gpu-no-cupti"]):
        m = plugin(extra)
        upload = m["steps"]["upload"]
        kernel = m.get("kernel_ms")
        agree = f", {100 * (kernel / reference - 1):+.2f}% against torch.profiler" if kernel else ""
        print(
            f"plugin {' '.join(extra) or '(CUPTI)'}: truth {m['truth']}, utilization {m.get('utilization')}, "
            f"wall {m['wall_ms']:.1f} ms, kernels {kernel} ms{agree}; upload {upload['gbps']} GB/s, "
            f"pageable {upload['pageable']}, idle upload {upload['idle_ms']} ms, train {m['steps']['train']['idle_ms']} ms, "
            f"unattributed {m.get('unattributed_ms')} ms of {m.get('overhead_ms')} ms",
            flush=True,
        )
    print(f"torch.profiler: kernel total {reference:.2f} ms a loop (mean of 3 loops)", flush=True)


if __name__ == "__main__":
    main()
