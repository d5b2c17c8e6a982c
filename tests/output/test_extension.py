"""What a project builds on: the hookspecs, the GPU-budget failure category and report
section, and the JSON Schemas of the report and the baseline, with frozen documents of the
current format that every later version must read."""

import json
from pathlib import Path

import jsonschema
import pytest

from pytest_gpuprof.baselines.records import load
from pytest_gpuprof.baselines.store import Store
from pytest_gpuprof.output import schema

DATA = Path(__file__).parents[1] / "data"

PIPELINE = """
def test_pipeline(gpuprof, gpu_workload):
    gpu_workload.partitions(n=8, workers=2)

def test_plain():
    assert 1 + 1 == 3
"""

HOOKS = """
def pytest_gpuprof_machine_info(config, machine):
    machine["runner"] = "rack-7"

def pytest_gpuprof_update_json(config, report):
    report["build"] = {"url": "https://ci.example/1"}
"""


def test_the_hooks_add_to_the_machine_and_the_report_and_baseline(pytester):
    pytester.makepyfile(test_p=PIPELINE.split("def test_plain")[0])
    pytester.makeconftest(HOOKS)
    result = pytester.runpytest("--gpu-report=r.json", "--gpu-save=main")
    assert result.ret == 0
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["machine"]["runner"] == "rack-7" and report["build"] == {"url": "https://ci.example/1"}
    (stored,) = (pytester.path / ".gpuprof").rglob("main@*.json")
    baseline = json.loads(stored.read_text())
    assert baseline["machine"]["runner"] == "rack-7" and baseline["build"]["url"] == "https://ci.example/1"
    schema.validate(report)
    schema.validate(baseline, "baseline")


def test_without_the_hooks_nothing_is_added(pytester):
    pytester.makepyfile(test_p=PIPELINE.split("def test_plain")[0])
    assert pytester.runpytest("--gpu-report=r.json").ret == 0
    report = json.loads((pytester.path / "r.json").read_text())
    assert "runner" not in report["machine"] and "build" not in report


def test_a_hook_with_a_wrong_name_or_argument_is_refused_by_pytest(pytester):
    pytester.makeconftest("def pytest_gpuprof_machine_info(config, machin):\n    pass\n")
    pytester.makepyfile(test_p="def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret != 0 and "machin" in result.stdout.str() + result.stderr.str()


def test_a_budget_failure_is_its_own_status_with_a_section(pytester):
    pytester.makepyfile(test_p=PIPELINE)
    result = pytester.runpytest("--gpu-budget", "--gpu-min-utilization=0.9", "-v", "-rf")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_p.py::test_pipeline GPU BUDGET*", "*test_p.py::test_plain FAILED*"])
    result.stdout.fnmatch_lines(
        [
            "GPU budget exceeded: utilization 66.7% < 90.0% (min_utilization)*",
            "*- gpuprof -*",
            "test *wall ms*kernel_ms*copy_ms*util*reported*largest idle cause",
            "test_p.py::test_pipeline *67.1*44.7*66.7%*100.0%*upload 22.4 ms",
        ]
    )
    result.stdout.re_match_lines([r"GPU BUDGET test_p.py::test_pipeline - Failed: GPU budget exceeded"])
    assert result.parseoutcomes()["failed"] == 2  # counted with the failures
    quiet = pytester.runpytest("--gpu-budget", "--gpu-min-utilization=0.9", "-q")
    quiet.stdout.fnmatch_lines(["GF*"])
    passing = pytester.runpytest("--gpu-budget", "--gpu-min-utilization=0.5", "-v")
    passing.stdout.fnmatch_lines(["*test_p.py::test_pipeline PASSED*"])


def test_an_uncaught_check_is_a_gpu_budget_failure_too(pytester):
    pytester.makepyfile(
        test_p="""
        def test_checked(gpuprof, gpu_workload):
            gpu_workload.partitions(n=8, workers=2)
            gpuprof.check(min_utilization=0.9)
        """
    )
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_p.py::test_checked GPU BUDGET*"])


# the schemas


@pytest.mark.parametrize("which", sorted(schema.FILES))
def test_the_shipped_schemas_are_the_ones_the_descriptors_build(which):
    assert schema.FILES[which].read_text() == schema.text(which), "python -m pytest_gpuprof.output.schema"
    jsonschema.Draft202012Validator.check_schema(json.loads(schema.FILES[which].read_text()))


def test_the_frozen_report_and_baseline_of_schema_1_are_still_read():
    report = load(str(DATA / "report-schema1.json"), strict=True)
    schema.validate(report)
    store = Store(str(DATA / "store"))
    (machine,) = store.machines()
    reference = store.reference(machine, "main", 1)
    entry = reference.entry("test_seed_pipeline.py::test_single_lock_pipeline")
    assert entry is not None and entry[0]["metrics"]["utilization"] == pytest.approx(2 / 3, abs=1e-3)
    for path in (DATA / "store").rglob("*.json"):
        schema.validate(json.loads(path.read_text()), "baseline")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.update(schema=2), "schema"),
        (lambda r: r["tests"][0]["metrics"].update(utilization="high"), "utilization"),
        (lambda r: r["tests"][0]["metrics"].update(kernel_ms=-1.0), "kernel_ms"),
        (lambda r: r["tests"][0].pop("verdict"), "verdict"),
        (lambda r: r["machine"].pop("id"), "id"),
        (lambda r: r["tests"][0]["budget"]["breaches"].append({"metric": "x"}), "value"),
    ],
)
def test_the_schema_refuses_a_report_that_breaks_it(change, field):
    report = json.loads((DATA / "report-schema1.json").read_text())
    schema.validate(report)
    change(report)
    with pytest.raises(jsonschema.ValidationError, match=field):
        schema.validate(report)


def test_a_baseline_needs_its_name_and_run(tmp_path):
    report = json.loads((DATA / "report-schema1.json").read_text())
    with pytest.raises(jsonschema.ValidationError, match="name"):
        schema.validate(report, "baseline")
    schema.validate({**report, "name": "main", "run_id": "r1"}, "baseline")


def test_the_suite_checks_every_report_it_writes(pytester, monkeypatch):
    """The suite's runs write under PYTEST_GPUPROF_CHECK_SCHEMA=1: a report breaking the
    schema is an error there (shown with a hook that breaks it)."""
    pytester.makepyfile(test_p=PIPELINE.split("def test_plain")[0])
    pytester.makeconftest("def pytest_gpuprof_update_json(config, report):\n    report['schema'] = 2\n")
    monkeypatch.setenv("PYTEST_GPUPROF_CHECK_SCHEMA", "1")
    result = pytester.runpytest("--gpu-report=r.json")
    assert result.ret != 0 and "ValidationError" in result.stdout.str() + result.stderr.str()
    monkeypatch.delenv("PYTEST_GPUPROF_CHECK_SCHEMA")
    assert pytester.runpytest("--gpu-report=r.json").ret == 0
