import functools
import itertools
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof import cli
from pytest_gpuprof.analysis.mann_whitney import can_fail, mann_whitney_greater
from pytest_gpuprof.baselines import records as storage
from pytest_gpuprof.baselines.store import Store
from pytest_gpuprof.verdict.compare import assess
from pytest_gpuprof.verdict.samples import samples_of
from pytest_gpuprof.verdict.thresholds import CompareError, parse_thresholds


def test_expressions_parse_into_thresholds():
    util, wall, upload, idle = parse_thresholds(
        "utilization:-2pt, wall_ms:+10%,steps.upload.host_ms:+15%,steps.a.b.idle_ms:+3ms"
    )
    assert (util.metric, util.direction, util.amount, util.unit) == ("utilization", -1, 2.0, "pt")
    assert util.delta(0.9) == pytest.approx(0.02)
    assert wall.delta(200.0) == pytest.approx(20.0)
    assert upload.metric == "steps.upload.host_ms"
    assert idle.delta(7.0) == 3.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("utilization-2pt", "expected METRIC:+N%"),
        ("wall_ms:10%", "expected METRIC:+N%"),
        ("wall_ms:+10", "expected METRIC:+N%"),
        ("wall_ms:+2pt", "'pt' (percentage points) applies to fractions only"),
        (",", "no expression given"),
    ],
)
def test_bad_expressions_name_themselves(text, fragment):
    with pytest.raises(CompareError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        parse_thresholds(text)


(WALL,) = parse_thresholds("wall_ms:+10%")
(UTIL,) = parse_thresholds("utilization:-2pt")


def test_clear_regression_unchanged_improvement_and_inconclusive():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    assert assess(WALL, base, [130.0, 131.0, 129.0, 130.5, 129.5]).finding == "regression"
    assert assess(WALL, base, [101.0, 100.0, 102.0, 99.0, 100.0]).finding == "unchanged"
    assert assess(WALL, base, [70.0, 71.0, 69.0, 70.5, 69.5]).finding == "improvement"
    # the median moved 15% but one round says otherwise: not clear
    assert assess(WALL, base, [115.0, 99.0, 116.0, 100.0, 117.0]).finding == "inconclusive"
    # too few rounds never give a finding
    assert assess(WALL, [100.0], [200.0]).finding == "inconclusive"
    assert assess(UTIL, [0.8] * 5, [0.7] * 5).finding == "regression"
    assert assess(UTIL, [0.8] * 5, [0.79] * 5).finding == "unchanged"


samples = st.lists(st.floats(50, 150), min_size=4, max_size=9)


@given(samples)
def test_a_shift_far_beyond_the_spread_is_a_regression(base):
    spread = max(base) - min(base)
    shifted = [b + 31 + spread for b in base]  # beyond 10% of either median (at most 30 here)
    assert assess(WALL, base, shifted).finding == "regression"
    assert assess(WALL, shifted, base).finding == "improvement"
    assert assess(WALL, base, list(base)).finding == "unchanged"


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=5, unique=True).flatmap(
        lambda xs: st.tuples(
            st.just(xs),
            st.lists(st.integers(0, 10**6).filter(lambda v: v not in xs), min_size=1, max_size=5, unique=True),
        )
    )
)
def test_mann_whitney_matches_enumerating_every_ordering(pair):
    x, y = pair
    pooled = sorted([*x, *y])

    def u_of(ys):
        return sum(b > a for a in set(pooled) - set(ys) for b in ys)

    observed = u_of(y)
    orderings = [set(c) for c in itertools.combinations(pooled, len(y))]
    expected = sum(u_of(c) >= observed for c in orderings) / len(orderings)
    assert mann_whitney_greater(x, y) == pytest.approx(expected)


@functools.cache
def _splits(n, m):
    """Every way to choose which n of n + m pooled rounds are the x's, one row each."""
    splits = np.zeros((math.comb(n + m, n), n + m))
    for row, chosen in enumerate(itertools.combinations(range(n + m), n)):
        splits[row, list(chosen)] = 1
    return splits


def _permutation_p(x, y):
    """The brute-force reference: every split of the pooled rounds into len(x) and len(y),
    ties counted a half, the share whose U is at least the observed one."""
    pooled = np.array([*x, *y], dtype=float)
    # twice the pair's U contribution when row is an x and column a y: 2 above, 1 tied, 0 below
    pair = 1 + np.sign(pooled[None, :] - pooled[:, None])
    splits = _splits(len(x), len(y))
    twice_u = np.einsum("si,ij,sj->s", splits, pair, 1 - splits)
    observed = twice_u[0]  # the first split puts the x's first: the observed one
    return float(np.mean(twice_u >= observed))


