"""``--gpu-trace=DIR``: one Chrome-trace JSON per test, for Perfetto UI or chrome://tracing.

A process per test; a track per host thread (its steps), one for the regions, one per
stream for kernels and for copies; the kernel-idle stretches on their own track with
what they were charged to; NVML utilization and power as counter tracks.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pytest_gpuprof.analysis.lanes import build
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.files import write_atomic


def trace_events(nodeid: str, timeline: Timeline, pid: int = 1) -> dict[str, Any]:
    lanes, counters = build(timeline)
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": nodeid}},
    ]
    for tid, lane in enumerate(lanes, start=1):
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": lane.name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
        for item in lane.items:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "name": item.label,
                    "cat": lane.kind,
                    "ts": item.start / 1000,  # microseconds
                    "dur": max(item.end - item.start, 0) / 1000,
                    "args": item.args,
                }
            )
    for counter in counters:
        for time_ns, value in counter.points:
            events.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "name": f"{counter.name} ({counter.unit})",
                    "ts": time_ns / 1000,
                    "args": {"value": value},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"nodeid": nodeid, "truth": timeline.truth}}


def file_name(nodeid: str) -> str:
    """A safe, unique file name for a test id (which may hold any character)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_")[:100]
    digest = hashlib.sha256(nodeid.encode()).hexdigest()[:8]
    return f"{readable}-{digest}.json"


def write_trace(directory: Path, nodeid: str, timeline: Timeline, window: tuple[int, int, int] | None = None) -> Path:
    """The test's trace; ``window``: (which, of how many, the reported one). The reported
    window keeps the test's file name, every other breaching window has its own."""
    name = file_name(nodeid)
    title = nodeid
    if window is not None and window[1] > 1:
        index, count, primary = window
        title = f"{nodeid} [window {index + 1} of {count}]"
        if index != primary:
            name = name.removesuffix(".json") + f"-window{index + 1}.json"
    path = Path(directory) / name
    write_atomic(path, json.dumps(trace_events(title, timeline)))
    return path
