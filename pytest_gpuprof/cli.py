"""The ``gpuprof`` command: read, compare and merge reports outside pytest.

gpuprof show REPORT
gpuprof compare BASE NEW [--fail EXPR[,EXPR...]]   exit 1 on a clear regression
gpuprof merge A B ... -o OUT
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_gpuprof.output.files import write_json
from pytest_gpuprof.output.storage import BaselineError, load
from pytest_gpuprof.output.text import pct
from pytest_gpuprof.verdict.compare import (
    DEFAULT_THRESHOLDS,
    CompareError,
    change_lines,
    compare_tests,
    parse_thresholds,
)


def show(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    lines = [
        f"machine {m.get('id')}: {m.get('gpu')}, driver {m.get('driver')}, PCIe {m.get('pcie')}, "
        f"backend {m.get('backend')}, truth {m.get('truth')}; created {report.get('created')}"
    ]
    for t in report["tests"]:
        metrics = t.get("metrics", {})
        breaches = t.get("budget", {}).get("breaches", [])
        wall = metrics.get("wall_ms")
        lines.append(
            f"{t['nodeid']}: {t.get('outcome', '?')}, wall {wall if wall is None else f'{wall:.1f}'} ms, "
            f"utilization {pct(metrics.get('utilization'))}, reported {pct(metrics.get('reported_utilization'))}"
            + (f", breaches {', '.join(b.get('key', '?') for b in breaches)}" if breaches else "")
        )
    return lines


def compare(base: dict[str, Any], new: dict[str, Any], expressions: str) -> tuple[list[str], bool]:
    thresholds = parse_thresholds(expressions)
    by_id = {t["nodeid"]: t for t in base["tests"]}
    lines = []
    if base["machine"].get("id") != new["machine"].get("id"):
        lines.append(f"note: machine ids differ ({base['machine'].get('id')} vs {new['machine'].get('id')})")
    regressed = False
    for test in new["tests"]:
        old = by_id.get(test["nodeid"])
        if old is None:
            lines.append(f"{test['nodeid']}: new")
            continue
        changes = compare_tests(thresholds, old, test)
        lines += change_lines(test["nodeid"], changes)
        regressed |= any(c.finding == "regression" for c in changes)
    gone = sorted(set(by_id) - {t["nodeid"] for t in new["tests"]})
    lines.extend(f"{nodeid}: gone (only in the baseline)" for nodeid in gone)
    return lines, regressed


def merge(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report of several: later reports win for a test id seen twice."""
    ids = {r["machine"].get("id") for r in reports}
    if len(ids) > 1:
        raise BaselineError(f"cannot merge reports of different machines: {', '.join(sorted(map(str, ids)))}")
    tests: dict[str, dict[str, Any]] = {}
    for r in reports:
        for t in r["tests"]:
            tests[t["nodeid"]] = t
    return {**reports[-1], "tests": list(tests.values())}


def main(argv: Sequence[str] | None = None) -> int:
    from pytest_gpuprof import __version__

    parser = argparse.ArgumentParser(prog="gpuprof", description="read, compare and merge pytest-gpuprof reports")
    parser.add_argument("--version", action="version", version=f"gpuprof (pytest-gpuprof) {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    p_show = commands.add_parser("show", help="print a report")
    p_show.add_argument("report", type=Path)
    p_compare = commands.add_parser("compare", help="compare NEW with BASE; exit 1 on a clear regression")
    p_compare.add_argument("base", type=Path)
    p_compare.add_argument("new", type=Path)
    p_compare.add_argument(
        "--fail",
        default=DEFAULT_THRESHOLDS,
        metavar="EXPR[,EXPR...]",
        help=f"default {DEFAULT_THRESHOLDS.replace('%', '%%')}",
    )
    p_merge = commands.add_parser("merge", help="merge reports of one machine")
    p_merge.add_argument("reports", type=Path, nargs="+")
    p_merge.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            print("\n".join(show(load(args.report))))
            return 0
        if args.command == "compare":
            lines, regressed = compare(load(args.base), load(args.new), args.fail)
            print("\n".join(lines))
            return 1 if regressed else 0
        write_json(args.output, merge([load(p) for p in args.reports]))
        print(f"merged {len(args.reports)} reports into {args.output}")
        return 0
    except (BaselineError, CompareError) as e:
        print(f"gpuprof {args.command}: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        # a report that passed the checks of ``load`` but holds fields of the wrong shape
        read = (
            [args.report]
            if args.command == "show"
            else [args.base, args.new]
            if args.command == "compare"
            else args.reports
        )
        where = ", ".join(map(str, read))
        print(f"gpuprof {args.command}: {where}: a field of the wrong shape ({type(e).__name__}: {e})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
