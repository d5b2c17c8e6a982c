"""``--gpu-html=PATH``: one self-contained HTML report (inline script and SVG, no fetches).

A summary table of every test (sortable, failures first) and, per test, its timeline lanes
with zoom, its metrics, its budget and each breach. Lanes are aggregated to at most
``MAX_ITEMS`` drawn items, so tens of thousands of kernels stay light. Every name from a
test (ids, steps, kernels) reaches the page as JSON data and is set as text, never markup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pytest_gpuprof.analysis import descriptors as d
from pytest_gpuprof.analysis.lanes import aggregate, build
from pytest_gpuprof.analysis.metrics import Metrics, overlap_schedule
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.report import GpuRecord
from pytest_gpuprof.output.text import explain

MAX_ITEMS = 1500


# the page's figures that are fractions (shown as percentages): the window's and NVML's
_FRACTIONS = [p for p in (*d.names("window"), *(f"nvml.{n}" for n in d.names("nvml"))) if d.is_fraction(p)]


def page_data(record: GpuRecord, timeline: Timeline | None) -> dict[str, Any]:
    m = record.metrics
    data: dict[str, Any] = {
        "id": record.nodeid,
        "outcome": record.outcome,
        "xfail": record.xfail,
        "verdict": record.status,
        "breaches": [b.to_dict() for b in record.breaches],
        "limits": record.budget.limits(),
        "explain": explain(m),
        "metrics": {
            "wall_ms": m.wall_ms,
            "kernel_ms": m.kernel_ms,
            "utilization": m.utilization,
            "reported_utilization": m.reported_utilization,
            "overhead_ms": m.overhead_ms,
            "truth": m.truth,
        },
        "steps": {name: s.to_dict() for name, s in m.steps.items()},
        "lanes": [],
        "counters": [],
        "span_us": 0,
    }
    if timeline is not None:
        span = timeline.end - timeline.start
        lanes, counters = build(timeline)
        data["span_us"] = span / 1000
        data["lanes"] = [
            {
                "name": lane.name,
                "kind": lane.kind,
                "items": [
                    [i.start / 1000, i.end / 1000, i.label, i.count, i.args]
                    for i in aggregate(lane.items, span, MAX_ITEMS, f"{lane.kind}s", by_label=lane.kind == "idle")
                ],
            }
            for lane in lanes
        ]
        data["lanes"] += _predicted_lanes(m, timeline)
        data["counters"] = [
            {
                "name": c.name,
                "unit": c.unit,
                "points": [[t / 1000, v] for t, v in c.points[:: max(1, len(c.points) // MAX_ITEMS)]],
            }
            for c in counters
        ]
    return data


def _predicted_lanes(m: Metrics, timeline: Timeline) -> list[dict[str, Any]]:
    """Each ``overlap:STEP`` prediction as two lanes under the measured ones: the step's
    work one unit after another on its own engine, and the rest of each unit."""
    lanes = []
    for scenario in m.what_if:
        kind, _, step = scenario.partition(":")
        schedule = overlap_schedule(timeline, step) if kind == "overlap" else None
        if schedule is None:
            continue
        t0 = timeline.start
        for name, lane_kind, spans in ((step, "memcpy", schedule[0]), ("the rest of each unit", "region", schedule[1])):
            lanes.append(
                {
                    "name": f"what if {scenario}: {name}",
                    "kind": lane_kind,
                    "items": [[(s - t0) / 1000, (e - t0) / 1000, f"{name} (predicted)", 1, {}] for s, e in spans],
                }
            )
    return lanes


def render(tests: Iterable[dict[str, Any]], machine: dict[str, Any]) -> str:
    """The page, from each test's ``page_data``."""
    payload = {"machine": machine, "tests": list(tests), "fractions": _FRACTIONS}
    # JSON inside <script> must not be able to close it or open a comment: no raw <, >, &.
    embedded = (
        json.dumps(payload, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    )
    return PAGE.replace("__DATA__", embedded)


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>pytest-gpuprof report</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}#machine{color:#555;margin-bottom:12px}
table{border-collapse:collapse}th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
th{cursor:pointer;background:#f3f3f3;user-select:none}td.num{text-align:right;font-variant-numeric:tabular-nums}
#summary tbody tr{cursor:pointer}#summary tbody tr:hover{background:#eef4ff}
tr.breach td{background:#fde8e8}tr.selected td{outline:2px solid #36c}
#detail{margin-top:16px}#detail h2{font-size:15px;margin:8px 0}.breach-line{color:#b00;font-weight:600}
pre{background:#f7f7f7;padding:8px;white-space:pre-wrap}
#tools button{margin-right:4px}svg{border:1px solid #ccc;background:#fff;display:block}
.legend span{display:inline-block;margin-right:10px}.legend i{display:inline-block;width:10px;height:10px;margin-right:3px}
</style></head><body>
<h1>pytest-gpuprof: true GPU utilization</h1>
<div id="machine"></div>
<table id="summary"><thead><tr>
<th data-key="id">test</th><th data-key="wall_ms">wall ms</th><th data-key="utilization">util</th>
<th data-key="reported_utilization">reported</th><th data-key="overhead_ms">overhead ms</th><th data-key="verdict">verdict</th>
</tr></thead><tbody></tbody></table>
<div id="detail"><p>Click a test to see its timeline.</p></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const COLORS = {step:"#7aa6d8", region:"#c9b8e8", kernel:"#2e9e4f", memcpy:"#e08a2c", memset:"#b5892f"};
const SVGNS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }
function num(x) { return x === null || x === undefined ? "-" : x.toFixed(1); }
function hue(name) { let h = 0; for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 360; return `hsl(${h},65%,55%)`; }
const m = DATA.machine;
document.getElementById("machine").textContent =
  `${m.gpu} | driver ${m.driver} | PCIe ${m.pcie} | backend ${m.backend} | truth ${m.truth} | machine ${m.id}`;
const failing = t => t.breaches.length > 0 || t.outcome === "failed";
let order = DATA.tests.map((t, i) => i).sort((a, b) =>
  (failing(DATA.tests[b]) - failing(DATA.tests[a])) || DATA.tests[a].id.localeCompare(DATA.tests[b].id));
let sortKey = null, sortDir = 1, selected = null;
function value(t, key) { return key === "id" || key === "verdict" ? t[key] : t.metrics[key]; }
function renderSummary() {
  const body = document.querySelector("#summary tbody");
  body.replaceChildren();
  for (const i of order) {
    const t = DATA.tests[i];
    const row = el("tr", {"data-index": i});
    if (failing(t)) row.classList.add("breach");
    if (i === selected) row.classList.add("selected");
    row.append(el("td", {}, t.id), el("td", {class: "num"}, num(t.metrics.wall_ms)),
      el("td", {class: "num"}, pct(t.metrics.utilization)), el("td", {class: "num"}, pct(t.metrics.reported_utilization)),
      el("td", {class: "num"}, num(t.metrics.overhead_ms)), el("td", {}, t.verdict + (t.outcome === "failed" ? " (failed)" : "")));
    row.addEventListener("click", () => select(i));
    body.append(row);
  }
}
for (const th of document.querySelectorAll("#summary th")) {
  th.addEventListener("click", () => {
    const key = th.dataset.key;
    sortDir = sortKey === key ? -sortDir : 1; sortKey = key;
    order.sort((a, b) => {
      const x = value(DATA.tests[a], key), y = value(DATA.tests[b], key);
      if (x === y) return 0; if (x === null || x === undefined) return 1; if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    renderSummary();
  });
}
let view = null;
function select(i) {
  selected = i; renderSummary();
  const t = DATA.tests[i];
  const d = document.getElementById("detail");
  d.replaceChildren(el("h2", {}, t.id));
  const fraction = k => DATA.fractions.includes(k);
  const shown = (k, v) => typeof v !== "number" ? String(v) : fraction(k) ? pct(v) : v.toFixed(2);
  for (const b of t.breaches)
    d.append(el("div", {class: "breach-line"}, `breach of ${b.key}: ${b.metric} ${shown(b.metric, b.value)}, limit ${shown(b.metric, b.limit)}`));
  d.append(el("pre", {}, t.explain.join("\n")));
  const tools = el("div", {id: "tools"});
  const zoomIn = el("button", {}, "zoom in"), zoomOut = el("button", {}, "zoom out"), reset = el("button", {}, "reset");
  tools.append(zoomIn, zoomOut, reset, el("span", {}, " wheel: zoom, drag: pan"));
  d.append(tools);
  const svg = el("svg:svg", {id: "timeline", width: 1100});
  d.append(svg, legend(t));
  const steps = el("table", {id: "steps"});
  steps.append(el("tr", {}, ""));
  steps.firstChild.append(...["step", "count", "host ms", "idle ms", "bytes", "GB/s", "pageable"].map(h => el("th", {}, h)));
  for (const [name, s] of Object.entries(t.steps)) {
    const r = el("tr");
    r.append(el("td", {}, name), el("td", {class: "num"}, String(s.count)), el("td", {class: "num"}, num(s.host_ms)),
      el("td", {class: "num"}, num(s.idle_ms)), el("td", {class: "num"}, String(s.bytes)),
      el("td", {class: "num"}, s.gbps === null ? "-" : s.gbps.toFixed(1)), el("td", {}, String(s.pageable)));
    steps.append(r);
  }
  d.append(el("h2", {}, "steps"), steps, el("h2", {}, "budget"), el("pre", {}, JSON.stringify(t.limits, null, 1)));
  view = [0, t.span_us || 1];
  const redraw = () => draw(svg, t);
  zoomIn.onclick = () => { zoom(0.5, 0.5); redraw(); };
  zoomOut.onclick = () => { zoom(2, 0.5); redraw(); };
  reset.onclick = () => { view = [0, t.span_us || 1]; redraw(); };
  svg.addEventListener("wheel", e => { e.preventDefault(); zoom(e.deltaY < 0 ? 0.8 : 1.25, e.offsetX / 1100); redraw(); });
  let dragging = null;
  svg.addEventListener("mousedown", e => { dragging = [e.clientX, view.slice()]; });
  window.addEventListener("mouseup", () => { dragging = null; });
  svg.addEventListener("mousemove", e => {
    if (!dragging) return;
    const dt = (e.clientX - dragging[0]) / 1100 * (dragging[1][1] - dragging[1][0]);
    view = [dragging[1][0] - dt, dragging[1][1] - dt]; redraw();
  });
  redraw();
}
function zoom(factor, at) {
  const w = view[1] - view[0], c = view[0] + at * w;
  view = [c - (c - view[0]) * factor, c + (view[1] - c) * factor];
}
function legend(t) {
  const l = el("div", {class: "legend"});
  for (const [k, c] of Object.entries(COLORS)) { const s = el("span"); s.append(el("i", {style: `background:${c}`}), document.createTextNode(k)); l.append(s); }
  const charged = new Set();
  for (const lane of t.lanes) if (lane.kind === "idle") for (const it of lane.items) charged.add(it[2]);
  for (const name of charged) { const s = el("span"); s.append(el("i", {style: `background:${hue(name)}`}), document.createTextNode("idle: " + name)); l.append(s); }
  return l;
}
function draw(svg, t) {
  const W = 1100, LABEL = 230, ROW = 18, CH = 40;
  const plot = W - LABEL, [v0, v1] = view, scale = plot / (v1 - v0);
  svg.replaceChildren();
  let y = 4;
  const axis = el("svg:text", {x: LABEL, y: 12, "font-size": 10}, `${(v0 / 1000).toFixed(2)} ms .. ${(v1 / 1000).toFixed(2)} ms`);
  svg.append(axis); y += 12;
  for (const lane of t.lanes) {
    const g = el("svg:g", {class: "lane", "data-kind": lane.kind});
    g.append(el("svg:text", {x: 2, y: y + 13, "font-size": 11}, lane.name));
    for (const [s, e, label, count, args] of lane.items) {
      if (e < v0 || s > v1) continue;
      const raw = (Math.min(e, v1) - Math.max(s, v0)) * scale;
      const x = LABEL + Math.max(0, (s - v0) * scale), w = Math.max(1, raw);
      // an idle gap narrower than a pixel is drawn faint, not as a pixel of solid idle
      // a kernel is shaded by the fraction of the SMs its grid covered (args.SMs)
      const opacity = lane.kind === "idle" ? Math.min(1, Math.max(0.15, raw))
        : args && typeof args.SMs === "number" ? Math.max(0.15, args.SMs) : 1;
      const r = el("svg:rect", {x, y: y + 2, width: w, height: ROW - 4, "fill-opacity": opacity,
        fill: lane.kind === "idle" ? hue(label) : COLORS[lane.kind] || "#888", class: "item"});
      r.append(el("svg:title", {}, `${label}: ${((e - s) / 1000).toFixed(3)} ms` + (count > 1 ? ` (${count} merged)` : "") +
        (args && Object.keys(args).length ? " " + JSON.stringify(args) : "")));
      g.append(r);
    }
    svg.append(g); y += ROW;
  }
  for (const c of t.counters) {
    const max = Math.max(1, ...c.points.map(p => p[1]));
    const pts = c.points.filter(p => p[0] >= v0 && p[0] <= v1)
      .map(p => `${LABEL + (p[0] - v0) * scale},${y + CH - 2 - (p[1] / max) * (CH - 6)}`).join(" ");
    svg.append(el("svg:text", {x: 2, y: y + 14, "font-size": 11}, `${c.name} (max ${max.toFixed(0)} ${c.unit})`));
    if (pts) svg.append(el("svg:polyline", {points: pts, fill: "none", stroke: "#c33", "stroke-width": 1.2, class: "counter"}));
    y += CH;
  }
  svg.setAttribute("height", y + 4);
}
renderSummary();
const auto = /#click=(\d+)/.exec(location.hash);
if (auto) { const row = document.querySelector(`#summary tbody tr[data-index="${auto[1]}"]`); if (row) row.click(); }
</script></body></html>
"""
