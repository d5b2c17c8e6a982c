"""--gpu-exclusive: a lock per device among this plugin's processes, dropped when its
holder dies, and the wait reported outside every window."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from plugin_runs import WITHOUT_HYPOTHESIS

from pytest_gpuprof.capture.exclusive import DeviceLock


def _me():
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def test_a_second_holder_waits_and_knows_for_whom(tmp_path, monkeypatch):
    first, second = DeviceLock("GPU-1234", tmp_path), DeviceLock("GPU-1234", tmp_path)
    first.acquire("t.py::test_first")
    assert first.held
    monkeypatch.delenv("PYTEST_GPUPROF_HELD")  # the second holder plays another process
    got: list[tuple[float, str]] = []
    waiter = threading.Thread(target=lambda: got.append(second.acquire("t.py::test_second")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not second.held  # blocked while the first holds it
    first.release()
    waiter.join(10)
    ((waited, holder),) = got
    assert second.held and waited > 0 and holder == f"pid {os.getpid()} (user {_me()}): t.py::test_first"
    second.release()


def test_starts_share_the_device_with_each_other_but_never_with_a_hold(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    a, b, window = (DeviceLock("GPU-s", tmp_path) for _ in range(3))
    with a.starting(), b.starting():  # two workers start side by side
        got: list[tuple[float, str]] = []
        waiter = threading.Thread(target=lambda: got.append(window.acquire("t.py::test_window")))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not window.held  # a window waits for the starts
    waiter.join(10)
    assert window.held and got[0][1] == f"pid {os.getpid()} (user {_me()})"  # a start: its process, no test
    monkeypatch.delenv("PYTEST_GPUPROF_HELD")  # the starter plays another process
    started: list[float] = []
    starter = threading.Thread(target=lambda: started.append(a.starting().__enter__()))
    starter.start()
    starter.join(0.2)
    assert starter.is_alive() and not started  # and a start waits for the window
    window.release()
    starter.join(10)
    assert len(started) == 1 and started[0] > 0
    window.acquire("x")
    with pytest.raises(RuntimeError, match="wait for itself"), window.starting():
        pass
    window.release()


def test_a_released_hold_leaves_no_holder_to_name(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    first, starter, second = (DeviceLock("GPU-r", tmp_path) for _ in range(3))
    first.acquire("t.py::test_gone")
    first.release()
    got: list[tuple[float, str]] = []
    with starter.starting():  # the next holder waits, for a start, not for the test gone
        waiter = threading.Thread(target=lambda: got.append(second.acquire("t.py::test_next")))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()
    waiter.join(10)
    assert second.held and got[0][1] == f"pid {os.getpid()} (user {_me()})"  # the start, not the test gone
    second.release()


CHILD = (
    "import sys, time; from pathlib import Path; from pytest_gpuprof.capture.exclusive import DeviceLock;"
    "lock = DeviceLock('GPU-c', Path(sys.argv[1])); waited, holder = lock.acquire(sys.argv[2]);"
    "print(sys.argv[2], 'held', holder, flush=True); time.sleep(float(sys.argv[3]))"
)


def test_children_of_the_holder_take_turns_under_its_hold(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    lock = DeviceLock("GPU-c", tmp_path)
    lock.acquire("parent")
    assert os.environ["PYTEST_GPUPROF_HELD"] == f"GPU-c {os.getpid()}"
    # the parent holds the device and waits for its children: they must not wait for it,
    # and must not overlap each other (an xdist run inside a test)
    first = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), "first", "1"], stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None and first.stdout.readline().split() == ["first", "held"]
    second = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), "second", "0"], capture_output=True, text=True, timeout=60
    )
    first.wait(60)
    first.stdout.close()
    assert second.stdout.split()[:2] == ["second", "held"]
    assert second.stdout.split()[2:] == ["pid", str(first.pid), "(user", f"{_me()}):", "first"]  # its sibling
    lock.release()
    assert "PYTEST_GPUPROF_HELD" not in os.environ


def test_locks_of_two_devices_are_independent(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    a, b = DeviceLock("GPU-a", tmp_path), DeviceLock("GPU-b", tmp_path)
    a.acquire("x")
    _, holder = b.acquire("y")
    assert b.held and holder == ""
    a.release()
    b.release()


def test_a_killed_holder_leaves_the_device_free(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pytest_gpuprof.capture.exclusive import DeviceLock;"
            f"DeviceLock('GPU-k', Path({str(tmp_path)!r})).acquire('doomed'); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = DeviceLock("GPU-k", tmp_path)
        got: list[tuple[float, str]] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire("survivor")))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()
        os.kill(holder.pid, signal.SIGKILL)
        waiter.join(30)
        assert not waiter.is_alive() and got[0][1] == f"pid {holder.pid} (user {_me()}): doomed"
        lock.release()
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


GPU_SUITE = """
import json, os, time, pytest

