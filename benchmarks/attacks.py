"""Attacks a careless CI job or a hostile file makes, counted (host backend, no GPU).

``python benchmarks/attacks.py [--fuzz 2000] [--signals 40] [--seed 1]``

``--fuzz N``: N seeded mutations of a real report (a host-backend run of two tests), each
read by ``gpuprof compare BASE NEW`` as the baseline, in this process: a number made
implausible or of another type, a key deleted, the schema changed, the text cut short, a
deep nesting. Counted: the exits, the tracebacks (an exception out of the command: must be
0), the refusals whose line does not name the file (must be 0), and the wrong verdicts: a
gated time made implausible (non-finite, subnormal, negative, beyond a day) that was
compared instead of refused (the whole file, exit 2, or that test, ``not compared: FILE:
FIELD``; must be 0).

``--signals N``: N runs of ``gpuprof ab`` in a scratch repository, each sent SIGINT,
SIGTERM, SIGHUP or SIGKILL (in turn) at a seeded moment while its pairs run. Counted per
signal: the exit, and whether the repository is as it was (``git status`` clean, one
worktree, no leftover folder) at once, or for SIGKILL after the next ``ab`` run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

SUITE = """
def test_kernels(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=4), rounds=5, warmup=0)

def test_upload(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.upload(8 << 20), rounds=5, warmup=0)
"""
ENV = {"PYTEST_ADDOPTS": "--gpu-host-clock=virtual -p no:cacheprovider -p no:randomly"}
IMPLAUSIBLE = [float("nan"), float("inf"), -5.0, 5e-324, 1e308]
ODD = [True, "x", None, [], {}, 0, -1, 2**70]


def _report(folder: Path, name: str) -> Path:
    path = folder / name
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    installed = any(e.name == "gpuprof" for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "pytest_gpuprof.plugin"]
    command = [sys.executable, "-m", "pytest", "-q", *plugin, f"--gpu-report={path}"]
    subprocess.run(command, cwd=folder, env=env, check=True, capture_output=True)
    return path


def _leaves(node: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*where, k))] or [where]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*where, i))] or [where]
    return [where]


def _set(node: Any, where: tuple[Any, ...], value: Any) -> None:
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value


def _gated(where: tuple[Any, ...]) -> bool:
    """A leaf ``gpuprof compare``'s default gate reads: a round of a time."""
    return len(where) >= 5 and where[0] == "tests" and where[2] == "rounds" and where[3] in ("kernel_ms", "wall_ms")


def _mutate(report: dict[str, Any], rng: random.Random) -> tuple[str, str | None, bool]:
    """A mutated report's text, its kind, and whether a gated time was made implausible."""
    kind = rng.choice(["implausible", "odd", "delete", "schema", "cut", "deep"])
    mutated = copy.deepcopy(report)
    leaves = [w for w in _leaves(mutated) if w]
    gated = False
    if kind == "implausible":
        times = [w for w in leaves if _gated(w) and w[-2] == "samples"]
        where = rng.choice(times)
        _set(mutated, where, rng.choice(IMPLAUSIBLE))
        gated = True
    elif kind == "odd":
        _set(mutated, rng.choice(leaves), copy.deepcopy(rng.choice(ODD)))
    elif kind == "delete":
        where = rng.choice(leaves)
        parent: Any = mutated
        for key in where[:-1]:
            parent = parent[key]
        del parent[where[-1]]
    elif kind == "schema":
        mutated["schema"] = rng.choice([True, -1, 0, 99, "1", None, 1.5])
    elif kind == "deep":
        _set(mutated, rng.choice(leaves), "__deep__")
    text = json.dumps(mutated, allow_nan=True).replace('"__deep__"', "[" * 5000 + "]" * 5000)
    if kind == "cut":
        text = text[: rng.randrange(1, len(text))]
    return text, kind, gated


