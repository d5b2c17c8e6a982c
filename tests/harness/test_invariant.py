"""The gate's invariant as a state machine: sequences of runs (save, compare, deselect,
collect-only, a failing test, a rerun, several windows, caught checks) on the host
backend's virtual clock, each checked against an oracle computed from the raw rounds,
in every output: the terminal table, the JSON report, JUnit XML, the step summary and
the HTML page (docs/design.md: the baseline, direction and window rules)."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from plugin_runs import page_data_of

from pytest_gpuprof.analysis.run_spread import Spread

# every run's parameters come from params.json: the module itself never changes, so no
# stale bytecode can stand in for it between runs
SUITE = """
import json
import pathlib

import pytest
from pytest_gpuprof import GpuBudgetExceeded

P = json.loads(pathlib.Path("params.json").read_text())


@pytest.mark.gpu_budget(min_utilization=0.5)
def test_windows(gpuprof, gpu_workload):
    for bad, caught in P["windows"]:
        if bad:  # 64 MiB up and 1 ms of kernels: 9% busy
            gpuprof.measure(lambda: (gpu_workload.upload(64 << 20), gpu_workload.compute(ms=1)), rounds=1, warmup=0)
        else:
            gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=1, warmup=0)
        if caught:
            try:
                gpuprof.check()
            except GpuBudgetExceeded:
                pass
    assert not P["fails"], "the code under test failed"


def test_speed(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=P["speed"]), rounds=5, warmup=0)


if P["flaky"]:

    def test_flaky(gpuprof, gpu_workload):
        gpuprof.measure(lambda: gpu_workload.compute(ms=1), rounds=5, warmup=0)
        attempt = pathlib.Path(f"attempt-{P['run']}")  # a name no earlier run used
        if not attempt.exists():
            attempt.write_text("")
            raise AssertionError("fails the first time")
"""

GATE = "kernel_ms:+10%"

try:
    import pytest_rerunfailures  # noqa: F401

    HAS_RERUNS = True
except ImportError:  # the oldest pytest in CI runs without it
    HAS_RERUNS = False


def samples(test: dict, metric: str = "kernel_ms") -> list[float]:
    """A report test's raw rounds of ``metric`` (its one value where it kept no rounds)."""
    rounds = test.get("rounds", {}).get(metric)
    if rounds is not None:
        return [float(v) for v in rounds["samples"]]
    return [float(test["metrics"][metric])]


def regressed(before: list[float], now: list[float]) -> tuple[bool, bool]:
    """(clearly worse beyond the gate, the gate can never fail here), by brute force: the
    current rounds moved back by 10% of the baseline's median, every split of the pooled
    rounds enumerated for the one-sided rank test's p-value."""
    n, m = len(before), len(now)
    if 1 / math.comb(n + m, n) >= 0.05:
        return False, True
    shift = 0.1 * statistics.median(before)
    moved = [v - shift for v in now]

    def u(xs: list[float], ys: list[float]) -> float:
        return sum((y > x) + 0.5 * (y == x) for x in xs for y in ys)

    pooled = [*before, *moved]
    seen = u(before, moved)
    splits = list(itertools.combinations(range(n + m), m))
    tail = sum(
        u([pooled[i] for i in range(n + m) if i not in ys], [pooled[i] for i in ys]) >= seen - 1e-9 for ys in splits
    )
    worse = statistics.median(now) > statistics.median(before) + shift
    return worse and tail / len(splits) < 0.05, False


# a test's windows, each (bad, a caught check() after it): the shapes the window rule is
# about are drawn as often as any other
WINDOWS = st.one_of(
    st.sampled_from([[(True, True), (True, False)], [(True, False), (True, True)], [(False, True), (True, False)]]),
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=3),
)


