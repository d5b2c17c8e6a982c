"""NVTX ranges as steps: a range of a thread is a step of its name on that thread, nested
with the ``gpuprof.step``s around and inside it. Pure functions over plain data.

A range outside NVTX's default domain is named ``DOMAIN:message``. A range's ``span_id``
is ``RANGE_IDS`` plus CUPTI's marker id, apart from the steps' own ids.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from pytest_gpuprof.analysis.model import Span

RANGE_IDS = 1 << 40


def range_name(message: str, domain: str) -> str:
    return f"{domain}:{message}" if domain else message


def as_steps(steps: Sequence[Span], ranges: Sequence[Span]) -> tuple[Span, ...]:
    """The steps and the ranges as one set of steps, each at its depth among the steps
    and ranges of its thread that enclose it. A thread without ranges keeps its steps as
    they are; of two spans over the same time, the one opened first (the lower id: steps
    before ranges) is the outer one. A span of no length at the instant one span closes and
    another opens may be put in either (it owns no time)."""
    if not ranges:
        return tuple(steps)
    ranged = {r.thread for r in ranges}
    by_thread: dict[int, list[Span]] = defaultdict(list)
    out = [s for s in steps if s.thread not in ranged]
    for span in (*steps, *ranges):
        if span.thread in ranged:
            by_thread[span.thread].append(span)
    for spans in by_thread.values():
        stack: list[Span] = []
        for span in sorted(spans, key=lambda s: (s.start, -s.end, s.span_id)):
            while stack and stack[-1].end < span.end:
                stack.pop()
            out.append(replace(span, depth=len(stack)))
            stack.append(span)
    return tuple(out)
