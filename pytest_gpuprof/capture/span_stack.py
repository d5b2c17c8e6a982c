"""The innermost open host step of the calling thread, shared by profiler and backends."""

from __future__ import annotations

import threading

_local = threading.local()


def current_span_id() -> int | None:
    stack: list[int] | None = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def push_span(span_id: int) -> list[int]:
    """Open a span on this thread; returns this thread's stack of open spans (the span's
    nesting depth is its length less one)."""
    stack: list[int] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(span_id)
    return stack


def pop_span(stack: list[int], span_id: int) -> None:
    """Close a span on the stack it was opened on."""
    # Usually the innermost (a with block closes in LIFO order); a step entered and left
    # by hand (``__enter__``/``__exit__``) may close out of order.
    if stack and stack[-1] == span_id:
        stack.pop()
    elif span_id in stack:
        stack.remove(span_id)
