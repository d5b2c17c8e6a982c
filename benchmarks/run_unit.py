"""The run as the unit on a GPU: unchanged PyTorch and JAX tests, saved as main N times and
then compared M times, each run a fresh process, under the gate a pull request would use.

``python benchmarks/run_unit.py [--saves 6] [--compares 6] [--ab PAIRS] [--out DIR]``
``python benchmarks/run_unit.py --cpu 3 --saves 6 --compares 2 --hogged 4 --slower 4``
``python benchmarks/run_unit.py --replay run_unit.json [...]``

Prints, per test, how many of the compared runs failed, each run's medians and every
comparison line of the gated metrics (the spread between runs and the smallest detectable
change they state). The PyTorch test is launch-bound (6 Linear layers, 200 forwards a
round); the JAX test a jitted matmul loop. ``--fail`` sets the gate. ``--ab PAIRS`` then
runs ``gpuprof ab`` of the same code against itself (a git repository of the two files) under
the same gate: what the same runner says when both sides run in turns; with ``--slower``
too, then ``gpuprof ab`` of a commit of the slower code against the unchanged one (it must
exit 1).

``--replay`` judges the runs a former ``run_unit.json`` recorded again under the gate's
rule as it is now, from the runs' medians of ``wall_ms``, ``utilization`` and ``kernel_ms``
(not each kernel's time; each run's rounds taken at its median, so the rounds' test is
always clear): how many of its unchanged compared runs the rule would still fail.

``--slower N`` compares N more runs with ``--work`` host iterations added to each call
(slower code: each must fail). ``--cpu`` pins every run to one CPU; ``--hogged N`` then
compares N runs beside a busy process on that CPU (a runner made slower, the code
unchanged), and the ``--slower`` runs run beside it too (slower code on a slower runner).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

GATE = "wall_ms:+2%,utilization:-2pt,kernel_ms:+1%,kernels:+1%"

TORCH = """
import os
import pytest

WORK = int(os.environ.get("GPUPROF_HOST_WORK", "0"))  # a slower change of the code: host work

def test_torch_launch_bound(gpuprof):
    torch = pytest.importorskip("torch")
    layers = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]).cuda()
    x = torch.randn(64, 256, device="cuda")

    def body():
        with torch.no_grad():
            for _ in range(200):
                layers(x)
                sum(range(WORK))
        torch.cuda.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)
"""

JAX = """
import os
import pytest

WORK = int(os.environ.get("GPUPROF_HOST_WORK", "0"))

def test_jax_loop(gpuprof):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    step = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
    a = jax.random.normal(jax.random.PRNGKey(0), (2048, 2048), dtype=jnp.float32)
    step(a).block_until_ready()

    def body():
        b = a
        for _ in range(20):
            b = step(b)
            sum(range(WORK))
        b.block_until_ready()

    gpuprof.measure(body, rounds=5, warmup=1)
"""


def _plugin_args() -> list[str]:
    """Load the plugin by name where it is not installed (the GPU machine's checkout)."""
    installed = any(e.name == "gpuprof" for e in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_gpuprof.plugin"]


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    return None if cpu is None else lambda: os.sched_setaffinity(0, {cpu})


def _pytest(folder: Path, *args: str, cpu: int | None = None, work: int = 0) -> tuple[int, str]:
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "GPUPROF_HOST_WORK": str(work)}
    command = [sys.executable, "-m", "pytest", ".", "-q", "-p", "no:cacheprovider", *_plugin_args(), *args]
    done = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, env=env, check=False, preexec_fn=_pinned(cpu)
    )
    return done.returncode, done.stdout + done.stderr


