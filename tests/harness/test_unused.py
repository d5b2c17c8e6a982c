"""A run that asks nothing of the plugin at start-up (no option, no ``[tool.gpuprof]``):
its session starts only where a test turns out to be the plugin's, however late (collected
with a marker, a marker a fixture added, a fixture asked for by name), and every such test
is judged as in a run that asked; a suite that never uses the plugin starts nothing."""

from __future__ import annotations

import pytest

from pytest_gpuprof.harness import touch
from pytest_gpuprof.plugin import SESSION

# breaches are warnings where nothing asks for --gpu-budget; -W error makes them failures
STRICT = ("-W", "error::pytest_gpuprof.GpuBudgetWarning")

LATE = """
import time

import pytest

@pytest.fixture
def strict(request):
    request.applymarker(pytest.mark.gpu_budget(min_utilization=0.99))

def test_plain():
    pass

def test_marked_by_a_fixture(strict):
    time.sleep(0.02)  # measured whole: no kernel in 20 ms

def test_asks_for_the_workload_by_name_inside_the_call(request):
    request.applymarker(pytest.mark.gpu_budget(min_utilization=0.99))
    workload = request.getfixturevalue("gpu_workload")
    workload.compute(ms=1)
    time.sleep(0.05)
    workload.compute(ms=1)
"""


@pytest.fixture
def unasked(pytester, monkeypatch):
    """A run with nothing for the plugin on its command line (the suite's conftest puts
    ``--gpu-host-clock`` there for every run a test starts)."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


def test_a_suite_that_never_uses_the_plugin_starts_nothing(unasked):
    unasked.makepyfile("def test_plain():\n    pass\n")
    result = unasked.runpytest("-p", "pytester")  # pytester's own plugin: a run with plugins beside
    result.assert_outcomes(passed=1)
    assert touch.NOT_STARTED in result.stdout.lines  # its brackets are no fnmatch pattern
    assert "true GPU utilization" not in result.stdout.str()
    config = unasked.parseconfigure()
    assert not touch.asked(config) and config.stash.get(SESSION, None) is None


@pytest.mark.parametrize("check", ["budget", "gate"])
def test_a_test_that_becomes_the_plugins_late_is_judged(unasked, check):
    """The session starts at the call of the first test that is the plugin's; each late
    test is judged: a breach fails it (-W error), where a run that measured nothing passes."""
    unasked.makepyfile(test_late=LATE)
    if check == "gate":  # the same tests, their budgets kept: every test passes
        unasked.makepyfile(test_late=LATE.replace("0.99", "0.0"))
    result = unasked.runpytest(*STRICT)
    if check == "gate":
        result.assert_outcomes(passed=3)
        return
    result.assert_outcomes(passed=1, failed=2)
    for name in ("test_marked_by_a_fixture", "test_asks_for_the_workload_by_name_inside_the_call"):
        result.stdout.fnmatch_lines([f"test_late.py::{name}: utilization *% < 99.0% (min_utilization)*"])


def test_a_collected_marker_starts_the_session_before_any_test_runs(unasked):
    unasked.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_needs_a_gpu():
            pass
        """
    )
    result = unasked.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device*"])


@pytest.mark.parametrize(
    ("pyproject", "asked"),
    [
        (None, False),
        ('[project]\nname = "x"\n', False),
        ("[tool.gpuprof]\nrounds = 3\n", True),
        ("[tool]\ngpuprof = 5\n", True),
        ('[project]\ndependencies = ["pytest-gpuprof"]\n', True),  # named: read and checked, as before
    ],
)
def test_a_run_asks_by_option_or_by_a_pyproject_that_names_the_plugin(unasked, pyproject, asked):
    if pyproject is not None:
        unasked.makepyprojecttoml(pyproject)
    assert touch.asked(unasked.parseconfig()) is asked
    assert touch.asked(unasked.parseconfig("--gpu-rounds=3")) is True
    assert touch.asked(unasked.parseconfig("--gpu-budget")) is True


def test_a_bad_table_is_a_usage_error_in_a_suite_that_never_uses_the_plugin(unasked):
    unasked.makepyprojecttoml('[tool.gpuprof]\nrounds = "many"\n')
    unasked.makepyfile("def test_plain():\n    pass\n")
    result = unasked.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*rounds*"])


