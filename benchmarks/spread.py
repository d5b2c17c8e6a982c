"""Whether parallel runs read what serial runs read: each test's utilization over several
JSON reports of serial runs, and over those of each parallel mode, side by side.

``python benchmarks/spread.py --serial s1.json s2.json ... --mode "-n 2" p1.json ... --mode "-n 4" q1.json ...``

For each test: the serial runs' values, their range (lowest to highest), and each mode's
median, marked ``inside`` where it falls within the serial range and ``OUTSIDE`` where not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def utilizations(paths: list[Path]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for path in paths:
        for test in json.loads(path.read_text())["tests"]:
            value = (test.get("metrics") or {}).get("utilization")
            if value is not None:
                out.setdefault(test["nodeid"], []).append(float(value))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serial", type=Path, nargs="+", required=True, help="reports of serial runs")
    parser.add_argument(
        "--mode",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "REPORT"),
        help="a mode's name, then its reports",
    )
    args = parser.parse_args(argv)
    serial = utilizations(args.serial)
    modes = [(group[0], utilizations([Path(p) for p in group[1:]])) for group in args.mode]
    outside = 0
    for nodeid, values in sorted(serial.items()):
        low, high = min(values), max(values)
        print(
            f"{nodeid}\n  serial ({len(values)}): {' '.join(f'{100 * v:.1f}' for v in values)}  range {100 * low:.1f}-{100 * high:.1f}%"
        )
        for name, figures in modes:
            theirs = figures.get(nodeid, [])
            if not theirs:
                print(f"  {name}: not measured")
                continue
            median = statistics.median(theirs)
            inside = low <= median <= high
            outside += not inside
            print(
                f"  {name} ({len(theirs)}): {' '.join(f'{100 * v:.1f}' for v in theirs)}  median {100 * median:.1f}% "
                f"{'inside' if inside else 'OUTSIDE'}"
            )
    print(f"\n{outside} mode median(s) outside the serial range")
    return 0


if __name__ == "__main__":
    sys.exit(main())