@contextmanager
def _hog(cpu: int | None, on: bool) -> Iterator[None]:
    """A busy process on the runs' CPU: the runner made slower, the code unchanged."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"], preexec_fn=_pinned(cpu))
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def _commit(folder: Path, message: str) -> None:
    subprocess.run(["git", "add", "test_torch.py", "test_jax.py"], cwd=folder, check=True, capture_output=True)
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", message],
        cwd=folder,
        check=True,
        capture_output=True,
    )


def _ab(folder: Path, pairs: int, gate: str, work: int = 0) -> dict:
    """``gpuprof ab`` of the tests against themselves: its exit and its effects; ``work``:
    the head commits slower code (``work`` host iterations a call), whose ab must fail."""
    if not (folder / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=folder, check=True, capture_output=True)
        (folder / ".git" / "info" / "exclude").write_text("*.json\nstore/\n__pycache__/\n")
        _commit(folder, "base")
    base = "HEAD"
    if work:
        for name in ("test_torch.py", "test_jax.py"):
            text = (folder / name).read_text()
            (folder / name).write_text(text.replace('"GPUPROF_HOST_WORK", "0"', f'"GPUPROF_HOST_WORK", "{work}"'))
        _commit(folder, "slower")
        base = "HEAD~1"
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env.pop("GPUPROF_HOST_WORK", None)
    report_path = folder / ("ab-slower.json" if work else "ab.json")
    command = [sys.executable, "-m", "pytest_gpuprof", "ab", "--base", base, "--pairs", str(pairs), "--fail", gate]
    command += ["--report", str(report_path), "--", "-q", "-p", "no:cacheprovider", *_plugin_args()]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, check=False)
    print(done.stdout, flush=True)
    if done.returncode not in (0, 1):
        print(done.stderr[-2000:])
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return {"exit": done.returncode, "report": report}


def run(
    saves: int,
    compares: int,
    gate: str,
    out: Path,
    ab_pairs: int = 0,
    *,
    cpu: int | None = None,
    hogged: int = 0,
    slower: int = 0,
    work: int = 10_000,
) -> dict:
    """``hogged`` compared runs beside a busy process on ``cpu`` (a slower runner), then
    ``slower`` ones beside it with ``work`` more host iterations a call (slower code too)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuprof-run-unit-"))
    (folder / "test_torch.py").write_text(TORCH)
    (folder / "test_jax.py").write_text(JAX)
    store = folder / "store"
    started = time.time()
    results: dict = {"gate": gate, "saves": [], "compares": []}
    for i in range(saves):
        rc, text = _pytest(folder, f"--gpu-storage={store}", "--gpu-save=main", f"--gpu-report=s{i}.json", cpu=cpu)
        saved = "baseline saved" in text
        medians = _medians(folder / f"s{i}.json")
        print(f"save {i + 1}: exit {rc}, {'saved' if saved else 'NOT SAVED'}, {_short(medians)}", flush=True)
        if not saved:
            print(text[-3000:])
        results["saves"].append(medians)
    slowed = "slower code" if cpu is None else "slower runner, slower code"
    kinds = ["unchanged"] * compares + ["slower runner"] * hogged + [slowed] * slower
    for i, kind in enumerate(kinds):
        with _hog(cpu, kind.startswith("slower runner")):
            rc, text = _pytest(
                folder,
                f"--gpu-storage={store}",
                "--gpu-compare=main",
                f"--gpu-compare-fail={gate}",
                f"--gpu-report=c{i}.json",
                cpu=cpu,
                work=work if kind.endswith("code") else 0,
            )
        report = json.loads((folder / f"c{i}.json").read_text())
        outcomes = {t["nodeid"]: t["outcome"] for t in report["tests"]}
        lines = [line.strip() for line in text.splitlines() if "between" in line or ": regression" in line]
        shown = _short(_medians(folder / f"c{i}.json"))
        print(f"compare {i + 1} ({kind}): exit {rc}, {outcomes}, {shown}", flush=True)
        for line in lines:
            print(f"    {line}")
        entry = {"kind": kind, "outcomes": outcomes, "medians": _medians(folder / f"c{i}.json"), "lines": lines}
        results["compares"].append(entry)
    if ab_pairs:
        results["ab"] = _ab(folder, ab_pairs, gate)
        if slower:  # the slower code as a pull request: ab of it against the unchanged code
            results["ab_slower"] = _ab(folder, ab_pairs, gate, work)
            print(f"gpuprof ab of the slower code: exit {results['ab_slower']['exit']} (1: caught)", flush=True)
    failed: dict[str, dict[str, int]] = {}
    for c in results["compares"]:
        for nodeid, outcome in c["outcomes"].items():
            of_kind = failed.setdefault(c["kind"], {})
            of_kind[nodeid] = of_kind.get(nodeid, 0) + (outcome == "failed")
    results["failed"] = failed
    results["seconds"] = round(time.time() - started, 1)
    for kind, count in failed.items():
        print(f"failed of {kinds.count(kind)} compared runs ({kind}): {count}")
    print(f"({results['seconds']} s)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_unit.json").write_text(json.dumps(results, indent=2))
    return results


