"""Native children: the injection library built from CUPTI's headers and loaded into a
native program, its records read into the test's window; where it cannot be built or CUPTI
refuses it, the program is listed as not seen, never 0.

CUPTI here is a stand-in (``tests/capture/fake_cupti``: its header's layouts and a libcupti that
hands over three records at the flush), and the native program loads the library as the
CUDA driver does; the real CUPTI and driver are ``tests/gpu/test_child_processes.py``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_gpuprof.capture import injection
from pytest_gpuprof.capture.children import ChildWatch

FAKE = Path(__file__).with_name("fake_cupti")
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler to build the injection library")


@pytest.fixture
def fake_cuda(tmp_path, monkeypatch):
    """A CUDA installation holding the stand-in CUPTI, the only one the build looks in; and
    the native program."""
    assert CC is not None
    root = tmp_path / "cuda"
    (root / "include").mkdir(parents=True)
    (root / "lib64").mkdir()
    for header in ("cupti.h", "cupti_activity.h", "cuda.h"):
        shutil.copy(FAKE / header, root / "include")
    build = [CC, "-shared", "-fPIC", "-I", str(root / "include"), str(FAKE / "fake_cupti.c")]
    program = tmp_path / "native-program"
    for command in (
        [*build, "-o", str(root / "lib64" / "libcupti.so")],
        [CC, "-o", str(program), str(FAKE / "program.c"), "-ldl"],
    ):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:  # a compiler without a C library to build against
            pytest.skip(f"{CC} cannot build the stand-ins here: {done.stderr.strip()[-300:]}")
    monkeypatch.setattr(injection, "_roots", lambda: iter([root]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(injection.INJECTION, raising=False)
    monkeypatch.delenv(injection.PYTHON_PID, raising=False)
    injection.library.cache_clear()
    yield program
    injection.library.cache_clear()


def run_in_window(*commands: list[str], env: dict[str, str] | None = None):
    """The processes of one window in which each command ran."""
    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Channels

    watch, backend = ChildWatch(), HostBackend()
    try:
        profiler = Profiler(backend, channels=Channels(children=watch))
        with profiler.window("w") as done, profiler.step("run"):
            for command in commands:
                subprocess.run(command, env={**os.environ, **(env or {})}, check=False)
        profiler.end()
        return done[0].metrics, watch
    finally:
        watch.close()
        backend.close()


def test_the_library_is_built_once_against_the_headers_newest_records(fake_cuda, tmp_path):
    library, how = injection.library()
    assert library is not None and library.parent == tmp_path / "cache" / "pytest-gpuprof"
    assert how == f"built at {library}"
    built = library.stat().st_mtime_ns
    injection.library.cache_clear()
    assert injection.library()[0] == library and library.stat().st_mtime_ns == built  # kept, not built again
    header = (FAKE / "cupti_activity.h").read_text()
    assert injection.newest_layouts(header) == {
        "KERNEL": "CUpti_ActivityKernel3",
        "MEMCPY": "CUpti_ActivityMemcpy3",
        "MEMSET": "CUpti_ActivityMemset3",
    }


def test_a_cupti_with_only_its_versioned_name_is_linked_by_it(fake_cuda, tmp_path):
    # NVIDIA's wheels ship libcupti.so.13 and no bare libcupti.so
    lib = tmp_path / "cuda" / "lib64"
    build = [CC, "-shared", "-fPIC", "-Wl,-soname,libcupti.so.13", "-I", str(tmp_path / "cuda" / "include")]
    subprocess.run([*build, str(FAKE / "fake_cupti.c"), "-o", str(lib / "libcupti.so.13")], check=True)
    (lib / "libcupti.so").unlink()
    library, how = injection.library()
    assert library is not None, how
    m, _ = run_in_window([str(fake_cuda)])
    assert m.processes[1].kernel_ms == pytest.approx(2.0, abs=1e-6)


def test_a_native_childs_kernels_copies_and_memsets_are_the_windows(fake_cuda):
    m, _ = run_in_window([str(fake_cuda)], env={"RANK": "3"})
    own, child = m.processes
    assert own.pid == os.getpid()
    assert child.command == str(fake_cuda) and child.rank == 3 and child.why is None
    # the stand-in's records: a 2 ms kernel, a 0.5 ms copy, in CUPTI's clock moved to the test's
    assert child.kernel_ms == pytest.approx(2.0, abs=1e-6) and child.copy_ms == pytest.approx(0.5, abs=1e-6)
    assert m.kernel_ms >= 2.0 - 1e-6
    assert m.notes == () or not any("processes traced" in n for n in m.notes)


def test_the_records_are_read_as_the_library_wrote_them(fake_cuda, tmp_path):
    library, _ = injection.library()
    folder = tmp_path / "children"
    folder.mkdir()
    env = {**os.environ, injection.INJECTION: str(library), "PYTEST_GPUPROF_CHILDREN": str(folder)}
    done = subprocess.run([str(fake_cuda)], env=env, check=False)
    assert done.returncode == 0
    (native,) = folder.glob("*.native")
    work = injection.read(native, int(native.stem))
    kinds = [(d.kind, d.name, d.bytes, d.pageable) for d in work]
    assert kinds == [
        ("kernel", "_Z4spinPy", 0, False),
        ("memcpy", "HTOD", 4096, True),
        ("memset", "memset", 512, False),
    ]
    kernel = work[0]
    assert (kernel.end - kernel.start, kernel.stream >> 32) == (2_000_000, int(native.stem))
    assert work.rows[0]["blocks"] == 4 and work.rows[0]["threads"] == 256 and work.rows[0]["shared"] == 1024


def test_a_python_child_recorded_by_cupti_python_is_left_alone(fake_cuda, tmp_path):
    library, _ = injection.library()
    folder = tmp_path / "children"
    folder.mkdir()
    env = {**os.environ, injection.INJECTION: str(library), "PYTEST_GPUPROF_CHILDREN": str(folder)}
    subprocess.run(["/bin/sh", "-c", f'{injection.PYTHON_PID}=$$ exec "$0"', str(fake_cuda)], env=env, check=True)
    assert list(folder.iterdir()) == []  # one CUPTI subscriber a process: cupti-python's


def test_a_killed_native_child_is_said_to_be_lost(fake_cuda):
    m, _ = run_in_window([str(fake_cuda), "die"])
    _, child = m.processes
    assert child.kernel_ms is None and child.why == "killed or crashed before writing its records: lost"
    assert any(n.startswith("1 of 2 processes traced;") for n in m.notes)


def test_a_native_child_cupti_refuses_is_not_seen_and_says_why(fake_cuda):
    m, _ = run_in_window([str(fake_cuda)], env={"FAKE_CUPTI_REFUSE": "1"})
    _, child = m.processes
    assert child.kernel_ms is None and child.copy_ms is None
    assert child.why == (
        "not traced: CUPTI refused the injection library: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
    )


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        ("compiler", "building the injection library failed"),
        ("headers", "CUPTI's headers (cupti.h with cuda.h) not found"),
    ],
)
def test_where_the_library_cannot_be_built_a_native_child_is_not_seen(fake_cuda, monkeypatch, tmp_path, broken, why):
    if broken == "compiler":
        monkeypatch.setenv("CC", str(fake_cuda))  # runs, and builds nothing
    else:
        monkeypatch.setattr(injection, "_roots", lambda: iter([tmp_path / "nowhere"]))
    library, how = injection.library()
    assert library is None and how.startswith(why)
    m, watch = run_in_window([str(fake_cuda)])
    _, child = m.processes
    assert child.pid is None and child.kernel_ms is None
    assert child.why == f"a native program: not traced ({how}); its device work is not in this window"
    assert watch.native_why == child.why


def test_another_tools_injection_is_kept_and_said(fake_cuda, monkeypatch):
    monkeypatch.setenv(injection.INJECTION, "/opt/nsight/libToolsInjection64.so")
    m, _ = run_in_window([str(fake_cuda)])
    _, child = m.processes
    assert child.kernel_ms is None and child.why == (
        "a native program: not traced (CUDA_INJECTION64_PATH names another tool's library, "
        "/opt/nsight/libToolsInjection64.so); its device work is not in this window"
    )
    assert os.environ[injection.INJECTION] == "/opt/nsight/libToolsInjection64.so"


def test_cuda_home_is_looked_in_first(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert next(iter(injection._roots())) == tmp_path


# --- another user of the host (docs/design.md, "Threat model")


def test_a_library_put_in_place_of_the_built_one_is_never_loaded(fake_cuda, tmp_path):
    """The injection library is trusted by the digest recorded when this source built it,
    not by its file name: one written over it is built again before any process loads it."""
    library, _ = injection.library()
    assert library is not None
    built = library.read_bytes()
    library.write_bytes(built + b"\0planted")
    injection.library.cache_clear()
    again, how = injection.library()
    assert again == library and how == f"built at {library}" and library.read_bytes() == built


def test_a_cache_folder_others_may_write_in_is_not_loaded_from(fake_cuda, tmp_path):
    folder = tmp_path / "cache" / "pytest-gpuprof"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    library, why = injection.library()
    assert library is None and "another user owns it or may write in it" in why


def test_a_native_child_writes_nothing_once_its_folder_is_not_the_tests(fake_cuda, tmp_path):
    """A process that outlives its test keeps the folder's name: once the folder is gone
    and someone re-makes it (open to all), the child writes nothing there."""
    from pytest_gpuprof.capture import injection as inj

    library, _ = inj.library()
    assert library is not None
    folder = tmp_path / "remade"
    folder.mkdir()
    folder.chmod(0o777)  # re-made by another user: anyone may write in it
    env = {**os.environ, "PYTEST_GPUPROF_CHILDREN": str(folder), inj.INJECTION: str(library)}
    env["CUDA_INJECTION64_PATH"] = str(library)
    subprocess.run([str(fake_cuda)], env=env, check=False)
    assert list(folder.iterdir()) == []
    folder.chmod(0o700)  # the test's own folder: the same child writes its records
    subprocess.run([str(fake_cuda)], env=env, check=False)
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".native"]
