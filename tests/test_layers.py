"""The package's layers, read from its imports (docs/design.md, "Layers").

The data flows one way: ``capture`` produces timelines, ``analysis`` (pure) turns them
into metrics, ``verdict`` judges them, ``output`` writes them, and the pytest glue at the
top level wires them together. A module imports only from its own layer and those
before it, and no modules import each other in a circle (lazy imports included).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_gpuprof"
# each layer, and the layers it may import from besides itself
ALLOWED = {
    "analysis": set(),
    "capture": {"analysis"},
    "verdict": {"analysis"},
    "output": {"analysis", "verdict"},
    # the store, the choice of a baseline, the comparison and the history: no pytest
    "baselines": {"analysis", "verdict", "output"},
    # the measuring engine: a test's windows cut, judged and kept; no pytest
    "measure": {"analysis", "capture", "verdict", "output"},
    # every setting once, its conversions and checks; no pytest
    "settings": {"analysis", "verdict", "output", "baselines", "measure"},
    # the pytest layer: what runs around each test, over every layer below it
    "harness": {"analysis", "capture", "verdict", "output", "baselines", "measure", "settings"},
}
# the modules of ``output`` the engine may use: how a figure reads, and no more
MEASURE_OUTPUT = {"pytest_gpuprof.output.text"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The package modules that ``path`` imports at run time (lazily or not); imports
    made for type checking only are not a dependency."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pytest_gpuprof"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pytest_gpuprof"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES} - {_module_name(path)}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module's imports (read when a test asks: every xdist worker collects this file)."""
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in ALLOWED else None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m)))
def test_a_layer_imports_only_what_comes_before_it(module: str) -> None:
    layer = _layer(module)
    assert layer is not None
    wrong = sorted(
        imported for imported in graph()[module] if _layer(imported) != layer and _layer(imported) not in ALLOWED[layer]
    )
    assert not wrong, (
        f"{module} ({layer}) imports {wrong}: {layer} may import only {sorted(ALLOWED[layer]) or 'itself'}"
    )


def _outside_imports(path: Path) -> list[str]:
    """Every module ``path`` imports, lazily or for type checking alike."""
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return names + [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]


def test_the_pure_layer_imports_no_pytest_and_no_device_library() -> None:
    heavy = ("pytest", "_pytest", "cupy", "cupti", "pynvml", "hypothesis")
    for path in (PACKAGE / "analysis").rglob("*.py"):
        names = _outside_imports(path)
        assert not [n for n in names if n.split(".")[0] in heavy], f"{path.name} imports {names}"


@pytest.mark.parametrize(("room", "least"), [("measure", 9), ("settings", 4)])
def test_the_engine_and_the_settings_import_no_pytest(room: str, least: int) -> None:
    """``measure/`` runs outside pytest (``benchmarks/``), ``settings/`` is read by the CLI as
    well: pytest is the layer above's. The engine uses of ``output`` how a figure reads."""
    paths = sorted((PACKAGE / room).rglob("*.py"))
    assert len(paths) >= least
    for path in paths:
        names = _outside_imports(path)
        assert not [n for n in names if n.split(".")[0] in ("pytest", "_pytest")], f"{path.name} imports {names}"
        output = {n for n in names if n.startswith("pytest_gpuprof.output")}
        assert room != "measure" or output <= MEASURE_OUTPUT, f"{path.name} imports {sorted(output - MEASURE_OUTPUT)}"


def test_no_modules_import_each_other_in_a_circle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph().get(module, ())):
            if state.get(imported) == 1:
                circle = [*path[path.index(imported) :], imported]
                pytest.fail("import circle: " + " -> ".join(circle))
            if imported not in state:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(graph()):
        if module not in state:
            visit(module)


def test_the_check_sees_a_layer_broken() -> None:
    """The reader of imports finds an upward import (so the tests above can fail)."""
    assert "pytest_gpuprof.analysis.model" in graph()["pytest_gpuprof.analysis.metrics"]
    assert _layer("pytest_gpuprof.output.report") == "output"
    assert "analysis" not in ALLOWED["analysis"] and "output" not in ALLOWED["verdict"]


def _private_imports(path: Path) -> list[str]:
    """``from pytest_gpuprof.X import _name``: a private name taken across modules."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}: {node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pytest_gpuprof")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_private_name_crosses_a_module() -> None:
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(p)]
    assert found == []


def test_the_private_name_check_sees_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from pytest_gpuprof.capture.nvml import _secret\n")
    assert _private_imports(bad) == ["bad.py: pytest_gpuprof.capture.nvml._secret"]


def test_the_top_level_holds_the_public_entry_points_only() -> None:
    """The pytest layer lives in ``harness/``; at the top: the package's names, the pytest
    plugin's entry point, the command, the A/B runner it starts (worktrees and pytest
    processes) and the bisection over commits it runs, and the hypothesis strategies."""
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "plugin", "cli", "ab", "bisection", "strategies"}
