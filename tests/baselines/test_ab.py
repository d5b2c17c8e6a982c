"""``gpuprof ab`` in a git repository: the base revision and the current tree in turns, on
the host backend's virtual clock. Each run's level moves by up to 1% (seeded from a counter
the runs share) and the whole job's by ``GPUPROF_OFFSET``, as a slow runner would."""

import json
import math
import re
import subprocess

import pytest
from plugin_runs import AB_SUITE as SUITE
from plugin_runs import new_repository

from pytest_gpuprof import cli


def _git(path, *args):
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = new_repository(tmp_path / "repo", SUITE.format(slower=1.0))
    monkeypatch.chdir(root)
    monkeypatch.setenv("GPUPROF_COUNTER", str(tmp_path / "counter"))
    monkeypatch.setenv("PYTEST_ADDOPTS", "--gpu-host-clock=virtual -p no:cacheprovider -p no:randomly")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return root


def test_a_five_percent_slowdown_is_caught_with_five_pairs_while_a_runner_offset_fails_nothing(
    repo, monkeypatch, capsys, tmp_path
):
    (repo / "test_perf.py").write_text(SUITE.format(slower=1.05))
    _git(repo, "checkout", "-qb", "pr")
    _git(repo, "commit", "-qam", "slower")  # the pull request: committed, as ab measures commits
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
    # one screen: each regression on one short line with its interval, pairs and limit; the
    # unchanged effects counted; the full lines (the smallest detectable change) under -v
    shown = [line for line in out.splitlines() if line.startswith("  test_perf.py::test_kernels: kernel_ms +")]
    assert len(shown) == 1 and shown[0].endswith(" over 5 pairs, limit kernel_ms:+2%: regression"), out
    assert re.search(r"\[\+\d+\.\d+% \.\. \+\d+\.\d+%\]", shown[0]) and len(shown[0]) <= 160
    assert "effect(s) unchanged (-v shows every line)" in out and "smallest detectable change" not in out
    assert "| `test_perf.py::test_kernels` | kernel_ms |" in summary.read_text()
    steady = next(e for e in found["effects"] if e["metric"] == "kernel_ms" and "test_steady" in e["nodeid"])
    assert steady["verdict"] == "unchanged"
    # why: the regressed test's change of wall time over its pairs, its kernel first, on
    # the screen, in the JSON and in the step summary; no other test explained
    assert list(found["explain"]) == ["test_perf.py::test_kernels"], found["explain"]
    why = found["explain"]["test_perf.py::test_kernels"]
    assert why["causes"][0]["what"] == "kernel fft slower" and why["causes"][0]["share"] > 0.8
    assert "median of 5 pairs; last: total " in why["causes"][0]["evidence"]
    at = out.index("  why test_perf.py::test_kernels: wall ")
    assert out[at:].splitlines()[1].startswith("    kernel fft slower: +0.")
    assert "- why test_perf.py::test_kernels: wall " in summary.read_text()


def test_the_same_code_passes_whatever_the_runner_does(repo, monkeypatch, capsys):
    monkeypatch.setenv("GPUPROF_OFFSET", "1.08")
    argv = ["ab", "--base", "HEAD", "--pairs", "3", "--seed", "2", "--fail", "kernel_ms:+2%,kernels:+2%", "-v", "--"]
    rc = cli.main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "regression" not in out.replace("kernels:+2%", "")
    # -v: every effect's full line, unchanged ones included
    assert "test_perf.py::test_steady: kernel_ms: effect " in out and "smallest detectable change" in out


def test_an_unsure_test_gets_more_pairs_of_its_own(repo, monkeypatch, capsys, tmp_path):
    """A test whose interval holds its threshold is run again alone, up to --max-pairs;
    the others keep their pairs. The runs' figures are given here: the current side of one
    test alternates between its base's time and 4% more (2% on average, at a 2% limit)."""
    from pytest_gpuprof import ab

    made = {"current": 0}
    asked = []

    def run(tree, relative, args, report, timeout=None):
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
    assert err.strip() == f"gpuprof ab: --base no-such-branch: no such revision in {repo}"
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1