# few distinct values: ties in most pairs, as integer timers and a virtual clock give; every
# multiset of 1 to 5 rounds of them (125), against every other: all 15,625 pairs
TIED_ROUNDS = [list(c) for k in range(1, 6) for c in itertools.combinations_with_replacement(range(4), k)]


def test_mann_whitney_equals_the_permutation_reference_with_ties():
    for x in TIED_ROUNDS:
        for y in TIED_ROUNDS:
            assert mann_whitney_greater(x, y) == pytest.approx(_permutation_p(x, y), abs=1e-9), (x, y)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 2), (3, 3), (1, 19), (2, 4)])
def test_too_few_rounds_never_fail_however_tied(n, m):
    # the exact p of n vs m rounds cannot go below 1/C(n+m, n) >= 0.05: no finding, ties or not
    assert not can_fail(n, m)
    for base, now in (
        ([10.0] * n, [30.0] * m),
        ([10.0] * n, [10.0] * m),
        (list(range(n)), [100.0 + i for i in range(m)]),
    ):
        assert mann_whitney_greater(base, now) >= 0.05
        assert assess(WALL, base, now).finding != "regression"
    assert can_fail(1, 20) and can_fail(4, 4)
    assert mann_whitney_greater([10.0], [30.0] * 20) == pytest.approx(1 / 21)


@pytest.fixture(scope="module")
def scipy_stats():
    return pytest.importorskip("scipy.stats")


@settings(max_examples=300, derandomize=True)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=8), st.lists(st.floats(0, 100), min_size=1, max_size=8))
def test_mann_whitney_agrees_with_scipy_without_ties(scipy_stats, x, y):
    if len({*x, *y}) < len(x) + len(y):
        return  # scipy's exact method assumes no ties; the permutation test above covers them
    expected = scipy_stats.mannwhitneyu(y, x, alternative="greater", method="exact").pvalue
    assert mann_whitney_greater(x, y) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("value", [1.0, 7.5])
def test_fully_tied_rounds_give_no_evidence(value):
    assert mann_whitney_greater([value] * 4, [value] * 6) == 1.0
    many = [value] * 150  # past the exact method: the tie-corrected approximation
    assert mann_whitney_greater(many, many) == 1.0


def test_the_normal_approximation_matches_scipy_on_many_tied_rounds(scipy_stats):
    x, y = [1, 1, 2, 2, 3] * 30, [2, 2, 3, 3, 4] * 30
    expected = scipy_stats.mannwhitneyu(y, x, alternative="greater", method="asymptotic").pvalue
    assert mann_whitney_greater(x, y) == pytest.approx(expected, rel=1e-6)


def test_one_stray_baseline_round_costs_its_pairs_not_the_finding():
    base = [100.0, 100.2, 99.9, 100.1, 100.0, 99.8, 100.1, 100.0, 130.0]  # one hiccup, 9 rounds
    slowed = [110.4, 110.6, 110.2, 110.5, 110.3, 110.4, 110.6, 110.2, 110.5]
    (five,) = parse_thresholds("wall_ms:+5%")
    assert assess(five, base, slowed).finding == "regression"  # the 130 ms round costs 9 pairs of 81
    assert assess(WALL, base, [v - 1.0 for v in slowed]).finding == "unchanged"  # +9.4%: within +10%


def test_with_five_rounds_a_side_one_stray_round_above_all_blocks_the_finding():
    (five,) = parse_thresholds("wall_ms:+5%")
    slowed = [110.4, 110.6, 110.2, 110.5, 110.3]
    # 20 of the 25 pairs are ordered (p = 19/252); the exact test needs 21 (p = 12/252)
    assert assess(five, [100.0, 100.1, 99.9, 100.0, 130.0], slowed).finding == "inconclusive"
    assert assess(five, [100.0, 100.1, 99.9, 100.0, 100.2], slowed).finding == "regression"


def test_samples_come_from_rounds_else_the_single_value():
    test = {
        "metrics": {"wall_ms": 5.0, "steps": {"up.load": {"idle_ms": 2.0}}},
        "rounds": {"wall_ms": {"samples": [4, 5, 6]}},
    }
    assert samples_of(test, "wall_ms") == [4.0, 5.0, 6.0]
    assert samples_of(test, "steps.up.load.idle_ms") == [2.0]
    assert samples_of(test, "kernel_ms") == []


def report(machine_id="host-aaa", tests=(), created="x"):
    return {
        "schema": 1,
        "created": created,
        "machine": {"id": machine_id, "gpu": "g", "backend": "host"},
        "tests": list(tests),
    }