def fuzz(count: int, seed: int) -> dict[str, Any]:
    from pytest_gpuprof import cli

    rng = random.Random(seed)
    folder = Path(tempfile.mkdtemp(prefix="gpuprof-fuzz-"))
    (folder / "test_suite.py").write_text(SUITE)
    new = _report(folder, "new.json")
    report = json.loads(_report(folder, "base.json").read_text())
    exits: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    tracebacks, unnamed, wrong, samples = 0, 0, 0, []
    base = folder / "mutated.json"
    for _ in range(count):
        text, kind, gated = _mutate(report, rng)
        kinds[kind or "?"] += 1
        base.write_text(text)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = cli.main(["compare", str(base), str(new)])
        except BaseException as e:  # counting what escapes is the point
            tracebacks += 1
            samples.append(f"{kind}: {type(e).__name__}: {e}"[:200])
            continue
        exits[rc] += 1
        if rc == 2 and str(base) not in err.getvalue():
            unnamed += 1
            samples.append(f"{kind}: unnamed: {err.getvalue().strip()[:200]}")
        if gated and rc != 2 and f"not compared: {base}: rounds." not in out.getvalue():
            wrong += 1
            samples.append(f"{kind}: compared: {out.getvalue().strip()[:200]}")
    return {
        "inputs": count,
        "kinds": dict(kinds),
        "exits": dict(exits),
        "tracebacks": tracebacks,
        "refusals naming no file": unnamed,
        "implausible times compared": wrong,
        "implausible times": kinds["implausible"],
        "examples": samples[:10],
    }


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True, text=True).stdout


def _intact(folder: Path, temp: Path) -> bool:
    """``git status`` clean, one worktree, and no folder of ab's left in its temporary folder."""
    worktrees = _git(folder, "worktree", "list").splitlines()
    return _git(folder, "status", "--porcelain") == "" and len(worktrees) == 1 and not any(temp.iterdir())


def signals(count: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    folder = Path(tempfile.mkdtemp(prefix="gpuprof-signals-"))
    _git(folder, "init", "-q", "-b", "main")
    (folder / "test_suite.py").write_text(SUITE)
    (folder / ".gitignore").write_text("__pycache__/\n")
    _git(folder, "add", ".")
    _git(folder, "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-q", "-m", "base")
    temp = Path(tempfile.mkdtemp(prefix="gpuprof-signals-tmp-"))  # ab's own: whatever it leaves is seen
    env = {**os.environ, **ENV, "TMPDIR": str(temp)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest_gpuprof", "ab", "--base", "main", "--pairs", "3", "--", "-q"]
    sent = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
    tally: dict[str, Counter[str]] = {s.name: Counter() for s in sent}
    for i in range(count):
        which = sent[i % len(sent)]
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        time.sleep(rng.uniform(0.3, 6.0))
        if which == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(which)
        _, err = process.communicate(timeout=120)
        seen = tally[which.name]
        seen[f"exit {process.returncode}"] += 1
        if which == signal.SIGKILL:  # no clean-up runs: the next ab must do it
            subprocess.run([*command[:-2], "--pairs", "1", "--max-pairs", "1", "--", "-q"], cwd=folder, env=env, capture_output=True, check=False)  # fmt: skip
        seen["repository as it was" if _intact(folder, temp) else "LEFT SOMETHING"] += 1
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if which != signal.SIGKILL and process.returncode != 0:
            said = last.startswith("gpuprof ab: ") and last.endswith("what it had made is removed")
            seen["one line" if said else f"last line: {last[:80]}"] += 1
    return {name: dict(c) for name, c in tally.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz", type=int, default=2000)
    parser.add_argument("--signals", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.fuzz:
        print(json.dumps({"fuzz": fuzz(args.fuzz, args.seed)}, indent=1), flush=True)
    if args.signals:
        print(json.dumps({"signals": signals(args.signals, args.seed)}, indent=1), flush=True)


if __name__ == "__main__":
    main()
