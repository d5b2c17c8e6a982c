"""The gate's workflow off the main road, as a CI team walks it: each case once gave a wrong
verdict or a stuck job (a regression passed, a narrowed run became the baseline, a damaged
field failed a passing test, clocks mixed, a bootstrap that could never start)."""

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from plugin_runs import TWO_MEASURED, page_data_of

SUITE = TWO_MEASURED
GATE = "--gpu-compare-fail=kernel_ms:+5%"


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(test_pipeline=SUITE)
    return pytester


def _stored(pytester):
    return sorted(Path(pytester.path, ".gpuprof").glob("host-*/*.json"))


def test_k_of_zero_is_refused_not_read_as_no_baseline(suite, monkeypatch):
    """``main~0`` once pooled nothing and passed a 100% regression as ``new``."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    for value in ("main~0", "latest~0"):
        result = suite.runpytest(f"--gpu-compare={value}", GATE)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*K is a whole number of 1 or more*"])
    suite.runpytest("--gpu-compare=main~1", GATE).assert_outcomes(passed=1, failed=1)


@pytest.mark.parametrize("narrowed", ["test_pipeline.py::test_omega", "test_pipeline.py"])
def test_a_run_narrowed_by_test_id_or_file_is_no_baseline(suite, monkeypatch, narrowed):
    """A run of one test (or one file) saved as main once hid the next regression of that
    test ("12.000 -> 12.000 unchanged"): it saves nothing, as -k does; a folder is a suite."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest(narrowed, "--gpu-save=main")
    kind = "test id" if "::" in narrowed else "file"
    result.stdout.fnmatch_lines([f"gpuprof: no baseline saved: ran with the {kind} {narrowed}: not every*"])
    assert len(_stored(suite)) == 1
    suite.runpytest("--gpu-compare=main", GATE).assert_outcomes(passed=1, failed=1)
    suite.runpytest(".", "--gpu-save=nightly").stdout.fnmatch_lines(["gpuprof: baseline saved as *nightly@*"])


def _damage(pytester, change):
    (path,) = _stored(pytester)
    record = json.loads(path.read_text())
    for test in record["tests"]:
        change(test)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda t: t["metrics"].update(kernel_totals=[1, 2]), "metrics.kernel_totals"),
        (lambda t: t["metrics"].update(wall_ms=10**400), "metrics.wall_ms: a number is expected, not an integer"),
        (lambda t: t["rounds"]["kernel_ms"].update(samples=[10**400] * 5), "rounds.kernel_ms.samples"),
        # implausible figures: once +inf% (a passing test failed) or every change unchanged
        (
            lambda t: t["rounds"]["kernel_ms"].update(samples=[5e-324] * 5),
            "rounds.kernel_ms.samples: 5e-324 ms is impossible: shorter than a femtosecond",
        ),
        (
            lambda t: t["rounds"]["kernel_ms"].update(samples=[1e308] * 5),
            "rounds.kernel_ms.samples: 1e+308 ms is impossible: longer than a day",
        ),
        (
            lambda t: t["metrics"].update(wall_ms=1e9),
            "metrics.wall_ms: 1000000000.0 ms is impossible: longer than a day",
        ),
        (
            lambda t: t["metrics"].update(wall_ms=-5.0),
            "metrics.wall_ms: -5.0 ms is impossible: a window's wall time is never negative",
        ),
    ],
    ids=[
        "kernel-totals-a-list",
        "a-400-digit-wall",
        "400-digit-samples",
        "subnormal",
        "1e308",
        "a-wall-of-days",
        "a-negative-wall",
    ],
)
def test_a_malformed_baseline_field_leaves_each_test_its_own_outcome(suite, change, field):
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    _damage(suite, change)
    result = suite.runpytest("-v", "--gpu-compare=main", GATE, "--gpu-compare-fail=kernels:+5%", "--gpu-report=r.json")
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in result.stdout.str() and "Traceback" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"*test_alpha: not compared: *main@*{field}*comparison not made"])
    (entry,) = [t for t in json.loads(Path(suite.path, "r.json").read_text())["tests"] if "alpha" in t["nodeid"]]
    assert entry["baseline"]["status"] == "not compared" and field.split(":")[0] in entry["baseline"]["why_not"]