class Runs(RuleBasedStateMachine):
    def __init__(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, number: int) -> None:
        super().__init__()
        self.pytester, self.monkeypatch = pytester, monkeypatch
        self.store = f"store{number}"  # each example its own store
        self.baseline: dict | None = None  # the report of the last run that became the baseline
        self.history: list[dict] = []  # every run that became one, newest first: the spread between runs
        self.run = 0

    def spread(self, name: str) -> Spread:
        return _spread_of(self.history, name)

    @initialize()
    def suite(self) -> None:
        self.pytester.makepyfile(test_gate_sequence=SUITE)

    @rule(
        windows=WINDOWS,
        fails=st.booleans(),
        speed=st.sampled_from([2, 3]),
        mode=st.sampled_from(["full", "full", "collect-only", "deselect"]),
        save=st.booleans(),
        compare=st.booleans(),
        flaky=st.booleans() if HAS_RERUNS else st.just(False),
    )
    def a_run(self, windows, fails, speed, mode, save, compare, flaky) -> None:
        self.run += 1
        p = self.pytester.path
        for name in ("r.json", "page.html", "junit.xml", "summary.md"):
            p.joinpath(name).unlink(missing_ok=True)
        p.joinpath("params.json").write_text(
            json.dumps(
                {"windows": windows, "fails": fails, "speed": speed, "flaky": flaky, "run": f"{self.store}-{self.run}"}
            )
        )
        self.monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(p / "summary.md"))
        args = ["--gpu-budget", f"--gpu-storage={self.store}", "-p", "no:cacheprovider"]
        args += ["--gpu-report=r.json", "--gpu-html=page.html", "--junitxml=junit.xml"]
        args += {"full": [], "collect-only": ["--collect-only"], "deselect": ["-k", "test_speed"]}[mode]
        args += ["--gpu-save=main"] if save else []
        args += ["--gpu-compare=main", f"--gpu-compare-fail={GATE}"] if compare else []
        args += ["--reruns=1"] if flaky else []
        stored_before = sorted(p.joinpath(self.store).rglob("*.json"))
        result = self.pytester.runpytest(*args)
        stored = sorted(p.joinpath(self.store).rglob("*.json"))

        if mode == "collect-only":  # runs nothing, compares nothing, saves nothing
            assert result.ret == pytest.ExitCode.OK and stored == stored_before
            return
        # nothing to compare with: a usage error, saving nothing; unless the store is empty
        # and this run saves the first baseline (every test new)
        if compare and self.baseline is None and (not save or stored_before):
            assert result.ret == pytest.ExitCode.USAGE_ERROR
            assert "no baseline named 'main'" in result.stderr.str()
            assert stored == stored_before
            return

        report = json.loads(p.joinpath("r.json").read_text())
        tests = {t["nodeid"].split("::")[1]: t for t in report["tests"]}
        ran = (
            ["test_speed"] if mode == "deselect" else ["test_windows", "test_speed", *(["test_flaky"] if flaky else [])]
        )
        assert sorted(tests) == sorted(ran), result.stdout.str()[-3000:]

        # the oracle, from the windows drawn and the raw rounds of both sides
        want: dict[str, str] = {}
        failed: set[str] = set()
        base = {t["nodeid"].split("::")[1]: t for t in self.baseline["tests"]} if compare and self.baseline else {}
        for name in ran:
            parts: list[str] = []
            if name == "test_windows":
                breach = any(bad and not caught for bad, caught in windows)
                expected = any(bad and caught for bad, caught in windows)
                if breach or fails:
                    failed.add(name)
                parts.append(
                    "FAIL: breach min_utilization"
                    if breach
                    else ("expected: breach min_utilization" if expected else "ok")
                )
            inert = False
            if name in base:
                before, now = samples(base[name]), samples(tests[name])
                worse, inert = regressed(before, now)
                spread = self.spread(name)
                shift = 0.1 * statistics.median(before)
                moved = abs(statistics.median(now) - statistics.median(before)) > shift
                beyond = spread.beyond(statistics.median(now), 1)
                blind = (spread.detectable or 0.0) > shift
                if worse and beyond:
                    failed.add(name)
                    parts = [p for p in parts if p.startswith("FAIL")] + ["FAIL: regression kernel_ms"]
                elif inert or moved or blind:  # undecided: the gate could not see its threshold
                    parts = [p for p in parts if p.startswith("FAIL")] + ["warn: undecided kernel_ms"]
                elif not parts:
                    parts.append("ok")
            want[name] = "; ".join([*(parts or ["-"]), *([f"gate inert: {GATE}"] if inert else [])])
            assert tests[name]["outcome"] == ("failed" if name in failed else "passed"), name
        for name in ran:  # a rerun plugin runs each failing test once more; the flaky one passes then
            reruns = flaky and (name == "test_flaky" or name in failed)
            assert tests[name]["reruns"] == reruns, name

        # every output gives the oracle's verdict
        assert {n: t["verdict"] for n, t in tests.items()} == want
        table = {}
        lines = result.stdout.lines
        title = next((i for i, line in enumerate(lines) if "true GPU utilization" in line), len(lines))
        for line in lines[title:]:  # the summary's table, not a failure's gpuprof section
            found = re.match(r"test_gate_sequence\.py::(test_\w+)\s", line)
            if found and "  " in line and found[1] not in table:
                table[found[1]] = re.split(r"\s{2,}", line.strip())[-1]
        assert table == want
        junit = {
            case.get("name"): prop.get("value")
            for case in ET.parse(p / "junit.xml").iter("testcase")
            for prop in case.iter("property")
            if prop.get("name") == "gpuprof.verdict"
        }
        assert junit == want
        summary = {}
        for line in p.joinpath("summary.md").read_text().splitlines():
            found = re.match(r"\| `test_gate_sequence\.py::(test_\w+)` \|.*\| ([^|]+) \|$", line)
            if found:
                summary[found[1]] = found[2].strip()
        assert summary == want
        page = {
            t["id"].split("::")[1]: t["verdict"] for t in page_data_of(p.joinpath("page.html").read_text())["tests"]
        }
        assert page == want

        # the baseline rule: only a complete run that passed becomes the baseline
        assert result.ret == (pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK)
        accepted = save and mode == "full" and not failed
        assert len(stored) == len(stored_before) + accepted
        if accepted:
            self.baseline = report
            self.history.insert(0, report)


