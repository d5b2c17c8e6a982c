"""A printed smallest detectable change holds as printed: a run slower than the baseline's
figure by that much is caught ``POWER`` (90%) of the time, through the code the gate runs
(``compare_tests``, as ``Gate.compare`` calls it), over seeded histories. The runner's runs
are normal around their level (the rule's assumption; docs/gates.md says so), each run's 9
rounds within 0.1% of its level; the rate is the mean over histories, as stated.

Two regimes: a threshold the spread hides (sd 1%, ``kernel_ms:+1%``), where the bound
decides, and a threshold wider than the spread (sd 1%, ``kernel_ms:+10%``), where the old
figure (2.4%, from the level alone) was caught 0 times in 10 at 2.9%."""

import math

import numpy as np
import pytest

from pytest_gpuprof.analysis.run_spread import POWER
from pytest_gpuprof.verdict.compare import compare_tests
from pytest_gpuprof.verdict.thresholds import parse_thresholds

HISTORIES = 400
NEW_RUNS = 10
RUNS = 10  # the saved runs the spread is learnt from
ROUNDS = 9
# the margin of a simulated rate, in standard errors (4: one failure in 30,000 where it holds)
MARGIN = 4


def _entry(level, rng):
    samples = list(level * (1 + rng.normal(0, 0.001, ROUNDS)))
    return {
        "nodeid": "t",
        "metrics": {"kernel_ms": float(np.median(samples))},
        "rounds": {"kernel_ms": {"samples": samples}},
    }


def _caught(gate, sd, seed, times=1.0):
    """How often a run ``times`` the printed detectable change past the baseline's figure is
    a regression, and the mean printed change (relative to the figure)."""
    rng = np.random.default_rng(seed)
    (threshold,) = parse_thresholds(gate)
    caught = tried = 0
    printed = []
    for _ in range(HISTORIES):
        history = [_entry(100 * (1 + rng.normal(0, sd)), rng) for _ in range(RUNS)]  # newest first
        baseline = history[0]
        (probe,) = compare_tests([threshold], baseline, baseline, history)
        detectable = probe.detectable
        assert detectable is not None and detectable >= threshold.delta(probe.baseline)
        figure = baseline["metrics"]["kernel_ms"]
        printed.append(detectable / figure)
        for _ in range(NEW_RUNS):
            # the new code's level: the figure moved by the printed change; its run moves as any run does
            level = (figure + times * detectable) * (1 + rng.normal(0, sd))
            (change,) = compare_tests([threshold], baseline, _entry(level, rng), history)
            caught += change.finding == "regression"
            tried += 1
    return caught / tried, float(np.mean(printed))


@pytest.mark.parametrize(("gate", "seed"), [("kernel_ms:+1%", 11), ("kernel_ms:+10%", 12), ("kernel_ms:+3%", 13)])
def test_a_run_slower_by_the_printed_change_is_caught_nine_times_in_ten(gate, seed):
    rate, printed = _caught(gate, 0.01, seed)
    assert rate >= POWER - MARGIN * math.sqrt(POWER * (1 - POWER) / (HISTORIES * NEW_RUNS))
    (threshold,) = parse_thresholds(gate)
    assert printed > threshold.amount / 100  # the threshold is part of it


def test_the_printed_change_is_not_much_more_than_it_needs():
    """Half the printed change past the threshold is caught well under 90% of the time: the
    figure is the smallest that holds, not a safe overstatement."""
    rate, _ = _caught("kernel_ms:+10%", 0.01, 14, times=0.93)
    assert rate < POWER - 0.1


def test_the_old_figure_of_the_issue_is_gone():
    """Runs within +-1%, ``kernel_ms:+10%``: the line said 2.4% and a 2.9% slowdown was caught
    0 times in 10; it says a change past 10% now, and 2.9% is never a regression."""
    _, printed = _caught("kernel_ms:+10%", 0.01, 15)
    assert 0.10 < printed < 0.13


def test_the_stated_suite_rate_matches_what_unchanged_suites_do():
    """Twenty gated tests, each at sd 1% between runs and independent, 10 saved runs each:
    how often an unchanged run fails one of them (100 histories x 20 runs, seeded, through
    ``compare_tests`` as ``Gate.compare`` calls it, its bounds sharing ``SUITE_RATE`` over
    the 20 comparisons) against the line's ``1 - (1 - rate)^20`` (``RunGate.suite_line``):
    at most 5%, and within 2 points of what is stated (docs/gates.md). Before the bounds
    shared the rate, 17.4% failed."""
    from pytest_gpuprof.verdict.run_gate import RunGate

    rng = np.random.default_rng(1)
    (threshold,) = parse_thresholds("kernel_ms:+1%")
    gated, histories, runs = 20, 100, 20
    failed = 0
    stated = None
    for _ in range(histories):
        saved = [[_entry(100 * (1 + rng.normal(0, 0.01)), rng) for _ in range(RUNS)] for _ in range(gated)]
        for _ in range(runs):
            changes = [
                compare_tests(
                    [threshold], history[0], _entry(100 * (1 + rng.normal(0, 0.01)), rng), history, comparisons=gated
                )[0]
                for history in saved
            ]
            failed += any(c.finding == "regression" for c in changes)
            if stated is None:
                entries = [
                    {
                        "nodeid": f"t{i}",
                        "gate": {"decision": "unchanged"},
                        "comparisons": [{**c.to_dict(), "gates": True}],
                    }
                    for i, c in enumerate(changes)
                ]
                gate = RunGate.of(entries)
                assert gate is not None and len(gate.rates) == gated
                stated = 1 - math.prod(1 - r for r in gate.rates)
                assert f"about {100 * stated:.0f}% of the time" in (gate.suite_line() or "")
    measured = failed / (histories * runs)
    assert stated is not None and measured <= 0.05 and abs(measured - stated) <= 0.02, (measured, stated)