def test_concurrent_saves_of_one_name_each_land_whole(tmp_path):
    saved = []

    def save_some():
        for _ in range(5):
            saved.append(Path(Store(tmp_path).save(report(tests=[{"nodeid": "t"}]), "main")))

    threads = [threading.Thread(target=save_some) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({p.name for p in saved}) == 40 and all(p.name.startswith("main@") for p in saved)
    assert all(json.loads(p.read_text())["schema"] == 1 for p in saved)
    assert not list((tmp_path / "host-aaa").glob(".*"))  # no temporary file left behind


def test_a_reference_takes_the_newest_or_the_named(tmp_path):
    store = Store(tmp_path)
    store.save(report(tests=[{"nodeid": "t"}], created="2026-01-01T00:00:00+00:00"), "main")
    store.save(report(tests=[{"nodeid": "t"}], created="2026-01-02T00:00:00+00:00"), "pr")
    assert store.reference("host-aaa", None).newest_record["name"] == "pr"
    assert store.reference("host-aaa", "main").newest_record["name"] == "main"
    with pytest.raises(storage.BaselineError, match="no baseline named 'x' for machine host-aaa"):
        store.reference("host-aaa", "x")
    with pytest.raises(storage.BaselineError, match="baselines exist for machine ids host-aaa"):
        store.reference("cuda-bbb", None)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"schema": 1, "machine": {"id": "x"}, "tests": [', "corrupt or truncated JSON"),
        ("[]", "not a gpuprof report"),
        ('{"schema": 2, "machine": {"id": "x"}, "tests": []}', "schema 2 is newer than this pytest-gpuprof reads (1)"),
        ('{"schema": 1, "tests": []}', "no machine id"),
        ('{"schema": 1, "machine": {"id": "x"}, "tests": [{"no": 1}]}', "must be a list of tests with a nodeid"),
    ],
)
def test_bad_baselines_are_explained(tmp_path, content, fragment):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(storage.BaselineError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        storage.load(path)


def test_cli_show_compare_merge_exit_codes(tmp_path, capsys):
    def test(nodeid, walls):
        return {
            "nodeid": nodeid,
            "outcome": "passed",
            "metrics": {"wall_ms": walls[0], "utilization": 0.5},
            "rounds": {"wall_ms": {"samples": walls}},
        }

    base = tmp_path / "base.json"
    same = tmp_path / "same.json"
    slow = tmp_path / "slow.json"
    base.write_text(json.dumps(report(tests=[test("t::a", [10, 10.1, 9.9, 10, 10])])))
    same.write_text(json.dumps(report(tests=[test("t::a", [10, 10.2, 9.8, 10, 10.1]), test("t::b", [1, 1, 1])])))
    slow.write_text(json.dumps(report(tests=[test("t::a", [14, 14.1, 13.9, 14, 14])])))
    assert cli.main(["show", str(base)]) == 0
    assert "t::a: passed, wall 10.0 ms, utilization 50.0%" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(same), "--fail", "wall_ms:+10%"]) == 0
    assert "t::b: new" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(slow), "--fail", "wall_ms:+10%"]) == 1
    assert "t::a: regression\n    wall_ms 10.000 -> 14.000 (+40.0%): regression, p=0.004\n" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(slow), "--fail", "wall_ms:+10%", "-v"]) == 1
    out = capsys.readouterr().out
    assert (
        "wall_ms: baseline 10.000 -> 14.000 (+4.000, +40.0%; limit wall_ms:+10%; 5 vs 5 rounds; one-sided Mann-Whitney p=0.00397): "
        "regression" in out
    )
    assert "note: a report's file is one run: the rounds decide alone" in out
    assert cli.main(["compare", str(base), str(slow), "--fail", "wall_ms:10"]) == 2
    assert "expected METRIC:+N%" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert cli.main(["show", str(broken)]) == 2
    merged = tmp_path / "m.json"
    only_b = tmp_path / "only_b.json"
    only_b.write_text(json.dumps(report(tests=[test("t::b", [1, 1, 1])])))
    assert cli.main(["merge", str(base), str(only_b), "-o", str(merged)]) == 0
    assert [t["nodeid"] for t in json.loads(merged.read_text())["tests"]] == ["t::a", "t::b"]
    assert cli.main(["merge", str(base), str(same), "-o", str(merged)]) == 2  # t::a in both
    assert f"t::a is in {base} and in {same}" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps(report(machine_id="cuda-x")))
    assert cli.main(["merge", str(base), str(other), "-o", str(merged)]) == 2


