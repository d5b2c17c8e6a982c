"""``gpuprof ab``'s looks on simulated runners, through the code ab runs (``in_looks``).

``python benchmarks/ab_sim.py [--runs 1000] [--seed 2]``

Each run is one ``gpuprof ab`` of a test gated at ``kernel_ms:+1%``, 5 pairs extended to 10
for a test left unsure, git and pytest aside: each process's time is the runner's level
times the true change on the current side. Printed per runner: how often a true change
equal to the limit, and no change, is called a regression; how often a fresh ab run at
the change an ab run printed as its smallest detectable one finds it (half as many runs);
and how often a 10% slowdown is found.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from pytest_gpuprof.verdict.paired import Effect, Order, Runs, in_looks
from pytest_gpuprof.verdict.thresholds import parse_thresholds

GATE = "kernel_ms:+1%"


def _report(value: float) -> dict[str, object]:
    return {"tests": [{"nodeid": "t", "rounds": {"kernel_ms": {"samples": [value]}}}], "outcomes": {"t": "passed"}}


def normal(sd: float) -> Callable[[np.random.Generator], Callable[[], float]]:
    def runner(rng: np.random.Generator) -> Callable[[], float]:
        return lambda: math.exp(rng.normal(0, sd))

    return runner


def two_speeds(rng: np.random.Generator) -> Callable[[], float]:
    """30% of processes 20% slower, a slow spell lasting 5 processes on average, each within 0.5%."""
    state = {"slow": rng.random() < 0.3}

    def level() -> float:
        state["slow"] = rng.random() < (0.8 if state["slow"] else 0.3 * 0.2 / 0.7)
        return (1.2 if state["slow"] else 1.0) * math.exp(rng.normal(0, 0.005))

    return level


RUNNERS = {
    "normal, sd 1%": normal(0.01),
    "normal, sd 3%": normal(0.03),
    "normal, sd 10%": normal(0.10),
    "two speeds, persisting": two_speeds,
}


def one(rng: np.random.Generator, runner: Callable[[np.random.Generator], Callable[[], float]], true: float) -> Effect:
    thresholds = parse_thresholds(GATE)
    runs, order, level = Runs(("kernel_ms",)), Order(int(rng.integers(1 << 30))), runner(rng)

    def pair(alone: str | None) -> None:
        reports = {
            side: _report(10.0 * level() * (math.exp(true) if side == "current" else 1.0)) for side in order.next()
        }
        runs.add(reports["base"], reports["current"])

    (found,) = [e for e in in_looks(runs, pair, 5, 10, thresholds, thresholds) if e.metric == "kernel_ms"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    limit = math.log(1.01)
    print(f"gpuprof ab, {GATE}, 5 -> 10 pairs, {args.runs} runs a case, seed {args.seed}")
    print("| runner | regression at the limit | regression with no change | printed change found | 10% slower found |")
    print("|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(args.seed)
    for name, runner in RUNNERS.items():
        at_limit = sum(one(rng, runner, limit).verdict == "regression" for _ in range(args.runs)) / args.runs
        none = sum(one(rng, runner, 0.0).verdict == "regression" for _ in range(args.runs)) / args.runs
        found = 0
        for _ in range(args.runs // 2):
            printed = one(rng, runner, 0.0).detectable or 0.0
            found += one(rng, runner, math.log1p(printed)).verdict == "regression"
        slower = sum(one(rng, runner, math.log(1.1)).verdict == "regression" for _ in range(args.runs)) / args.runs
        shown = (at_limit, none, found / (args.runs // 2), slower)
        print(f"| {name} | " + " | ".join(f"{100 * x:.1f}%" for x in shown) + " |")


if __name__ == "__main__":
    main()