def _medians(path: Path) -> dict[str, dict[str, float]]:
    out = {}
    for t in json.loads(path.read_text())["tests"]:
        rounds = t.get("rounds", {})
        out[t["nodeid"]] = {
            m: sorted(rounds[m]["samples"])[len(rounds[m]["samples"]) // 2]
            for m in ("wall_ms", "kernel_ms", "utilization", "runner_probe_ms")
            if m in rounds
        }
    return out


def _short(medians: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{nodeid.split('::')[-1]} " + " ".join(f"{m} {v:.4g}" for m, v in figures.items())
        for nodeid, figures in medians.items()
    )


def replay(path: Path, gate: str) -> dict[str, int]:
    """How many of ``path``'s unchanged compared runs the current rule fails, per test, by
    the medians alone (each run's rounds taken at its median): ``verdict.compare.assess``
    against the newest saved run, with the saved runs' spread."""
    from pytest_gpuprof.analysis.run_spread import Spread
    from pytest_gpuprof.verdict.compare import assess
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    recorded = json.loads(path.read_text())
    thresholds = [t for t in parse_thresholds(gate) if t.metric in ("wall_ms", "utilization", "kernel_ms")]
    failed: dict[str, int] = {}
    for entry in recorded["compares"]:
        if entry.get("kind", "unchanged") != "unchanged":
            continue
        for nodeid, now in entry["medians"].items():
            history = [save[nodeid] for save in reversed(recorded["saves"]) if nodeid in save]  # newest first
            breached = []
            for t in thresholds:
                past = [h[t.metric] for h in history if t.metric in h]
                if t.metric in now and past:
                    change = assess(t, [past[0]] * 5, [now[t.metric]] * 5, Spread.of(past))
                    if change.finding == "regression":
                        breached.append(t.metric)
            failed[nodeid] = failed.get(nodeid, 0) + bool(breached)
            if breached:
                print(f"  {nodeid}: {', '.join(breached)} past the threshold and the spread")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replay", type=Path, nargs="+", metavar="RUN_UNIT_JSON")
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--compares", type=int, default=6)
    parser.add_argument("--fail", default=GATE)
    parser.add_argument("--ab", type=int, default=0, metavar="PAIRS", help="then gpuprof ab of the code against itself")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--cpu", type=int, help="pin every run to this CPU")
    parser.add_argument("--hogged", type=int, default=0, help="then compared runs beside a busy process on --cpu")
    parser.add_argument("--slower", type=int, default=0, help="then those with slower host code too")
    parser.add_argument("--work", type=int, default=10_000, help="host iterations a call that --slower adds")
    args = parser.parse_args(argv)
    if args.replay:
        for path in args.replay:
            print(f"{path}: failed of its unchanged compared runs, by the medians: {replay(path, args.fail)}")
        return 0
    if args.hogged and args.cpu is None:
        parser.error("--hogged needs --cpu")
    run(
        args.saves,
        args.compares,
        args.fail,
        args.out,
        args.ab,
        cpu=args.cpu,
        hogged=args.hogged,
        slower=args.slower,
        work=args.work,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