@pytest.mark.parametrize(
    "args", [["--help"], ["show", "--help"], ["compare", "--help"], ["merge", "--help"], ["--version"]]
)
def test_cli_help_and_version(args, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(args)
    assert done.value.code == 0
    assert "gpuprof" in capsys.readouterr().out


def test_cli_malformed_report_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1, "machine": {"id": "x"}, "tests": [{"nodeid": "a", "metrics": [1, 2]}]}')
    assert cli.main(["show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"gpuprof show: {bad}: test a: metrics: a table is expected, not list\n"


def test_a_baseline_at_another_sm_clock_is_said_so_in_its_lines():
    from pytest_gpuprof.verdict.compare import change_lines, clock_note

    def test(mhz):
        return {"nodeid": "t::a", "metrics": {"wall_ms": 1.0, "nvml": {"sm_clock_mhz": mhz}}}

    assert clock_note(test(1980), test(1960)) is None  # within 5%: the same clock
    note = clock_note(test(1980), test(1500))
    assert note == "SM clock 1980 MHz in the baseline, 1500 MHz now: device times scale with it"
    assert change_lines("t::a", [], note)[1] == f"    note: {note}"
    assert clock_note({"metrics": {}}, test(1500)) is None  # not measured (no NVML): nothing to say


def test_the_sm_clock_is_a_metric_like_any_other():
    from pytest_gpuprof.analysis.metrics import nvml_metrics
    from pytest_gpuprof.analysis.model import Sample

    nvml = nvml_metrics(
        [Sample(1, sm_clock_mhz=1980.0), Sample(2, sm_clock_mhz=1700.0), Sample(9, sm_clock_mhz=1.0)], (0, 5)
    )
    assert nvml is not None and nvml.sm_clock_mhz == 1840.0
    assert parse_thresholds("nvml.sm_clock_mhz:-5%")[0].metric == "nvml.sm_clock_mhz"


def _at_clock(ms, mhz):
    return {
        "nodeid": "t",
        "metrics": {"kernel_ms": ms, "nvml": {"sm_clock_mhz": mhz}},
        "rounds": {"kernel_ms": {"samples": [ms] * 5}},
    }


def test_a_kernel_time_the_sm_clock_explains_reads_clock_naming_both_clocks():
    from pytest_gpuprof.verdict.compare import compare_tests
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    gate = parse_thresholds("kernel_ms:+2%")
    (slower_clock,) = compare_tests(gate, _at_clock(10.0, 1980), _at_clock(11.0, 1800))
    assert slower_clock.finding == "clock"
    assert "SM clock 1980 MHz in the baseline, 1800 MHz now: in cycles, unchanged" in slower_clock.describe()
    (slower_code,) = compare_tests(gate, _at_clock(10.0, 1980), _at_clock(12.0, 1800))
    assert slower_code.finding == "regression" and "a regression in cycles too" in slower_code.describe()
    (same_clock,) = compare_tests(gate, _at_clock(10.0, 1980), _at_clock(11.0, 1980))
    assert same_clock.finding == "regression" and same_clock.clock is None


def test_the_throttle_reasons_of_a_window_are_every_bit_its_samples_had_and_the_clock_line_names_them():
    from pytest_gpuprof.analysis.model import Sample
    from pytest_gpuprof.analysis.nvml_metrics import nvml_metrics
    from pytest_gpuprof.analysis.throttle import throttle_names
    from pytest_gpuprof.verdict.compare import compare_tests
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    samples = [Sample(1, sm_clock_mhz=1980.0, throttle_reasons=0x1), Sample(2, throttle_reasons=0x4), Sample(3)]
    nvml = nvml_metrics(samples, (0, 5))
    assert nvml is not None and nvml.throttle_reasons == 0x5
    assert throttle_names(0x5) == ["power cap"] and throttle_names(None) == []
    now = _at_clock(11.0, 1800)
    now["metrics"]["nvml"]["throttle_reasons"] = 0x4 | 0x20
    (change,) = compare_tests(parse_thresholds("kernel_ms:+2%"), _at_clock(10.0, 1980), now)
    assert change.finding == "clock"
    assert "(held down now by: power cap, thermal (software))" in change.describe()


def test_a_pooled_baseline_against_a_run_is_counted_over_the_run(scipy_stats):
    """``main~50`` of 9 rounds a run against one run of 9: the exact table was built over
    the 450 pooled rounds for the "better" side (97 s and 2.2 GiB a gated metric); it is
    counted over the smaller side now, both ways round, and agrees with scipy."""
    rng = np.random.default_rng(3)
    pooled = list(rng.normal(100, 1, 450))
    run = list(rng.normal(100.3, 1, 9))
    for x, y in ((pooled, run), (run, pooled)):
        expected = scipy_stats.mannwhitneyu(y, x, alternative="greater", method="exact").pvalue
        assert mann_whitney_greater(x, y) == pytest.approx(expected, rel=1e-9, abs=1e-12)