def test_a_real_clock_run_is_never_gated_against_a_virtual_clock_baseline(suite):
    """The host clock is part of the machine: a real-time run once read +32% wall against
    a virtual-clock baseline of the same machine id, as a regression."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    result = suite.runpytest("--gpu-host-clock=real", "--gpu-compare=main", GATE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*no baseline named 'main' for machine host-*; baselines exist for machine ids host-*"]
    )
    (record,) = _stored(suite)
    assert json.loads(record.read_text())["machine"]["clock"] == "virtual"


def test_after_a_driver_update_any_machine_takes_a_baseline_name(suite):
    """A new machine id (a driver update) once failed every gate until main saved again:
    ``--gpu-compare-any-machine`` takes a name, and the comparison says what differs."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    (path,) = _stored(suite)
    record = json.loads(path.read_text())
    record["machine"].update(id="host-0ld0ld0ld0", driver="old driver")
    moved = path.parent.parent / "host-0ld0ld0ld0" / path.name
    moved.parent.mkdir()
    moved.write_text(json.dumps(record))
    path.unlink()
    refused = suite.runpytest("-v", "--gpu-compare=main", GATE)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*baselines exist for machine ids host-0ld0ld0ld0 (--gpu-compare-any-machine*"])
    result = suite.runpytest("-v", "--gpu-compare=main", GATE, "--gpu-compare-any-machine")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["compared with baseline *host-0ld0ld0ld0/main@*baseline of another machine (driver old driver -> *"]
    )


