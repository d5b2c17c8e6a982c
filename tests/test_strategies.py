"""Property-based stress with hypothesis: the strategies, the profile, shrinking, memory guards."""

import random
import re

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from pytest_gpuprof.strategies import ALIGNMENTS, EDGES, buffer_sizes, partition_counts, snap

KIB, MIB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    ("name", "predicate", "seed"),
    [
        ("a power of two", lambda n: n > 1 and n & (n - 1) == 0, 0),
        ("one past a power of two", lambda n: n > 2 and (n - 1) & (n - 2) == 0, 0),
        ("one short of a power of two", lambda n: n > 1 and (n + 1) & n == 0, 0),
        ("a CuPy pool unit multiple", lambda n: n % 512 == 0 and n & (n - 1) != 0, 0),
        ("one byte past a 2 MiB page", lambda n: n % (2 * MIB) == 1, 1),
        ("an odd size that is no edge", lambda n: n % 2 == 1 and n > 100_000 and (n - 1) & (n - 2) != 0, 0),
        ("the lower end", lambda n: n == 3, 0),
        ("the upper end", lambda n: n == 64 * MIB + 5, 3),
    ],
)
def test_each_edge_case_is_drawn(name, predicate, seed):
    # the upper end comes from the integers' own bias to their bounds, about one draw in 700
    # (300 to 1,600 in 12 seeds): 2,000 examples missed it in about one run in twenty. A
    # seeded search: the same draws every run, so its cost does not vary (it did, 0.7-6.5 s).
    # The two rarest cases take the seed, of the first six, whose search ends soonest
    # (0.6 s and 0.03 s here, against 1.5 s and 0.5 s with seed 0)
    found = find(
        buffer_sizes(3, 64 * MIB + 5),
        predicate,
        settings=settings(max_examples=20_000, database=None),
        random=random.Random(seed),
    )
    assert 3 <= found <= 64 * MIB + 5, name


def test_alignment_and_bounds_hold_for_every_draw():
    from hypothesis import given

    @given(buffer_sizes(KIB, MIB, align=256), partition_counts(8))
    @settings(max_examples=300, database=None)
    def check(size, n):
        assert KIB <= size <= MIB and size % 256 == 0
        assert 1 <= n <= 8

    check()


GIB = 1 << 30
# find's own default: with settings' 100 examples, a size at or above 3 GiB of 4 was drawn in
# only about 9 searches of 10 (3 of 30 seeds found none), a red CI run in ten
SEARCH = settings(max_examples=2000, database=None)


@pytest.mark.parametrize(
    "threshold",
    [24_000_000, 64 * MIB, 64 * MIB + 1, 64 * MIB - 1, 3 * GIB, 3 * GIB + 12_345, 5 * KIB + 7, 2 * MIB + 1],
)
def test_shrinking_reaches_any_threshold_exactly(threshold):
    """The smallest size at or above the threshold, at, beside, between and far from powers
    of two: edges never stop the shrink."""
    found = find(buffer_sizes(KIB, 4 * GIB), lambda n: n >= threshold, settings=SEARCH)
    assert found == threshold


@pytest.mark.parametrize("threshold", [24_000_001, 64 * MIB + 1, 3 * GIB + 1])
def test_shrinking_with_alignment_reaches_the_first_aligned_size(threshold):
    found = find(buffer_sizes(KIB, 4 * GIB, align=256), lambda n: n >= threshold, settings=SEARCH)
    assert found == -(-threshold // 256) * 256


@given(st.sampled_from(EDGES), st.integers(1, 5000), st.integers(1, 5000))
def test_an_edge_is_the_largest_of_its_kind_at_or_below_the_size(edge, n, lo):
    """Against a brute-force search down from the size."""
    lo = min(lo, n)
    kinds = {
        "power of two": lambda m: m & (m - 1) == 0,
        "one short of a power of two": lambda m: (m + 1) & m == 0,
        "one past a power of two": lambda m: m > 1 and (m - 1) & (m - 2) == 0,
        "odd": lambda m: m % 2 == 1,
        **{f"multiple of {u}": (lambda m, u=u: m % u == 0) for u in ALIGNMENTS},
        **{f"one short of a multiple of {u}": (lambda m, u=u: (m + 1) % u == 0) for u in ALIGNMENTS},
        **{f"one past a multiple of {u}": (lambda m, u=u: m > 1 and (m - 1) % u == 0) for u in ALIGNMENTS},
    }
    moved = snap(edge, n, lo)
    assert lo <= moved <= n
    if edge == "lower end":
        assert moved == lo
    elif edge in kinds:
        expected = next((m for m in range(n, lo - 1, -1) if kinds[edge](m)), n)
        assert moved == expected, (edge, n, lo)
    else:
        assert moved == n


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="min_bytes=0"):
        buffer_sizes(0, 10)
    with pytest.raises(ValueError, match="max_bytes=5 is below min_bytes=10"):
        find(buffer_sizes(10, 5), lambda n: True)


