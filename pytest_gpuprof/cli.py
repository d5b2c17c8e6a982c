"""The ``gpuprof`` command: read, compare and merge reports outside pytest.

gpuprof show REPORT
gpuprof compare BASE NEW [--fail EXPR[,EXPR...]] [--storage URL]   exit 1 on a clear regression
gpuprof merge A B ... -o OUT
gpuprof history [--storage URL] [--machine ID] [--test PATTERN] [--metric M] [-o FILE.html]
gpuprof prune --keep N [--storage URL] [--machine ID] [--name NAME]
gpuprof export --format bmf|github-action-benchmark REPORT [-o OUT]
gpuprof ab --base REF [--pairs N] [--max-pairs M] [--fail EXPR,...] [--report FILE] [--undecided warn|fail]
           [--run-timeout SECONDS] [--allow-dirty] -- [PYTEST ARGS]
gpuprof explain BASE HEAD [--test PATTERN] [--json FILE] [-o FILE.html]  why each test's wall time changed
gpuprof bisect GOOD BAD [--pairs N] [--max-pairs M] [--fail EXPR,...] [--seed S] [--run-timeout SECONDS]
               -- [PYTEST ARGS]                                    exit 1 naming the first regressed commit

A REPORT is a file or a store's URL (s3://bucket/prefix/MACHINE/...json); BASE may also be
a baseline name of the store (NAME, NAME~K, latest).

Exit codes: 0 done, 1 a clear regression (compare, ab; bisect: its commit named), 2 a report,
argument or run that cannot be used, or a bisection left undecided (the message names it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from pytest_gpuprof.ab import AbError
from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.baselines.gate import Gate
from pytest_gpuprof.baselines.history import DEFAULT_METRICS
from pytest_gpuprof.baselines.records import BaselineError, load, merge, shown
from pytest_gpuprof.baselines.store import Store
from pytest_gpuprof.output.files import write_atomic, write_json
from pytest_gpuprof.output.text import host_in, pct
from pytest_gpuprof.settings.options import BY_FLAG
from pytest_gpuprof.verdict.decision import lines as decided_lines
from pytest_gpuprof.verdict.thresholds import DEFAULT_THRESHOLDS, CompareError, Threshold, parse_thresholds

if TYPE_CHECKING:
    from pytest_gpuprof.output.report import Machine


def _shape(args: argparse.Namespace) -> tuple[tuple[str, ...], str | None, str | None] | None:
    """``show``'s table, where ``--columns``, ``--sort`` or ``--group-by`` asks for one."""
    from pytest_gpuprof.output.columns import NAMED, ColumnError, check_sort, parse_columns

    if args.columns is None and args.sort is None and args.group_by is None:
        return None
    try:
        columns = NAMED if args.columns is None else parse_columns(args.columns)
        sort = None if args.sort is None else check_sort(args.sort)
    except ColumnError as e:
        raise BaselineError(f"--columns/--sort: {e}") from None
    return columns, sort, args.group_by


def show(report: dict[str, Any], shape: tuple[tuple[str, ...], str | None, str | None] | None = None) -> list[str]:
    """A report's machine and tests: a line each, or the table ``shape`` asks for (columns,
    sort, group)."""
    m = report["machine"]
    lines = [
        f"machine {m.get('id')}: {m.get('gpu')}, driver {m.get('driver')}, PCIe {m.get('pcie')}, "
        f"backend {m.get('backend')}, truth {m.get('truth')}; created {report.get('created')}"
    ]
    if report.get("partial"):
        lines.append(f"partial: the run {report['partial']}")
    if report.get("note"):
        lines.append(f"note: {report['note']}")
    if shape is not None:
        from pytest_gpuprof.output import columns as c

        names, sort, group = shape
        rows = c.report_rows(
            report["tests"], [n for n in (*names, sort) if n and n not in ("test", "cause", "verdict", "name")]
        )
        if sort is not None:
            rows = [rows[i] for i in c.order([r[0] for r in rows], [r[2] for r in rows], sort)]
        return lines + c.table(rows, names, group)
    for t in report["tests"]:
        metrics = t.get("metrics", {})
        breaches = t.get("budget", {}).get("breaches", [])
        wall = metrics.get("wall_ms")
        lines.append(
            f"{t['nodeid']}: {t.get('outcome', '?')}, wall {wall if wall is None else f'{wall:.1f}'} ms, "
            f"utilization {pct(metrics.get('utilization'))}, reported {pct(metrics.get('reported_utilization'))}"
            + (f", breaches {', '.join(b.get('key', '?') for b in breaches)}" if breaches else "")
        )
        codes = [(c["where"], c["ms"]) for c in metrics.get("idle_by_code") or ()]
        explained = host_in(codes, metrics.get("unattributed_ms"))
        if explained:
            lines.append(f"  unattributed {metrics['unattributed_ms']:.1f} ms, host in: {explained}")
    return lines