@pytest.mark.parametrize(("before", "after", "verdict"), [(0.80, 0.70, "regression"), (0.70, 0.80, "improvement")])
def test_an_effect_reads_as_the_metric_moved(before, after, verdict):
    """Utilization down 10 points is an effect of -10pt and a regression under
    ``utilization:-2pt``, in the line and in the JSON alike: never the worse-positive sign
    the verdict is reckoned in."""
    from pytest_gpuprof.verdict.paired import effect
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    def side(value):
        return {"utilization": value}

    pairs = [(side(before + d), side(after + d)) for d in (0.0, 0.01, -0.01, 0.005)]
    found = effect("t.py::t", "utilization", parse_thresholds("utilization:-2pt")[0], pairs)
    assert found.verdict == verdict
    assert found.effect == pytest.approx(after - before)
    assert found.low is not None and found.high is not None and found.low <= found.effect <= found.high
    moved = f"{100 * (after - before):+.2f}pt"
    assert f"effect {moved} [" in found.line() and found.to_dict()["effect"] == pytest.approx(after - before)


# --- the whole pull request

FAILING = """
def test_new_and_broken():
    assert False
"""


def _branch(repo, message, **files):
    _git(repo, "checkout", "-qB", "pr")
    for name, text in files.items():
        if text is None:
            (repo / name).unlink()
        else:
            (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)


def _worktrees(repo):
    return subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout.splitlines()


def test_a_pull_request_that_adds_a_failing_test_fails_naming_it(repo, capsys, tmp_path):
    """It once printed "unchanged" lines, never named the test and exited 0."""
    _branch(repo, "adds a broken test", **{"test_new.py": FAILING})
    rc = cli.main(
        ["ab", "--base", "main", "--pairs", "2", "--fail", "kernel_ms:+5%", "--report", str(tmp_path / "r.json"), "--"]
    )
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "  test_new.py::test_new_and_broken: failed in head (2 of 2 runs)" in out
    assert "  test_new.py::test_new_and_broken: new (in head only)" in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"gpuprof ab: 3 tests in \d pairs: 2 unchanged; 1 test failed in head", last), last
    found = json.loads((tmp_path / "r.json").read_text())
    assert found["failed"] == {"base": [], "head": ["test_new.py::test_new_and_broken"]}
    assert found["new"] == ["test_new.py::test_new_and_broken"] and found["verdict"] == last


