"""``gpuprof explain``: each cause injected alone into a test on the host backend's virtual
clock is explained first with at least 80% of the test's change; two at once are both
named with their true shares; the split sums to the change."""

import json
import os

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pytest_gpuprof import cli
from pytest_gpuprof.verdict.explain import FLOOR_MS, explain

PIPELINE = """
import os

CHANGE = os.environ.get("GPUPROF_CHANGE", "")

def test_pipeline(gpuprof, gpu_workload):
    def body():
        with gpuprof.step("upload"):
            gpu_workload.upload(64 << 20, pinned="pageable" not in CHANGE)
        with gpuprof.step("compute"):
            gpu_workload.compute(ms=4.4 if "slower" in CHANGE else 4.0)
            if "new kernel" in CHANGE:
                gpu_workload.compute(ms=1.0, kind="matmul")
    gpuprof.measure(body, rounds=3, warmup=0)
"""


def _report(pytester, name, change):
    os.environ["GPUPROF_CHANGE"] = change
    try:
        result = pytester.runpytest("--gpu-host-clock=virtual", f"--gpu-report={name}", "-p", "no:randomly")
    finally:
        del os.environ["GPUPROF_CHANGE"]
    result.assert_outcomes(passed=1)
    return json.loads(pytester.path.joinpath(name).read_text())["tests"][0]


@pytest.fixture
def runs(pytester):
    pytester.makepyfile(test_pipeline=PIPELINE)
    return lambda change: _report(pytester, f"{change or 'base'}.json".replace(" ", "-"), change)


@pytest.mark.parametrize(
    ("change", "first"),
    [
        ("slower", "kernel fft slower"),
        ("new kernel", "kernel matmul appeared"),
        ("pageable", "copies in step upload"),
    ],
)
def test_a_cause_injected_alone_is_explained_first_with_most_of_the_change(runs, change, first):
    found = explain(runs(""), runs(change))
    assert found.change_ms > 0
    top = found.causes[0]
    assert top.what == first, found.lines()
    sure = "in 3 of 3 rounds, in no round of the base" if change == "new kernel" else "3 of 3 rounds past the base's"
    assert sure in top.evidence, top.evidence  # how sure: the rounds that show it
    assert found.share(top) >= 0.8, found.lines()
    assert abs(found.unexplained_ms) < 1e-6


def test_two_causes_at_once_are_both_named_with_their_true_shares(runs):
    base, slower, new, both = runs(""), runs("slower"), runs("new kernel"), runs("slower new kernel")
    alone = {c.what: c.ms for e in (explain(base, slower), explain(base, new)) for c in e.causes}
    found = explain(base, both)
    shares = {c.what: found.share(c) for c in found.causes}
    total = sum(alone.values())
    for what, ms in alone.items():
        assert abs(shares[what] - ms / total) <= 0.10, found.lines()


