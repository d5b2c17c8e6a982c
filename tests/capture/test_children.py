"""The processes a test starts: their records read into the test's windows (written here as
a child writes them), lost ones said, never 0; and the start-up hook that a child runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from plugin_runs import WITHOUT_HYPOTHESIS

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.analysis.processes import ProcessFigures, note
from pytest_gpuprof.capture import children
from pytest_gpuprof.capture.children import BOOTSTRAP, ENV, ChildWatch

MS = 1_000_000


def write_child(folder, pid, intervals, *, started=0, rank=None, records=True, refused=None):
    meta = {"command": f"python train.py --pid {pid}", "started": started}
    if rank is not None:
        meta["rank"] = rank
    if refused:
        meta["refused"] = refused
    (folder / f"{pid}.json").write_text(json.dumps(meta))
    if records and not refused:
        work = DeviceWork.of(intervals)
        np.savez(folder / f"{pid}.npz", rows=work.rows, names=np.array(work.names, dtype=str))


def dead_pid():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_window_holds_its_childrens_kernels_and_lists_each_process(tmp_path):
    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Channels

    watch, backend = ChildWatch(), HostBackend()
    try:
        profiler = Profiler(backend, channels=Channels(children=watch))
        with profiler.window("w") as done:
            start = profiler.backend.clock.now()
            a, b = dead_pid(), dead_pid()
            write_child(watch.folder, a, [DeviceInterval("kernel", start + 1 * MS, start + 3 * MS)], rank=0)
            write_child(watch.folder, b, [DeviceInterval("memcpy", start, start + 1 * MS, bytes=8)], rank=1)
            lost = dead_pid()
            write_child(watch.folder, lost, [], started=start + 1, records=False)
            time.sleep(0.01)  # the host backend's real clock: the window outlasts the child's work
        m = done[0].metrics
        own, first, second, gone = m.processes
        assert own.pid == os.getpid() and first.rank == 0 and second.rank == 1
        assert first.kernel_ms == 2.0 and second.copy_ms == 1.0 and first.copy_ms == 0.0
        assert gone.kernel_ms is None and "lost" in gone.why  # never 0 for work not seen
        assert m.kernel_ms >= 2.0  # the child's kernels are the window's
        assert any(n.startswith("3 of 4 processes traced;") and f"pid {lost}" in n for n in m.notes)
        assert [p["pid"] for p in m.to_dict()["processes"]] == [os.getpid(), a, b, lost]
        profiler.end()
    finally:
        watch.close()
        backend.close()  # its device threads: none outlives its test
    assert not watch.folder.exists()


def test_a_child_from_an_earlier_window_is_not_listed_again(tmp_path):
    watch = ChildWatch()
    write_child(watch.folder, dead_pid(), [DeviceInterval("kernel", 0, MS)], started=0)
    records = watch.collect()
    assert len(records) == 1 and records[0].work is not None
    watch.close()


def test_the_note_counts_the_processes_traced():
    seen = ProcessFigures(1, "a", None, 1.0, 0.0)
    refused = ProcessFigures(2, "b", None, None, None, "not traced: CUPTI refused: in use")
    assert note((seen,)) is None
    assert note((seen, refused)) == (
        "1 of 2 processes traced; pid 2 (b): not traced: CUPTI refused: in use; "
        "the window's kernel and copy figures are lower bounds: they hold none of that work"
    )


def test_telling_sets_the_childrens_environment_and_restores_the_parents(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/mine")
    watch = ChildWatch()
    with watch.told():
        assert os.environ[ENV] == str(watch.folder)
        assert os.environ["PYTHONPATH"] == BOOTSTRAP + os.pathsep + "/mine"
    assert ENV not in os.environ and os.environ["PYTHONPATH"] == "/mine"
    watch.close()


def test_the_start_up_hook_records_a_child_and_runs_the_childs_own_sitecustomize(tmp_path):
    """A Python child started with the test's environment runs the hook: with no CUPTI here
    it says why it is not traced; its own sitecustomize still runs after ours."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    folder = tmp_path / "records"
    folder.mkdir()
    root = str(Path(children.__file__).parents[2])  # where pytest_gpuprof is found
    env = {**os.environ, ENV: str(folder), "PYTHONPATH": os.pathsep.join([BOOTSTRAP, str(own), root])}
    code = "import os, sys; print(os.environ.get('OWN_SITECUSTOMIZE'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "ran"
    (meta,) = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert "-c" in meta["command"]
    assert meta.get("refused") or (folder / f"{next(folder.glob('*.json')).stem}.npz").exists()


