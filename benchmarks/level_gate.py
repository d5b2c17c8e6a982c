"""The history gate against one history, end to end on the host backend's virtual clock.

``python benchmarks/level_gate.py [--seed 7] [--saves 10] [--compares 20]``
``python benchmarks/level_gate.py --sketch 4000``

Runs whose level moves uniformly within +-3% (seeded), as on a virtual machine: ``--saves``
saved as main, then ``--compares`` unchanged runs gated with ``--gpu-compare=main
--gpu-compare-fail=kernel_ms:+2%`` and ``main~10`` at ``+1%``, then ten runs 10% slower.
Every compared run shares the one history's level and spread, so what matters is each
history's own rate of false alarms, which the tolerance bound holds. ``--sketch N``
computes the rule in numpy instead, over N histories (a run's rounds all at its level, as
on the virtual clock): the mean false-alarm rate, the share of histories with two or more
false alarms in ``--compares`` runs, the 10% slowdowns caught, and how a pull request
fares that undoes a merge which made main faster.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

TEST = """
import os

def test_kernels(gpuprof, gpu_workload):
    level = float(os.environ["GPUPROF_LEVEL"])
    gpuprof.measure(lambda: gpu_workload.compute(ms=4 * level), rounds=5, warmup=0)
"""


def sketch(histories: int, saves: int, compares: int, seed: int) -> None:
    """The gate's rule in numpy over ``histories`` histories: unchanged runs against each,
    ten 10% slower ones, and a main that got 10% faster in its newest runs, then slower again."""
    import numpy as np

    from pytest_gpuprof.analysis.run_spread import Spread

    rng = np.random.default_rng(seed)

    def levels(size: int) -> np.ndarray:
        return 4 * (1 + rng.uniform(-0.03, 0.03, size))

    def alarms(history: np.ndarray, base: float, threshold: float, new: np.ndarray) -> int:
        spread = Spread.of(list(history[::-1]))  # newest first
        return sum(v - base > threshold * base and spread.beyond(float(v), 1) for v in new)

    for name, pooled, threshold in (("main", 1, 0.02), ("main~10", 10, 0.01)):
        false, missed = [], []
        for _ in range(histories):
            history = levels(saves)
            base = float(np.median(history[-pooled:]))
            false.append(alarms(history, base, threshold, levels(compares)))
            missed.append(10 - alarms(history, base, threshold, levels(10) * 1.10))
        each, lost = np.array(false), np.array(missed)
        print(
            f"{name}: mean false-alarm rate {each.mean() / compares:.2%}; "
            f"histories with 2 or more of {compares}: {(each >= 2).mean():.1%}; "
            f"10% slower caught {1 - lost.mean() / 10:.1%}, fewer than 9 of 10 in {(lost >= 2).mean():.1%}"
        )
    for newest in (1, 2, 3, 5):
        caught = 0
        for _ in range(histories // 10):
            history = np.r_[levels(saves - newest), levels(newest) * 0.9]  # main got 10% faster
            caught += alarms(history, float(history[-1]), 0.02, levels(1))
        print(
            f"main 10% faster in its newest {newest} runs, then 10% slower again: caught {caught / (histories // 10):.0%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--compares", type=int, default=20)
    parser.add_argument("--sketch", type=int, default=0, metavar="HISTORIES")
    args = parser.parse_args(argv)
    if args.sketch:
        sketch(args.sketch, args.saves, args.compares, args.seed)
        return 0
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="gpuprof-level-gate-"))
    (folder / "test_level.py").write_text(TEST)

    def level() -> float:
        return 1 + rng.uniform(-0.03, 0.03)

    def run(at: float, *extra: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GPUPROF_LEVEL": repr(at)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gpu-host-clock=virtual"]
        command += ["--gpu-storage=store", *extra]
        return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)

    for _ in range(args.saves):
        run(level(), "--gpu-save=main")
    failed = {"main": 0, "main~10": 0}
    lines: dict[str, str] = {}
    for _ in range(args.compares):
        at = level()
        for name, gate in (("main", "kernel_ms:+2%"), ("main~10", "kernel_ms:+1%")):
            done = run(at, f"--gpu-compare={name}", f"--gpu-compare-fail={gate}")
            failed[name] += done.returncode == 1
            found = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("kernel_ms: base")]
            lines.setdefault(name, found[0] if found else "(no comparison line)")
    slower = [run(level() * 1.10, "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+2%") for _ in range(10)]
    caught = sum(done.returncode == 1 for done in slower)
    print(f"seed {args.seed}: unchanged runs failed {failed} of {args.compares} each; 10% slower caught {caught} of 10")
    for name, line in lines.items():
        print(f"  {name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
