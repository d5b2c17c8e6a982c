"""One settings table: the pytest options, the file keys, the defaults and the docs' tables."""

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_gpuprof.harness import config
from pytest_gpuprof.settings import checks
from pytest_gpuprof.settings.options import BY_FLAG, DEFAULT, TABLE

ROOT = Path(__file__).resolve().parents[2]


def option_rows(path):
    """The flags each row of a document's options table names, and the row."""
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("| `--gpu-"):
            cell = line.split(" | ")[0]
            rows.append((re.findall(r"`(--gpu-[a-z-]+)(?:=([^`]*))?`", cell), line))
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md"])
def test_the_docs_options_tables_hold_every_option_once_as_the_table_has_it(doc):
    """The README lists every option; the design's contract table the public ones (not the
    host clock, the xdist devices or the any-machine comparison), each once."""
    rows = option_rows(ROOT / doc)
    named = [flag for flags, _ in rows for flag, _ in flags]
    expected = {o.flag for o in TABLE}
    if doc == "docs/design.md":
        expected -= {"--gpu-host-clock", "--gpu-devices", "--gpu-compare-any-machine"}
    assert sorted(named) == sorted(expected), doc
    for flags, line in rows:
        for flag, value in flags:
            o = BY_FLAG[flag]
            if o.choices:
                assert value.replace("\\|", "|") == "|".join(o.choices), (doc, flag, value)
            elif o.switch:
                assert not value, (doc, flag)
            else:
                assert value, (doc, flag)
            if o.key is not None and o.key not in ("device", "rounds", "warmup", "backend", "nvml_interval"):
                # a key that only the file and this flag set is named beside it
                assert f"`{o.key}`" in line, (doc, flag, o.key)


def test_every_default_comes_from_the_table():
    s = config.Settings()
    assert (s.backend, s.host_clock, s.device, s.rounds, s.warmup) == (
        DEFAULT["--gpu-backend"],
        DEFAULT["--gpu-host-clock"],
        DEFAULT["--gpu-device"],
        DEFAULT["--gpu-rounds"],
        DEFAULT["--gpu-warmup"],
    )
    assert s.nvml_interval_ms == DEFAULT["--gpu-nvml-interval"]
    assert str(s.storage) == DEFAULT["--gpu-storage"]
    assert s.summary_rows == int(DEFAULT["--gpu-summary"])
    # the file keys accept exactly the table's keys: with choices, a range, or text
    keys = checks.FileKeys.of(TABLE)
    assert set(keys.choices) | set(keys.numbers) | set(keys.text) == {o.key for o in TABLE if o.key}


def test_each_settings_field_is_one_rows_or_named_as_derived():
    """A new setting is one row of the table (its field, its converter, its conflicts) and
    its typed field: ``from_pytest_config`` reads the table row by row, and no field is set
    twice or by nobody."""
    rows = [o.field for o in TABLE if o.field is not None]
    assert len(rows) == len(set(rows)), "a field two rows set"
    assert set(rows).isdisjoint(config.DERIVED)
    assert set(rows) | set(config.DERIVED) == {f.name for f in dataclasses.fields(config.Settings)}


