"""How fast the runner's host runs Python just now: a fixed loop, timed.

A pytest process on a virtual machine runs at a level of its own: its cores, their clock,
its neighbours. Unchanged code then moves by 20-100% in wall time from process to process,
while its kernels hold (docs/performance-log.md). Timed just before each window, this loop
followed that level where each process ran at one of two speeds, and not where a busy process
shared the core (a loop this short runs inside one of the scheduler's turns or misses it
whole). So a comparison shows it beside host-bound changes and decides nothing by it
(``verdict.compare``, docs/gates.md).
"""

from __future__ import annotations

import time

# about 0.7 ms on a current server core: long enough to read, short enough to pay per window
LOOP = 20_000


def runner_probe_ms() -> float:
    """The loop's time in ms."""
    start = time.perf_counter_ns()
    total = 0
    for i in range(LOOP):
        total += i & 7
    return (time.perf_counter_ns() - start) / 1e6
