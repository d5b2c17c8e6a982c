"""Where following JAX's allocations through the driver's calls costs a loop of small
jitted steps: the callbacks a round, the threads they came from, the time spent in the
plugin's callback, and the same loop with a callback that does nothing (what CUPTI's
Python callbacks cost by themselves). Also what ``device.memory_stats()`` gives under the
allocator in use.

Run on a CUDA machine with JAX and cupti-python: ``python benchmarks/jax_callbacks.py
[--rounds N]``. The allocator is JAX's platform one unless ``XLA_PYTHON_CLIENT_ALLOCATOR``
says otherwise (under JAX's own pool the driver sees almost no call).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds of each way (their median is printed)")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    import jax
    import jax.numpy as jnp
    from cupti import cupti

    from pytest_gpuprof.capture import driver_memory

    device = jax.local_devices()[0]
    print("allocator", os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"], "memory_stats:", device.memory_stats())
    w = jnp.ones((1024, 1024), jnp.float32)
    step = jax.jit(lambda x: jnp.tanh(x @ w))
    x0 = jnp.ones((256, 1024), jnp.float32)

    def one_round() -> None:
        x = x0
        for _ in range(200):
            x = step(x)
        x.block_until_ready()

    def timed() -> float:
        walls = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            one_round()
            walls.append((time.perf_counter() - start) * 1e3)
        return statistics.median(walls)

    for _ in range(3):
        one_round()
    base = timed()
    calls, inside, threads = [0], [0], dict[int, int]()
    source = driver_memory.DriverSource(lambda: 0, cupti)

    def counted(*call: Any) -> None:
        start = time.perf_counter_ns()
        source._called(*call)
        inside[0] += time.perf_counter_ns() - start
        calls[0] += 1
        threads[threading.get_ident()] = threads.get(threading.get_ident(), 0) + 1

    def subscribed(callback: Callable[..., None]) -> Any:
        subscriber = cupti.subscribe(callback, None)
        for cbid in source._kinds:
            cupti.enable_callback(1, subscriber, int(cupti.CallbackDomain.DRIVER_API), cbid)
        return subscriber

    source.close()
    subscriber = subscribed(counted)
    followed = timed()
    cupti.unsubscribe(subscriber)
    print(f"round untraced {base:.2f} ms, followed {followed:.2f} ms ({100 * (followed / base - 1):+.1f}%)")
    each = inside[0] / max(calls[0], 1) / 1e3
    print(
        f"callbacks a round {calls[0] / args.rounds:.0f}, in the plugin's {inside[0] / args.rounds / 1e6:.3f} ms, {each:.1f} us each"
    )
    main_thread = threading.main_thread().ident
    print("threads:", {("main" if k == main_thread else k): v for k, v in threads.items()})
    subscriber = subscribed(lambda *call: None)
    empty = timed()
    cupti.unsubscribe(subscriber)
    print(f"a callback that does nothing: {empty:.2f} ms ({100 * (empty / base - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
