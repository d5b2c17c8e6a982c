"""What tracking device memory costs a loop, in one process: the tracker on and off between
blocks of rounds, in turn (as ``interleaved.py`` does for the capture's sources).

Run on a CUDA machine: ``python benchmarks/memory_cost.py LOOP [--cycles N]``, LOOP one of
``graph`` (the CUDA-graph MLP of ``observer.py``: PyTorch's allocator history on, its
counters read at each window's start, the history read back after its end), ``pytorch``
(its training loop, the same) or ``cupy`` (2,000 small elementwise
operations a round, each allocating its output: CuPy's pool hook called for every one).
``jax`` (200 small jitted steps a round with JAX's platform allocator, each output its own
mapping: the driver's allocation calls followed by CUPTI callbacks).
``memory`` marks at each round's edges, as a window's edges are marked; ``memory+steps``
also marks a step's edge every 100 operations (``cupy``) or once a round (the others);
``each+steps`` the same as under a memory budget (CuPy's allocation hook on, PyTorch's
history with each allocation's Python stack).
Printed: the median over cycles of each block's median round (with its edge marks: what the
test pays) and window (between them: what a window measures), against ``none``.
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
sys.path.insert(0, str(Path(__file__).parents[1]))
from observer import LOOPS

CUPY = """
import cupy as cp

def make_round():
    x = cp.ones(1024, dtype=cp.float32)

    def one_round(mark=None):
        y = x
        for i in range(2000):
            if mark is not None and i % 100 == 0:
                mark()
            y = y * 1.0001 + 0.5
        cp.cuda.Device().synchronize()
        return y

    return one_round
"""
JAX = """
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
import jax
import jax.numpy as jnp

def make_round():
    w = jnp.ones((1024, 1024), jnp.float32)
    step = jax.jit(lambda x: jnp.tanh(x @ w))
    x0 = jnp.ones((256, 1024), jnp.float32)

    def one_round(mark=None):
        x = x0
        for i in range(200):
            if mark is not None and i % 20 == 0:
                mark()
            x = step(x)
        x.block_until_ready()
        return x

    return one_round
"""
CONFIGS = ["none", "memory", "memory+steps", "each+steps"]


def main() -> None:
    from pytest_gpuprof.capture.memory import Discovery, MemoryTracker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop", choices=["graph", "pytorch", "cupy", "jax"])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    namespace: dict[str, Any] = {}
    exec({"cupy": CUPY, "jax": JAX}.get(args.loop) or LOOPS[args.loop], namespace)
    one_round = namespace["make_round"]()
    for _ in range(3):
        one_round()
    blocks: dict[str, list[float]] = {c: [] for c in CONFIGS}  # the round with its edge marks
    windows: dict[str, list[float]] = {c: [] for c in CONFIGS}  # between the edge marks, as a window
    read_by: dict[str, str | None] = {}  # each configuration's sources, or why it had none
    for cycle in range(args.cycles):
        for config in CONFIGS if cycle % 2 == 0 else CONFIGS[::-1]:
            tracker = MemoryTracker(Discovery()) if config != "none" else None
            if tracker is not None and config.startswith("each"):
                tracker.see_each()  # as under a memory budget: CuPy's hook on
            mark = (lambda t=tracker: t.mark(time.perf_counter_ns())) if tracker is not None else None
            # a step's edge, as the plugin marks it
            step = (lambda t=tracker: t.mark(time.perf_counter_ns(), step=True)) if tracker is not None else None
            walls, inside = [], []
            for _ in range(args.rounds + 1):
                start = time.perf_counter_ns()
                if mark is not None:
                    mark()
                opened = time.perf_counter_ns()
                if args.loop in ("cupy", "jax"):
                    one_round(step if config.endswith("+steps") else None)
                else:
                    if config.endswith("+steps") and step is not None:
                        step()
                    one_round()
                closed = time.perf_counter_ns()
                if mark is not None:
                    mark()
                walls.append((time.perf_counter_ns() - start) / 1e6)
                inside.append((closed - opened) / 1e6)
                if tracker is not None:  # the window's figures, read after it (PyTorch's history), then let go
                    tracker.log()
                    tracker.forget()
            if tracker is not None:
                read_by[config] = tracker.name or tracker.why
                tracker.close()
            blocks[config].append(statistics.median(walls[1:]))
            windows[config].append(statistics.median(inside[1:]))
    base, window_base = statistics.median(blocks["none"]), statistics.median(windows["none"])
    for config, medians in blocks.items():
        wall, window = statistics.median(medians), statistics.median(windows[config])
        out = {"loop": args.loop, "config": config, "wall_ms": round(wall, 3), "window_ms": round(window, 3)}
        out |= {"read_by": read_by.get(config), "blocks": f"{min(medians):.3f}-{max(medians):.3f}"}
        print(
            json.dumps(out), f"round {100 * (wall / base - 1):+.2f}%, window {100 * (window / window_base - 1):+.2f}%"
        )


if __name__ == "__main__":
    main()
