"""The report page: one HTML file, its script and styles inline (``output.html`` fills it)."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>pytest-gpuprof report</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222;max-width:1240px}
h1{font-size:18px;margin:0 0 4px}#machine{color:#555;margin-bottom:12px}
table{border-collapse:collapse}th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
th{cursor:pointer;background:#f3f3f3;user-select:none}td.num{text-align:right;font-variant-numeric:tabular-nums}
#summary{table-layout:fixed;width:100%}#summary td{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
#summary th:first-child{width:46%}#summary tbody tr{cursor:pointer}#summary tbody tr:hover{background:#eef4ff}
#scroll{max-height:420px;overflow:auto}#filters{margin:6px 0}
tr.breach td{background:#fde8e8}tr.selected td{background:#dce8fb}tr.selected{outline:2px solid #36c;outline-offset:-2px}
#detail{margin-top:16px}#detail h2{font-size:15px;margin:8px 0;overflow-wrap:anywhere}.breach-line{color:#b00;font-weight:600}
pre{background:#f7f7f7;padding:8px;white-space:pre-wrap;overflow-wrap:anywhere}
#tools button{margin-right:4px}#tools span{color:#555}svg{border:1px solid #ccc;background:#fff;display:block;user-select:none}
svg text{font-family:system-ui,sans-serif}svg .label{pointer-events:none}
.legend span{display:inline-block;margin-right:10px}.legend i{display:inline-block;width:10px;height:10px;margin-right:3px}
#steps td:first-child{max-width:360px;overflow-wrap:anywhere}
</style></head><body>
<h1>pytest-gpuprof: true GPU utilization</h1>
<div id="machine"></div>
<div id="filters"><label><input type="checkbox" id="failed-only"> failed and breaching only</label> &middot; <span id="count"></span></div>
<div id="scroll"><table id="summary"><thead><tr>
<th data-key="id">test</th><th data-key="wall_ms">wall ms</th><th data-key="utilization">util</th>
<th data-key="reported_utilization">reported</th><th data-key="overhead_ms">overhead ms</th><th data-key="verdict">verdict</th>
</tr></thead><tbody></tbody></table></div>
<div id="detail"><p>Click a test to see its timeline.</p></div>
<div id="view" hidden></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const T0 = performance.now();
const DATA = JSON.parse(document.getElementById("data").textContent);
const COLORS = {step:"#7aa6d8", region:"#c9b8e8", kernel:"#2e9e4f", memcpy:"#e08a2c", memset:"#b5892f", predicted:"#b9b9b9", host:"#8da0cb"};
const NAMES = {step:"steps", region:"brackets (regions)", kernel:"kernels", memcpy:"copies", memset:"memsets", idle:"kernel-idle, coloured by the step charged", predicted:"what if (predicted)", host:"host code in unattributed idle (sampled)"};
const SVGNS = "http://www.w3.org/2000/svg";
// the timeline's geometry: lane names on the left, the plot from LABEL to W
const W = 1200, LABEL = 240, PLOT = W - LABEL, ROW = 18, CH = 40, AXIS = 24, CHAR = 6.2;
function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }
function num(x) { return x === null || x === undefined ? "-" : x.toFixed(1); }
// one colour per step name, the same in steps, idle and legend: a palette in order of first
// appearance, distinct for the first ten names of a page, then hues from the name
const PALETTE = ["#4e79a7", "#b07aa1", "#e15759", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#bab0ac"];  // no orange or green: the copies' and kernels'
const named = new Map();
function colour(name) {
  if (!named.has(name)) {
    let h = 0; for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 360;
    named.set(name, named.size < PALETTE.length ? PALETTE[named.size] : `hsl(${h},60%,62%)`);
  }
  return named.get(name);
}
// a name cut to what fits in px pixels (the whole name stays in the item's tooltip)
function fit(text, px) {
  const n = Math.floor(px / CHAR);
  return n >= text.length ? text : n >= 4 ? text.slice(0, n - 1) + "\u2026" : "";
}
const m = DATA.machine;
document.getElementById("machine").textContent =
  `${m.gpu} | driver ${m.driver} | PCIe ${m.pcie} | backend ${m.backend} | truth ${m.truth} | machine ${m.id}`;
const failing = t => t.breaches.length > 0 || t.outcome === "failed" || /^(FAIL|warn)/.test(t.verdict);
const ALL = DATA.tests.map((t, i) => i).sort((a, b) =>
  (failing(DATA.tests[b]) - failing(DATA.tests[a])) || DATA.tests[a].id.localeCompare(DATA.tests[b].id));
let order = ALL.slice(), sortKey = null, sortDir = 1, selected = null, failedOnly = false;
function value(t, key) { return key === "id" || key === "verdict" ? t[key] : t.metrics[key]; }
function renderSummary() {
  const body = document.querySelector("#summary tbody");
  const rows = document.createDocumentFragment();
  let shown = 0;
  for (const i of order) {
    const t = DATA.tests[i];
    if (failedOnly && !failing(t)) continue;
    shown++;
    const row = el("tr", {"data-index": i});
    if (failing(t)) row.classList.add("breach");
    if (i === selected) row.classList.add("selected");
    row.append(el("td", {title: t.id}, t.id), el("td", {class: "num"}, num(t.metrics.wall_ms)),
      el("td", {class: "num"}, pct(t.metrics.utilization)), el("td", {class: "num"}, pct(t.metrics.reported_utilization)),
      el("td", {class: "num"}, num(t.metrics.overhead_ms)), el("td", {title: t.verdict}, t.verdict + (t.outcome === "failed" ? " (failed)" : "") + (t.reruns ? ` (after ${t.reruns} rerun${t.reruns > 1 ? "s" : ""})` : "")));
    rows.append(row);
  }
  body.replaceChildren(rows);
  document.getElementById("count").textContent = `${shown} of ${DATA.tests.length} tests shown`;
}
document.querySelector("#summary tbody").addEventListener("click", e => {
  const row = e.target.closest("tr"); if (row) select(Number(row.dataset.index));
});
document.getElementById("failed-only").addEventListener("change", e => { failedOnly = e.target.checked; renderSummary(); });
function sortBy(key) {
  sortDir = sortKey === key ? -sortDir : 1; sortKey = key;
  const keyed = order.map(i => [value(DATA.tests[i], key), i]);
  keyed.sort(([x, i], [y, j]) => {
    if (x === y) return i - j; if (x === null || x === undefined) return 1; if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * sortDir;
  });
  order = keyed.map(([, i]) => i);
  renderSummary();
}
for (const th of document.querySelectorAll("#summary th")) th.addEventListener("click", () => sortBy(th.dataset.key));

// the timeline: a visible range [lo, hi] of the window [0, span], in us
let view = null, span = 1;
function setView(lo, hi) {  // clamped to the window: never wider, never outside it
  const w = Math.min(hi - lo, span);
  lo = Math.min(Math.max(lo, 0), span - w);
  view = [lo, lo + w];
  const v = document.getElementById("view");
  v.dataset.lo = view[0]; v.dataset.hi = view[1];
}
function zoom(factor, at) {  // at: where in the plot (0..1) the pointer is; that instant stays put
  const w = view[1] - view[0], c = view[0] + at * w;
  const nw = Math.min(span, Math.max(w * factor, 1e-3));
  setView(c - at * nw, c - at * nw + nw);
}
function plotX(svg, e) { return (e.clientX - svg.getBoundingClientRect().left) * (W / svg.getBoundingClientRect().width) - LABEL; }
function select(i) {
  selected = i; renderSummary();
  const t = DATA.tests[i];
  const d = document.getElementById("detail");
  d.replaceChildren(el("h2", {}, t.id));
  for (const b of t.breaches) d.append(el("div", {class: "breach-line"}, `breach of ${b.key}: ${b.text}`));
  for (const line of t.compare) d.append(el("div", {class: / regression$/.test(line) ? "breach-line" : "compare-line"}, line));
  d.append(el("pre", {}, t.explain.join("\n")));
  if (t.lanes.length) {
    const tools = el("div", {id: "tools"});
    const zoomIn = el("button", {}, "zoom in"), zoomOut = el("button", {}, "zoom out"), reset = el("button", {}, "whole window");
    const readout = el("span", {id: "cursor"}, " wheel: zoom about the pointer, drag: pan");
    tools.append(zoomIn, zoomOut, reset, readout);
    const svg = el("svg:svg", {id: "timeline", width: W, viewBox: `0 0 ${W} 100`});
    d.append(tools, svg, legend(t));
    span = t.span_us || 1;
    setView(0, span);
    const redraw = () => draw(svg, t);
    zoomIn.onclick = () => { zoom(0.5, 0.5); redraw(); };
    zoomOut.onclick = () => { zoom(2, 0.5); redraw(); };
    reset.onclick = () => { setView(0, span); redraw(); };
    svg.addEventListener("wheel", e => {
      e.preventDefault();
      zoom(e.deltaY < 0 ? 0.8 : 1.25, Math.min(1, Math.max(0, plotX(svg, e) / PLOT))); redraw();
    });
    let dragging = null;
    svg.addEventListener("mousedown", e => { dragging = [plotX(svg, e), view.slice()]; });
    window.addEventListener("mouseup", () => { dragging = null; });
    svg.addEventListener("mousemove", e => {
      const x = plotX(svg, e);
      if (x >= 0) readout.textContent = ` ${((view[0] + x / PLOT * (view[1] - view[0])) / 1000).toFixed(3)} ms`;
      if (!dragging) return;
      const [x0, [lo, hi]] = dragging, dt = (x - x0) / PLOT * (hi - lo);
      setView(lo - dt, hi - dt); redraw();
    });
    redraw();
  }
  const steps = el("table", {id: "steps"});
  steps.append(el("tr", {}, ""));
  steps.firstChild.append(...["step", "count", "host ms", "idle ms", "bytes", "GB/s", "pageable", "memory peak"].map(h => el("th", {}, h)));
  for (const [name, s] of Object.entries(t.steps)) {
    const r = el("tr");
    r.append(el("td", {}, name), el("td", {class: "num"}, String(s.count)), el("td", {class: "num"}, num(s.host_ms)),
      el("td", {class: "num"}, num(s.idle_ms)), el("td", {class: "num"}, String(s.bytes)),
      el("td", {class: "num"}, s.gbps === null ? "-" : s.gbps.toFixed(1)), el("td", {}, String(s.pageable)),
      el("td", {class: "num"}, s.memory_peak_bytes != null ? (s.memory_peak_bytes / 1048576).toFixed(1) + " MiB"
        : s.memory_peak_range ? s.memory_peak_range.map(b => (b / 1048576).toFixed(1)).join("-") + " MiB" : "-"));
    steps.append(r);
  }
  if (Object.keys(t.steps).length) d.append(el("h2", {}, "steps"), steps);
  if (Object.keys(t.limits).length) d.append(el("h2", {}, "budget"), el("pre", {}, JSON.stringify(t.limits, null, 1)));
}
function legend(t) {  // what is on the page, and nothing else
  const l = el("div", {class: "legend"});
  const kinds = new Set(t.lanes.map(lane => lane.kind));
  for (const [k, c] of Object.entries(COLORS)) {
    if (!kinds.has(k) || k === "step") continue;
    const s = el("span"); s.append(el("i", {style: `background:${c}`}), document.createTextNode(NAMES[k])); l.append(s);
  }
  const names = new Set();
  for (const lane of t.lanes) if (lane.kind === "step" || lane.kind === "idle") for (const it of lane.items) names.add(it[2]);
  for (const name of names) {
    const s = el("span", {title: name}); s.append(el("i", {style: `background:${colour(name)}`}), document.createTextNode(fit(name, 200)));
    l.append(s);
  }
  return l;
}
function ticks(v0, v1) {  // a round step in ms giving 5 to 10 ticks
  const w = (v1 - v0) / 1000, raw = w / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(k => k * p).find(s => w / s <= 10) * 1000;
  const out = [];
  for (let x = Math.ceil(v0 / step) * step; x <= v1; x += step) out.push(x);
  return [out, step];
}
function draw(svg, t) {
  const [v0, v1] = view, scale = PLOT / (v1 - v0);
  svg.replaceChildren();
  const [marks, step] = ticks(v0, v1);
  const digits = Math.max(0, -Math.floor(Math.log10(step / 1000)));
  let y = AXIS;
  const rows = [];  // [lane, depth] for each row drawn
  for (const lane of t.lanes) {
    const depths = lane.kind === "step" ? Math.max(0, ...lane.items.map(it => (it[4] && it[4].depth) || 0)) + 1 : 1;
    rows.push([lane, depths]);
  }
  const height = AXIS + rows.reduce((h, [, n]) => h + n * ROW, 0) + t.counters.length * CH + 4;
  for (const x of marks) {
    const px = LABEL + (x - v0) * scale;
    svg.append(el("svg:line", {x1: px, x2: px, y1: AXIS - 6, y2: height, stroke: "#eee"}));
    svg.append(el("svg:text", {x: px + 2, y: 12, "font-size": 10, class: "tick"}, `${(x / 1000).toFixed(digits)} ms`));
  }
  svg.append(el("svg:line", {x1: LABEL, x2: W, y1: AXIS - 4, y2: AXIS - 4, stroke: "#999"}));
  for (const [lane, depths] of rows) {
    const g = el("svg:g", {class: "lane", "data-kind": lane.kind});
    const name = el("svg:text", {x: 2, y: y + 13, "font-size": 11}, fit(lane.name, LABEL - 6));
    name.append(el("svg:title", {}, lane.name));
    g.append(name);
    for (const [s, e, label, count, args] of lane.items) {
      if (e < v0 || s > v1) continue;
      const raw = (Math.min(e, v1) - Math.max(s, v0)) * scale;
      const x = LABEL + Math.max(0, (s - v0) * scale), w = Math.max(1, raw);
      const row = lane.kind === "step" ? (args && args.depth) || 0 : 0;
      // a kernel is shaded by the fraction of the SMs its grid covered (args.SMs); an
      // idle gap narrower than a pixel is drawn faint, not as a pixel of solid idle
      const opacity = lane.kind === "idle" ? Math.min(1, Math.max(0.15, raw))
        : args && typeof args.SMs === "number" ? Math.max(0.15, args.SMs) : 1;
      const fill = lane.kind === "step" || lane.kind === "idle" ? colour(label) : COLORS[lane.kind] || "#888";
      const top = y + row * ROW + 2;
      const r = el("svg:rect", {x, y: top, width: w, height: ROW - 4, "fill-opacity": opacity, fill, class: "item"});
      if (w > 4) { r.setAttribute("stroke", "#fff"); r.setAttribute("stroke-width", 0.5); }  // neighbours apart
      r.append(el("svg:title", {}, `${label}: ${((e - s) / 1000).toFixed(3)} ms` + (count > 1 ? ` (${count} merged)` : "") +
        (args && Object.keys(args).length ? " " + JSON.stringify(args) : "")));
      g.append(r);
      const text = fit(label, w - 4);
      if (text) g.append(el("svg:text", {x: x + 2, y: top + ROW - 8, "font-size": 10, class: "label"}, text));
    }
    svg.append(g); y += depths * ROW;
  }
  for (const c of t.counters) {
    const max = Math.max(1, ...c.points.map(p => p[1]));
    const pts = c.points.filter(p => p[0] >= v0 && p[0] <= v1)
      .map(p => `${LABEL + (p[0] - v0) * scale},${y + CH - 2 - (p[1] / max) * (CH - 6)}`).join(" ");
    svg.append(el("svg:text", {x: 2, y: y + 14, "font-size": 11}, `${c.name} (max ${max.toFixed(0)} ${c.unit})`));
    if (pts) svg.append(el("svg:polyline", {points: pts, fill: "none", stroke: "#c33", "stroke-width": 1.2, class: "counter"}));
    y += CH;
  }
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${W} ${height}`);
}
renderSummary();
document.getElementById("view").dataset.loaded_ms = (performance.now() - T0).toFixed(1);
// '#click=N' clicks row N; then 'wheel=AT,N' turns the wheel N times (in if N > 0, out if
// N < 0) at AT (0..1) of the plot, 'drag=DX' drags by DX of the plot's width, and
// 'sort=KEY' sorts by a column: each through the same handlers as a person's hand
function act() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.has("sort")) {
    const t0 = performance.now();
    document.querySelector(`#summary th[data-key="${hash.get("sort")}"]`).click();
    document.getElementById("view").dataset.sorted_ms = (performance.now() - t0).toFixed(1);
  }
  if (hash.has("failed")) document.getElementById("failed-only").click();
  if (!hash.has("click")) return;
  const row = document.querySelector(`#summary tbody tr[data-index="${hash.get("click")}"]`);
  if (!row) return;
  row.click();
  const svg = document.getElementById("timeline");
  if (!svg) return;
  const box = svg.getBoundingClientRect(), k = box.width / W;
  const at = f => box.left + (LABEL + f * PLOT) * k;
  for (const part of hash.getAll("wheel")) {
    const [f, n] = part.split(",").map(Number);
    for (let i = 0; i < Math.abs(n); i++)
      svg.dispatchEvent(new WheelEvent("wheel", {deltaY: n > 0 ? -100 : 100, clientX: at(f), clientY: box.top + 30, cancelable: true}));
  }
  if (hash.has("drag")) {
    const dx = Number(hash.get("drag")), y = box.top + 30;
    svg.dispatchEvent(new MouseEvent("mousedown", {clientX: at(0.5), clientY: y}));
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: at(0.5 + dx), clientY: y}));
    window.dispatchEvent(new MouseEvent("mouseup", {clientX: at(0.5 + dx), clientY: y}));
  }
}
act();
</script></body></html>
"""
