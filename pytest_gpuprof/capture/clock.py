"""Clocks for the host backend: real time, or a virtual clock for deterministic tests.

``RealClock``: intervals are the real time work took on this machine.

``VirtualClock``: device work (kernels, copies) advances simulated time by exactly what it
was asked for, and host code costs no time at all. Threads still run and interleave for
real; only the time they see is simulated. Time moves only when every thread taking part
is blocked on the clock (in a kernel or copy, a synchronize, a lock, an idle stream's
queue, a join) and then jumps to the earliest deadline, as the autojump clocks of async
test frameworks do. So a pipeline gives the same timeline on a busy machine as on an idle
one. Every blocking point of a participating thread must be one of this clock's
primitives: a plain ``threading`` wait would stop the clock for good.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class Lock(Protocol):
    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> Any: ...


class Event(Protocol):
    def set(self) -> None: ...

    def wait(self) -> Any: ...


class Queue(Protocol[T]):
    def put(self, item: T) -> None: ...

    def get(self) -> T: ...


class Joinable(Protocol):
    def join(self) -> None: ...


class Clock(Protocol):
    """Time and the blocking primitives that go with it."""

    virtual: bool
    # what threads the clock cannot follow tried to do (the virtual clock's; always empty
    # on the real one), for the test's verdict
    refused: list[str]

    def now(self) -> int:
        """Nanoseconds on this clock (``perf_counter_ns`` for the real one)."""
        ...

    def spend(self, ns: int, work: Callable[[], object] | None = None) -> None:
        """Occupy the calling thread for ``ns``: repeat ``work`` until then (real), or
        let exactly ``ns`` of simulated time pass (virtual)."""
        ...

    def lock(self) -> Lock: ...

    def event(self) -> Event: ...

    def queue(self) -> Queue[Any]: ...

    def start_thread(self, target: Callable[[], object], name: str) -> Joinable: ...

    def attach(self) -> None:
        """The calling thread takes part: time waits for it while it runs."""
        ...

    def detach(self) -> None: ...


class RealClock:
    virtual = False

    def __init__(self) -> None:
        self.refused: list[str] = []

    @staticmethod
    def now() -> int:
        return time.perf_counter_ns()

    def spend(self, ns: int, work: Callable[[], object] | None = None) -> None:
        start = time.perf_counter_ns()
        while time.perf_counter_ns() - start < ns:
            if work is None:
                time.sleep(max(0.0, (ns - (time.perf_counter_ns() - start)) / 1e9))
            else:
                work()

    def lock(self) -> Lock:
        return threading.Lock()

    def event(self) -> Event:
        return threading.Event()

    def queue(self) -> Queue[Any]:
        return queue.SimpleQueue()

    def start_thread(self, target: Callable[[], object], name: str) -> Joinable:
        thread = threading.Thread(target=target, name=name, daemon=True)
        start_quiet(thread)
        return thread

    def attach(self) -> None:
        return None

    def detach(self) -> None:
        return None


class VirtualClockError(RuntimeError):
    """A thread the virtual clock cannot follow tried to use it."""


class _Waiter:
    """One thread's place in a wait, woken on its own: waking every waiting thread on each
    step would cost each of them a switch in and out (a pipeline's thousand steps, times its
    threads)."""

    __slots__ = ("cancelled", "counted", "ready", "woken")

    def __init__(self, lock: threading.RLock) -> None:
        self.woken = threading.Condition(lock)
        self.ready = False
        self.counted = False
        self.cancelled = False  # its thread left the wait (an interrupt): nobody is waiting


class VirtualClock:
    """Simulated time that jumps when every participating thread is blocked on it.

    ``_running`` counts the participating threads that are not blocked; whoever wakes a
    blocked participant counts it running again before it even resumes, so that time
    cannot jump past work that is about to happen.
    """

    virtual = True

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._now = 0
        self._running = 0
        self._sleepers: list[tuple[int, int, _Waiter]] = []
        self._order = itertools.count()
        self._local = threading.local()
        # what threads the clock cannot follow tried to do, for the test's verdict
        self.refused: list[str] = []

    def now(self) -> int:
        return self._now

    def _refuse(self) -> None:
        """A thread the clock did not start (the test's own ``threading.Thread``) would
        wait on it.

        Virtual time moves when every thread taking part is blocked on the clock; a thread
        it does not know of waits while the test's thread is in a plain ``join``, which the
        clock cannot see: time would stop for good. So the wait is refused at once, with
        what to do instead (reading the time and launching work do not wait)."""
        name = threading.current_thread().name
        message = (
            f"thread {name!r}, which the test started, used the host backend on its virtual clock "
            '(--gpu-host-clock=virtual, or host_clock = "virtual" in [tool.gpuprof]): virtual time follows '
            "only the threads the plugin starts. Run this test on the real clock: --gpu-host-clock=real"
        )
        if message not in self.refused:
            self.refused.append(message)
        raise VirtualClockError(message)

    def spend(self, ns: int, work: Callable[[], object] | None = None) -> None:
        with self._guard():
            waiter = _Waiter(self._lock)
            heapq.heappush(self._sleepers, (self._now + max(0, int(ns)), next(self._order), waiter))
            self._block(waiter)

    def attach(self) -> None:
        with self._guard():
            self._local.participant = True
            self._running += 1

    def detach(self) -> None:
        with self._guard():
            if getattr(self._local, "participant", False):
                self._local.participant = False
                self._running -= 1
                self._advance()

    def lock(self) -> Lock:
        return _VirtualLock(self)

    def event(self) -> Event:
        return _VirtualEvent(self)

    def queue(self) -> Queue[Any]:
        return _VirtualQueue(self)

    def start_thread(self, target: Callable[[], object], name: str) -> Joinable:
        done = _VirtualEvent(self)
        with self._guard():
            self._running += 1  # running from now: time must not jump before it starts

        def run() -> None:
            self._local.participant = True
            try:
                target()
            finally:
                done.set()
                self.detach()

        thread = threading.Thread(target=run, name=name, daemon=True)
        start_quiet(thread)
        return _Joined(done, thread)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """The clock's lock, with Ctrl-C held back while its books change: an interrupt
        between taking a sleeper off the heap and waking it would leave that thread
        waiting for good. Waits let it through (``_block``)."""
        with _sigint(signal.SIG_BLOCK), self._lock:
            yield

    # under self._guard()
    def _block(self, waiter: _Waiter) -> None:
        waiter.counted = getattr(self._local, "participant", False)
        if not waiter.counted:
            waiter.cancelled = True  # nobody waits here: a wake goes to the next in line
            self._refuse()
        if waiter.counted:
            self._running -= 1
            self._advance()
        try:
            while not waiter.ready:
                with _sigint(signal.SIG_UNBLOCK):
                    waiter.woken.wait()
        except BaseException:  # Ctrl-C in the middle of a wait: this thread runs again
            if not waiter.ready:
                waiter.cancelled = True
                if waiter.counted:
                    self._running += 1
            raise

    def _wait_in(self, waiters: deque[_Waiter] | list[_Waiter]) -> None:
        """Wait in line in ``waiters`` until someone wakes this thread."""
        waiter = _Waiter(self._lock)
        waiters.append(waiter)
        self._block(waiter)

    def _wake(self, waiter: _Waiter) -> bool:
        """Wake ``waiter``; False if its thread already left the wait."""
        if waiter.cancelled:
            return False
        waiter.ready = True
        if waiter.counted:
            self._running += 1
        waiter.woken.notify()
        return True

    def _advance(self) -> None:
        while self._running <= 0 and self._sleepers:
            self._now = max(self._now, self._sleepers[0][0])
            while self._sleepers and self._sleepers[0][0] <= self._now:
                self._wake(heapq.heappop(self._sleepers)[2])


def start_quiet(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGINT blocked for its whole life (a thread inherits the mask
    of the one that starts it).

    The kernel hands a process's SIGINT to any thread that does not block it. Python runs
    the handler in the main thread, but a main thread blocked in a join or a lock is woken
    only when the signal reached *it*: delivered to a worker, Ctrl-C waits until the
    workers are done (the whole pipeline). With every plugin thread blocking it, the
    signal goes where it is acted on."""
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _in_main_thread() -> bool:
    """Where SIGINT is handled, and where signal masks exist to hold it back."""
    return hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigint(how: int) -> Iterator[None]:
    """SIGINT held back (``SIG_BLOCK``) or let through (``SIG_UNBLOCK``) for the body, then as
    before; only the main thread gets it (the plugin's threads block it: ``start_quiet``), and only
    there does this change anything."""
    if not _in_main_thread():
        yield
        return
    previous = signal.pthread_sigmask(how, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _VirtualLock:
    """A FIFO lock whose waiters are blocked on the clock; release hands it over."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._held = False
        self._waiters: deque[_Waiter] = deque()

    def __enter__(self) -> None:
        with self._clock._guard():
            if not self._held:
                self._held = True
                return
            self._clock._wait_in(self._waiters)  # woken as the new holder

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> None:
        with self._clock._guard():
            while self._waiters:
                if self._clock._wake(self._waiters.popleft()):
                    return  # handed over
            self._held = False


class _VirtualEvent:
    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._set = False
        self._waiters: list[_Waiter] = []

    def set(self) -> None:
        with self._clock._guard():
            self._set = True
            for waiter in self._waiters:
                self._clock._wake(waiter)
            self._waiters.clear()

    def wait(self) -> bool:
        with self._clock._guard():
            if not self._set:
                self._clock._wait_in(self._waiters)
        return True


class _VirtualQueue(Generic[T]):
    """A queue whose single consumer blocks on the clock while it is empty."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._items: deque[T] = deque()
        self._waiters: deque[_Waiter] = deque()

    def put(self, item: T) -> None:
        with self._clock._guard():
            self._items.append(item)
            while self._waiters and not self._clock._wake(self._waiters.popleft()):
                pass

    def get(self) -> T:
        with self._clock._guard():
            while not self._items:
                self._clock._wait_in(self._waiters)
            return self._items.popleft()


class _Joined:
    def __init__(self, done: _VirtualEvent, thread: threading.Thread) -> None:
        self._done = done
        self._thread = thread

    def join(self) -> None:
        self._done.wait()
        self._thread.join()  # it has only its detach left


def make(kind: str) -> Clock:
    return VirtualClock() if kind == "virtual" else RealClock()