def test_loading_the_plugin_imports_its_flags_and_checks_alone():
    """The plugin loads into every pytest run of its environment: the session's modules
    (18 ms of imports once, docs/performance-log.md) wait until a run or a test asks for it."""
    import subprocess
    import sys

    code = "import sys, pytest_gpuprof.plugin; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    ours = {m for m in loaded if m.startswith("pytest_gpuprof")}
    assert ours == {
        "pytest_gpuprof",
        "pytest_gpuprof.plugin",
        "pytest_gpuprof.harness",
        "pytest_gpuprof.harness.touch",
        "pytest_gpuprof.settings",
        "pytest_gpuprof.settings.options",
        "pytest_gpuprof.settings.convert",  # its converters import their checks when they run
        "pytest_gpuprof.harness.xdist",  # what xdist says, read in one place
        "pytest_gpuprof.measure",  # its package alone: the default rounds and warm-up
        "pytest_gpuprof.analysis",
        "pytest_gpuprof.analysis.descriptors",
        "pytest_gpuprof.verdict",
        "pytest_gpuprof.verdict.validate",
    }
    assert "numpy" not in loaded


def test_a_suite_that_never_uses_the_plugin_has_one_per_test_hook_of_its(unasked):
    unasked.makeconftest(
        """
import sys

def pytest_sessionfinish(session):
    manager = session.config.pluginmanager
    hooks = [name for name in dir(session.config.hook) if name.startswith("pytest_runtest_") or name == "pytest_report_teststatus"]
    ours = sorted(
        name
        for name in hooks
        for impl in getattr(session.config.hook, name).get_hookimpls()
        if "gpuprof" in (manager.get_name(impl.plugin) or "")
    )
    print("OURS", ours, "SESSION", "pytest_gpuprof.harness.session" in sys.modules)
"""
    )
    unasked.makepyfile("import pytest\n\n@pytest.mark.parametrize('i', range(3))\ndef test_plain(i):\n    pass\n")
    result = unasked.runpytest_subprocess("-s")
    result.assert_outcomes(passed=3)
    assert "OURS ['pytest_runtest_call'] SESSION False" in result.stdout.str()


PLACED = {
    "decorator": ("", "@pytest.mark.gpu_budget(min_utilization=0.99)\n", ""),
    "class": ("", "", "@pytest.mark.gpu_budget(min_utilization=0.99)\n"),
    "module": ("pytestmark = pytest.mark.gpu_budget(min_utilization=0.99)\n", "", ""),
}


@pytest.mark.parametrize("where", [*PLACED, "hook"])
def test_a_marker_anywhere_starts_the_session_in_a_run_that_asked_nothing(unasked, where):
    """However the marker arrives, on the test or on a node above it, the session starts
    and judges it (a breach fails with -W error); a run that asked nothing at start-up
    finds it by looking at each collected test's markers and its parents'."""
    module, function, klass = PLACED.get(where, ("", "", ""))
    if where == "hook":  # a plugin's hook marks the module node, after collection
        unasked.makeconftest(
            """
import pytest

def pytest_collection_modifyitems(items):
    items[0].parent.parent.add_marker(pytest.mark.gpu_budget(min_utilization=0.99))
"""
        )
    unasked.makepyfile(
        test_placed=f"import time\n\nimport pytest\n\n{module}\n{klass}class TestIdle:\n"
        f"    {function.strip()}\n    def test_idle(self):\n        time.sleep(0.02)\n"
    )
    result = unasked.runpytest(*STRICT)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["test_placed.py::TestIdle::test_idle: utilization 0.0% < 99.0% (min_utilization)*"])


def test_an_xdist_controller_gathers_what_its_workers_measured(unasked):
    """The controller collects no test: it starts its session at start-up, so that its
    summary holds what the workers measured in a run that asked nothing."""
    unasked.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.99)
        def test_upload(gpu_workload):
            gpu_workload.upload(16 << 20)
            gpu_workload.compute(ms=2)

        def test_plain():
            pass
        """
    )
    result = unasked.runpytest("-n", "2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*gpuprof: true GPU utilization*", "*test_upload*warn: breach min_utilization*"])
    assert touch.asked(unasked.parseconfig("-n", "2")) and not touch.asked(unasked.parseconfig("-n", "0"))
