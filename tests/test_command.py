"""The gpuprof command: merge, compare, history, and what each says of its arguments."""

from __future__ import annotations

import json

import pytest


def _report(tmp_path, name, nodeid="t::a", **extra):
    from tests.verdict.test_compare import report

    path = tmp_path / name
    data = report(tests=[{"nodeid": nodeid, "outcome": "passed", "metrics": {"wall_ms": 1.0}}])
    path.write_text(json.dumps({**data, **extra}))
    return path


def test_merge_refuses_a_folder_or_a_missing_folder_and_keeps_any_partial_run(tmp_path, capsys):
    from pytest_gpuprof import cli

    done = _report(tmp_path, "done.json")
    cut = _report(tmp_path, "cut.json", nodeid="t::b", partial="was interrupted")
    assert cli.main(["merge", str(done), str(cut), "-o", str(tmp_path)]) == 2
    assert "is a folder; give a file path" in capsys.readouterr().err
    assert cli.main(["merge", str(done), str(cut), "-o", str(tmp_path / "missing" / "m.json")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    merged = tmp_path / "m.json"
    assert cli.main(["merge", str(cut), str(done), "-o", str(merged)]) == 0
    assert json.loads(merged.read_text())["partial"] == "was interrupted (1 of 2)"
    capsys.readouterr()
    assert cli.main(["show", str(merged)]) == 0
    assert "partial: the run was interrupted (1 of 2)" in capsys.readouterr().out


def test_compare_names_a_metric_in_neither_report_as_such(tmp_path, capsys):
    from pytest_gpuprof import cli

    a, b = _report(tmp_path, "a.json"), _report(tmp_path, "b.json")
    assert cli.main(["compare", str(a), str(b), "--fail", "steps.uplod.host_ms:+5%", "-v"]) == 0
    out = capsys.readouterr().out
    assert "steps.uplod.host_ms: not measured in the baseline nor in this run: this gate cannot act" in out
    assert "gate inert: steps.uplod.host_ms:+5%" in out and "not in baseline" not in out


@pytest.mark.parametrize(("command", "words"), [("show", "JSON report"), ("compare", "METRIC:+N%"), ("merge", "file")])
def test_each_command_describes_its_arguments(command, words, capsys):
    from pytest_gpuprof import cli

    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    assert words in capsys.readouterr().out


def test_a_malformed_report_is_named_by_file_test_and_field_in_every_command(tmp_path, capsys):
    from pytest_gpuprof import cli

    bad = _report(tmp_path, "bad.json")
    data = json.loads(bad.read_text())
    data["tests"][0]["metrics"] = "oops"
    machine = data["machine"]["id"]
    stored = tmp_path / "store" / machine / "0001_main.json"
    stored.parent.mkdir(parents=True)
    for path in (bad, stored):
        path.write_text(json.dumps(data))
    good = _report(tmp_path, "good.json")
    for argv, path in (
        (["show", str(bad)], bad),
        (["merge", str(good), str(bad), "-o", str(tmp_path / "m.json")], bad),
        (["history", "--storage", str(tmp_path / "store")], stored),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"{path}: test t::a: metrics: a table is expected, not 'oops'" in err, argv
        assert "AttributeError" not in err
    assert not (tmp_path / "m.json").exists()
    # a comparison leaves the unusable test out, naming it the same way
    assert cli.main(["compare", str(bad), str(good)]) == 0
    assert f"t::a: not compared: {bad}: metrics: a table is expected, not 'oops'" in capsys.readouterr().out


def test_show_lays_a_report_out_as_a_table_of_the_columns_asked_for(tmp_path, capsys):
    from pytest_gpuprof import cli
    from tests.verdict.test_compare import report

    tests = [
        {"nodeid": "a.py::t1", "verdict": "ok", "metrics": {"wall_ms": 10.0, "utilization": 0.9, "kernel_ms": 9.0}},
        {"nodeid": "b.py::t2", "verdict": "FAIL", "metrics": {"wall_ms": 20.0, "utilization": 0.4, "kernel_ms": 8.0}},
        {"nodeid": "a.py::t3", "verdict": "ok", "metrics": {"wall_ms": 5.0, "utilization": None}},
    ]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(tests=tests)))
    assert cli.main(["show", str(path), "--columns", "utilization,kernel_ms,verdict", "--sort", "utilization"]) == 0
    heading, *rows = capsys.readouterr().out.splitlines()[1:]
    assert heading.split() == ["test", "util", "kernel_ms", "verdict"]
    assert [r.split() for r in rows] == [
        ["b.py::t2", "40.0%", "8.0", "FAIL"],
        ["a.py::t1", "90.0%", "9.0", "ok"],
        ["a.py::t3", "-", "-", "ok"],  # no figure: last, and not 0
    ]
    assert cli.main(["show", str(path), "--group-by", "module"]) == 0
    out = capsys.readouterr().out
    assert "-- module a.py (2 rows)" in out and "-- module b.py (1 row)" in out
    assert cli.main(["show", str(path)]) == 0  # without them: a line a test, as before
    assert "a.py::t1: ?, wall 10.0 ms, utilization 90.0%" in capsys.readouterr().out
    assert cli.main(["show", str(path), "--sort", "fastest"]) == 2
    assert "'fastest' names no metric" in capsys.readouterr().err


LONG = "x" * 300  # a name past the 255 bytes a file system holds


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu-report={}.json"],
        ["--gpu-html={}.html"],
        ["--gpu-csv={}.csv"],
        ["--gpu-trace={}"],
        ["--gpu-budget-file={}.toml"],
        ["--gpu-storage={}", "--gpu-save=main"],
        ["--gpu-storage={}", "--gpu-compare=main"],
    ],
    ids=["report", "html", "csv", "trace", "budget-file", "storage-save", "storage-compare"],
)
def test_a_name_too_long_for_a_file_system_is_one_usage_line(pytester, args):
    """Each once ended in INTERNALERROR (OSError: File name too long) from deep inside."""
    pytester.makepyfile("def test_a(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    result = pytester.runpytest(*(a.format(LONG) for a in args), "--gpu-host-clock=virtual")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-400:] + result.stderr.str()[-400:]
    err = result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + err and "Traceback" not in err
    assert args[0].split("=")[0] in err or "File name too long" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["merge", "{report}", "-o", "{long}.json"],
        ["compare", "{report}", "{long}.json"],
        ["compare", "{long}.json", "{report}"],
        ["show", "{long}.json"],
        ["export", "{report}", "--format", "bmf", "-o", "{long}.json"],
    ],
    ids=["merge-o", "compare-new", "compare-base", "show", "export-o"],
)
def test_a_command_given_a_name_too_long_says_so_in_one_line(tmp_path, capsys, argv):
    from pytest_gpuprof import cli

    report = _report(tmp_path, "r.json")
    code = cli.main([a.format(report=report, long=tmp_path / LONG) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"gpuprof {argv[0]}: ")


@pytest.mark.parametrize(
    "argv",
    [["show", "{fifo}"], ["export", "{fifo}", "--format", "bmf"], ["merge", "{fifo}", "{report}", "-o", "{out}"],
     ["compare", "{report}", "{fifo}"]],
    ids=["show", "export", "merge", "compare"],
)  # fmt: skip
def test_a_fifo_given_as_a_report_is_refused_not_read(tmp_path, argv):
    """show, export and merge once blocked for good on a FIFO with no writer."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    report = _report(tmp_path, "other.json")
    args = [a.format(fifo=fifo, report=report, out=tmp_path / "m.json") for a in argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest_gpuprof", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{fifo}: cannot read: is a FIFO, not a report's file" in done.stderr


def test_a_partial_file_a_killed_writer_left_in_the_report_folder_goes_with_the_next_report(pytester):
    """A kill between a report's temporary file and its rename left the temporary file for
    good; the next report written there removes those older than a write could be, not a
    live writer's."""
    import os
    import time

    from pytest_gpuprof.output.files import STALE_TMP_S

    pytester.makepyfile("def test_a(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    out = pytester.mkdir("out")
    stale, fresh = out / ".gpuprof.killed.tmp", out / ".gpuprof.live.tmp"
    for partial in (stale, fresh):
        partial.write_text("{")
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    pytester.runpytest("--gpu-report=out/r.json", "--gpu-host-clock=virtual").assert_outcomes(passed=1)
    assert not stale.exists() and fresh.exists() and (out / "r.json").is_file()
