"""The history gate on the runners teams have, simulated through the code the gate runs.

``python benchmarks/gate_sim.py [--histories 1000] [--seed 1] [--scenario NAME ...]``

Each history is 10 saved runs of main (9 rounds a run, within 0.1% of its level), then 20
unchanged pull requests, main saving a run after each (the last 10 are the history, as in
CI; the one-saved-run scenario keeps its one); before them, pull requests 1, 3, 5, 10 and 50%
slower against the history as it stands. Each is a new run on the same runner, compared
through ``compare_tests`` (what ``Gate.compare`` calls) and decided by
``verdict.decision`` (regression, undecided, unchanged), gate ``kernel_ms:+1%``. A run's
level is the runner's: each scenario draws it its own way. Printed per scenario: false
regressions per comparison, the share of histories with two or more in 20 unchanged pull
requests, the share of unchanged pull requests left undecided, and the slower ones found
(a regression) and left undecided.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

import numpy as np

from pytest_gpuprof.verdict.compare import compare_tests
from pytest_gpuprof.verdict.comparison import Comparison, confirmed
from pytest_gpuprof.verdict.decision import decision
from pytest_gpuprof.verdict.entry import Entry
from pytest_gpuprof.verdict.thresholds import parse_thresholds

GATE = "kernel_ms:+1%"
SAVED = 10
PRS = 20
SLOWER = (0.01, 0.03, 0.05, 0.10, 0.50)
# fresh runs a regression is put to (--gpu-compare-confirm; its default)
CONFIRM = 1


def normal(sd: float) -> Callable[[np.random.Generator], Iterator[float]]:
    def runs(rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield 1 + rng.normal(0, sd)

    return runs


def two_speeds(rng: np.random.Generator) -> Iterator[float]:
    """70% of runs fast, 30% 20% slower; a slow spell lasts 5 runs on average."""
    slow = rng.random() < 0.3
    while True:
        slow = rng.random() < (0.8 if slow else 0.3 * 0.2 / 0.7)
        yield (1.2 if slow else 1.0) * (1 + rng.normal(0, 0.005))


def drift(rng: np.random.Generator) -> Iterator[float]:
    """+0.25% a run, sd 1%."""
    k = 0
    while True:
        k += 1
        yield (1 + 0.0025 * k) * (1 + rng.normal(0, 0.01))


def heavy(rng: np.random.Generator) -> Iterator[float]:
    """t(3) tails scaled to sd 3%."""
    while True:
        yield 1 + 0.03 * float(rng.standard_t(3)) / math.sqrt(3)


def lone_slow(rng: np.random.Generator) -> Iterator[float]:
    """sd 1%, one saved run (the second newest when pull requests start) 3x slow: a
    hiccup, or a bad commit reverted."""
    k = 0
    while True:
        k += 1
        yield (3.0 if k == 9 else 1.0) * (1 + rng.normal(0, 0.01))


def step(rng: np.random.Generator) -> Iterator[float]:
    """sd 1%, main 10% faster from its ninth saved run on (a merge that made it faster, two
    saves before pull requests start)."""
    k = 0
    while True:
        k += 1
        yield (0.9 if k >= 9 else 1.0) * (1 + rng.normal(0, 0.01))


SCENARIOS: dict[str, tuple[Callable[[np.random.Generator], Iterator[float]], int]] = {
    "normal, sd 1%": (normal(0.01), SAVED),
    "normal, sd 3%": (normal(0.03), SAVED),
    "normal, sd 10%": (normal(0.10), SAVED),
    "two speeds, persisting": (two_speeds, SAVED),
    "drift +0.25% a run": (drift, SAVED),
    "t(3) tails, sd 3%": (heavy, SAVED),
    "one saved run, sd 1%": (normal(0.01), 1),
    "a lone 3x saved run": (lone_slow, SAVED),
    "main 10% faster two saves ago": (step, SAVED),
}


def entry(level: float, rng: np.random.Generator) -> Entry:
    samples = [float(v) for v in 10 * level * (1 + rng.normal(0, 0.001, 9))]
    return {
        "nodeid": "t",
        "metrics": {"kernel_ms": float(np.median(samples))},
        "rounds": {"kernel_ms": {"samples": samples}},
    }


def decided(history: list[Entry], new: Entry, fresh: Callable[[], Entry]) -> str:
    """The gate's decision, a regression put to ``CONFIRM`` fresh runs (``fresh()``: the
    runner's next run) as ``--gpu-compare-confirm`` does (``verdict.compare.confirmed``)."""
    gating = tuple(parse_thresholds(GATE))

    def compared(entry: Entry) -> Comparison:
        return Comparison("t", "compared", tuple(compare_tests(gating, history[0], entry, history)), gating)

    comparison = compared(new)
    if CONFIRM and decision(comparison)[0] == "regression":
        comparison = confirmed(comparison, [compared(fresh()) for _ in range(CONFIRM)])
    return decision(comparison)[0]


def scenario(name: str, histories: int, rng: np.random.Generator) -> str:
    runner, saved = SCENARIOS[name]
    false = undecided = 0
    twice = 0
    found = dict.fromkeys(SLOWER, 0)
    unsure = dict.fromkeys(SLOWER, 0)
    for _ in range(histories):
        levels = runner(rng)
        history = [entry(next(levels), rng) for _ in range(saved)][::-1]  # newest first
        for slower in SLOWER:  # against the history as it stands: right after its events

            def slower_run(lv: Iterator[float] = levels, times: float = 1 + slower) -> Entry:
                return entry(next(lv) * times, rng)

            verdict = decided(history, slower_run(), slower_run)
            found[slower] += verdict == "regression"
            unsure[slower] += verdict == "undecided"
        alarms = 0
        for _ in range(PRS):

            def run(lv: Iterator[float] = levels) -> Entry:
                return entry(next(lv), rng)

            verdict = decided(history, run(), run)
            alarms += verdict == "regression"
            undecided += verdict == "undecided"
            if saved > 1:  # main merges and saves between pull requests, on the same runner
                history = [entry(next(levels), rng), *history][:SAVED]
        false += alarms
        twice += alarms >= 2
    n = histories * PRS
    caught = " ".join(f"{100 * found[s] / histories:5.1f}/{100 * unsure[s] / histories:4.1f}" for s in SLOWER)
    return (
        f"| {name} | {100 * false / n:.2f}% | {100 * twice / histories:.1f}% | {100 * undecided / n:.1f}% | {caught} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--confirm", type=int, default=1, help="fresh runs a regression is put to (0: none)")
    args = parser.parse_args()
    global CONFIRM
    CONFIRM = args.confirm
    print(
        f"gate {GATE}, confirmed by {CONFIRM} fresh runs, {SAVED} saved runs (one where the scenario says), {PRS} unchanged PRs a history, "
        f"{args.histories} histories, seed {args.seed}"
    )
    print(
        "| runner | false regressions a comparison | histories with >= 2 in 20 | unchanged PRs undecided | "
        "slower by 1/3/5/10/50%: found/undecided (%) |"
    )
    print("|---|---:|---:|---:|---|")
    for name in args.scenario or SCENARIOS:
        print(scenario(name, args.histories, np.random.default_rng(args.seed)))


if __name__ == "__main__":
    main()
