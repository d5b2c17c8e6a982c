"""What a pytest plugin costs a suite that never uses it: ``--tests`` trivial tests run with
the plugin loaded and with it turned off (``-p no:NAME``), in one environment.

Counted in instructions under valgrind's callgrind, which a shared virtual machine's clock
cannot move (its paired timings spread by several percent either way), with the hash seed
fixed, summed over every process the run starts; each arm ``--repeat`` times, to show how
far the count itself moves. Bytecode is
cached first (one run of each arm).

    python benchmarks/unused_cost.py                                  # pytest-gpuprof
    python benchmarks/unused_cost.py --python VENV/bin/python --plugin benchmark   # pytest-benchmark
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(python: str, folder: Path, *extra: str) -> int:
    # every process the run starts counted (a plugin may start some: pytest-benchmark's
    # CPU probe does), summed
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--trace-children=yes"]
    command += [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": ""}
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    counts = [int(n) for n in COLLECTED.findall(done.stderr)]
    if not counts:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter (this one)")
    parser.add_argument("--plugin", default="gpuprof", help="the plugin's name for -p no:NAME (gpuprof)")
    parser.add_argument("--tests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_trivial.py").write_text(
            f"import pytest\n\n@pytest.mark.parametrize('i', range({args.tests}))\ndef test_trivial(i):\n    assert i >= 0\n"
        )
        off = ("-p", f"no:{args.plugin}")
        for extra in ((), off):  # the bytecode cached, for both
            subprocess.run(
                [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
                cwd=folder,
                capture_output=True,
                check=False,
            )
        without = [instructions(args.python, folder, *off) for _ in range(args.repeat)]
        loaded = [instructions(args.python, folder) for _ in range(args.repeat)]
    base = min(without)
    print(f"{args.tests:,} trivial tests, {args.plugin} loaded vs -p no:{args.plugin} ({args.python}):")
    print(f"  instructions without: {', '.join(f'{n:,}' for n in without)}")
    print(f"  instructions with:    {', '.join(f'{n:,}' for n in loaded)}")
    print(
        f"  cost: {100 * (min(loaded) - base) / base:+.2f}% (lowest against lowest), {100 * (max(loaded) - base) / base:+.2f}% at most"
    )


if __name__ == "__main__":
    main()
