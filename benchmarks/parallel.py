"""Compare the JSON reports of one suite run serially and in parallel (``--gpu-exclusive``):
per test, the outcome, the utilization and the time it waited for the device.

python benchmarks/parallel.py SERIAL.json PARALLEL.json [PARALLEL.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def tests_of(path: Path) -> dict[str, dict[str, Any]]:
    return {t["nodeid"]: t for t in json.loads(path.read_text())["tests"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("serial", type=Path)
    parser.add_argument("parallel", type=Path, nargs="+")
    args = parser.parse_args(argv)
    serial = tests_of(args.serial)
    worst = 0.0
    for path in args.parallel:
        other = tests_of(path)
        print(f"{path.name}: {len(other)} measured tests (serial: {len(serial)})")
        for nodeid, base in serial.items():
            now = other.get(nodeid)
            if now is None:
                print(f"  {nodeid}: missing")
                continue
            u0, u1 = base["metrics"]["utilization"], now["metrics"]["utilization"]
            diff = None if u0 is None or u1 is None else 100 * (u1 - u0)
            worst = max(worst, abs(diff or 0.0))
            shown = "-" if diff is None else f"{diff:+.2f}pt"
            print(
                f"  {nodeid}: {base['outcome']}->{now['outcome']} utilization "
                f"{u0 if u0 is None else f'{100 * u0:.1f}%'} -> {u1 if u1 is None else f'{100 * u1:.1f}%'} ({shown}), "
                f"waited {now.get('waited_ms', 0.0):.0f} ms"
            )
    print(f"largest utilization difference: {worst:.2f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
