"""The PyTorch training loop that ``benchmarks/user_code.py`` and ``tests/gpu`` measure,
written once: six pinned 4096 x 4096 float32 batches (64 MiB each) copied with
``to(non_blocking=True)`` in step "upload", a forward and backward pass on each in step
"train". A child pytest imports it from its own folder, where the caller copies it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

SIDE = 4096


def tensors() -> tuple[Any, Any]:
    """One pinned host batch and one weight on the GPU."""
    host = torch.full((SIDE, SIDE), 0.5).pin_memory()
    return host, torch.randn(SIDE, SIDE, device="cuda", requires_grad=True)


def make_loop(
    step: Callable[[str], AbstractContextManager[Any]], held: tuple[Any, Any] | None = None
) -> Callable[[], None]:
    """The loop, each part inside ``step(name)`` (``gpuprof.step``, an NVTX range, ...);
    ``held``: the tensors to reuse (``tensors()``), new ones otherwise."""
    host, weight = held if held is not None else tensors()

    def loop() -> None:
        for _ in range(6):
            with step("upload"):
                x = host.to("cuda", non_blocking=True)
            with step("train"):
                (torch.relu(weight @ x) ** 2).mean().backward()
        torch.cuda.synchronize()

    return loop