def compare(
    gate: Gate, new: dict[str, Any], base: dict[str, Any] | None = None, every: bool = False
) -> tuple[list[str], bool, bool]:
    """Each test of ``new`` against the gate's baseline (the same ``Gate.compare`` as the
    pytest gate's), then the gate's headline and each undecided test; ``base``: the report
    given by its path, whose tests ``new`` lacks are listed as gone. One screen, as the
    pytest gate's terminal shows it (``short_lines``; the unchanged tests counted), or
    ``every`` line. Whether a test regressed, and whether one was undecided."""
    from pytest_gpuprof.verdict.decision import gate_entry, short_lines
    from pytest_gpuprof.verdict.run_gate import RunGate

    lines: list[str] = []
    if gate.note:
        lines.append(f"note: {gate.note}")
    regressed = False
    judged = []
    quiet = 0  # the tests one screen counts, not shows
    # what else changes kernels (driver, CUDA, libraries) as NEW recorded it: a change named
    # beside the verdict, as the pytest gate names it
    environment = new["machine"].get("environment")
    environment = {str(k): str(v) for k, v in environment.items()} if isinstance(environment, dict) else None
    for test in new["tests"]:
        comparison = gate.compare(test["nodeid"], test, environment)
        if comparison.error:  # the comparison itself failed: the command's error, exit 2
            raise BaselineError(f"{test['nodeid']}: {comparison.why_not}")
        regressed |= bool(comparison.regressed)
        entry = {
            "nodeid": test["nodeid"],
            "gate": gate_entry(comparison),
            "baseline": comparison.record(),
            "comparisons": comparison.change_records(),
        }
        judged.append(entry)
        shown = decided_lines(comparison) if every else short_lines(entry)
        quiet += not shown
        lines += shown
    if quiet:
        lines.append(f"{quiet} test(s) unchanged (-v shows every line)")
    if base is not None:
        gone = sorted({t["nodeid"] for t in base["tests"]} - {t["nodeid"] for t in new["tests"]})
        lines.extend(f"{nodeid}: gone (only in the baseline)" for nodeid in gone)
    run = RunGate.of(judged)
    if run is not None:
        lines += [*run.undecided_lines(), run.headline()]
    return lines, regressed, bool(run is not None and run.undecided)


def _output(path: Path) -> None:
    """Where ``merge -o`` writes: a file in a folder that exists, of a name a file system holds."""
    from pytest_gpuprof.settings.checks import name_problem, shown_path

    problem = name_problem(path)
    if problem is not None:
        raise BaselineError(f"-o {shown_path(path)}: {problem}")
    if path.is_dir():
        raise BaselineError(f"-o {path}: is a folder; give a file path")
    if not path.parent.is_dir():
        raise BaselineError(f"-o {path}: the folder {path.parent} does not exist")


def _history(args: argparse.Namespace) -> int:
    from pytest_gpuprof.baselines import history as h

    store = Store(args.storage)
    machine = store.machine(args.machine)
    for metric in args.metric or ():
        if not descriptors.comparable(metric):
            raise BaselineError(f"--metric {metric}: no such metric; metrics are {descriptors.grammar()}")
    summaries = store.summaries(machine)
    series = h.history(store, machine, args.test, args.metric or h.DEFAULT_METRICS, summaries)
    for line in h.skipped(store, summaries, args.test):
        print(f"gpuprof history: {line}", file=sys.stderr)
    if not series:
        hint = ""
        if not any(c in args.test for c in "*?["):
            hint = f"; the pattern is matched against whole test ids (fnmatch): try --test '*{args.test}*'"
        raise BaselineError(
            f"no stored run of machine {machine} under {shown(args.storage)} has a test matching {args.test!r}{hint}"
        )
    if args.output is None:
        print("\n".join(h.table(series)))
        return 0
    _output(args.output)
    try:
        write_atomic(args.output, h.page(series, machine))
    except OSError as e:
        raise BaselineError(f"-o {args.output}: cannot write: {e.strerror}") from None
    marked = sum(len(s.changes) for s in series)
    print(f"history of {len({s.test for s in series})} tests, {marked} change point(s), written to {args.output}")
    return 0


