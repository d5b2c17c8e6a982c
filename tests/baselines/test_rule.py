"""The baseline rule, as one pure function of a run's facts: each reason alone, their
order, and a run id that makes a narrowed run a part instead of a refusal."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.baselines.rule import RunFacts, Verdict, judge

WHOLE = RunFacts()


def test_a_whole_passing_run_that_measured_something_is_a_baseline():
    assert judge(WHOLE) == Verdict(None, None)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"cut_short": "was interrupted"}, "the run was interrupted"),
        ({"collect_only": True}, "was --collect-only: no test ran"),
        ({"failed": True}, "had failed tests"),
        ({"deselected": 3}, "deselected 3 test(s)"),
        ({"narrowed": ("-k", "tests/a.py")}, "ran with -k, tests/a.py: not every collected test ran"),
        ({"measured": 0}, "no test measured anything"),
    ],
)
def test_each_reason_alone_refuses_the_run_and_says_why(change, said):
    refused = judge(dataclasses.replace(WHOLE, **change)).refused
    assert refused is not None and refused.startswith(said)


def test_under_a_run_id_a_narrowed_run_is_a_part_not_a_refusal():
    part = judge(RunFacts(narrowed=("tests/a.py",), run_id="ci-7"))
    assert part == Verdict(None, "ran with tests/a.py: a part of run ci-7")
    assert judge(RunFacts(deselected=2, run_id="ci-7", failed=True)).refused.startswith("had failed tests")


@given(
    cut=st.none() | st.just("was interrupted"),
    collect=st.booleans(),
    failed=st.booleans(),
    deselected=st.integers(0, 3),
    narrowed=st.lists(st.sampled_from(["-k", "-m", "a.py"]), max_size=2).map(tuple),
    run_id=st.none() | st.just("r"),
    measured=st.integers(0, 2),
)
def test_a_run_is_a_baseline_exactly_when_nothing_is_against_it(
    cut, collect, failed, deselected, narrowed, run_id, measured
):
    """Against the rule written the other way round: nothing cut short, collected and run,
    passed, measured, and every test run unless a run id makes it a part."""
    facts = RunFacts(cut, collect, deselected, narrowed, failed, run_id, measured)
    said = judge(facts)
    whole = not (deselected or narrowed)
    may = cut is None and not collect and not failed and measured > 0 and (whole or run_id is not None)
    assert (said.refused is None) == may
    assert (said.part is not None) == (may and not whole)