def _spread_of(history: list[dict], name: str) -> Spread:
    """The spread between the saved runs of ``name`` (up to 10, newest first), as a gate on
    the virtual clock learns it: one code, one figure (``Spread.of(exact=True)``)."""
    medians = [
        statistics.median(samples(t))
        for report in history[:10]
        for t in report["tests"]
        if t["nodeid"].split("::")[1] == name
    ]
    return Spread.of(medians, exact=True)


def test_every_output_gives_the_oracles_verdict_over_sequences_of_runs(pytester, monkeypatch):
    numbers = itertools.count()
    run_state_machine_as_test(
        lambda: Runs(pytester, monkeypatch, next(numbers)),
        settings=settings(
            max_examples=12,
            stateful_step_count=6,
            derandomize=True,
            phases=[Phase.generate],
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


# (windows, fails, mode, save, compare) of each run, at speed 2 and no flaky test
DRAWN = [
    ([(True, True), (True, False)], False, "deselect", False, False),
    ([(True, True), (True, False)], True, "full", True, True),
    ([(True, True), (False, True), (False, True)], False, "full", True, False),
    ([(True, False), (True, True), (True, False)], True, "full", False, True),
]


def test_an_inert_gate_on_a_failing_test_reads_undecided_in_every_output(pytester, monkeypatch):
    """The sequence the oldest pytest's run drew: a gate that cannot fail a test whose own
    code failed is undecided, beside its breach, in every output."""
    runs = Runs(pytester, monkeypatch, 0)
    runs.suite()
    for windows, fails, mode, save, compare in DRAWN:
        runs.a_run(windows=windows, fails=fails, speed=2, mode=mode, save=save, compare=compare, flaky=False)
