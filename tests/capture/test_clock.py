"""The virtual clock against what its rules say by hand: time is the longest wait chain."""

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_runs import WITHOUT_HYPOTHESIS

from pytest_gpuprof.capture.clock import RealClock, VirtualClock

chains = st.lists(st.lists(st.integers(0, 50), max_size=5), min_size=1, max_size=4)


@settings(max_examples=50, deadline=None)
@given(chains)
def test_threads_that_only_spend_time_end_at_their_own_sums(chains):
    clock = VirtualClock()
    clock.attach()
    ends: dict[int, int] = {}

    def run(i: int) -> None:
        for ns in chains[i]:
            clock.spend(ns)
        ends[i] = clock.now()

    threads = [clock.start_thread(lambda i=i: run(i), f"chain-{i}") for i in range(len(chains))]
    for thread in threads:
        thread.join()
    clock.detach()
    assert ends == {i: sum(chain) for i, chain in enumerate(chains)}
    assert clock.now() == max(map(sum, chains))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=4))
def test_a_lock_serialises_its_holders(holds):
    clock = VirtualClock()
    clock.attach()
    lock = clock.lock()
    spans: list[tuple[int, int]] = []

    def hold(ns: int) -> None:
        with lock:
            start = clock.now()
            clock.spend(ns)
            spans.append((start, clock.now()))

    threads = [clock.start_thread(lambda ns=ns: hold(ns), "holder") for ns in holds]
    for thread in threads:
        thread.join()
    clock.detach()
    spans.sort()
    assert clock.now() == sum(holds)  # one after another, never idle in between
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_an_event_releases_its_waiters_at_the_time_it_is_set():
    clock = VirtualClock()
    clock.attach()
    event = clock.event()
    seen: list[int] = []

    def waiter() -> None:
        event.wait()
        seen.append(clock.now())

    threads = [clock.start_thread(waiter, "waiter") for _ in range(3)]
    clock.spend(7)
    event.set()
    for thread in threads:
        thread.join()
    clock.detach()
    assert seen == [7, 7, 7]


@pytest.mark.parametrize("make", [RealClock, VirtualClock])
def test_the_plugins_threads_leave_ctrl_c_to_the_main_thread(make):
    # The kernel gives SIGINT to any thread that does not block it; one given to a worker
    # does not wake a main thread blocked in a join, so Ctrl-C waited for the workers.
    import signal

    clock = make()
    clock.attach()
    masks = []
    thread = clock.start_thread(lambda: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "probe")
    thread.join()
    clock.detach()
    assert signal.SIGINT in masks[0]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the caller's mask as it was


@pytest.mark.parametrize("kind", ["virtual", "real"])
def test_a_ctrl_c_between_two_worker_starts_stops_the_worker_already_running(kind):
    # Ctrl-C can land after the first worker started and before the second did: the
    # first must stop after its partition, or it runs every partition left on its own
    # (minutes), long after the run was interrupted.
    from pytest_gpuprof.capture import clock as clocks
    from pytest_gpuprof.measure.workload import _run_workers

    clock = clocks.make(kind)
    clock.attach()
    started = clock.start_thread

    def start_then_interrupt(target, name):
        if name.endswith("-1"):
            raise KeyboardInterrupt
        return started(target, name)

    clock.start_thread = start_then_interrupt  # type: ignore[method-assign]
    done = []
    with pytest.raises(KeyboardInterrupt):
        _run_workers(clock, 100_000, 2, lambda worker: (clock.spend(1_000), done.append(worker)))
    running = [t.name for t in threading.enumerate() if t.name.startswith("gpuprof-worker-")]
    clock.detach()
    assert running == []  # no worker outlives the call: it stopped after its partition
    assert len(done) < 100_000


THREAD_TEST = """
import threading

def test_threaded(gpuprof, gpu_workload):
    def work():
        with gpuprof.step("worker"):
            gpu_workload.compute(ms=2)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert gpuprof.check().steps["worker"].count == 1
"""


def test_a_thread_the_test_starts_runs_on_the_real_clock(pytester):
    pytester.makepyfile(THREAD_TEST)
    pytester.runpytest_subprocess("--gpu-host-clock=real", *WITHOUT_HYPOTHESIS, timeout=120).assert_outcomes(passed=1)


def test_the_virtual_clock_refuses_a_thread_the_test_starts_at_once_saying_what_to_do(pytester):
    pytester.makepyfile(THREAD_TEST)
    # in a process of its own, with a limit: a clock that hangs fails this test, not the suite
    result = pytester.runpytest_subprocess("--gpu-host-clock=virtual", *WITHOUT_HYPOTHESIS, timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*thread 'Thread-*', which the test started, used the host backend on its virtual clock*--gpu-host-clock=real*"
        ]
    )