def test_every_conflict_is_refused_naming_both_flags_and_why(pytester):
    """Each row's conflicts, given together, are a usage error naming both flags and the
    row's reason; none is a conflict a row names without a reason."""
    pytester.makepyfile("def test_x(): pass")
    pairs = [(o, other) for o in TABLE for other in o.conflicts]
    assert len(pairs) >= 15 and all(o.why for o, _ in pairs)
    for o, other in pairs:
        args = [o.flag if o.switch else f"{o.flag}=x", BY_FLAG[other].flag]
        args[1] = args[1] if BY_FLAG[other].switch else f"{args[1]}=latest"
        result = pytester.runpytest(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        assert f"{o.flag} and {other} cannot be given together: {o.why}" in result.stderr.str(), args


def test_each_default_is_written_once_in_the_package():
    """``grep`` finds each default's literal once: in the table."""
    package = ROOT / "pytest_gpuprof"
    for needle in ['".gpuprof"', "rounds: int = 5", "warmup: int = 1", "nvml_interval_ms: float = 20"]:
        hits = [p.name for p in package.rglob("*.py") if needle in p.read_text()]
        assert hits in ([], ["options.py"]), (needle, hits)


def test_an_option_shows_its_default_in_its_help(pytester):
    result = pytester.runpytest("--help")
    out = " ".join(result.stdout.str().split())
    for o in TABLE:
        if o.default is not None:
            assert f"(default {o.default})" in out, o.flag
    assert "--gpu-exclusive={auto,off}" in out


def test_a_file_key_outside_its_range_names_the_key_and_the_file(pytester):
    pytester.makepyprojecttoml("[tool.gpuprof]\nwarmup = -1\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == 4
    assert "pyproject.toml [tool.gpuprof]: 'warmup' = -1 is out of range" in result.stderr.str()


def test_the_command_line_wins_over_the_file_and_the_file_over_the_table(pytester):
    pytester.makepyprojecttoml('[tool.gpuprof]\nrounds = 7\nnvtx = "off"\n')
    pytester.makeconftest(
        """
        import pytest
        from pytest_gpuprof.harness.config import Settings

        def pytest_configure(config):
            s = Settings.from_pytest_config(config)
            print(f"SETTINGS rounds={s.rounds} warmup={s.warmup} nvtx={s.nvtx} storage={s.storage}")
        """
    )
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-s", "--gpu-warmup=3")
    result.stdout.fnmatch_lines(["*SETTINGS rounds=7 warmup=3 nvtx=False storage=*/.gpuprof"])
    result = pytester.runpytest("-s", "--gpu-rounds=2", "--gpu-nvtx=on")
    result.stdout.fnmatch_lines(["*SETTINGS rounds=2 warmup=1 nvtx=True storage=*/.gpuprof"])


def test_a_bad_step_summary_is_no_business_of_a_suite_that_does_not_use_the_plugin(pytester, monkeypatch):
    """The CI's ``$GITHUB_STEP_SUMMARY`` pointing at a folder once refused every pytest run of
    the environment (exit 4); a suite that never uses the plugin runs, one that uses it
    without configuring it says at the end, once, that the summary could not be written, and
    one configured for it (a ``--gpu-*`` option, ``[tool.gpuprof]``) is refused before its
    first test."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path))  # a folder
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    pytester.runpytest("test_plain.py").assert_outcomes(passed=1)
    pytester.makepyfile(test_gpu="def test_gpu(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    result = pytester.runpytest("test_gpu.py")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.stdout.str().count("gpuprof: could not write the step summary") == 1
    # a run configured for the plugin is refused before its first test, in one line
    configured = pytester.runpytest("test_gpu.py", "--gpu-budget")
    assert configured.ret == pytest.ExitCode.USAGE_ERROR
    configured.stderr.fnmatch_lines(
        [f"ERROR: pytest-gpuprof: $GITHUB_STEP_SUMMARY={pytester.path}: is a folder; give a file path"]
    )
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "missing" / "summary.md"))
    missing = pytester.runpytest("test_gpu.py", "--gpu-budget")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(
        ["ERROR: pytest-gpuprof: $GITHUB_STEP_SUMMARY=*summary.md: the folder * does not exist"]
    )
    assert "passed" not in missing.stdout.str()


def test_a_pytest_older_than_declared_is_one_line_and_exit_4(pytester, monkeypatch):
    """pytest 7.4.4, forced into an environment, once ran the plugin without a word."""
    monkeypatch.setattr(pytest, "__version__", "7.4.4")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pytest-gpuprof needs pytest 8.0 or newer; this is pytest 7.4.4*"])