def test_a_pytest_child_is_left_to_its_own_plugin_and_so_are_its_workers(tmp_path):
    """A pytest run started by a test is not its child to trace, nor are the processes that
    run starts (its xdist workers): the variable is gone from its environment."""
    folder = tmp_path / "records"
    folder.mkdir()
    (tmp_path / "test_inner.py").write_text(f"import os\ndef test_env():\n    assert {ENV!r} not in os.environ\n")
    env = {**os.environ, ENV: str(folder), "PYTHONPATH": BOOTSTRAP + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        *WITHOUT_HYPOTHESIS,
        str(tmp_path / "test_inner.py"),
    ]
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert list(folder.iterdir()) == []


def test_metrics_without_children_list_no_processes():
    from pytest_gpuprof.analysis.timeline import Timeline

    m = metrics.compute(Timeline(0, MS, "host"))
    assert m.processes == () and "processes" not in m.to_dict()


def test_the_message_lists_each_process():
    from pytest_gpuprof.analysis.timeline import Timeline
    from pytest_gpuprof.output.text import explain

    processes = (
        ProcessFigures(1, "this test's process", None, 0.0, 0.0),
        ProcessFigures(2, "python train.py", 0, 12.5, 1.0),
        ProcessFigures(3, "python eval.py", None, None, None, "killed or crashed before writing its records: lost"),
    )
    m = metrics.compute(Timeline(0, MS, "host", processes=processes))
    (line,) = [line for line in explain(m) if line.startswith("processes: ")]
    assert line == (
        "processes: pid 1 (this test's process): kernels 0.0 ms, copies 0.0 ms; "
        "pid 2 (python train.py, rank 0): kernels 12.5 ms, copies 1.0 ms; pid 3 (python eval.py): not seen"
    )


def test_a_native_program_the_test_starts_is_listed_as_not_seen_never_0():
    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Channels

    # where no injection library could be had (``tests/capture/test_injection.py``: where one can)
    watch, backend = ChildWatch(native=(None, "no injection library")), HostBackend()
    try:
        profiler = Profiler(backend, channels=Channels(children=watch))
        with profiler.window("w") as done:
            with profiler.step("run"):
                subprocess.run(["true"], check=True)  # a native program
                subprocess.run([sys.executable, "-c", "pass"], check=True)  # Python: traced by itself
                subprocess.run([sys.executable, "-c", "pass"], env={"PATH": os.environ["PATH"]}, check=True)
                os.system("true")
        m = done[0].metrics
        # the Python child is its own record (here: CUPTI refused, no cupti-python); the
        # rest were only seen starting
        unseen = [p for p in m.processes if p.pid is None]
        assert all(p.kernel_ms is None and p.copy_ms is None for p in unseen)
        assert [(p.pid, p.command.split()[-1], p.why) for p in unseen] == [
            (None, "true", children.NATIVE),
            (None, "pass", children.OWN_ENV),
            (None, "true", children.NATIVE),
        ]
        assert any(
            n.startswith("a process (true): a native program: not traced") or "a process (true)" in n for n in m.notes
        )
        assert [p["kernel_ms"] for p in m.to_dict()["processes"][-3:]] == [None, None, None]
        profiler.end()
    finally:
        watch.close()
        backend.close()


def test_outside_a_told_window_nothing_is_listed():
    watch = ChildWatch()
    try:
        subprocess.run(["true"], check=True)
        assert watch.collect() == []
    finally:
        watch.close()


@pytest.mark.parametrize(
    ("argv", "env", "why"),
    [
        (["/usr/bin/python3.12", "train.py"], None, None),
        ([sys.executable, "-m", "torch.distributed.run"], None, None),
        (["/bin/sh", "-c", "cd /data && python train.py"], None, None),
        (["/bin/sh", "-c", "./bench --iters 3"], None, children.NATIVE),
        (["./bench"], None, children.NATIVE),
        (["python3", "x.py"], {"PATH": "/usr/bin"}, children.OWN_ENV),
        (["python3", "x.py"], {**os.environ, ENV: "/tmp/x"}, None),
        ([], None, None),
    ],
)
def test_which_started_processes_are_traced(argv, env, why):
    assert children.untraced(argv, env) == why


