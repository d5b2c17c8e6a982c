"""``gpuprof ab`` in a git repository: the base revision and the current tree in turns, on
the host backend's virtual clock. Each run's level moves by up to 1% (seeded from a counter
the runs share) and the whole job's by ``GPUPROF_OFFSET``, as a slow runner would."""

import json
import subprocess

import pytest

from pytest_gpuprof import cli

SUITE = """
import os, random
from pathlib import Path

SLOWER = {slower}

def _level():
    counter = Path(os.environ["GPUPROF_COUNTER"])
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    noise = float(os.environ.get("GPUPROF_NOISE", "0.01"))
    return float(os.environ.get("GPUPROF_OFFSET", "1")) * (1 + random.Random(n).uniform(-noise, noise))

def test_kernels(gpuprof, gpu_workload):
    level = _level()
    gpuprof.measure(lambda: gpu_workload.compute(ms=4 * level * SLOWER), rounds=5, warmup=0)

def test_steady(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=5, warmup=0)
"""


def _git(path, *args):
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "ab@example.com")
    _git(root, "config", "user.name", "ab")
    (root / "test_perf.py").write_text(SUITE.format(slower=1.0))
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "base")
    monkeypatch.chdir(root)
    monkeypatch.setenv("GPUPROF_COUNTER", str(tmp_path / "counter"))
    monkeypatch.setenv("PYTEST_ADDOPTS", "--gpu-host-clock=virtual -p no:cacheprovider -p no:randomly")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return root


def test_a_five_percent_slowdown_is_caught_with_five_pairs_while_a_runner_offset_fails_nothing(
    repo, monkeypatch, capsys, tmp_path
):
    (repo / "test_perf.py").write_text(SUITE.format(slower=1.05))
    monkeypatch.setenv("GPUPROF_OFFSET", "1.08")  # the runner is 8% slower today, both sides alike
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    argv = ["ab", "--base", "main", "--pairs", "5", "--seed", "1", "--fail", "kernel_ms:+2%,kernels:+2%"]
    rc = cli.main([*argv, "--report", str(tmp_path / "ab.json"), "--", "-q"])
    out = capsys.readouterr().out
    assert rc == 1, out
    found = json.loads((tmp_path / "ab.json").read_text())
    regressed = {(e["nodeid"].split("::")[1], e["metric"]) for e in found["regressions"]}
    assert ("test_kernels", "kernel_ms") in regressed and all(t == "test_kernels" for t, _ in regressed)
    assert any(m.startswith("kernels.") for _, m in regressed)  # the kernel, by name
    kernel = next(e for e in found["effects"] if e["metric"] == "kernel_ms" and "test_kernels" in e["nodeid"])
    assert kernel["pairs"] == 5 and 0.03 < kernel["effect"] < 0.07 and kernel["low"] > 0.02
    assert kernel["detectable"] is not None
    assert "test_perf.py::test_kernels: kernel_ms: effect +" in out and "smallest detectable change" in out
    assert "| `test_perf.py::test_kernels` | kernel_ms |" in summary.read_text()
    steady = next(e for e in found["effects"] if e["metric"] == "kernel_ms" and "test_steady" in e["nodeid"])
    assert steady["verdict"] == "unchanged"


def test_the_same_code_passes_whatever_the_runner_does(repo, monkeypatch, capsys):
    monkeypatch.setenv("GPUPROF_OFFSET", "1.08")
    rc = cli.main(["ab", "--base", "HEAD", "--pairs", "3", "--seed", "2", "--fail", "kernel_ms:+2%,kernels:+2%", "--"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "regression" not in out.replace("kernels:+2%", "")


def test_an_unsure_test_gets_more_pairs_of_its_own(repo, monkeypatch, capsys, tmp_path):
    """A test whose interval holds its threshold is run again alone, up to --max-pairs;
    the others keep their pairs. The runs' figures are given here: the current side of one
    test alternates between its base's time and 4% more (2% on average, at a 2% limit)."""
    from pytest_gpuprof.baselines import ab

    made = {"current": 0}
    asked = []

    def run(tree, relative, args, report):
        asked.append(list(args))
        side = "base" if "gpuprof-ab-" in str(tree) else "current"
        slower = 1.0
        if side == "current":
            made["current"] += 1
            slower = 1.04 if made["current"] % 2 else 1.0
        tests = [("t.py::test_kernels", 10.0 * slower), ("t.py::test_steady", 5.0)]
        deselected = [a.split("=", 1)[1] for a in args if a.startswith("--deselect=")]
        return {
            "schema": 1,
            "machine": {"id": "host-x"},
            "tests": [
                {"nodeid": n, "metrics": {"kernel_ms": ms}, "rounds": {"kernel_ms": {"samples": [ms] * 5}}}
                for n, ms in tests
                if n not in deselected
            ],
        }

    monkeypatch.setattr(ab, "run_pytest", run)
    outcome = ab.ab("main", ["-q"], pairs=3, max_pairs=6, fail="kernel_ms:+2%", seed=0, say=lambda line: None)
    pairs = {e.nodeid: e.pairs for e in outcome.effects if e.metric == "kernel_ms"}
    assert pairs == {"t.py::test_kernels": 6, "t.py::test_steady": 3}
    verdict = {e.nodeid: e.verdict for e in outcome.effects if e.metric == "kernel_ms"}
    assert verdict == {"t.py::test_kernels": "unsure", "t.py::test_steady": "unchanged"}
    assert all(args[-1] == "--deselect=t.py::test_steady" for args in asked[6:])  # that test alone
    assert not outcome.regressions


def test_a_base_that_is_no_revision_is_one_line_and_exit_2(repo, capsys):
    assert cli.main(["ab", "--base", "no-such-branch", "--"]) == 2
    err = capsys.readouterr().err
    assert "gpuprof ab: git rev-parse --verify no-such-branch^{commit}" in err
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1


@pytest.mark.parametrize(("before", "after", "verdict"), [(0.80, 0.70, "regression"), (0.70, 0.80, "improvement")])
def test_an_effect_reads_as_the_metric_moved(before, after, verdict):
    """Utilization down 10 points is an effect of -10pt and a regression under
    ``utilization:-2pt``, in the line and in the JSON alike: never the worse-positive sign
    the verdict is reckoned in."""
    from pytest_gpuprof.baselines.ab import effect
    from pytest_gpuprof.verdict.compare import parse_thresholds

    def side(value):
        return {"rounds": {"utilization": {"samples": [value] * 5}}}

    pairs = [(side(before + d), side(after + d)) for d in (0.0, 0.01, -0.01, 0.005)]
    found = effect("t.py::t", "utilization", parse_thresholds("utilization:-2pt")[0], pairs)
    assert found.verdict == verdict
    assert found.effect == pytest.approx(after - before)
    assert found.low is not None and found.high is not None and found.low <= found.effect <= found.high
    moved = f"{100 * (after - before):+.2f}pt"
    assert f"effect {moved} [" in found.line() and found.to_dict()["effect"] == pytest.approx(after - before)
