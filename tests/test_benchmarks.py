"""The benchmarks do not rot: each loads against the package as it is now, those with
arguments parse them, and those that mean something without a GPU run one tiny case on
the host backend. Their figures are taken on the GPU (docs/performance-log.md)."""

import json
import runpy
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks"
# the scripts (their helpers, such as the printed table, are modules they import)
BENCHMARKS = sorted(p for p in FOLDER.glob("*.py") if "__main__" in p.read_text())


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_each_benchmark_loads(script, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))
    names = runpy.run_path(str(script), run_name="benchmark_smoke")
    assert callable(names.get("main")), f"{script.name} has no main()"


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_every_benchmark_answers_help_without_running(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def run_benchmark(name, *argv, monkeypatch):
    script = FOLDER / f"{name}.py"
    monkeypatch.syspath_prepend(str(FOLDER))
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"{name} {' '.join(argv)} exited {exit_.code}"


@pytest.mark.parametrize(
    ("name", "argv", "printed"),
    [
        ("startup", ["--backend", "host"], ["calibrate upload", "size the kernels", "all"]),
        (
            "whatif",
            ["--host", "--windows", "3"],
            ["3 windows, scenarios on", "3 windows, scenarios off", "seed single lock"],
        ),
        ("columns", ["compute", "--kernels", "500"], ["metrics.compute of 500 kernels"]),
        ("bench", ["--host", "plugin", "--runs", "2", "--tests", "5"], ["5 trivial tests, plugin loaded vs not: CPU"]),
        ("suite_memory", ["2", "--steps", "3"], ["2 tests of 3 steps: peak RSS "]),
        (
            "attacks",
            ["--fuzz", "40", "--signals", "0", "--seed", "5"],
            ['"tracebacks": 0', '"refusals naming no file": 0', '"implausible times compared": 0'],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_benchmark_runs_a_tiny_case_on_the_host_backend(name, argv, printed, monkeypatch, capsys):
    run_benchmark(name, *argv, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    for text in printed:
        assert text in out, out


def report_entry(nodeid, level, noise=0.0):
    """A report's test as the gate benchmark keeps it: figures and five rounds of each."""
    samples = [level * (1 + noise * k) for k in range(5)]
    rounds = {m: {"samples": [f * x for x in samples]} for m, f in (("wall_ms", 10), ("kernel_ms", 5), ("busy_ms", 5))}
    rounds["kernels.spin.total_ms"] = {"samples": [4 * x for x in samples]}
    metrics = {"wall_ms": 10 * level, "kernel_ms": 5 * level, "busy_ms": 5 * level, "utilization": 0.5}
    return {
        "nodeid": nodeid,
        "outcome": "passed",
        "metrics": {**metrics, "kernel_totals": {"spin": {}}},
        "rounds": rounds,
    }


def test_the_gate_and_parallel_benchmarks_judge_reports_they_are_given(tmp_path, monkeypatch, capsys):
    slower = [1.0, 1.01, 1.02, 1.05]
    runs = [
        {
            "machine": {"id": "host-test"},
            "tests": [report_entry(f"t.py::test_loop[{s}]", s * (1 + 0.0001 * i), 0.001) for s in slower],
        }
        for i in range(4)
    ]
    data = tmp_path / "gates.json"
    data.write_text(json.dumps({"slower": slower, "runs": runs}))
    run_benchmark("gates", "judge", str(data), "--history", str(tmp_path / "history"), monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert "test_loop: spread from process to process" in out and "5% slower caught" in out
    assert len(list((tmp_path / "history" / "host-test").glob("*.json"))) == 4

    for name, waited in (("serial", 0.0), ("parallel", 120.0)):
        tests = [{**report_entry("t.py::test_loop", 1.0), "waited_ms": waited}]
        (tmp_path / f"{name}.json").write_text(json.dumps({"tests": tests}))
    run_benchmark("parallel", str(tmp_path / "serial.json"), str(tmp_path / "parallel.json"), monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert "t.py::test_loop: passed->passed utilization 50.0% -> 50.0% (+0.00pt), waited 120 ms" in out


def test_the_gate_simulation_runs_a_scenario_through_the_gate(monkeypatch, capsys):
    run_benchmark("gate_sim", "--histories", "20", "--scenario", "one saved run, sd 1%", monkeypatch=monkeypatch)
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| one saved run")]
    assert row.startswith("| one saved run, sd 1% | 0.00% | 0.0% |")  # never a regression from one run's rounds