def test_each_process_is_a_group_of_lanes_the_tests_own_first():
    from pytest_gpuprof.analysis import lanes
    from pytest_gpuprof.analysis.timeline import Timeline

    child, other = 812, 97
    device = (
        DeviceInterval("kernel", 2 * MS, 3 * MS, stream=(child << 32) | 7, name="k"),
        DeviceInterval("memcpy", 1 * MS, 2 * MS, stream=(child << 32) | 7, bytes=8),
        DeviceInterval("kernel", 0, MS, stream=7, name="k"),
        DeviceInterval("kernel", 0, MS, stream=(other << 32) | 3, name="k"),
    )
    processes = (
        ProcessFigures(1, "this test's process", None, 1.0, 0.0),
        ProcessFigures(child, "python train.py --epochs 3 --data /a/long/path/to/the/dataset", 0, 1.0, 1.0),
    )
    drawn, _ = lanes.build(Timeline(0, 4 * MS, "cupti", device=device, processes=processes))
    assert [lane.name for lane in drawn if lane.kind in ("kernel", "memcpy")] == [
        "kernels, stream 7",
        "pid 97: kernels, stream 3",  # no rank
        "pid 812, rank 0: kernels, stream 7",
        "pid 812, rank 0: memcpys, stream 7",
    ]


ENDING = """
import os, signal, sys, time
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.capture import children

class Capture:  # what CUPTI's capture gives: the process's device work, slowly
    def drain(self):
        if how == "drain fails":
            raise RuntimeError("CUPTI said no")
        if how == "two SIGTERMs":
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while the records are written
            time.sleep(0.2)
        return DeviceWork.of([DeviceInterval("kernel", 0, 5_000_000)]), None

folder, how = sys.argv[1], sys.argv[2]
children._finish_at_every_end(os.getpid(), folder, Capture())
print("READY", flush=True)
if how == "os._exit":
    os._exit(3)
if how in ("SIGTERM", "two SIGTERMs", "drain fails"):
    signal.pause()
"""


@pytest.mark.parametrize("how", ["exit", "os._exit", "SIGTERM", "two SIGTERMs", "drain fails"])
def test_a_child_writes_its_records_however_it_ends_short_of_sigkill(tmp_path, how):
    """The ways a pool's worker ends: a normal exit, os._exit, SIGTERM (Pool.terminate), a
    second SIGTERM while it writes; and a failure to write, which is said, not "lost"."""
    import signal

    script = tmp_path / "child.py"
    script.write_text(ENDING)
    with subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), how], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
        if how in ("SIGTERM", "two SIGTERMs", "drain fails"):
            child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=60)
    assert code == {"exit": 0, "os._exit": 3}.get(how, -signal.SIGTERM)  # it ends as it would have
    records, failed = tmp_path / f"{child.pid}.npz", tmp_path / f"{child.pid}.err"
    if how == "drain fails":
        assert not records.exists() and failed.read_text() == "RuntimeError: CUPTI said no"
    else:
        with np.load(records) as data:
            assert len(data["rows"]) == 1 and not failed.exists()


def test_a_record_that_could_not_be_written_says_why(tmp_path):
    watch = ChildWatch()
    try:
        pid = dead_pid()
        write_child(watch.folder, pid, [], records=False)
        (watch.folder / f"{pid}.err").write_text("RuntimeError: CUPTI said no")
        (record,) = watch.collect()
        assert (
            record.work is None and record.why == "its records could not be written (RuntimeError: CUPTI said no): lost"
        )
    finally:
        watch.close()


def test_multiprocessings_resource_tracker_is_not_traced(tmp_path, monkeypatch):
    monkeypatch.setattr(
        sys, "orig_argv", [sys.executable, "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    )
    children.start_in_child(str(tmp_path))  # returns before CUPTI or any record
    assert list(tmp_path.iterdir()) == []


def test_a_child_writes_only_into_the_tests_own_folder_and_never_through_a_link(tmp_path):
    """A process that outlives its test keeps ``PYTEST_GPUPROF_CHILDREN``: once the folder
    is gone, or re-made open to all, it writes nothing; into the test's own folder it writes
    a new file, whatever link was planted under the old fixed temporary name."""
    from pytest_gpuprof.capture import children

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    gone = tmp_path / "gone"
    children._write(gone / "7.json", b"{}")
    assert not gone.exists()
    remade = tmp_path / "remade"
    remade.mkdir()
    remade.chmod(0o777)
    children._write(remade / "7.json", b"{}")
    assert list(remade.iterdir()) == []
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    (own / "7.tmp").symlink_to(victim)
    children._write(own / "7.json", b'{"pid": 7}')
    assert (own / "7.json").read_text() == '{"pid": 7}' and victim.read_text() == "keep"
