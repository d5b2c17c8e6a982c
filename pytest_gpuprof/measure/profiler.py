"""The ``gpuprof`` fixture's object: host steps and regions (``spans``), windows
(``windows``), metrics, and budget checks, for one test.

Every judgement is ``budget.judge``'s and every message ``text.failure_message``'s; this
object keeps what was judged (``verdicts``) so that the session records a test's
verdict, a failing ``check()`` included, wherever it is shown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, cast

from pytest_gpuprof.analysis import metrics as metrics_mod
from pytest_gpuprof.analysis import rounds as rounds_mod
from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.analysis.whatif import Prediction
from pytest_gpuprof.capture import memory
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.measure import ROUNDS, WARMUP, confirm
from pytest_gpuprof.measure.confirm import Checked
from pytest_gpuprof.measure.errors import NotMeasuredError
from pytest_gpuprof.measure.spans import SpanRecorder, SpanScope
from pytest_gpuprof.measure.windows import Channels, Window, WindowCollector
from pytest_gpuprof.verdict.budget import Budget, judge, parse_budget


def not_measured(message: str) -> NoReturn:
    """What reading an unmeasured figure does outside pytest (the pytest layer skips)."""
    raise NotMeasuredError(message)


class NotMeasured:
    """What ``measure``, ``metrics``, ``check`` and ``what_if`` give under ``--gpu-disable``:
    the code ran and nothing was measured, so reading any figure ends the test through
    ``skip`` (it has nothing honest to assert on), never a zero."""

    __slots__ = ("_skip",)

    def __init__(self, skip: Callable[[str], NoReturn]) -> None:
        object.__setattr__(self, "_skip", skip)

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__") or name == "_skip":  # copy, pickle and the like ask for protocols: it has none
            raise AttributeError(name)
        self._skip(f"pytest-gpuprof: --gpu-disable: nothing was measured, so the test cannot read {name!r}")

    def __repr__(self) -> str:
        return "<not measured: --gpu-disable>"


class Profiler:
    def __init__(
        self,
        backend: Backend,
        *,
        budget: Budget | None = None,
        rounds: int = ROUNDS,
        warmup: int = WARMUP,
        rounds_floor: int | None = None,
        enforce: bool = False,
        owner: str = "this test",
        disabled: bool = False,
        channels: Channels | None = None,  # NVML, GPM, stacks, child processes: the session's
        skip: Callable[[str], NoReturn] = not_measured,  # the pytest layer's: pytest.skip
    ) -> None:
        self.backend = backend
        self.disabled = disabled  # --gpu-disable: the code runs once, nothing is measured
        self.unmeasured = cast(Metrics, NotMeasured(skip))
        self.budget = budget or Budget()
        self.default_rounds = rounds
        self.default_warmup = warmup
        self.rounds_floor = rounds_floor  # --gpu-rounds: the least rounds of any measure()
        self.enforce = enforce
        self.owner = owner  # the test this profiler belongs to
        self.spans = SpanRecorder(backend)
        self.spans.memory = memory.tracker_for(backend)
        self.spans.memory.open_steps = self.spans.open_steps
        if self.budget.gates_memory:
            self.spans.memory.see_each()
        self.channels = channels = channels or Channels()
        self.collector = WindowCollector(backend, self.spans, channels)
        if channels.children is not None:
            channels.children.tell()  # the processes the test starts record their device work for it
        # what gpuprof.check() judged, passing or failing, with the metrics it judged and
        # the exception it raised (to tell, when the call ends, whether the test caught it)
        self.verdicts: list[Checked] = []
        # device memory held when the test started: what it must give back by its end
        self.memory_before = backend.memory_in_use()
        self.leaks: list[str] = []
        self._examples = confirm.Examples(backend, self.leaks)
        self._ended = False
        backend.source.begin()
        if channels.stacks is not None:
            channels.stacks.arm()

    @property
    def windows(self) -> list[Window]:
        return self.collector.windows

    # the fixture's life
    def end(self) -> None:
        """The test is over: any later use is a mistake, and says whose profiler it was."""
        if not self._ended and self.channels.stacks is not None:
            self.channels.stacks.disarm()
        if self.spans.memory is not None:
            self.spans.memory.close()
        if self.channels.children is not None:
            self.channels.children.close()
        self._ended = True

    def _alive(self, what: str) -> None:
        if self._ended:
            raise RuntimeError(
                f"gpuprof.{what}: this gpuprof belongs to {self.owner}, which has ended; "
                "a fixture lives for its own test only (do not keep it in a global or a class)"
            )

    def exclude_held_memory(self) -> None:
        """Count the device memory held now as not this test's (a fixture's buffers that
        live for the session)."""
        self.memory_before = self.backend.memory_in_use()

    # host spans
    def step(self, name: str, bytes: int | None = None, stream: Any = None, *, pageable: bool = False) -> SpanScope:
        """A host step: nestable, thread-safe; closed and recorded even when its body raises.

        With ``stream``, a copy that starts on that stream while the step is open is the
        step's (its bytes, bandwidth and pageable flag), and where CUPTI is not available,
        events recorded on that stream at both edges are how the step's device time is seen.
        """
        self._alive("step()")
        if bytes is not None and (isinstance(bytes, bool) or not isinstance(bytes, int) or bytes < 0):
            raise ValueError(f"gpuprof.step({name!r}, bytes={bytes!r}): bytes is a whole number of bytes, 0 or more")
        return self.spans.scope("step", name, bytes, pageable, stream)

    def region(self, name: str = "partition") -> SpanScope:
        """A bracket, as GPU_START..GPU_END instrumentation would put around a partition."""
        self._alive("region()")
        return self.spans.scope("region", name)

    # windows
    @contextlib.contextmanager
    def window(self, label: str) -> Iterator[list[Window]]:
        """Measure the body as one window of this test, judged on its budget and kept as
        ``measure()``'s rounds are (inside a ``measure()`` round it is part of that round);
        the yielded list holds it once the body ends. A window that was measured and then
        dropped would leave the test in no output at all."""
        self._alive("window()")
        inside = self.collector.measuring
        with self.collector.window(label) as done:
            yield done
        if done and not inside:
            self.keep(done[0])

    def measure(self, fn: Callable[[], Any], rounds: int | None = None, warmup: int | None = None) -> Metrics:
        """Run ``fn`` ``warmup`` times unmeasured, then ``rounds`` times, each its own window.

        Each window runs from just before the call to the end of the device work it
        launched (a device synchronize is inside the window). Returns per-metric medians
        with each metric's spread in ``Metrics.rounds``.
        """
        self._alive("measure()")
        if self.disabled:
            return self.run_once(fn)
        rounds = self.rounds(rounds)
        warmup = self.default_warmup if warmup is None else warmup
        if rounds < 1 or warmup < 0:
            raise ValueError(f"measure(rounds={rounds}, warmup={warmup}): rounds must be >= 1, warmup >= 0")
        example = self._examples.running()
        if example:
            self._examples.watch_memory()
        metrics = self.repeat(fn, rounds=rounds, warmup=warmup, label="measure")
        if example:
            self._examples.remember(lambda: self.repeat(fn, rounds=rounds, warmup=0, label="measure"))
            if self.enforce:
                self._examples.settle(self.windows[-1])
        return metrics

    def run_once(self, fn: Callable[[], Any]) -> Metrics:
        """``--gpu-disable``: the code once, its device work waited for, nothing measured."""
        fn()
        self.backend.synchronize()
        return self.unmeasured

    def rounds(self, asked: int | None) -> int:
        """The rounds a measurement runs: what it asked for (else the configured default),
        raised to ``--gpu-rounds`` where that was given on the command line."""
        rounds = self.default_rounds if asked is None else asked
        return rounds if self.rounds_floor is None else max(rounds, self.rounds_floor)

    def start_call(self, budget: Budget) -> None:
        """The test's call begins: what its fixtures' set-up did is in no window of it
        (docs/design.md, "The window"), and its budget is its markers' as they read now."""
        self.collector.reset(drain=False)
        self.rebudget(budget)

    def rebudget(self, budget: Budget) -> None:
        """This test's budget as its markers read now (a plugin, a hook or ``applymarker``
        may have added one since collection): the windows judged again on it."""
        if budget == self.budget:
            return
        self.budget = budget
        if budget.gates_memory and self.spans.memory is not None:
            self.spans.memory.see_each()
        for window in self.windows:
            if not window.settled:
                window.verdict = judge(budget, window.metrics)

    def repeat(self, body: Callable[[], Any], *, rounds: int, warmup: int, label: str) -> Metrics:
        if self.disabled:
            return self.run_once(body)
        cut: list[list[Window]] = []
        # the warm-up inside the batch: CUPTI's forced flush at its start slows the round
        # after it, which is then a warm-up round, not the first measured one
        with self.collector.batch(label):
            for _ in range(warmup):
                with self.collector.unmeasured():
                    body()
                    self.backend.synchronize()
            for _ in range(rounds):
                with self.collector.window(label) as done:
                    body()
                cut.append(done)
        results = [done[0] for done in cut]
        each = tuple(w.metrics for w in results)
        merged = rounds_mod.aggregate(list(each)) if rounds > 1 else each[0]
        return self.keep(Window(label, merged, results[-1].timeline, rounds=each if rounds > 1 else ()))

    def keep(self, window: Window) -> Metrics:
        """Judge ``window`` on this test's budget and keep it."""
        window.example = self._examples.running()
        return self.collector.keep(window, self.budget)

    def whole_test(self) -> Window | None:
        return self.collector.whole_test()

    @property
    def metrics(self) -> Metrics:
        """The latest window's metrics, or the whole test so far when nothing was measured;
        a clear error, not ``None``, before anything was."""
        current = self.metrics_now()
        if current is None:
            raise ValueError(
                f"gpuprof.metrics: nothing measured yet in {self.owner}: no step, region or measure() so far"
            )
        return current

    def metrics_now(self) -> Metrics | None:
        """The latest window's metrics, or the test so far (synchronizing the device and
        draining its records); ``None`` before anything was measured."""
        self._alive("metrics")
        if self.disabled:
            return self.unmeasured
        if self.windows:
            return self.windows[-1].metrics
        window = self.whole_test()
        return window.metrics if window else None

    def what_if(self, scenario: str) -> Prediction | None:
        """The predicted wall time and utilization of the latest window (or of the test so
        far) under ``scenario``: ``overlap:STEP``, ``pinned:STEP`` or ``faster:STEP:F``;
        ``None`` where it does not apply. The window's own ``Metrics.what_if`` holds the
        default scenarios already."""
        self._alive("what_if()")
        if self.disabled:
            return cast(Prediction, self.unmeasured)
        window = self.windows[-1] if self.windows else self.whole_test()
        if window is None or window.timeline is None:
            raise ValueError(f"gpuprof.what_if({scenario!r}): nothing measured yet")
        return metrics_mod.what_if(window.timeline, scenario, self.channels.pinned_gbps)

    def check(self, **limits: Any) -> Metrics:
        """Assert a budget now on the latest ``measure()`` result, or on the test so far.

        Keyword arguments follow ``[tool.gpuprof.budget]``; none given means this test's
        configured budget. Passing or failing, the verdict is the test's record.
        """
        self._alive("check()")
        budget, asked = self.budget, None
        if limits:
            own = parse_budget(limits, "gpuprof.check()", own=True)
            budget, asked = own.merged_over(self.budget), frozenset(own.keys())
        if self.disabled:  # its limits checked as written, nothing judged
            return self.unmeasured
        current = self.metrics_now()
        if current is None:
            raise ValueError("gpuprof.check(): nothing measured yet: no step, region or measure() in this test")
        checked = self._examples.check(budget, current, asked, len(self.windows) - 1 if self.windows else None)
        self.verdicts.append(checked)
        if checked.error is not None:
            raise checked.error
        return checked.metrics

    def final_windows(self) -> list[Window]:
        """The windows this test's budget is checked on: every measured one, else the test.
        Device work after the last measured window is said (``collector.outside``)."""
        if self.disabled:
            return []
        if self.windows:
            self.backend.synchronize()
            self.collector.note_outside(self.windows[-1].label, after=True)
        else:
            whole = self.whole_test()
            if whole is None:
                return []
            self.keep(whole)
        self._leaks_at_call_end()
        return self.windows

    def _leaks_at_call_end(self) -> None:
        """A leak is what the test still holds as its call ends: each window's leak becomes
        what it kept and is still live now (``analysis.memory.at_call_end``), judged again.
        A buffer freed after the window, before the call ended, is no leak."""
        tracker = self.spans.memory
        kept = [w for w in self.windows if not w.settled and any(_kept(m) for m in w.rounds or (w.metrics,))]
        live = tracker.live() if tracker is not None and kept else None
        if live is None:
            return
        for window in kept:
            each = window.rounds or (window.metrics,)
            now = tuple(metrics_mod.at_call_end(m, live) for m in each)
            if all(a is b for a, b in zip(now, each, strict=True)):
                continue
            window.rounds = now if window.rounds else ()
            window.metrics = rounds_mod.aggregate(list(now)) if window.rounds else now[0]
            window.verdict = judge(self.budget, window.metrics)

    def problems(self) -> list[str]:
        """What the test did wrong with its spans (made and never entered, never left)."""
        return self.spans.problems()


def _kept(m: Metrics) -> bool:
    """Whether the window kept device memory at its end: a leak unless freed before the call ends."""
    return m.memory is not None and bool(m.memory.leaked_bytes)
