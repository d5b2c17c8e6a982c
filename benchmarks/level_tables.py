"""The tables of ``pytest_gpuprof.analysis.levels``: the 99.9th percentile, over histories
of steady normal runs, of a run's distance from the others' mean in their sd (``ALONE``)
and of the largest two-sample t over a history's splits (``SHIFT``).

``python benchmarks/level_tables.py [--histories 200000] [--seed 7]`` (3 s)
"""

from __future__ import annotations

import argparse

import numpy as np


def alone(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    out = np.zeros(len(x))
    for i in range(n):
        others = np.delete(x, i, axis=1)
        out = np.maximum(out, np.abs(x[:, i] - others.mean(1)) / others.std(1, ddof=1))
    return out


def shift(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    out = np.zeros(len(x))
    for k in range(2, n - 1):
        new, old = x[:, :k], x[:, k:]
        squares = ((new - new.mean(1, keepdims=True)) ** 2).sum(1) + ((old - old.mean(1, keepdims=True)) ** 2).sum(1)
        pooled = np.sqrt(squares / (n - 2))
        out = np.maximum(out, np.abs(new.mean(1) - old.mean(1)) / (pooled * np.sqrt(1 / k + 1 / (n - k))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tables: dict[str, dict[int, float]] = {"ALONE": {}, "SHIFT": {}}
    for n in range(5, 11):
        x = rng.normal(size=(args.histories, n))
        tables["ALONE"][n] = round(float(np.quantile(alone(x), 0.999)), 2)
        if n >= 6:
            tables["SHIFT"][n] = round(float(np.quantile(shift(x), 0.999)), 2)
    for name, table in tables.items():
        print(f"{name} = {table}")


if __name__ == "__main__":
    main()