def _gate(args: argparse.Namespace, new: dict[str, Any], gating: Sequence[Threshold] = ()) -> Gate:
    """``compare``'s and ``explain``'s BASE (a report's file or URL, or a baseline name of
    the store) as the pytest gate opens it; another machine's baseline is compared, and said."""
    text = str(args.base)
    if not (text.endswith(".json") or "/" in text or "://" in text) and Path(text).is_file():
        text = f".{os.sep}{text}"  # a report file in this folder, named without a folder
    machine: Machine = {**new["machine"], "id": args.machine or new["machine"]["id"]}
    gate = Gate.open(text, machine, gating, storage=args.storage, any_machine=True)
    assert gate is not None  # only a saving run may find no baseline
    return gate


def _prune(args: argparse.Namespace) -> int:
    store = Store(args.storage)
    machines = [store.machine(args.machine)] if args.machine else store.machines()
    removed = [key for m in machines for key in store.prune(m, args.keep, args.name)]
    for key, why in store.doubtful.items():
        print(f"gpuprof prune: warning: {store.where(key)} {why}", file=sys.stderr)
    for key in removed:
        damaged = store.damaged.get(key)
        print(f"removed {store.where(key)}" + (f" (damaged: {damaged})" if damaged else ""))
    print(f"pruned {len(removed)} record(s); each name keeps its {args.keep} newest run(s)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from pytest_gpuprof.output.export import export

    text = export(load(args.report, strict=True), args.format, args.metric or DEFAULT_METRICS, args.tool)
    if args.output is None:
        print(text, end="")
        return 0
    _output(args.output)
    try:
        write_atomic(args.output, text)
    except OSError as e:
        raise BaselineError(f"-o {args.output}: cannot write: {e.strerror}") from None
    print(f"exported {args.report} as {args.format} to {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (``| head``): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    """The ``gpuprof`` command and its subcommands."""
    from pytest_gpuprof import __version__

    parser = argparse.ArgumentParser(
        prog="gpuprof", description="read, compare and merge pytest-gpuprof reports, and show their history"
    )
    parser.add_argument("--version", action="version", version=f"gpuprof (pytest-gpuprof) {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_show,
        _add_compare,
        _add_merge,
        _add_history,
        _add_prune,
        _add_export,
        _add_ab,
        _add_bisect,
        _add_explain,
    ):
        add(commands)
    return parser


# what ``add_subparsers`` returns
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _storage(p: argparse.ArgumentParser, machine: str) -> None:
    """``--storage`` and ``--machine``, as the commands that read the store take them."""
    storage = BY_FLAG["--gpu-storage"]
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help=storage.help + " (default: [tool.gpuprof] storage, else .gpuprof, at the project's root: the nearest "
        "folder up from here with pytest.ini, pyproject.toml, tox.ini or setup.cfg, as pytest finds it)",
    )
    p.add_argument("--machine", default=None, help=machine)


def _add_show(commands: Commands) -> None:
    p = commands.add_parser("show", help="print a report", description="print each test of a JSON report")
    p.add_argument("report", help="a JSON report (--gpu-report) or a stored baseline: a file or URL")
    for flag in ("--columns", "--sort", "--group-by"):
        o = BY_FLAG[flag.replace("--", "--gpu-")]
        p.add_argument(flag, default=None, choices=o.choices, metavar=o.metavar, help=o.help + "; a table")


def _add_compare(commands: Commands) -> None:
    p = commands.add_parser(
        "compare",
        help="compare NEW with BASE; exit 1 on a clear regression",
        description="compare each test of NEW with the same test of BASE, metric by metric; exit 1 when one "
        "regressed beyond its threshold and clearly over the rounds (one-sided Mann-Whitney, p < 0.05)",
    )
    p.add_argument(
        "base", help="the baseline: a report's file or URL, or a baseline name of --storage (NAME, NAME~K, latest)"
    )
    p.add_argument("new", help="the report to judge (a file or URL)")
    p.add_argument(
        "--fail",
        default=DEFAULT_THRESHOLDS,
        metavar="EXPR[,EXPR...]",
        help="METRIC:+N%% | METRIC:-N%% | METRIC:+Npt | METRIC:-Npt | METRIC:+Nms | METRIC:-Nms, comma-separated; "
        "the sign is the direction that is worse, pt (percentage points) for fractions only; METRIC is "
        f"{descriptors.grammar()}; default {DEFAULT_THRESHOLDS.replace('%', '%%')}",
    )
    _storage(p, "machine id (default: every machine / NEW's)")
    _undecided(p)
    _verbose(p)


def _add_merge(commands: Commands) -> None:
    p = commands.add_parser(
        "merge", help="merge reports of one machine", description="merge reports of one machine into one"
    )
    p.add_argument(
        "reports", nargs="+", help="reports (files or URLs), each test in one of them: a test in two is refused"
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="the merged report (a file)")


def _add_history(commands: Commands) -> None:
    p = commands.add_parser(
        "history",
        help="each test's metrics across the stored baselines, with their change points",
        description="lay out, for every test and metric, the stored baselines of one machine in order, and "
        "mark the change points: a level shift beyond the noise of the runs around it (the runs on each "
        "side separated, the shift over 3x their spread), never a single outlier",
    )
    _storage(p, "machine id (needed where several are stored)")
    p.add_argument("--test", default="*", metavar="PATTERN", help="test ids to show (fnmatch), default all")
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="M",
        help=f"a metric to show (repeatable), default {', '.join(DEFAULT_METRICS)}",
    )
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE.html", help="a page of trend charts")


def _add_prune(commands: Commands) -> None:
    p = commands.add_parser(
        "prune",
        help="remove old baselines, keeping each name's newest N runs",
        description="remove the stored baselines of each machine and name beyond its N newest runs (the shards "
        "of one run count as one), newest by their created time",
    )
    p.add_argument("--keep", type=_positive, required=True, metavar="N", help="runs to keep per name")
    p.add_argument("--name", default=None, help="only this baseline name")
    _storage(p, "machine id (default: every machine / NEW's)")


def _add_export(commands: Commands) -> None:
    p = commands.add_parser(
        "export",
        help="a report in a dashboard's format",
        description="write a report's metrics (median of the rounds, their range) as Bencher Metric Format (bmf) "
        "or as github-action-benchmark's custom tool JSON (one direction a file: --tool)",
    )
    p.add_argument("report", help="a JSON report or stored baseline: a file or URL")
    p.add_argument("--format", required=True, choices=("bmf", "github-action-benchmark"))
    p.add_argument(
        "--tool",
        choices=("customSmallerIsBetter", "customBiggerIsBetter"),
        default="customSmallerIsBetter",
        help="github-action-benchmark: which metrics, by the way they get better (default customSmallerIsBetter)",
    )
    p.add_argument("--metric", action="append", default=None, metavar="M", help=f"default {', '.join(DEFAULT_METRICS)}")
    p.add_argument("-o", "--output", type=Path, default=None, help="a file (default: print)")


def _add_ab(commands: Commands) -> None:
    p = commands.add_parser(
        "ab",
        help="run the base revision and this tree in turns; exit 1 on a clear regression",
        description="check out REF in a temporary git worktree and run the same pytest arguments in it and in "
        "this tree in turns (pairs of fresh processes on one runner, the side that starts each pair random); "
        "compare each test's runs pair by pair and print each effect with its 96% interval and the smallest "
        "detectable change; exit 1 on a clear regression under --fail, 0 otherwise, 2 on an error",
    )
    p.add_argument(
        "--base", required=True, metavar="REF", help="the git revision to compare with (main, HEAD~1, a sha)"
    )
    _pairing(p)
    p.add_argument("--report", type=Path, default=None, metavar="FILE", help="the effects as JSON")
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="measure the working tree with its uncommitted changes as the head (refused otherwise); said first and last",
    )
    _undecided(p)
    _verbose(p)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")


def _add_bisect(commands: Commands) -> None:
    p = commands.add_parser(
        "bisect",
        help="the first commit between GOOD and BAD where the tests regressed; exit 1 naming it",
        description="binary search over the commits between GOOD and BAD, each step a gpuprof ab of GOOD against "
        "one commit in temporary worktrees (regressed / same / undecided, more pairs where unsure); prints the "
        "first regressed commit and the steps; exit 1 naming it, 0 where BAD does not regress, 2 on an error "
        "or a step left undecided",
    )
    p.usage = "gpuprof bisect GOOD BAD [options] -- [PYTEST ARGS]"
    p.add_argument("good", metavar="GOOD", help="a revision whose tests pass at their level (a tag, a sha)")
    p.add_argument("bad", metavar="BAD", help="a later revision that regressed (HEAD, a sha)")
    _pairing(p)
    # pytest's arguments follow a -- (``_main`` cuts them off): after GOOD and BAD a
    # remainder would swallow the options too
    p.set_defaults(pytest_args=[])


def _bisect(args: argparse.Namespace) -> int:
    from pytest_gpuprof.ab import Looks
    from pytest_gpuprof.bisection import bisect

    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    looks = Looks.of(args.pairs, args.max_pairs, args.fail, args.seed, args.run_timeout)
    found = bisect(args.good, args.bad, pytest_args, looks, say=lambda line: print(line, file=sys.stderr))
    print("\n".join(found.lines()))
    return found.exit_code()


def _pairing(p: argparse.ArgumentParser) -> None:
    """How ``ab`` and each step of ``bisect`` run their pairs and what fails them."""
    p.add_argument(
        "--pairs", type=_pairs, default=5, metavar="N", help=f"pairs of runs (default 5, at most {MOST_PAIRS})"
    )
    p.add_argument(
        "--max-pairs", type=_pairs, default=None, metavar="M", help="pairs an unsure test may get (default 2N)"
    )
    p.add_argument("--fail", default=None, metavar="EXPR[,EXPR...]", help="what fails: as --gpu-compare-fail")
    p.add_argument("--seed", type=int, default=None, help="the seed of which side starts each pair (reproducible runs)")
    p.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="end a pytest run of a pair that takes longer, with one line naming the pair (default 1800)",
    )


def _add_explain(commands: Commands) -> None:
    p = commands.add_parser(
        "explain",
        help="why each test's wall time changed between two runs, cause by cause",
        description="split each test's change of wall time between BASE and HEAD into its causes: each kernel's "
        "time (appeared, vanished, replaced, slower, faster, launches, geometry), each step's kernel-idle (its "
        "copies: bytes, rate, pinned or pageable; overlap lost; where the host now waits), each with its size and "
        "share of the change, what they do not sum to shown as unexplained; the device memory kept past the call "
        "by step and line; the environment's changes; what a record cannot tell, said not judged",
    )
    p.add_argument(
        "base", metavar="BASE", help="the run before: a report's file or URL, or a baseline name of --storage "
        "(NAME, NAME~K, latest)"
    )  # fmt: skip
    p.add_argument("head", type=Path, metavar="HEAD", help="the report after")
    p.add_argument("--test", default="*", metavar="PATTERN", help="test ids to explain (fnmatch), default all")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="every cause of every test as JSON")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE.html", help="the explanations as a page")
    p.add_argument("--top", type=_positive, default=5, metavar="N", help="causes shown a test (default 5)")
    _storage(p, "machine id of BASE's baseline (default: HEAD's)")


def _explain(args: argparse.Namespace) -> int:
    import fnmatch
    import json

    from pytest_gpuprof.baselines.gate import changed
    from pytest_gpuprof.verdict.explain import explain

    new = load(args.head, strict=True)
    gate = _gate(args, new)
    found, missing, environment, runs = [], [], {}, []
    for test in (t for t in new["tests"] if "crashed" not in t and fnmatch.fnmatchcase(t["nodeid"], args.test)):
        held = gate.reference.entry(test["nodeid"])
        if held is None:
            missing.append(test["nodeid"])
            continue
        found.append(explain(held[0], test))
        runs.append((found[-1], held[0], test))
        environment = dict(held[1].environment)
    lines = [f"gpuprof explain: {gate.where} against {args.head}"]
    moved = changed(environment, {str(k): str(v) for k, v in (new["machine"].get("environment") or {}).items()})
    if moved:
        lines.append(f"the environment changed: {', '.join(moved)}")
    for e in sorted(found, key=lambda e: -abs(e.change_ms)):
        lines += e.lines(args.top)
    if missing:
        lines.append(f"gpuprof explain: {len(missing)} test(s) BASE does not hold: {', '.join(missing[:5])}")
    print("\n".join(lines))
    documents = {"json": json.dumps([e.to_dict() for e in found], indent=2) + "\n"}
    if args.output is not None:
        from pytest_gpuprof.output.explain_page import page

        documents["output"] = page(sorted(runs, key=lambda r: -abs(r[0].change_ms)), lines[: 2 if moved else 1])
    for name, document in documents.items():
        if (path := getattr(args, name)) is not None:
            _output(path)
            write_atomic(path, document)
    return 0


def _undecided(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--undecided",
        choices=("warn", "fail"),
        default="warn",
        help="a gated test the comparison cannot decide (its threshold within the noise): warn (exit 0, named and "
        "counted) or fail (exit 1) (default warn)",
    )


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="every line of every test (rounds, p, the spread, the bound); by default one screen: what changed "
        "or was undecided, one short line each, the unchanged tests counted",
    )


def _ab(args: argparse.Namespace) -> int:
    from pytest_gpuprof import ab

    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.report is not None:
        _output(args.report)
    outcome = ab.ab(
        args.base,
        pytest_args,
        pairs=args.pairs,
        max_pairs=args.max_pairs,
        fail=args.fail,
        seed=args.seed,
        say=lambda line: print(line, file=sys.stderr),
        allow_dirty=args.allow_dirty,
        run_timeout=args.run_timeout,
    )
    print("\n".join(outcome.lines(every=args.verbose)))
    try:
        ab.report(outcome, args.report)
    except OSError as e:
        raise BaselineError(f"--report / $GITHUB_STEP_SUMMARY: cannot write: {e.strerror or e}") from None
    return outcome.exit_code(args.undecided)


class _Stopped(Exception):
    """SIGTERM or SIGHUP (a runner's cancel, ``timeout``, a closed terminal): unwound as
    Ctrl-C is, so that what the command made is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, stop)


def _run(args: argparse.Namespace) -> int:
    """The command ``args`` names, its exit code; its errors are ``_main``'s to say."""
    if args.command == "show":
        print("\n".join(show(load(args.report, strict=True), _shape(args))))
        return 0
    if args.command == "history":
        return _history(args)
    if args.command == "prune":
        return _prune(args)
    if args.command == "export":
        return _export(args)
    if args.command == "ab":
        _stop_on_signals()
        return _ab(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "bisect":
        _stop_on_signals()
        return _bisect(args)
    if args.command == "compare":
        new = load(args.new)
        gate = _gate(args, new, parse_thresholds(args.fail))
        base = gate.reference.newest_record if gate.reference.store is None else None
        lines, regressed, undecided = compare(gate, new, base, every=args.verbose)
        print("\n".join(lines))
        return 1 if regressed or (undecided and args.undecided == "fail") else 0
    _output(args.output)
    merged = merge([load(p, strict=True) for p in args.reports], [str(p) for p in args.reports])
    try:
        write_json(args.output, merged)
    except OSError as e:
        raise BaselineError(f"-o {args.output}: cannot write: {e.strerror}") from None
    print(f"merged {len(args.reports)} reports into {args.output}")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    rest = None
    if given[:1] in (["ab"], ["bisect"]) and "--" in given:  # pytest's own, after the first --
        cut = given.index("--")
        given, rest = given[:cut], given[cut + 1 :]
    args = _parser().parse_args(given)
    if rest is not None:
        args.pytest_args = rest
    if getattr(args, "storage", "") is None:
        from pytest_gpuprof.baselines.place import default_storage

        args.storage = default_storage(Path.cwd(), BY_FLAG["--gpu-storage"].default)
    try:
        return _run(args)
    except (BaselineError, CompareError, AbError) as e:
        print(f"gpuprof {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the system refused (a name too long): named, never a traceback
        where = str(e.filename)[:120] if e.filename is not None else "a file"
        print(f"gpuprof {args.command}: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpuprof {args.command}: interrupted; what it had made is removed", file=sys.stderr)
        return 130
    except _Stopped as e:
        import signal

        name = signal.Signals(e.signum).name
        print(f"gpuprof {args.command}: stopped by {name}; what it had made is removed", file=sys.stderr)
        return 128 + e.signum
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        # a report that passed the checks of ``load`` but holds fields of the wrong shape
        read = {
            "show": lambda: [args.report],
            "compare": lambda: [args.base, args.new],
            "merge": lambda: args.reports,
            "history": lambda: [args.storage],
            "prune": lambda: [args.storage],
            "export": lambda: [args.report],
            "ab": lambda: [args.base],
            "bisect": lambda: [args.good, args.bad],
            "explain": lambda: [args.base, args.head],
        }[args.command]()
        where = ", ".join(map(str, read))
        print(f"gpuprof {args.command}: {where}: a field of the wrong shape ({type(e).__name__}: {e})", file=sys.stderr)
        return 2


# pairs of fresh processes, each two pytest runs: past this a run of ab is a mistake
MOST_PAIRS = 1000


def _pairs(text: str) -> int:
    pairs = _positive(text)
    if pairs > MOST_PAIRS:
        raise argparse.ArgumentTypeError(f"{text}: at most {MOST_PAIRS} pairs")
    return pairs


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of 1 or more")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())
