"""The benchmarks' printed table: one row at a time, as it is measured."""

from __future__ import annotations

import time

rows: list[tuple[str, str, str]] = []


def row(name: str, ours: str, reference: str) -> None:
    rows.append((name, ours, reference))
    print(f"{name:<58} {ours:<34} {reference}", flush=True)


def per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - start) / n / 1000)
    return best
