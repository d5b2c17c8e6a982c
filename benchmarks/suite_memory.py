"""A long suite's memory: ``N`` tests, each of ``--steps`` ``gpuprof.step``s, on the host
backend's virtual clock, in a process of their own; printed, the peak resident memory of
that process (its ``ru_maxrss``) for each ``N``.

    python benchmarks/suite_memory.py 20 200
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from child import env, pytest_command

SUITE = """
import pytest

@pytest.mark.parametrize("i", range({tests}))
def test_steps(gpuprof, i):
    for _ in range({steps}):
        with gpuprof.step("s"):
            pass
"""


def peak_mb(tests: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_long.py").write_text(SUITE.format(tests=tests, steps=steps))
        command = pytest_command("--gpu-host-clock=virtual")
        # the child's peak alone: a wrapper that runs it and reads its children's
        wrapper = (
            "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
        )
        done = subprocess.run(
            [sys.executable, "-c", wrapper, *command], cwd=tmp, capture_output=True, text=True, env=env()
        )
        if done.returncode != 0:
            raise SystemExit(f"{tests} tests failed:\n{done.stderr[-2000:]}")
        return int(done.stdout.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", type=int, nargs="+")
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    for tests in args.tests:
        print(f"{tests} tests of {args.steps:,} steps: peak RSS {peak_mb(tests, args.steps):.0f} MB")


if __name__ == "__main__":
    main()
