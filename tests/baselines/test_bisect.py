"""``gpuprof bisect`` in a git repository of 16 commits on the host backend's virtual clock:
the first regressed commit in at most 5 steps, a range with no regression said as such, a
GOOD whose tests fail said before any search; the repository left as it was."""

import subprocess

import pytest
from plugin_runs import AB_SUITE, new_repository
from plugin_runs import git as _git

from pytest_gpuprof import cli

GATE = "kernel_ms:+2%"


@pytest.fixture
def history(tmp_path, monkeypatch):
    """16 commits: each changes a note; the 11th makes ``test_kernels`` 5% slower, for good."""
    root = new_repository(tmp_path / "repo", AB_SUITE.format(slower=1.0))
    for n in range(2, 17):
        (root / "test_perf.py").write_text(AB_SUITE.format(slower=1.05 if n >= 11 else 1.0))
        (root / "notes.txt").write_text(f"commit {n}\n")
        _git(root, "add", ".")
        _git(root, "commit", "-q", "-m", f"commit {n}")
    monkeypatch.chdir(root)
    monkeypatch.setenv("GPUPROF_COUNTER", str(tmp_path / "counter"))
    monkeypatch.setenv("GPUPROF_NOISE", "0.002")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--gpu-host-clock=virtual -p no:cacheprovider -p no:randomly")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    commits = _git(root, "rev-list", "--reverse", "HEAD").split()
    return root, commits


def _state(root):
    return _git(root, "status", "--porcelain"), _git(root, "worktree", "list").count("\n")


def test_a_five_percent_slowdown_at_the_eleventh_of_sixteen_commits_is_found_in_five_steps(history, capsys):
    root, commits = history
    before = _state(root)
    rc = cli.main(["bisect", commits[0], commits[-1], "--pairs", "3", "--fail", GATE, "--seed", "1", "--"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    lines = out.splitlines()
    assert lines[0].startswith("gpuprof bisect: 5 steps between"), out
    assert f"the first regressed commit is {commits[10][:12]}" in out
    assert f"its parent {commits[9][:12]} reads the same as GOOD" in out
    assert f"{commits[10]} commit 11 (ab, " in out  # hash, subject, author, date
    assert "test_perf.py::test_kernels: kernel_ms +5." in out and "regression" in out
    # why the culprit is slower: its kernel, over the culprit step's pairs
    why = lines.index(next(line for line in lines if line.startswith("  why test_perf.py::test_kernels: wall ")))
    assert lines[why + 1].startswith("    kernel fft slower: +0.") and "median of 3 pairs" in lines[why + 1], out
    assert _state(root) == before


def test_a_range_with_no_regression_says_so_in_one_step(history, capsys):
    _root, commits = history
    rc = cli.main(["bisect", commits[0], commits[9], "--pairs", "3", "--fail", GATE, "--seed", "1", "--"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.splitlines()[0].startswith("gpuprof bisect: 1 steps between")
    assert f"gpuprof bisect: no regression between {commits[0]} and {commits[9]}" in out


def test_a_good_whose_tests_fail_is_said_before_any_search(history, capsys):
    root, _commits = history
    (root / "test_broken.py").write_text("def test_broken():\n    assert False\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "broken")
    good = _git(root, "rev-parse", "HEAD").strip()
    (root / "notes.txt").write_text("later\n")
    _git(root, "commit", "-qam", "later")
    rc = cli.main(["bisect", good, "HEAD", "--pairs", "2", "--fail", GATE, "--"])
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "gpuprof bisect: GOOD " in out and "test_broken.py::test_broken failed in its runs" in out


def test_a_bad_that_is_not_after_good_is_one_line(history, capsys):
    _, commits = history
    rc = cli.main(["bisect", commits[5], commits[2], "--"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().endswith(f"does not come after {commits[5]} ({commits[5][:12]})")


def test_ctrl_c_mid_search_is_one_line_exit_130_and_leaves_the_repository_as_it_was(history, tmp_path):
    """SIGINT while a step's pairs run (both worktrees out): one line, exit 130, ``git status``
    and ``git worktree list`` as before, nothing left in the temporary folder."""
    import os
    import signal
    import sys

    root, commits = history
    before = _state(root)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest_gpuprof", "bisect", commits[0], commits[-1], "--pairs", "3"]
    command += ["--fail", GATE, "--"]
    process = subprocess.Popen(command, cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # the second step's pairs have begun
        seen.append(line)
        if "gpuprof ab: pair 1" in line and any("gpuprof bisect: step 2:" in s for s in seen):
            break
    assert process.poll() is None, "".join(seen)
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == 130, rest
    assert rest.strip().splitlines()[-1] == "gpuprof bisect: interrupted; what it had made is removed"
    assert _state(root) == before
    assert not list(temp.iterdir())
