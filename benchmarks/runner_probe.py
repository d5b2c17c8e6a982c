"""Does a short probe, run in the same process, track how fast this runner is? Fresh
processes, each timing probes and then the launch-bound PyTorch loop and the JAX loop of
``run_unit.py`` (no plugin): if the probes move with the workloads' wall time from process
to process, a gate can read a run's wall time against its runner.

``python benchmarks/runner_probe.py [--processes 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, json, os, statistics, sys, time

def python_probe():
    t = time.perf_counter_ns()
    total = 0
    for i in range(200_000):
        total += i & 7
    return (time.perf_counter_ns() - t) / 1e6

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cuda.cuCtxSetCurrent(ctx)
buf = ctypes.c_uint64(); cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096))

def driver_probe():
    t = time.perf_counter_ns()
    for _ in range(500):
        cuda.cuMemsetD8Async(buf, ctypes.c_ubyte(1), ctypes.c_size_t(4096), None)
    cuda.cuCtxSynchronize()
    return (time.perf_counter_ns() - t) / 1e6

import torch
layers = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]).cuda()
x = torch.randn(64, 256, device="cuda")
one = torch.ones(1, device="cuda")

def torch_probe():
    t = time.perf_counter_ns()
    for _ in range(500):
        one.add_(0)
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t) / 1e6

def torch_body():
    with torch.no_grad():
        for _ in range(200):
            layers(x)
    torch.cuda.synchronize()

import jax
jnp = jax.numpy
step = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
a = jax.random.normal(jax.random.PRNGKey(0), (2048, 2048), dtype=jnp.float32)
step(a).block_until_ready()

def jax_body():
    b = a
    for _ in range(20):
        b = step(b)
    b.block_until_ready()

def timed(fn, rounds=5, warmup=1):
    out = []
    for i in range(rounds + warmup):
        t = time.perf_counter_ns(); fn(); ms = (time.perf_counter_ns() - t) / 1e6
        if i >= warmup:
            out.append(ms)
    return statistics.median(out)

probes = {}
for name, fn in (("python", python_probe), ("driver", driver_probe), ("torch_launch", torch_probe)):
    fn()
    probes[name] = statistics.median(fn() for _ in range(5))
figures = {"torch_wall": timed(torch_body), "jax_wall": timed(jax_body)}
after = {n + "_after": statistics.median(fn() for _ in range(5)) for n, fn in (("python", python_probe), ("driver", driver_probe))}
print(json.dumps({**probes, **after, **figures, "cpu": os.sched_getaffinity(0).__len__()}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    args = parser.parse_args(argv)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    rows = []
    for i in range(args.processes):
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=False)
        if done.returncode:
            print(done.stderr[-2000:])
            return 2
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(i, " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    import numpy as np

    for wall in ("torch_wall", "jax_wall"):
        w = np.log([r[wall] for r in rows])
        for probe in ("python", "driver", "torch_launch", "python_after", "driver_after"):
            p = np.log([r[probe] for r in rows])
            r = float(np.corrcoef(p, w)[0, 1])
            slope = float(np.polyfit(p, w, 1)[0])
            resid = w - np.polyval(np.polyfit(p, w, 1), p)
            print(
                f"{wall} vs {probe}: r {r:+.3f}, slope {slope:.2f}, sd of log wall {w.std():.3f} -> residual {resid.std():.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