def test_the_gpuprof_profile_fits_gpu_timing():
    profile = settings.get_profile("gpuprof")
    assert profile.deadline is None
    assert profile.max_examples == 20
    # a failing example is shrunk, not explained: explaining re-measures it tens of times
    assert Phase.shrink in profile.phases and Phase.explain not in profile.phases


SHRINK = """
import pytest
from hypothesis import given, settings
from pytest_gpuprof.strategies import buffer_sizes

MIB = 1 << 20
BUDGET = {"steps": {"compute": {"max_ms": 8}}}

def kernels_for(gpu_workload, size):
    # kernel time grows with the buffer: 1 ms a MiB, on the host backend exactly
    gpu_workload.compute(ms=size / MIB)

def breaches(gpuprof, gpu_workload, size):
    m = gpuprof.measure(lambda: kernels_for(gpu_workload, size), rounds=1, warmup=0)
    return m.steps["compute"].host_ms > 8

def test_find_threshold(gpuprof, gpu_workload):
    lo, hi = 1 << 10, 32 * MIB
    while hi - lo > 64 << 10:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if breaches(gpuprof, gpu_workload, mid) else (mid, hi)
    print(f"THRESHOLD={hi}")

@pytest.mark.gpu_budget(**BUDGET)
@settings(settings.get_profile("gpuprof"), max_examples=40, database=None)
@given(size=buffer_sizes(1 << 10, 32 * MIB))
def test_compute_budget(gpuprof, gpu_workload, size):
    gpuprof.measure(lambda: kernels_for(gpu_workload, size), rounds=1, warmup=0)
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_breach_shrinks_near_the_threshold_without_flaky(pytester, seed):
    pytester.makepyfile(SHRINK)
    found = pytester.runpytest("-s", "-k", "find_threshold", "--gpu-budget", "-p", "no:randomly")
    threshold = int(re.search(r"THRESHOLD=(\d+)", found.stdout.str())[1])
    result = pytester.runpytest("-k", "compute_budget", "--gpu-budget", f"--hypothesis-seed={seed}")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "FlakyFailure" not in out and "errors.Flaky" not in out
    size = int(re.search(r"size=(\d+)", out)[1])
    assert threshold / 2 <= size <= 2 * threshold, (size, threshold)
    result.stdout.fnmatch_lines(
        [
            "*GPU budget exceeded: steps.compute.host_ms * ms > 8.0 ms (steps.compute.max_ms)*",
            "*(confirmed by 2 more measurements)*",
        ]
    )


def test_a_leak_fails_the_test_and_names_it(pytester):
    pytester.makepyfile(
        """
        KEEP = []

        def test_keeps_a_buffer(gpu_workload):
            KEEP.append(gpu_workload.alloc(1 << 20))

        def test_next_is_clean(gpu_workload):
            gpu_workload.alloc(1 << 20)
        """
    )
    result = pytester.runpytest("--gpu-backend=host")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*GpuMemoryLeak: GPU memory leak: 1,048,576 bytes (1.0 MiB) of device memory*"])
    # one line: none of the plugin's own source before it
    result.stdout.no_fnmatch_line("*pytest_gpuprof/*.py:*")
    result.stdout.no_fnmatch_line("*raise GpuMemoryLeak*")


def test_a_leaking_hypothesis_example_is_named(pytester):
    pytester.makepyfile(
        """
        from hypothesis import given, settings
        from pytest_gpuprof.strategies import buffer_sizes
        KEEP = []

        @settings(max_examples=3, database=None)
        @given(size=buffer_sizes(4096, 8192))
        def test_leaky(gpuprof, gpu_workload, size):
            gpuprof.measure(lambda: KEEP.append(gpu_workload.alloc(size)), rounds=1, warmup=0)
        """
    )
    result = pytester.runpytest("--gpu-backend=host")
    result.stdout.fnmatch_lines(
        ["*GPU memory leak: a hypothesis example kept * bytes of device memory after it ended*"]
    )


def test_out_of_memory_names_the_size_and_the_free_memory(pytester):
    pytester.makepyfile(
        """
        import pytest
        from pytest_gpuprof.measure.workload import GpuOutOfMemory

        def test_too_big(gpu_workload):
            with pytest.raises(GpuOutOfMemory) as info:
                gpu_workload.alloc(1 << 52)
            assert "alloc of 4194304.00 GiB (4,503,599,627,370,496 B) does not fit" in str(info.value)
            assert "free of" in str(info.value)

        def test_then_clean(gpu_workload):
            gpu_workload.upload(1 << 20)
        """
    )
    pytester.runpytest("--gpu-backend=host").assert_outcomes(passed=2)


CHECK_PATTERN = """
import itertools
from hypothesis import given, settings
from pytest_gpuprof.strategies import buffer_sizes

