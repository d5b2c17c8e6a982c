"""Limits the house holds: a module at most 400 lines, a class at most 250, a function at
most 60. What is over them is named below with the reason and the work that brings it
under (issue #71); an entry that no longer needs its room fails too, so the list only
shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_gpuprof"
LIMITS = {"module": 400, "class": 250, "function": 60}

# (kind, place): why it is over, and what brings it under
ALLOWED = {
    ("module", "baselines/store.py"): "the store's I/O alone (save, list, read, packs, removal); the choice "
    "and pruning are choice.py's, reaching it reach.py's: the pack index is the next cut",
    ("class", "baselines/store.py:Store"): "every bounded call to the store is one of its methods: the pack index "
    "(summaries read and written in packs) is the next cut",
    ("module", "harness/session.py"): "the session still holds the gate's and the lock's hooks: "
    "#71 items 4 and 5 (the baseline rule one pure function, xdist facts one module)",
    ("class", "harness/session.py:GpuSession"): "every hook's work around a test in one object: #71 items 4, 5",
    ("class", "harness/wrap_up.py:Outputs"): "the terminal summary's sections and the baseline's save in one "
    "object (the files are output/run_files.py's): the summary's sections as rows are the next cut",
    ("module", "plugin.py"): "every pytest hook is here by design (DESIGN.md: one entry point); the facts it "
    "gathers for the baseline rule and xdist's facts are the next cut (#71 item 5)",
    ("module", "cli.py"): "every command's parser beside its work: #71 item 3's runner took ab's work out, "
    "its arguments remain",
    ("class", "harness/runtime.py:DeviceRuntime"): "the backend, the lock, NVML, GPM and the header in one "
    "object: #71 item 5 (one module for what xdist says, one for which GPU a worker uses)",
    ("class", "measure/profiler.py:Profiler"): "the gpuprof fixture's public API (measure, window, step, "
    "region, check, metrics, what_if) is one object by contract (DESIGN.md)",
}


def _over(package: Path = PACKAGE) -> dict[tuple[str, str], int]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(package))
        text = path.read_text()
        if len(text.splitlines()) > LIMITS["module"]:
            found[("module", where)] = len(text.splitlines())
        tree = ast.parse(text)
        for parent in ast.walk(tree):
            for node in ast.iter_child_nodes(parent):
                if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                owner = f"{parent.name}." if isinstance(parent, ast.ClassDef) else ""
                if size > LIMITS[kind]:
                    found[(kind, f"{where}:{owner}{node.name}")] = size
    return found


def test_no_module_class_or_function_is_over_its_limit_unless_named_with_why():
    over = _over()
    unexplained = {k: v for k, v in over.items() if k not in ALLOWED}
    assert not unexplained, f"over the limits {LIMITS}: {unexplained}"


def test_every_named_exception_is_still_over_its_limit():
    over = _over()
    stale = [k for k in ALLOWED if k not in over]
    assert not stale, f"back under the limit: drop from ALLOWED {stale}"


def test_the_check_sees_a_long_function_a_large_class_and_a_long_module(tmp_path):
    (tmp_path / "f.py").write_text("def f():\n" + "    pass\n" * 60)
    (tmp_path / "c.py").write_text("class C:\n" + "    x = 1\n" * 250)
    (tmp_path / "m.py").write_text("x = 1\n" * 401)
    (tmp_path / "ok.py").write_text("def f():\n" + "    pass\n" * 59)
    assert _over(tmp_path) == {("function", "f.py:f"): 61, ("class", "c.py:C"): 251, ("module", "m.py"): 401}
