"""The benchmarks do not rot: each loads against the package as it is now, and those with
arguments parse them. Their figures are taken on the GPU (docs/performance.md)."""

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
WITH_ARGUMENTS = ["adopted_suite", "gates", "interleaved", "memory_cost", "observer", "parallel"]


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_each_benchmark_loads(script, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))
    names = runpy.run_path(str(script), run_name="benchmark_smoke")
    assert callable(names.get("main")), f"{script.name} has no main()"


@pytest.mark.parametrize("name", WITH_ARGUMENTS)
def test_a_benchmark_with_arguments_explains_them(name, monkeypatch, capsys):
    script = BENCHMARKS[[p.stem for p in BENCHMARKS].index(name)]
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out