def test_each_output_names_the_baseline_record_and_shows_the_regression(suite, monkeypatch):
    """Which baseline a test was compared with: the summary, the JSON (name, created,
    commit, key), JUnit and the HTML page, where a regression shows its line in full."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    (path,) = _stored(suite)
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest(
        "--gpu-compare=main", GATE, "--gpu-report=r.json", "--gpu-html=page.html", "--junitxml=j.xml"
    )
    result.assert_outcomes(passed=1, failed=1)
    # one screen: the path on the heading, why it was chosen under it
    result.stdout.fnmatch_lines([f"compared with baseline .gpuprof/{path.parent.name}/{path.name}:", "  (*"])
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(Path(suite.path, "r.json").read_text())["tests"]}
    baseline = tests["test_omega"]["baseline"]
    assert baseline["name"] == "main" and baseline["key"].endswith(path.name) and baseline["status"] == "compared"
    assert baseline["created"] == json.loads(path.read_text())["created"] and baseline["pooled"] == 1
    junit = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ET.parse(suite.path / "j.xml").iter("testcase")
    }
    assert junit["test_omega"]["gpuprof.baseline"].endswith(path.name)
    page = {t["id"].split("::")[1]: t for t in page_data_of(Path(suite.path, "page.html").read_text())["tests"]}
    assert page["test_omega"]["compare"][0].startswith(f"compared with .gpuprof/{path.parent.name}/{path.name} (main, ")
    assert any(
        line.startswith("kernel_ms: ") and line.endswith(": regression") for line in page["test_omega"]["compare"]
    )
    assert not any(line.endswith(": regression") for line in page["test_alpha"]["compare"])
    # a kernel past the listed default is changed, not a regression, on the page as in the terminal
    listed = [line for line in page["test_omega"]["compare"] if line.startswith("kernel ")]
    assert listed and all(line.endswith("(beyond the default kernels:+5%, not a gate)") for line in listed)
    # each line as the terminal gives it, the spread between runs included
    (gated,) = [line for line in page["test_omega"]["compare"] if line.startswith("kernel_ms: ")]
    assert f"    {gated}" in result.stdout.lines
    assert "between runs none (the virtual clock: one code, one figure)" in gated


def test_gpu_only_with_a_save_or_a_compare_is_refused(suite):
    for flag in ("--gpu-save=main", "--gpu-autosave", "--gpu-compare=latest", GATE):
        result = suite.runpytest("--gpu-only", flag)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, flag
        result.stderr.fnmatch_lines([f"*--gpu-only and {flag.split('=')[0]} cannot be given together*"])


def test_an_lf_run_that_ran_every_test_is_a_baseline_and_one_that_did_not_is_not(suite, monkeypatch):
    cache = ("-p", "cacheprovider")
    suite.runpytest(*cache, "--lf", "--gpu-save=main").stdout.fnmatch_lines(["gpuprof: baseline saved as *"])
    suite.makepyfile(test_broken="def test_broken(gpu_workload):\n    gpu_workload.compute(ms=1)\n    assert False\n")
    suite.runpytest(*cache)  # records a failure
    Path(suite.path, "test_broken.py").write_text("def test_broken(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    result = suite.runpytest(*cache, "--lf", "--gpu-save=main")
    result.stdout.fnmatch_lines(["gpuprof: no baseline saved: *--lf*"])
    assert len(_stored(suite)) == 1


def test_autosave_with_compare_latest_starts_from_an_empty_store(suite):
    """The first run of ``--gpu-autosave --gpu-compare=latest`` once stopped at "no
    baseline" forever: it saves the first, every test new; a named baseline still must exist."""
    result = suite.runpytest("-v", "--gpu-autosave", "--gpu-compare=latest", GATE)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*holds no baseline of machine host-* yet; this run saves the first*"])
    assert len(_stored(suite)) == 1
    result = suite.runpytest("-v", "--gpu-autosave", "--gpu-compare=latest", GATE)
    result.stdout.fnmatch_lines(["*test_alpha: unchanged"])
    assert suite.runpytest("-v", "--gpu-compare=nightly", GATE).ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "[tool.gpuprof]\nroundz = 5\n[tool.gpuprof.budget]\nmin_utilization = 0.5\n",
            "[tool.gpuprof] roundz: a budget",
        ),
        (
            "[tool.gpuprof]\nrounds = 9\n[tool.gpuprof.budget]\nmin_utilization = 0.5\n",
            "[tool.gpuprof] rounds: a budget",
        ),
        ("[tool]\ngpuprof = 5\n", "'tool.gpuprof' must be a table"),
        ("tool = 5\n", "'tool' must be a table"),
    ],
)
def test_a_budget_file_with_settings_or_a_wrong_shape_is_one_usage_error(suite, text, said):
    Path(suite.path, "budget.toml").write_text(text)
    result = suite.runpytest("--gpu-budget-file=budget.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "budget.toml" in result.stderr.str() and said in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


def test_a_budget_file_that_is_not_utf8_is_one_usage_error(suite):
    Path(suite.path, "budget.toml").write_bytes(b"min_utilization = 0.5 # \xff\xfe\n")
    result = suite.runpytest("--gpu-budget-file=budget.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*budget.toml: not UTF-8 text*"])


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["one screen", "every line"])
def test_gpuprof_compare_and_the_pytest_gate_give_one_verdict_and_p(suite, monkeypatch, capsys, verbose):
    """One implementation: the command's lines for a report are the gate's lines for the
    run that wrote it, p-values included, and both fail the same test: on one screen and
    with every line."""
    from pytest_gpuprof import cli

    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest(*verbose, "--gpu-compare=main", GATE, "--gpu-report=r.json")
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("compared with baseline "))
    # the section's indented block only: on CI (CI=1) pytest's short summary repeats the
    # failure's whole message, indented lines included
    block = itertools.takewhile(lambda line: line.startswith("  "), lines[start + 1 :])
    # on one screen the heading's reason sits under it: "(the newest accepted baseline ...)"
    gate = [line.strip() for line in block if not line.strip().startswith("(")]
    monkeypatch.chdir(suite.path)
    capsys.readouterr()  # what the pytest runs printed
    assert cli.main(["compare", "main", "r.json", "--fail", GATE.split("=", 1)[1], *verbose]) == 1
    command = [line.strip() for line in capsys.readouterr().out.splitlines()]
    # the unchanged tests' count ends by naming how to see them: -v (the command), -v or
    # --gpu-summary=all (pytest)
    assert [line.split(" (-v")[0] for line in command[:-1]] == [line.split(" (-v")[0] for line in gate]
    assert any("p=" in line and line.endswith(": regression") for line in command) == bool(verbose)
    assert any("p=" in line and ": regression" in line for line in command)
    assert command[-1].startswith("gpuprof gate against 'main' (") and command[-1].endswith(
        ": 1 regression, 1 unchanged"
    )