def stamp(name, start, end):
    path = os.path.join({folder!r}, name + ".json")
    with open(path, "w") as f:
        json.dump([start, end, os.getpid()], f)

@pytest.mark.parametrize("i", range(4))
def test_measured(gpuprof, gpu_workload, i):
    start = time.time_ns()
    with gpuprof.step("work"):
        gpu_workload.compute(ms=30)
    stamp(f"gpu{{i}}", start, time.time_ns())

@pytest.mark.parametrize("i", range(4))
def test_cpu_only(i):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("exclusive", ["auto", "off"])
def test_xdist_workers_take_turns_on_a_device_and_report_their_wait(pytester, tmp_path, exclusive):
    pytest.importorskip("xdist")
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    pytester.makepyfile(GPU_SUITE.format(folder=str(stamps)))
    # the real clock: the virtual one needs no lock (its figures do not depend on load)
    result = pytester.runpytest(
        "--gpu-host-clock=real",
        "-n",
        "2",
        f"--gpu-exclusive={exclusive}",
        "--gpu-report=r.json",
        "-p",
        "no:randomly",
        *WITHOUT_HYPOTHESIS,
    )
    result.assert_outcomes(passed=8)
    spans = sorted(json.loads(p.read_text()) for p in stamps.glob("*.json"))
    assert len(spans) == 4
    assert len({pid for _, _, pid in spans}) >= 1
    overlapping = any(a[1] > b[0] for a, b in itertools.pairwise(spans))
    report = json.loads(Path(pytester.path, "r.json").read_text())
    measured = [t for t in report["tests"] if "test_measured" in t["nodeid"]]
    assert all("waited_ms" in t for t in measured)
    if exclusive == "auto":
        assert not overlapping  # one test at a time on the device, whichever worker runs it
        result.stdout.fnmatch_lines(
            ["*2 xdist workers shared 1 device(s) [[]0]; each test that used one held it alone*"]
        )
    else:
        assert all(t["waited_ms"] == 0.0 for t in measured)
        result.stdout.fnmatch_lines(["*2 xdist workers shared 1 device(s) [[]0]: their timings overlap*"])


# --- another user of the host (docs/design.md, "Threat model")


def test_a_planted_link_as_the_lock_file_is_refused_and_never_written_through(tmp_path, monkeypatch):
    """Another user once planted ``host-vm.lock -> the victim's file``; the victim's run cut
    that file to 0 bytes. The lock file is opened without following a link, never written."""
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    from pytest_gpuprof.capture.exclusive import LockError

    folder = tmp_path / "locks"
    folder.mkdir(mode=0o1777)
    folder.chmod(0o1777)
    victim = tmp_path / "private.txt"
    victim.write_text("the victim's data")
    (folder / "host-vm.lock").symlink_to(victim)
    with pytest.raises(LockError, match=r"host-vm.lock: cannot open the GPU lock .*refused"):
        DeviceLock("host-vm", folder).acquire("t.py::test")
    assert victim.read_text() == "the victim's data"
    (folder / "host-vm.lock").unlink()
    os.link(victim, folder / "host-vm.lock")  # a hard link: a file with two names
    with pytest.raises(LockError, match=r"not a plain file of its own"):
        DeviceLock("host-vm", folder).acquire("t.py::test")
    assert victim.read_text() == "the victim's data"


