"""``gpuprof explain -o FILE.html``: each test's explanation beside its two runs, drawn as
two bars on one scale (BASE above HEAD), each its wall time cut into what filled it: each
kernel's time and each step's kernel-idle, then the idle no step holds. One colour a part
in both bars, so that what grew reads at a glance; the causes' lines under them."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_gpuprof.verdict.explain import Explanation

__all__ = ["page", "parts"]

WIDTH, BAR, GAP = 900, 22, 8
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
NO_STEP = "#bab0ac"


def parts(entry: Mapping[str, Any]) -> list[tuple[str, float]]:
    """A run's wall time as it was filled: each kernel's time, each step's idle, the idle
    no step holds; in that order, nothing below 0."""
    m = entry.get("metrics") or {}
    out = [(f"kernel {k}", float(v)) for k, v in (m.get("kernel_totals") or {}).items() if isinstance(v, int | float)]
    steps = m.get("steps") or {}
    out += [(f"idle in step {k}", float(s.get("idle_ms") or 0.0)) for k, s in steps.items() if isinstance(s, Mapping)]
    out.append(("idle in no step", float(m.get("unattributed_ms") or 0.0)))
    return [(name, max(ms, 0.0)) for name, ms in out if ms > 0]


def _bars(before: Sequence[tuple[str, float]], after: Sequence[tuple[str, float]], colours: dict[str, str]) -> str:
    scale = WIDTH / max(sum(ms for _, ms in before), sum(ms for _, ms in after), 1e-9)
    rows = []
    for y, (label, run) in enumerate((("BASE", before), ("HEAD", after))):
        top, x = y * (BAR + GAP), 60.0
        rows.append(f'<text x="0" y="{top + BAR - 6}">{label}</text>')
        for name, ms in run:
            colour = colours.setdefault(
                name, PALETTE[len(colours) % len(PALETTE)] if name != "idle in no step" else NO_STEP
            )
            w = ms * scale
            tip = html.escape(f"{name}: {ms:.3f} ms")
            rows.append(
                f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="{BAR}" fill="{colour}"><title>{tip}</title></rect>'
            )
            x += w
    height = 2 * BAR + GAP
    return f'<svg width="{WIDTH + 70}" height="{height}" font-size="12">{"".join(rows)}</svg>'


def page(explained: Iterable[tuple[Explanation, Mapping[str, Any], Mapping[str, Any]]], head: Sequence[str]) -> str:
    """The page: ``head``'s lines, then each test's two bars, its legend and its lines."""
    body = [f"<pre>{html.escape(chr(10).join(head))}</pre>"]
    for e, before, after in explained:
        colours: dict[str, str] = {}
        bars = _bars(parts(before), parts(after), colours)
        legend = " ".join(
            f'<span style="border-left:12px solid {c};padding-left:4px;margin-right:10px">{html.escape(n)}</span>'
            for n, c in colours.items()
        )
        body += [
            f"<h2>{html.escape(e.nodeid)}</h2>",
            bars,
            f"<p>{legend}</p>",
            f"<pre>{html.escape(chr(10).join(e.lines()))}</pre>",
        ]
    style = "body{font-family:sans-serif;margin:20px}pre{white-space:pre-wrap}h2{font-size:15px}"
    return f"<!doctype html><meta charset=utf-8><title>gpuprof explain</title><style>{style}</style>{''.join(body)}\n"