def test_gpuprof_compare_imports_no_pytest(tmp_path):
    import subprocess
    import sys

    report = {
        "schema": 1,
        "created": "2026-01-01T00:00:00+00:00",
        "machine": {"id": "host-a"},
        "tests": [{"nodeid": "t", "metrics": {"wall_ms": 5.0}, "rounds": {"wall_ms": {"samples": [5.0] * 5}}}],
    }
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(report))
    code = (
        "import sys; from pytest_gpuprof import cli; rc = cli.main(['compare', 'a.json', 'b.json']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest'))); sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_a_baseline_records_its_environment_and_a_comparison_names_what_changed(suite, monkeypatch, capsys):
    """Library versions, the GPU and its power limit change kernels besides the code: the
    baseline keeps them, and a comparison across a change names it beside its verdict."""
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    (path,) = _stored(suite)
    record = json.loads(path.read_text())
    assert record["machine"]["environment"]["host clock"] == "virtual"
    record["machine"]["environment"]["host clock"] = "sundial"  # as another torch version would be
    path.write_text(json.dumps(record))
    result = suite.runpytest("-v", "--gpu-compare=main", GATE, "--gpu-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*note: the environment changed: host clock sundial -> virtual"])
    # and gpuprof compare, from the report's own record of its environment, names it too
    from pytest_gpuprof import cli

    monkeypatch.chdir(suite.path)
    assert cli.main(["compare", "main", "r.json", "-v", "--fail", GATE.split("=", 1)[1]]) == 0
    assert "note: the environment changed: host clock sundial -> virtual" in capsys.readouterr().out


def test_the_environment_names_the_loaded_libraries_only(monkeypatch):
    import sys
    import types

    from pytest_gpuprof.baselines.gate import changed
    from pytest_gpuprof.capture.environment import loaded_versions

    for name in ("torch", "triton", "jax", "jaxlib", "cupy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert loaded_versions() == {}
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.6.0"))
    assert loaded_versions() == {"Triton": "3.6.0"}
    assert changed({"Triton": "3.5.0", "JAX": "0.10"}, {"Triton": "3.6.0", "torch": "2.11"}) == [
        "Triton 3.5.0 -> 3.6.0"
    ]


def test_one_store_per_project_whatever_the_current_folder(suite, monkeypatch, capsys):
    """``cd tests && pytest --gpu-save=main`` once started a second store in tests/.gpuprof,
    and ``--gpu-compare=main`` from there found nothing without saying where it looked: the
    store is at pytest's rootdir, for pytest and for the ``gpuprof`` command alike."""
    from pytest_gpuprof import cli

    suite.makepyprojecttoml("[tool.pytest.ini_options]\n")
    sub = suite.mkdir("tests")
    Path(suite.path, "test_pipeline.py").rename(sub / "test_pipeline.py")
    monkeypatch.chdir(sub)
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    assert not (sub / ".gpuprof").exists()
    assert len(_stored(suite)) == 1
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    suite.runpytest("--gpu-compare=main", GATE).assert_outcomes(passed=1, failed=1)
    # a name the store lacks: the line names the folder it searched, whole
    result = suite.runpytest("--gpu-compare=nightly", GATE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*no baseline named 'nightly'*under {suite.path / '.gpuprof'}; this machine has main (newest 20*"]
    )
    # the command, from the subfolder, reads the same store
    assert cli.main(["history", "--test", "*test_omega"]) == 0
    assert "test_omega" in capsys.readouterr().out
    # a folder given on the command line is the user's: from the current folder
    suite.runpytest("--gpu-save=main", f"--gpu-storage={sub / 'own'}").assert_outcomes(passed=2)
    assert len(list((sub / "own").glob("host-*/*.json"))) == 1


def test_a_relative_storage_key_is_taken_from_the_project_file(pytester, tmp_path):
    from pytest_gpuprof.baselines.place import default_storage, project_root

    (tmp_path / "pyproject.toml").write_text('[tool.gpuprof]\nstorage = "perf/store"\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert project_root(deep) == tmp_path.resolve()
    assert default_storage(deep, ".gpuprof") == str(tmp_path.resolve() / "perf" / "store")
    (tmp_path / "pyproject.toml").write_text('[tool.gpuprof]\nstorage = "s3://bucket/p"\n')
    assert default_storage(deep, ".gpuprof") == "s3://bucket/p"
    (tmp_path / "pyproject.toml").write_text("[tool.other]\n")
    assert default_storage(deep, ".gpuprof") == str(tmp_path.resolve() / ".gpuprof")


@pytest.mark.parametrize(
    ("schema", "why"),
    [(True, "no schema number"), (-1, "schema -1 is no schema pytest-gpuprof ever wrote"), (0, "schema 0 is no")],
    ids=["true", "minus-one", "zero"],
)
def test_a_schema_that_is_not_a_known_integer_is_refused_with_one_line(tmp_path, capsys, schema, why):
    """``"schema": true`` once read as schema 1 (a bool is an int in Python), and -1 as an
    old schema: both were accepted as reports."""
    from pytest_gpuprof import cli

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": schema, "created": "x", "machine": {"id": "host-a"}, "tests": []}))
    assert cli.main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuprof show: {path}: ") and why in err and "Traceback" not in err
