"""pytest-gpuprof: GPU performance as a test assertion."""

from __future__ import annotations

__version__ = "0.1.0"