MIB = 1 << 20
calls = itertools.count()
confirmed = []

def upload_then_prepare(gpuprof, gpu_workload, size):
    gpu_workload.upload(size)
    with gpuprof.step("prepare"):
        # {noise}
        gpuprof.backend.clock.spend({prepare_ns})

@settings(settings.get_profile("gpuprof"), max_examples=20, database=None)
@given(size=buffer_sizes(1 << 10, 8 * MIB))
def test_upload_bandwidth(gpuprof, gpu_workload, gpu_device, size):
    gpuprof.measure(lambda: upload_then_prepare(gpuprof, gpu_workload, size), rounds=2)
    before = next(calls)
    gpuprof.check(steps={{"prepare": {{"max_ms": 1.0}}}})
    confirmed.append(next(calls) - before > 1)

def test_then_some_breach_was_confirmed_away():
    assert any(confirmed)
"""


def test_check_inside_an_example_confirms_a_noisy_breach_as_measure_does(pytester):
    # The hypothesis page's pattern (docs/hypothesis.md), near its threshold: one measurement in three breaches (as a
    # noisy machine would), the re-measurements pass, so no example fails and hypothesis
    # never sees an example that fails once and passes on replay (Flaky).
    pytester.makepyfile(
        CHECK_PATTERN.format(
            noise="calls 1 and 2 of every 7 take 1.5 ms: a measure() of them breaches, its re-measurement passes",
            prepare_ns="1_500_000 if next(calls) % 7 in (1, 2) else 500_000",
        )
    )
    result = pytester.runpytest("--gpu-budget", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert "Flaky" not in result.stdout.str()


def test_check_inside_an_example_fails_a_breach_that_repeats(pytester):
    pytester.makepyfile(CHECK_PATTERN.format(noise="always over", prepare_ns="1_500_000"))
    result = pytester.runpytest("--gpu-budget", "-k", "upload_bandwidth")
    result.assert_outcomes(failed=1)
    assert "Flaky" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*GPU budget exceeded: steps.prepare.host_ms 1.5 ms > 1.0 ms (steps.prepare.max_ms)*",
            "*(confirmed by 2 more measurements)*",
            "*size=1024*",  # shrunk to the smallest size
        ]
    )


def test_an_example_run_again_keeps_its_verdict(pytester):
    # The first example breaches in every measurement, its confirmations included; from
    # then on every measurement passes, as when a machine's load goes away. Hypothesis
    # runs the failing example again before it reports it: that run must fail the same
    # way, or hypothesis reports Flaky.
    pytester.makepyfile(
        CHECK_PATTERN.format(noise="slow for the first 8 calls", prepare_ns="1_500_000 if next(calls) < 8 else 500_000")
    )
    result = pytester.runpytest("--gpu-budget", "-k", "upload_bandwidth")
    result.assert_outcomes(failed=1)
    assert "Flaky" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*steps.prepare.host_ms 1.5 ms > 1.0 ms*", "*(confirmed by 2 more measurements)*"])
