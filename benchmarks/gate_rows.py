"""The regression gate's rows of ``bench.py``: false alarms and catches, each verdict the
plugin's, on the same measured rounds (on a GPU, or on the host backend with ``--host``)."""

from __future__ import annotations

import statistics
import time

from table import row


def judge_gate(label: str, baseline, unchanged, slowed, expressions, counts) -> None:
    """Rows of false alarms and catches, each verdict the plugin's, on the same measured rounds.

    ``unchanged`` and ``slowed`` are 20 runs' rounds each; every expression is judged on
    the first ``n`` rounds a side, for each ``n`` in ``counts``.
    """
    from pytest_gpuprof.verdict.compare import assess
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    print(f"    baseline rounds (ms): {' '.join(f'{v:.2f}' for v in baseline)}", flush=True)
    for name, runs in (("unchanged", unchanged), ("slowed", slowed)):
        print(f"    {name} run medians (ms): {' '.join(f'{statistics.median(r):.2f}' for r in runs)}", flush=True)
    for expression in expressions:
        (threshold,) = parse_thresholds(expression)
        for n in counts:
            alarms = [assess(threshold, baseline[:n], r[:n]).finding == "regression" for r in (*unchanged, *slowed)]
            row(
                f"gate {expression}, {n} rounds a side ({label})",
                f"false alarms {sum(alarms[: len(unchanged)])}/20 unchanged; "
                f"caught {sum(alarms[len(unchanged) :])}/20 slowed by 10%",
                f"baseline wall median {statistics.median(baseline[:n]):.2f} ms",
            )


def gate_reliability(workload, rounds: int = 9) -> None:
    """The regression gate on the two-lock pipeline, unchanged and slowed by 10%, 20 runs each.

    Every run measures ``rounds`` rounds; the gate is judged on the first 5 rounds and on
    all of them, at a +5% and a +3% threshold, so that each verdict sees the same rounds.
    """
    size = 1 << 30 if workload.backend.name == "cuda" else 64 << 20

    def run(extra_ms: float) -> list[float]:
        """``rounds`` of the two-lock pipeline; ``extra_ms`` of host work injected in each."""
        samples = []
        for _ in range(rounds):
            with workload.profiler.window("gate") as done:
                workload.partitions(n=4, upload_bytes=size, strategy="two-lock")
                time.sleep(extra_ms / 1000)
            samples.append(done[0].metrics.wall_ms)
        return samples

    run(0)  # warm-up: the first rounds pin the host source and grow the pool
    baseline = run(0)
    slowdown = 0.1 * statistics.median(baseline)
    unchanged = [run(0) for _ in range(20)]
    slowed = [run(slowdown) for _ in range(20)]
    label = f"two-lock, 4 x {size >> 20} MiB"
    judge_gate(label, baseline, unchanged, slowed, ("wall_ms:+5%", "wall_ms:+3%"), sorted({5, rounds}))


def gate_reliability_kernels(profiler, workload) -> None:
    """The same gate on a steady workload: 20 ms of matmuls a round; slowed by 2 ms of them."""
    stream = workload.backend.stream()

    def run(ms: float) -> list[float]:
        def body() -> None:
            with profiler.step("compute"):
                workload.backend.compute(ms, kind="matmul", stream=stream)
                workload.backend.synchronize(stream)

        return list(profiler.measure(body, rounds=5, warmup=1).rounds["wall_ms"].samples)

    run(20)  # warm-up, as the pipeline gate does: a cold GPU's first rounds run slow
    baseline = run(20)
    unchanged = [run(20) for _ in range(20)]
    slowed = [run(22) for _ in range(20)]
    judge_gate("20 ms of matmuls", baseline, unchanged, slowed, ("wall_ms:+5%",), (5,))
