"""The choice of a baseline and of what pruning removes, as pure functions over summaries
(no filesystem): the store's write order decides, a refused or damaged newer record is
named, a run's shards are one run."""

import pytest

from pytest_gpuprof.baselines.choice import NoBaseline, choose, to_prune
from pytest_gpuprof.baselines.summary import Summary


def _summary(key, stored, name="main", run="r", refused=None, damaged=None):
    return Summary(f"m/{key}", name, "2026-12-07T00:00:00+00:00", run, refused=refused, damaged=damaged, stored=stored)


def _choose(everything, wanted="main", pooled=1, others=()):
    return choose(everything, wanted, pooled, machine="m", url="/store", others=lambda: list(others), doubtful={})


def test_the_newest_accepted_record_is_chosen_and_the_refused_newer_ones_named():
    old, new, refused = (
        _summary("a", 1, run="1"),
        _summary("b", 2, run="2"),
        _summary("c", 3, run="3", refused="partial"),
    )
    chosen = _choose([old, new, refused])
    assert chosen.newest is new and chosen.accepted == (new, old)
    assert "passed over 1 newer: c (partial)" in chosen.why


def test_a_damaged_newer_record_is_named_in_a_warning_never_passed_in_silence():
    chosen = _choose([_summary("a", 1), _summary("z", 5, damaged="not JSON", refused="not JSON")])
    assert "warning: passed over 1 newer record(s) that cannot be read: z is damaged (not JSON)" in chosen.why


def test_no_record_of_the_name_says_what_the_machine_has_or_which_machines_have_some():
    with pytest.raises(
        NoBaseline, match=r"no baseline named 'nightly' for machine m under /store; this machine has main"
    ):
        _choose([_summary("a", 1)], wanted="nightly")
    with pytest.raises(NoBaseline, match="baselines exist for machine ids other") as e:
        _choose([], others=["other"])
    assert e.value.empty


def test_prune_keeps_each_names_newest_runs_their_shards_together_and_drops_the_damaged():
    shards = [_summary("s1", 5, run="9"), _summary("s2", 6, run="9")]
    older = [_summary("o1", 1, run="1"), _summary("o2", 2, run="2")]
    other = [_summary("n1", 3, name="nightly", run="7")]
    damaged = [_summary("d", 4, damaged="cut short")]
    everything = [*older, *other, *damaged, *shards]
    assert sorted(to_prune(everything, keep=1)) == ["m/d", "m/o1", "m/o2"]
    assert sorted(to_prune(everything, keep=2, name="main")) == ["m/d", "m/o1"]
