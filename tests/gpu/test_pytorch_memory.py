"""PyTorch's device memory as its users write tests: a step over its memory budget names
the line that allocated the activation, a leak into a module-level list names its line
while a warm cache passes, the test's own peak counters read the same with the plugin, and
--gpu-memory-top lists the places live at the peak. Skipped without PyTorch."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

GIB, MIB = 1 << 30, 1 << 20


def run(pytester, plugin_args, files, *args):
    """A child pytest of ``files`` (name: source) with the plugin and a JSON report, its
    output's end printed for the log."""
    pytester.makepyfile(**files)
    result = pytester.runpytest_subprocess(*plugin_args, *args, "--gpu-report=r.json")
    print(result.stdout.str()[-3000:])
    return result


STEP = """
import pytest
import torch

@pytest.mark.gpu_budget(max_memory="1 GiB")
def test_train(gpuprof):
    weights = torch.randn(1024, 1024, device="cuda")
    def body():
        with gpuprof.step("forward"):
            activation = torch.empty(3 << 29, dtype=torch.uint8, device="cuda")
            activation.fill_(1)
        del activation
        torch.cuda.synchronize()
    gpuprof.measure(body, rounds=2, warmup=1)
"""


def test_a_pytorch_step_over_its_memory_names_the_line(pytester, plugin_args):
    pytest.importorskip("torch")
    result = run(pytester, plugin_args, {"test_step": STEP}, "--gpu-budget")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memory.peak_bytes 1.50 GiB (1,610,612,736 B) > 1.00 GiB (1,073,741,824 B) (max_memory)*",
            "*live at the peak: 1.50 GiB at test_step.py:9 body (step forward)*",
        ]
    )


LEAKS = """
import pytest
import torch

KEPT = []

@pytest.mark.gpu_budget(max_leaked_bytes=0)
def test_leak(gpuprof):
    torch.empty(1, device="cuda")
    def body():
        with gpuprof.step("cache"):
            KEPT.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    gpuprof.measure(body, rounds=1, warmup=0)

@pytest.mark.gpu_budget(max_leaked_bytes=0)
def test_warm_cache(gpuprof):
    torch.empty(1, device="cuda")
    def body():
        scratch = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        scratch.fill_(1)
        del scratch
    gpuprof.measure(body, rounds=1, warmup=0)

@pytest.mark.gpu_budget(max_leaked_bytes=0, steps={"cache": {"max_leaked_bytes": 0}})
def test_freed_before_the_call_ends(gpuprof):
    torch.empty(1, device="cuda")
    held = []
    def body():
        with gpuprof.step("cache"):
            held.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    def between():
        with gpuprof.step("cache"):
            torch.ones(1 << 20, device="cuda").sum()
    gpuprof.measure(body, rounds=2, warmup=0)
    gpuprof.measure(between, rounds=1, warmup=0)  # another window in between
    held.clear()
"""


def test_a_leak_names_its_line_and_a_warm_cache_passes_saying_what_it_holds(pytester, plugin_args):
    """A tensor kept past the call fails ``max_leaked_bytes=0`` with its line; one freed
    after its window, before the call ended (another window between), passes."""
    pytest.importorskip("torch")
    result = run(pytester, plugin_args, {"test_leaks": LEAKS}, "--gpu-budget")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*memory.leaked_bytes 64.0 MiB (67,108,864 B) > 0 B (0 B) (max_leaked_bytes)*",
            "*not freed by the end of the test's call: 64.0 MiB by step cache, largest at test_leaks.py:11 body*",
        ]
    )
    tests = {t["nodeid"]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    warm = tests["test_leaks.py::test_warm_cache"]["metrics"]["memory"]
    print(warm)
    assert warm["leaked_bytes"] == 0 and warm["cached_bytes"] >= 64 * MIB


OWN_PEAK = """
import json
import torch

def test_peak(gpuprof, record_property):
    seen = []
    def body():
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        activation = torch.empty(3 << 29, dtype=torch.uint8, device="cuda")
        activation.fill_(1)
        del activation
        torch.cuda.synchronize()
        seen.append(torch.cuda.max_memory_allocated() - base)
    body()  # unmeasured
    m = gpuprof.measure(body, rounds=2, warmup=1)
    print(f"own rises {seen}; plugin {m.memory}")
    assert m.memory is not None and m.memory.peak_bytes == seen[-1] == 3 << 29
    assert len(set(seen)) == 1  # as without the plugin, every time
"""


def test_a_tests_own_peak_counters_read_the_same_with_the_plugin(pytester, plugin_args):
    """In a process of its own, as a PyTorch suite runs it (a JAX test earlier in this
    process would have preallocated its pool, and memory reads "not measured" then)."""
    pytest.importorskip("torch")
    result = run(pytester, plugin_args, {"test_own_peak": OWN_PEAK}, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*own rises [[]1610612736, 1610612736, 1610612736, 1610612736[]]; plugin MemoryMetrics(peak_bytes=1610612736*"]
    )


TOP = """
import torch

def test_loop(gpuprof):
    model = torch.nn.Linear(4096, 4096, device="cuda")
    def body():
        with gpuprof.step("load"):
            batch = torch.randn(2048, 4096, device="cuda")
            labels = torch.randint(0, 4096, (2048,), device="cuda")
        with gpuprof.step("forward"):
            hidden = model(batch)
            scores = torch.softmax(hidden, dim=1)
        with gpuprof.step("loss"):
            loss = torch.nn.functional.cross_entropy(scores, labels)
        del batch, labels, hidden, scores, loss
        torch.cuda.synchronize()
    gpuprof.measure(body, rounds=3, warmup=1)
"""


def test_memory_top_lists_five_places_summing_to_the_peak(pytester, plugin_args):
    pytest.importorskip("torch")
    result = run(pytester, plugin_args, {"test_top": TOP}, "--gpu-memory-top=5", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_top.py::test_loop: device memory peak * the 5 largest of * places live then:"])
    memory = json.loads((pytester.path / "r.json").read_text())["tests"][0]["metrics"]["memory"]
    top = sum(s["bytes"] for s in memory["sites"][:5])
    print(memory)
    assert abs(top - memory["peak_bytes"]) <= 0.01 * memory["peak_bytes"]


STEP_LEAKS = """
import pytest
import torch

KEPT = []

@pytest.mark.gpu_budget(steps={"cache": {"max_leaked_bytes": 0}, "scratch": {"max_leaked_bytes": 0}})
def test_step_leak(gpuprof):
    torch.empty(1, device="cuda")
    def body():
        with gpuprof.step("scratch"):
            scratch = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
            scratch.fill_(1)
            del scratch
        with gpuprof.step("cache"):
            KEPT.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    gpuprof.measure(body, rounds=1, warmup=0)
"""


def test_a_steps_max_leaked_bytes_names_the_step_that_kept_a_tensor(pytester, plugin_args):
    pytest.importorskip("torch")
    result = run(pytester, plugin_args, {"test_step_leaks": STEP_LEAKS}, "--gpu-budget")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*steps.cache.leaked_bytes 64.0 MiB (67,108,864 B) > 0 B (0 B) (steps.cache.max_leaked_bytes)*"]
    )
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    steps = test["metrics"]["steps"]
    assert steps["cache"]["leaked_bytes"] == 64 << 20 and steps["scratch"]["leaked_bytes"] == 0