def test_the_command_prints_each_cause_and_writes_every_one_as_json(runs, pytester, capsys):
    runs("")
    runs("pageable")
    out_json = pytester.path / "why.json"
    rc = cli.main(
        ["explain", str(pytester.path / "base.json"), str(pytester.path / "pageable.json"), "--json", str(out_json)]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "test_pipeline.py::test_pipeline: wall " in out
    assert "copies in step upload: +" in out and "pinned -> " in out and "pageable" in out
    (entry,) = json.loads(out_json.read_text())
    assert entry["causes"][0]["what"] == "copies in step upload" and entry["causes"][0]["share"] >= 0.8


@example(kernels={}, kernels_after={}, idle={}, idle_after={}, stray=(0.0, 1e-06))  # a change at the floor
@given(
    kernels=st.dictionaries(st.sampled_from("abcd"), st.floats(0.1, 5), max_size=4),
    kernels_after=st.dictionaries(st.sampled_from("abcd"), st.floats(0.1, 5), max_size=4),
    idle=st.dictionaries(st.sampled_from(["up", "down"]), st.floats(0, 3), max_size=2),
    idle_after=st.dictionaries(st.sampled_from(["up", "down"]), st.floats(0, 3), max_size=2),
    stray=st.tuples(st.floats(0, 2), st.floats(0, 2)),
)
def test_the_causes_sum_to_the_change_of_wall_time(kernels, kernels_after, idle, idle_after, stray):
    """Against the identity a window holds: wall = kernel time + each step's idle + the idle
    in no step (kernels here never overlap, so the union is their sum)."""

    def entry(totals, steps, unattributed):
        kernel = sum(totals.values())
        wall = kernel + sum(steps.values()) + unattributed
        return {
            "nodeid": "t",
            "metrics": {
                "wall_ms": wall,
                "kernel_ms": kernel,
                "kernel_totals": totals,
                "steps": {n: {"idle_ms": v} for n, v in steps.items()},
                "unattributed_ms": unattributed,
            },
        }

    found = explain(entry(kernels, idle, stray[0]), entry(kernels_after, idle_after, stray[1]))
    assert sum(c.ms for c in found.causes) + found.unexplained_ms == pytest.approx(found.change_ms, abs=1e-9)
    # only the terms at or under the floor are left out: at most the floor each
    terms = len({*kernels, *kernels_after}) + len({*idle, *idle_after}) + 1
    assert abs(found.unexplained_ms) <= terms * FLOOR_MS + 1e-12


_CAUSE_NAMES = ("kernel a slower", "kernel b appeared", "idle in step upload", "idle in no step")


@given(
    st.lists(
        st.tuples(
            st.floats(1, 100),
            st.floats(-50, 50),
            st.dictionaries(st.sampled_from(_CAUSE_NAMES), st.floats(-20, 20).filter(lambda x: abs(x) > 1e-3)),
        ),
        min_size=1,
        max_size=9,
    )
)
def test_pooled_pairs_take_each_causes_median_with_absent_as_zero_and_leave_the_rest_unexplained(pairs):
    """``gpuprof ab`` and ``bisect`` explain a regressed test over its pairs: each cause is
    its median over the pairs, a pair without it counting 0 (brute force below); the
    causes and the unexplained sum to the median change exactly."""
    import statistics

    from pytest_gpuprof.verdict.explain import Cause, Explanation, pooled

    made = [
        Explanation("t", before, before + change, tuple(Cause(w, ms, f"e{i}") for w, ms in causes.items()), 0.0)
        for i, (before, change, causes) in enumerate(pairs)
    ]
    found = pooled("t", made)
    expected = {w: statistics.median([c.get(w, 0.0) for _, _, c in pairs]) for w in _CAUSE_NAMES}
    expected = {w: ms for w, ms in expected.items() if abs(ms) > 1e-6}
    assert {c.what: c.ms for c in found.causes} == pytest.approx(expected)
    assert [abs(c.ms) for c in found.causes] == sorted((abs(c.ms) for c in found.causes), reverse=True)
    change = statistics.median([change for _, change, _ in pairs])
    assert found.change_ms == pytest.approx(change)
    assert sum(c.ms for c in found.causes) + found.unexplained_ms == pytest.approx(change)
    for c in found.causes:  # the evidence of the last pair that had the cause
        last = max(i for i, (_, _, causes) in enumerate(pairs) if c.what in causes)
        assert c.evidence.endswith(f"last: e{last}")


def test_a_regression_the_pytest_gate_finds_says_why_everywhere_it_is_read(pytester, monkeypatch):
    """Under ``--gpu-compare-fail``, a regressed test's failure, its report section, the
    terminal summary, its JSON ``gate`` entry, the step summary and the HTML page each say
    why its wall time changed against the baseline's entry, its kernel first; an unchanged
    test is explained nowhere."""
    pytester.makepyfile(test_pipeline=PIPELINE)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base = pytester.runpytest("--gpu-host-clock=virtual", "--gpu-rounds=5", "--gpu-save=main", "-p", "no:randomly")
    base.assert_outcomes(passed=1)
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GPUPROF_CHANGE", "slower")
    args = ["--gpu-host-clock=virtual", "--gpu-rounds=5", "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+5%"]
    args += ["-p", "no:randomly"]
    result = pytester.runpytest(*args, "--gpu-report=r.json", "--gpu-html=p.html", "--gpu-compare-confirm=0")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "  why: wall 6.796 -> 7.196 ms" in out and "    kernel fft slower: +0.400 ms (100% of" in out, out
    assert "      why: kernel fft slower +0.400 ms (100% of +0.400 ms)" in out  # the short comparison
    gate = json.loads((pytester.path / "r.json").read_text())["tests"][0]["gate"]
    assert gate["decision"] == "regression" and gate["explain"]["causes"][0]["what"] == "kernel fft slower"
    assert "kernel fft slower" in summary.read_text().split("why:", 1)[1]
    assert "why: kernel fft slower" in (pytester.path / "p.html").read_text()
    monkeypatch.setenv("GPUPROF_CHANGE", "")
    same = pytester.runpytest(*args, "--gpu-report=s.json")
    same.assert_outcomes(passed=1)
    assert "why" not in json.loads((pytester.path / "s.json").read_text())["tests"][0]["gate"]
    assert "why:" not in same.stdout.str()


OVERLAP = """
import os

CHANGE = os.environ.get("GPUPROF_CHANGE", "")
KEPT = []

def test_overlap(gpuprof, gpu_workload):
    copies, kernels = gpu_workload.backend.stream(), gpu_workload.backend.stream()

    def body():
        gpu_workload.upload(64 << 20, non_blocking=True, stream=kernels if "serial" in CHANGE else copies)
        if "sync" in CHANGE:
            gpu_workload.sync()
        gpu_workload.compute(ms=8.0, kind="matmul" if "swap" in CHANGE else "fft", stream=kernels)
        if "keep" in CHANGE:
            with gpuprof.step("keep"):
                KEPT.append(gpu_workload.alloc(32 << 20))
        gpu_workload.backend.synchronize()

    gpuprof.measure(body, rounds=3, warmup=0)
"""


@pytest.fixture
def overlap(pytester):
    pytester.makepyfile(test_overlap=OVERLAP)

    def run(change):
        os.environ["GPUPROF_CHANGE"] = change
        try:
            name = f"{change or 'base'}.json"
            pytester.runpytest("--gpu-host-clock=virtual", f"--gpu-report={name}", "-p", "no:randomly")
        finally:
            del os.environ["GPUPROF_CHANGE"]
        return json.loads(pytester.path.joinpath(name).read_text())["tests"][0]

    return run


@pytest.mark.parametrize(
    ("change", "first"),
    [
        # the upload queued behind the kernels: the same copy at its rate, beside no kernel now
        ("serial", "overlap lost in step upload, waited for in step compute"),
        # a synchronize added after the upload: the host waits in a new step
        ("sync", "overlap lost in step upload, waited for in step sync (a new step)"),
    ],
)
def test_lost_overlap_and_a_new_synchronization_are_named_with_where_the_host_waits(overlap, change, first):
    found = explain(overlap(""), overlap(change))
    assert found.change_ms == pytest.approx(2.796, abs=0.01)  # 64 MiB at the virtual clock's 24 GB/s
    assert found.causes[0].what == first, found.lines()
    assert found.share(found.causes[0]) >= 0.8


def test_a_library_swapping_one_kernel_for_another_is_one_cause_matched_by_its_step(overlap):
    """The records name each kernel's step (the one whose launches of it took the most
    time): a kernel that vanished and one that appeared in one step are one cause."""
    base, swapped = overlap(""), overlap("swap")
    assert {k["name"]: k["step"] for k in swapped["metrics"]["top_kernels"]} == {"matmul": "compute"}
    found = explain(base, swapped)
    (swap,) = [c for c in found.causes if c.what.startswith("kernel ")]
    assert swap.what == "kernel fft replaced by matmul" and "matched by their step compute" in swap.evidence


def test_kernels_of_records_without_steps_are_matched_by_launches_and_only_alone():
    """An older record names no kernel's step: a lone vanished and appeared pair with as
    many launches is matched so, and said so; two of each stay apart."""

    def entry(kernels):
        totals = {name: ms for name, ms, _ in kernels}
        top = [{"name": name, "count": count} for name, _, count in kernels]
        return {"nodeid": "t", "metrics": {"wall_ms": 10.0, "kernel_ms": sum(totals.values()), "kernel_totals": totals, "top_kernels": top}}  # fmt: skip

    found = explain(entry([("a", 4.0, 8)]), entry([("b", 5.0, 8)]))
    assert [c.what for c in found.causes] == ["kernel a replaced by b"]
    assert found.causes[0].evidence.startswith("matched by their launches (8 each)")
    assert found.causes[0].ms == pytest.approx(1.0)
    two = explain(entry([("a", 4.0, 8), ("c", 1.0, 2)]), entry([("b", 5.0, 8), ("d", 1.0, 2)]))
    assert sorted(c.what for c in two.causes) == [
        "kernel a vanished",
        "kernel b appeared",
        "kernel c vanished",
        "kernel d appeared",
    ]


def test_a_buffer_kept_past_the_call_is_the_memory_change_named_by_its_step_and_line(overlap):
    found = explain(overlap(""), overlap("keep"))
    memory = found.memory
    assert memory is not None and (memory.kept_before, memory.kept_after) == (0, 32 << 20)
    where, before, after = memory.places[0]
    assert where.startswith("step alloc at test_overlap.py:") and (before, after) == (0, 32 << 20)
    assert "kept by step alloc at test_overlap.py:" in "\n".join(found.lines())
    assert "(100% of the change)" in found.lines()[-1]


def test_what_a_record_lacks_is_said_not_judged():
    """An older record without kernel summaries or memory: those causes are not judged, and
    said so; the wall's split still sums."""
    base = {"nodeid": "t", "metrics": {"wall_ms": 10.0, "kernel_ms": 6.0}}
    head = {"nodeid": "t", "metrics": {"wall_ms": 12.0, "kernel_ms": 7.5}}
    found = explain(base, head)
    assert found.unjudged == (
        "launches and geometry (no kernel summary)",
        "each kernel's time (no kernel totals)",
        "device memory (not recorded)",
    )
    assert found.causes[0].what == "kernel time" and found.unexplained_ms == pytest.approx(0.5)
    assert found.lines()[-1].startswith("  not judged: launches and geometry")


def test_base_may_be_a_stored_baseline_name_and_a_changed_environment_is_said_first(overlap, pytester, capsys):
    """BASE takes what ``--gpu-compare`` takes: a baseline name of the store, here the run
    saved as ``main``; a library whose version changed between the runs is said before the
    causes; ``-o`` writes the explanation as a page."""
    os.environ["GPUPROF_CHANGE"] = ""
    try:
        pytester.runpytest("--gpu-host-clock=virtual", "--gpu-save=main", "-p", "no:randomly").assert_outcomes(passed=1)
    finally:
        del os.environ["GPUPROF_CHANGE"]
    overlap("serial")
    head = pytester.path / "serial.json"
    report = json.loads(head.read_text())
    report["machine"]["environment"] = {**report["machine"]["environment"], "host clock": "a later one"}
    head.write_text(json.dumps(report))
    page = pytester.path / "why.html"
    capsys.readouterr()  # the pytest runs' own output
    rc = cli.main(["explain", "main", str(head), "--storage", str(pytester.path / ".gpuprof"), "-o", str(page)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("gpuprof explain: ") and "main@" in out[0]
    assert out[1] == "the environment changed: host clock virtual -> a later one"
    assert out[3].startswith(
        "  overlap lost in step upload, waited for in step compute: +2.796 ms (100% of the change)"
    )
    drawn = page.read_text()
    assert "overlap lost in step upload" in drawn and drawn.startswith("<!doctype html>")
    # the two runs side by side: each a bar of what filled its wall time, one colour a part
    assert drawn.count(">BASE</text>") == 1 and drawn.count(">HEAD</text>") == 1
    assert "<title>idle in step upload: 2.796 ms</title>" in drawn and "<title>kernel fft: 8.000 ms</title>" in drawn
    assert cli.main(["explain", "nosuchname", str(head), "--storage", str(pytester.path / ".gpuprof")]) == 2
    assert "nosuchname" in capsys.readouterr().err


def _entry(total_ms, *, clock=None, count=10, blocks=256):
    metrics = {
        "wall_ms": total_ms + 2.0,
        "kernel_ms": total_ms,
        "kernel_totals": {"gemm": total_ms},
        "top_kernels": [{"name": "gemm", "count": count, "blocks": blocks, "threads": 128}],
        **({"nvml": {"sm_clock_mhz": clock}} if clock else {}),
    }
    return {"nodeid": "t", "metrics": metrics}


@pytest.mark.parametrize(
    ("before", "after", "first", "evidence"),
    [
        # the same cycles at a lower clock: the card, not the code
        (_entry(10.0, clock=1980), _entry(11.0, clock=1800), "kernel gemm slower only by the SM clock", "SM clock 1980 -> 1800 MHz"),
        # more cycles at the same clock: the code
        (_entry(10.0, clock=1980), _entry(11.0, clock=1980), "kernel gemm slower", "total 10.000 -> 11.000 ms"),
        # the grid halved: said as a change of the launch, with both grids
        (_entry(10.0), _entry(14.0, blocks=128), "kernel gemm launch geometry changed", "grid 256x128 -> 128x128"),
        # twice the launches
        (_entry(10.0), _entry(20.0, count=20), "kernel gemm more launches", "launches 10 -> 20"),
    ],
)  # fmt: skip
def test_a_kernels_change_is_named_by_what_changed_clock_geometry_or_launches(before, after, first, evidence):
    found = explain(before, after)
    assert found.causes[0].what == first and evidence in found.causes[0].evidence, found.lines()
    assert found.share(found.causes[0]) == pytest.approx(1.0)


def test_a_runs_parts_fill_its_wall_time_where_nothing_overlaps(runs):
    """``explain -o``'s bars: a run's kernels, each step's idle and the idle no step holds
    add up to its wall time where no two kernels ran at once (the host backend's pipeline)."""
    from pytest_gpuprof.output.explain_page import parts

    for change in ("", "pageable slower"):
        entry = runs(change)
        assert sum(ms for _, ms in parts(entry)) == pytest.approx(entry["metrics"]["wall_ms"], abs=1e-6)


def test_idle_in_no_step_names_the_host_code_whose_idle_grew():
    """Sampled host stacks (``idle_by_code``) say where the idle no step holds was spent:
    explain names the lines whose idle grew most, before -> after."""

    def entry(unattributed, sites):
        code = [{"where": w, "ms": ms} for w, ms in sites.items()]
        return {"nodeid": "t", "metrics": {"wall_ms": 10.0 + unattributed, "kernel_ms": 10.0, "unattributed_ms": unattributed, "idle_by_code": code}}  # fmt: skip

    found = explain(entry(1.0, {"a.py:3 f": 1.0}), entry(4.0, {"a.py:3 f": 1.0, "b.py:9 g": 3.0}))
    (cause,) = found.causes
    assert cause.what == "idle in no step" and cause.ms == pytest.approx(3.0)
    assert cause.evidence.endswith("; grew in b.py:9 g 0.000 -> 3.000 ms")