def test_a_removed_or_skipped_gated_test_is_said(repo, capsys):
    skipped = SUITE.format(slower=1.0).replace(
        "def test_steady", "import pytest\n@pytest.mark.skip('slow')\ndef test_steady"
    )
    _branch(repo, "skips one", **{"test_perf.py": skipped})
    rc = cli.main(["ab", "--base", "main", "--pairs", "2", "--fail", "kernel_ms:+5%", "--"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "  test_perf.py::test_steady: skipped in head, run in base: nothing of it was compared" in out
    kept = SUITE.format(slower=1.0).split("def test_steady")[0]
    _branch(repo, "removes one", **{"test_perf.py": kept})
    cli.main(["ab", "--base", "main", "--pairs", "2", "--fail", "kernel_ms:+5%", "--"])
    assert "  test_perf.py::test_steady: removed (in base only)" in capsys.readouterr().out


def test_uncommitted_changes_are_refused_unless_allowed_and_then_said_first_and_last(repo, capsys):
    (repo / "test_perf.py").write_text(SUITE.format(slower=1.0) + "\n# edited\n")
    (repo / "notes.txt").write_text("x")
    assert cli.main(["ab", "--base", "main", "--pairs", "2", "--"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "gpuprof ab: uncommitted changes (test_perf.py, notes.txt): commit them, or pass --allow-dirty to measure "
        "the working tree"
    )
    assert len(_worktrees(repo)) == 1
    assert cli.main(["ab", "--base", "main", "--pairs", "2", "--allow-dirty", "--"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0].startswith("gpuprof ab: --allow-dirty: head is the working tree")
    assert captured.out.strip().splitlines()[-1].endswith("; head was the working tree")


def test_no_repository_and_a_shallow_clone_are_one_line_each(tmp_path, monkeypatch, capsys, repo):
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.chdir(outside)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert cli.main(["ab", "--base", "main", "--"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"gpuprof ab: {outside} is in no git repository: gpuprof ab runs two revisions of one"
    )
    _git(repo, "checkout", "-qb", "feature")
    (repo / "later.txt").write_text("x")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "later")
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", "--branch", "feature", f"file://{repo}", str(shallow))
    monkeypatch.chdir(shallow)
    assert cli.main(["ab", "--base", "HEAD~1", "--"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpuprof ab: --base HEAD~1: no such revision in") and "this clone is shallow" in err
    assert len(err.splitlines()) == 1


def test_ctrl_c_is_one_line_exit_130_and_leaves_no_worktree(repo, monkeypatch, capsys):
    from pytest_gpuprof import ab

    made = []

    def interrupted(tree, relative, args, report, timeout=None):
        made.append(tree)
        raise KeyboardInterrupt

    monkeypatch.setattr(ab, "run_pytest", interrupted)
    assert cli.main(["ab", "--base", "main", "--"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "gpuprof ab: interrupted; what it had made is removed"
    assert len(_worktrees(repo)) == 1
    import subprocess

    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == ""  # the repository exactly as it was
    assert not any(tree.exists() for tree in made if "gpuprof-ab-" in str(tree))


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_or_sighup_ends_a_running_ab_with_one_line_and_nothing_left(repo, tmp_path, name, code):
    """A runner's cancel (SIGTERM) or a closed terminal (SIGHUP) while a pair runs: the
    pytest child ends, the worktree and its folder go, exit 128 + the signal."""
    import os
    import signal
    import sys
    import time

    (repo / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "hangs")  # on both sides
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest_gpuprof", "ab", "--base", "main", "--pairs", "1", "--", "test_hang.py"]
    process = subprocess.Popen(command, cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    line = process.stderr.readline()  # the pair has begun
    assert "pair 1" in line or "one pair" in line
    time.sleep(1.0)
    process.send_signal(getattr(signal, name))
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == code, rest
    assert rest.strip().splitlines()[-1] == f"gpuprof ab: stopped by {name}; what it had made is removed"
    assert len(_worktrees(repo)) == 1
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""


def test_what_a_killed_ab_left_is_removed_by_the_next_run(repo, capsys):
    """SIGKILL (docker stop's last word, an OOM kill) runs no clean-up: 30 of 30 such kills
    left a registered worktree and its folder, which `git worktree prune` does not clear.
    The next ab run recognises them (its folder's name, an owner no longer running), says
    so and removes them; the repository is as it was."""
    import os
    import signal
    import sys
    import time
    from pathlib import Path

    (repo / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "hangs")  # on both sides
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest_gpuprof", "ab", "--base", "main", "--pairs", "1", "--", "test_hang.py"]
    process = subprocess.Popen(command, cwd=repo, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stderr is not None
    line = process.stderr.readline()  # the pair has begun: the worktree is there
    assert "pair 1" in line or "one pair" in line
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)  # the ab and its pytest child, no clean-up
    process.communicate(timeout=60)
    (left,) = [w.split()[0] for w in _worktrees(repo) if "gpuprof-ab-" in w]
    assert Path(left).is_dir()
    rc = cli.main(["ab", "--base", "main", "--pairs", "1", "--max-pairs", "1", "--", "test_perf.py"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"gpuprof ab: removed {Path(left).parent}, left by a run of gpuprof ab that was killed" in err
    assert not Path(left).parent.exists() and len(_worktrees(repo)) == 1
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""


def test_one_pair_can_never_fail_and_says_so(repo, monkeypatch, capsys):
    rc = cli.main(["ab", "--base", "main", "--pairs", "1", "--max-pairs", "1", "--fail", "kernel_ms:+2%", "--"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "one pair has no interval: --pairs 2 or more: this run can find no regression" in captured.err
    assert captured.out.strip().splitlines()[-1] == "gpuprof ab: 2 tests in 1 pairs: 2 undecided"
    rc = cli.main(
        [
            "ab",
            "--base",
            "main",
            "--pairs",
            "1",
            "--max-pairs",
            "1",
            "--fail",
            "kernel_ms:+2%",
            "--undecided",
            "fail",
            "--",
        ]
    )
    assert rc == 1


def test_the_printed_detectable_change_is_caught_nine_times_in_ten():
    """Seeded: pairs whose differences are normal with sd 3%; a run of pairs prints its
    smallest detectable change; a fresh run of pairs at that true change is a regression at
    least 90% of the time (it was the distance past the limit, caught half the time)."""
    import numpy as np

    from pytest_gpuprof.verdict.paired import effect
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    (limit,) = parse_thresholds("kernel_ms:+2%")
    rng = np.random.default_rng(5)

    def pairs(true_change, n=5):
        out = []
        for d in rng.normal(true_change, 0.03, n):
            out.append(({"kernel_ms": 10.0}, {"kernel_ms": 10.0 * (1 + d)}))
        return out

    caught = trials = 0
    for _ in range(2000):
        printed = effect("t", "kernel_ms", limit, pairs(0.0)).detectable
        assert printed is not None and printed > 0.02
        caught += effect("t", "kernel_ms", limit, pairs(printed)).verdict == "regression"
        trials += 1
    assert caught / trials >= 0.9 - 4 * (0.9 * 0.1 / trials) ** 0.5


# --- the design, pinned: paired, balanced, its error spent over its two looks


def _report(value):
    return {"tests": [{"nodeid": "t", "rounds": {"kernel_ms": {"samples": [value]}}}], "outcomes": {"t": "passed"}}


def _simulated(level, true, pairs=5, max_pairs=10, gate="kernel_ms:+1%", seed=0):
    """``gpuprof ab``'s looks (``in_looks``) over runs whose time is ``level(pair, side,
    first)`` x the true change on the current side: the code ab runs, git and pytest aside."""
    import math

    from pytest_gpuprof.verdict.paired import Order, Runs, in_looks
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    thresholds = parse_thresholds(gate)
    runs, order, made = Runs(tuple(t.metric for t in thresholds)), Order(seed), []

    def pair(alone):
        reports = {}
        for i, side in enumerate(order.next()):
            change = math.exp(true) if side == "current" else 1.0
            reports[side] = _report(10.0 * level(len(made), side, i == 0) * change)
        made.append(1)
        runs.add(reports["base"], reports["current"])

    (found,) = [e for e in in_looks(runs, pair, pairs, max_pairs, thresholds, thresholds) if e.metric == "kernel_ms"]
    return found


def test_the_analysis_is_paired_a_runner_that_moves_between_pairs_cancels():
    """Each pair on a runner up to 30% slower or faster than the last, both its runs alike:
    a 3% slowdown is a regression from 5 pairs. Unpaired, the pairs' spread (17%) would
    hide it."""
    import numpy as np

    rng = np.random.default_rng(7)
    offsets = rng.uniform(0.7, 1.3, 20)
    noise = rng.normal(0, 0.002, 40)
    found = _simulated(lambda k, side, first: offsets[k] * (1 + noise[2 * k + first]), math.log(1.03))
    assert found.verdict == "regression" and found.pairs == 5


def test_one_pair_that_straddles_a_change_of_speed_sways_no_verdict():
    """Ten pairs, a 3% slowdown measured to 0.2%, but one pair's runs on either side of
    the runner's change of speed (that pair 18% faster, or slower): still a regression. The
    same with no change: still unchanged. Student's t over the mean called both unsure
    (the one pair's spread); the mean alone moved the effect by 1.8 points."""
    import numpy as np

    from pytest_gpuprof.verdict.paired import LOOKS, effect
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    (gate,) = parse_thresholds("kernel_ms:+1%")
    noise = np.random.default_rng(3).normal(0, 0.002, 10)
    for true, verdict in ((math.log(1.03), "regression"), (0.0, "unchanged")):
        for straddle in (math.log(1.18), -math.log(1.18)):
            logs = [true + e for e in noise[:9]] + [true + straddle]
            pairs = [({"kernel_ms": 10.0}, {"kernel_ms": 10.0 * math.exp(d)}) for d in logs]
            found = effect("t", "kernel_ms", gate, pairs, LOOKS[1])
            assert found.verdict == verdict, found.line()
            assert abs(math.log1p(found.effect) - true) < 0.003, found.line()


def test_each_order_comes_once_in_every_two_pairs_so_a_first_run_bias_cancels():
    """The first run of each pair 5% slower (a cold cache), no true change: over an even
    number of pairs the bias cancels exactly. A coin flip per pair left it in the effect."""
    from pytest_gpuprof.verdict.paired import Order

    for seed in range(20):
        order = Order(seed)
        firsts = [order.next()[0] for _ in range(10)]
        assert all({firsts[i], firsts[i + 1]} == {"base", "current"} for i in range(0, 10, 2)), firsts
    found = _simulated(lambda k, side, first: 1.05 if first else 1.0, 0.0, pairs=10, max_pairs=10, seed=3)
    assert abs(found.effect) < 1e-12 and found.verdict != "regression"


def test_the_extension_spends_its_error_over_its_two_looks():
    """A true change equal to the limit, runs moving by 3% each: ``regression`` at most
    about 2% of the time over 1,000 seeded ab runs, the extension (5 -> 10 pairs) included.
    Reusing the first look's 90% interval at every added pair called it 11% of the time."""
    import numpy as np

    rng = np.random.default_rng(11)
    regressions = 0
    trials = 1000
    for seed in range(trials):
        levels = np.exp(rng.normal(0, 0.03, 40))
        found = _simulated(lambda k, side, first, lv=levels: lv[2 * k + first], math.log(1.01), seed=seed)
        regressions += found.verdict == "regression"
    assert regressions / trials <= 0.02 + 4 * math.sqrt(0.02 * 0.98 / trials)


def test_a_pytest_run_that_hangs_ends_at_the_run_timeout_naming_its_pair(repo, capsys):
    (repo / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "hangs")
    assert cli.main(["ab", "--base", "main", "--pairs", "2", "--run-timeout", "2", "--", "test_hang.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("gpuprof ab: pair 1, ") and err.endswith("ran past --run-timeout 2 s and was ended")
    assert len(_worktrees(repo)) == 1


def test_pairs_are_bounded(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["ab", "--base", "main", "--pairs", "1000000", "--"])
    assert done.value.code == 2
    assert "--pairs: 1000000: at most 1000 pairs" in capsys.readouterr().err


def _with_submodule(repo, tmp_path, monkeypatch):
    """``repo`` with a submodule ``lib`` holding a test of its own, committed on main."""
    lib = tmp_path / "lib"
    lib.mkdir()
    _git(lib, "init", "-q", "-b", "main")
    _git(lib, "config", "user.email", "ab@example.com")
    _git(lib, "config", "user.name", "ab")
    (lib / "test_sub.py").write_text("def test_sub(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    _git(lib, "add", ".")
    _git(lib, "commit", "-qm", "lib")
    # a submodule on this disk: git refuses the file protocol for submodules unless allowed
    for key, value in {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")
    _git(repo, "submodule", "add", "-q", str(lib), "lib")
    _git(repo, "commit", "-qm", "with lib")
    return lib


def test_the_base_worktree_holds_its_submodules(repo, tmp_path, monkeypatch, capsys):
    """A worktree starts without the submodules: the base side once ran without their code,
    and the error did not say why."""
    _with_submodule(repo, tmp_path, monkeypatch)
    rc = cli.main(["ab", "--base", "main", "--pairs", "1", "--max-pairs", "1", "--seed", "0", "--", "lib/test_sub.py"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "gpuprof ab: 1 tests in 1 pairs: 1 unchanged" in out and "failed in" not in out


def test_submodules_that_cannot_be_checked_out_are_one_line(repo, tmp_path, monkeypatch, capsys):
    import shutil

    lib = _with_submodule(repo, tmp_path, monkeypatch)
    shutil.rmtree(lib)  # the submodule's remote is gone: a worktree cannot clone it
    rc = cli.main(["ab", "--base", "main", "--pairs", "1", "--", "lib/test_sub.py"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "gpuprof ab: --base main: its submodules could not be checked out in its worktree" in err
    assert len(_worktrees(repo)) == 1  # the worktree it had made is gone


def _entry(r, scale, nodeid="t.py::test_a"):
    """A test's report entry as a GPU run writes it: rounds, and metrics with lists of
    notes, kernels and memory sites that no gate reads."""
    samples = [scale * (10 + r.gauss(0, 0.2)) for _ in range(9)]
    return {
        "nodeid": nodeid,
        "outcome": "passed",
        "rounds": {"kernel_ms": {"samples": samples, "median": 0, "iqr": 0}, "wall_ms": {"samples": samples}},
        "metrics": {
            "kernel_ms": samples[0], "wall_ms": samples[0], "kernel_totals": {"spin": scale * 9.0, "copy": 1.0},
            "nvml": {"sm_clock_mhz": 1980}, "notes": ["a note"] * 50, "top_kernels": [{"name": "spin"}] * 50,
            "memory": {"peak_bytes": 1 << 20, "sites": [{"where": "x.py:1", "bytes": 1}] * 200},
        },
        "checks": [{"breaches": []}] * 100,
    }  # fmt: skip


def test_a_pair_keeps_only_the_figures_its_gates_read():
    """A run of many pairs once kept every run's whole report (3.1 MB a pair on a 100-test
    suite): each test of a pair is now the gated metrics' medians, each kernel's total and
    the SM clock, and the effects over them are those a brute-force reading of the whole
    entries gives."""
    import random as rnd
    import statistics

    from pytest_gpuprof.verdict import paired
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    r = rnd.Random(7)
    thresholds = parse_thresholds("kernel_ms:+2%,kernels:+2%,wall_ms:+5ms")
    kept = paired.Runs(tuple(t.metric for t in thresholds))
    whole = []
    for _ in range(6):
        base, current = _entry(r, 1.0), _entry(r, 1.04)
        whole.append((base, current))
        kept.add({"tests": [base]}, {"tests": [current]})
    (b, _c) = kept.pairs["t.py::test_a"][0]
    assert b == {
        "kernel_ms": statistics.median(whole[0][0]["rounds"]["kernel_ms"]["samples"]),
        "wall_ms": statistics.median(whole[0][0]["rounds"]["wall_ms"]["samples"]),
        "kernels.spin.total_ms": 9.0,
        "kernels.copy.total_ms": 1.0,
        "nvml.sm_clock_mhz": 1980.0,
    }
    found = {e.metric: e for e in paired.effects(kept, thresholds)}
    logs = [math.log(statistics.median(c["rounds"]["kernel_ms"]["samples"]) / statistics.median(b["rounds"]["kernel_ms"]["samples"])) for b, c in whole]  # fmt: skip
    trimmed = sorted(logs)[1:-1]  # 6 pairs: the lowest and the highest left out
    assert found["kernel_ms"].effect == pytest.approx(math.expm1(statistics.fmean(trimmed)))
    assert (
        found["kernels.spin.total_ms"].verdict == "regression" and found["kernels.copy.total_ms"].verdict == "unchanged"
    )
    assert found["wall_ms"].verdict == "unchanged"  # 0.4 ms slower, under the 5 ms allowed


def test_a_run_of_pairs_grows_by_the_numbers_it_compares_not_by_its_reports():
    """Memory flat in pairs: 20 pairs of a 100-test suite whose reports are 0.5 MB each
    add under 96 KB a pair to what the run holds (traced; 82 KB: five numbers a test a
    side, and the sizes of its change's causes that ``why`` pools), where each pair kept
    3.1 MB, then 1.2 MB."""
    import random as rnd
    import tracemalloc

    from pytest_gpuprof.verdict import paired
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    r = rnd.Random(3)
    thresholds = parse_thresholds("kernel_ms:+1%,kernels:+1%")
    runs = paired.Runs(tuple(t.metric for t in thresholds))

    def report():
        return {"tests": [_entry(r, 1.0, f"t.py::test_{i}") for i in range(100)]}

    assert len(json.dumps(report())) > 400_000
    tracemalloc.start()
    try:
        runs.add(report(), report())
        first, _ = tracemalloc.get_traced_memory()
        for _ in range(20):
            runs.add(report(), report())
        last, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(runs.pairs["t.py::test_0"]) == 21
    assert (last - first) / 20 < 96_000, f"{(last - first) / 20:.0f} B a pair"
