"""The innermost open host step of the calling thread, shared by profiler and backends."""

from __future__ import annotations

import threading

_local = threading.local()


def current_span_id() -> int | None:
    stack: list[int] | None = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def push_span(span_id: int) -> int:
    """Open a span on this thread; returns its nesting depth (0 for the outermost)."""
    stack: list[int] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(span_id)
    return len(stack) - 1


def pop_span(span_id: int) -> None:
    stack: list[int] = _local.stack
    # Steps close in LIFO order per thread: a context manager cannot do otherwise.
    if stack and stack[-1] == span_id:
        stack.pop()
    elif span_id in stack:
        stack.remove(span_id)