@pytest.mark.parametrize("kind", ["link", "open-folder"])
def test_a_planted_lock_folder_is_refused(tmp_path, monkeypatch, kind):
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    from pytest_gpuprof.capture.exclusive import LockError

    folder = tmp_path / "locks"
    if kind == "link":
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
        match = "not a folder"
    else:
        folder.mkdir()
        folder.chmod(0o777)  # writable by every user, not sticky: anyone can swap its files
        match = "another user could swap its files"
    with pytest.raises(LockError, match=match):
        DeviceLock("host-vm", folder).acquire("t.py::test")


def test_a_wait_is_said_at_once_naming_the_holder_and_ends_at_the_timeout(tmp_path, monkeypatch):
    """Anyone who can read the lock file can hold it: a victim's run once sat silently after
    "collected 6 items" until killed. The wait is said at once, with the holder's pid, user
    and test, and ends at the timeout with an error that names the holder."""
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    from pytest_gpuprof.capture.exclusive import LockError

    holder = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), "t.py::test_hog", "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().split()[:2] == ["t.py::test_hog", "held"]
        said: list[str] = []
        waiter = DeviceLock("GPU-c", tmp_path, timeout_s=0.5, say=said.append)
        with pytest.raises(LockError) as raised:
            waiter.acquire("t.py::test_victim")
        name = f"pid {holder.pid} (user {_me()}): t.py::test_hog"
        assert said == [f"gpuprof: waiting for GPU GPU-c, held by {name}"]
        assert str(raised.value).startswith(f"gpuprof: waited 0.5 s for GPU GPU-c, held by {name}: giving up")
        assert not waiter.held
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the hold goes with its holder: the next acquire takes the device. (The wait given up
    # on leaves its helper thread blocked in the kernel's flock; it takes the lock as the
    # holder dies and lets go of it at once, so this acquire may wait those milliseconds.)
    after = DeviceLock("GPU-c", tmp_path, timeout_s=5)
    waited, whom = after.acquire("t.py::test_victim")
    assert waited == 0.0 or f"pid {holder.pid} " not in whom
    after.release()  # a helper that this acquire came before takes the lock now, and ends
    assert helpers_end()


def helpers_end(within_s: float = 30.0) -> bool:
    """Whether every wait's helper thread ends, a given-up one once its holder is gone
    (it is scheduled when it is: a busy machine gets it there late)."""
    deadline = time.monotonic() + within_s
    while any(t.name == "gpuprof-device-lock" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_test_that_cannot_hold_its_device_errors_at_set_up_naming_the_holder(pytester, tmp_path, monkeypatch):
    """The wait's timeout through pytest: the first test's set-up errors with the line, the
    other four are refused at once with it (one wait a session, not one a test: 5 tests at
    10 s once took 104 s); the next run, once the holder is gone, runs."""
    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    pytester.makepyfile(
        test_gpu="import pytest\n\n@pytest.mark.parametrize('i', range(5))\n"
        "def test_gpu(gpu_workload, i):\n    gpu_workload.compute(ms=1)\n"
    )
    from pytest_gpuprof.capture import exclusive

    lock_folder = tmp_path / "pytest-gpuprof-locks"
    monkeypatch.setattr(exclusive, "LOCKS", lock_folder)
    import platform

    key = f"host-{platform.node()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", CHILD.replace("'GPU-c'", repr(key)), str(lock_folder), "t.py::test_hog", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().split()[1] == "held"
        result = pytester.runpytest("--gpu-host-clock=real", "--gpu-lock-timeout=0.5")
        result.assert_outcomes(errors=5)
        result.stdout.fnmatch_lines(
            [
                f"gpuprof: waiting for GPU {key}, held by pid {holder.pid} (user *): t.py::test_hog",
                f"*gpuprof: waited 0.5 s for GPU {key}, held by pid {holder.pid}*giving up*",
            ]
        )
        out = result.stdout.str()
        assert out.count("gpuprof: waiting for GPU") == 1
        said = [line for line in result.stdout.lines if line.startswith("gpuprof: waited 0.5 s for GPU")]
        assert len(said) == 5 and sum(line.endswith("waited for it once already") for line in said) == 4, said
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert helpers_end()


# a holder that says it belongs to the pytest run sys.argv[4] (xdist's run id)
RUN_CHILD = CHILD.replace("Path(sys.argv[1]))", "Path(sys.argv[1]), run=sys.argv[4])")


def _holding(tmp_path, test, seconds, run="other-run"):
    holder = subprocess.Popen(
        [sys.executable, "-c", RUN_CHILD, str(tmp_path), test, str(seconds), run], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().split()[1] == "held"
    return holder


def _end(holder):
    holder.kill()
    holder.wait()
    holder.stdout.close()


def test_a_hold_given_up_on_refuses_the_sessions_later_waits_at_once(tmp_path, monkeypatch):
    """Five tests against a held lock once waited the timeout each (and twice: start, then
    acquire): 104 s at 10 s. The first wait ends at the timeout; every later one, while that
    hold lasts, is refused at once with the same holder named, and says nothing of waiting.
    Once the hold ends, the device is taken again."""
    from pytest_gpuprof.capture.exclusive import LockError

    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    holder = _holding(tmp_path, "t.py::test_hog", 60)
    said: list[str] = []
    lock = DeviceLock("GPU-c", tmp_path, timeout_s=0.3, say=said.append)
    try:
        errors = []
        for i in range(5):
            with pytest.raises(LockError) as raised:
                lock.acquire(f"t.py::test_{i}")
            errors.append(str(raised.value))
        assert sum(line.startswith("gpuprof: waiting for GPU") for line in said) == 1, said
        assert all("giving up" in e and f"pid {holder.pid} " in e for e in errors)
        assert all(e.endswith("refused at once: this session waited for it once already") for e in errors[1:])
        assert "refused at once" not in errors[0]
    finally:
        _end(holder)
    assert helpers_end()
    lock.timeout_s = 10
    lock.acquire("t.py::test_after")  # the hold is gone: taken, with a wait of its own if any
    assert lock.held and lock.gave_up is None
    lock.release()


def test_a_sibling_workers_long_test_is_queued_for_not_an_error(tmp_path, monkeypatch):
    """Under -n 2 --gpu-lock-timeout=2 a sibling worker's legitimate 3 s test once made the
    other worker's tests error. Workers of one run (one id) queue; another run's hold times out."""
    from pytest_gpuprof.capture.exclusive import LockError

    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    holder = _holding(tmp_path, "t.py::test_long", 1.5, run="run-1")
    try:
        said: list[str] = []
        sibling = DeviceLock("GPU-c", tmp_path, timeout_s=0.3, say=said.append, run="run-1")
        waited, whom = sibling.acquire("t.py::test_next")
        assert waited > 300 and f"pid {holder.pid} " in whom
        assert any("held by a worker of this run" in line for line in said), said
        sibling.release()
    finally:
        _end(holder)
    holder = _holding(tmp_path, "t.py::test_long", 60, run="run-1")
    try:
        stranger = DeviceLock("GPU-c", tmp_path, timeout_s=0.3, run="run-2")
        with pytest.raises(LockError, match="giving up"):
            stranger.acquire("t.py::test_next")
    finally:
        _end(holder)
    assert helpers_end()


def test_the_holders_own_words_are_cleaned_before_they_are_printed(tmp_path, monkeypatch):
    """Another user writes the who-file: an escape sequence in it (clear the screen, retitle
    the window) once landed raw in the victim's terminal, setup error and short summary."""
    from pytest_gpuprof.capture.exclusive import LockError

    monkeypatch.delenv("PYTEST_GPUPROF_HELD", raising=False)
    holder = _holding(tmp_path, "t.py::test_\x1b[2J\x1b]0;owned\x07", 60)
    said: list[str] = []
    try:
        with pytest.raises(LockError) as raised:
            DeviceLock("GPU-c", tmp_path, timeout_s=0.2, say=said.append).acquire("t.py::test_victim")
    finally:
        _end(holder)
    for text in [*said, str(raised.value)]:
        assert "\x1b" not in text and "\x07" not in text, text
        assert "t.py::test_\\x1b[2J\\x1b]0;owned\\x07" in text
    assert helpers_end()
