"""What JAX's allocator says of its device memory (``device.memory_stats()``), and what
reading it costs: the figures a window's JAX peak could be read from under JAX's default
preallocated pool.

Run on a CUDA machine with JAX: ``python benchmarks/jax_memory_stats.py [--reads N]``.
Printed: the statistics before, while and after a 256 MiB array lives, which methods the
device has for memory, and the time of one ``memory_stats()`` call (mean of N).
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=1000, help="memory_stats() calls to time")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    print("jax", jax.__version__, device)
    print(sorted(device.memory_stats().items()))

    def shown() -> dict[str, int]:
        return {k: v for k, v in device.memory_stats().items() if "use" in k or "peak" in k}

    x = jnp.ones((256, 1 << 20), dtype=jnp.uint8)
    x.block_until_ready()
    print("while 256 MiB lives:", shown())
    del x
    print("after:", shown())
    print([n for n in dir(device) if "mem" in n.lower() or "stat" in n.lower()])
    start = time.perf_counter()
    for _ in range(args.reads):
        device.memory_stats()
    print(f"memory_stats(): {(time.perf_counter() - start) / args.reads * 1e6:.2f} us a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
