"""The report page: one HTML file, its CSS, script and data inline. Pure.

Nothing is fetched when the page opens (no CDN, no font, no image), so it works offline
and from an e-mail attachment. Both views are drawn on a ``<canvas>``: one rectangle per
node and one path per kind of edge, whatever the run's size (a DOM node or an SVG element
per node would make a 10,000-node run slow to open). A click finds the node under the
pointer with a binary search in its lane (timeline) or column (DAG).

When drawn, the page sets ``data-timeline-nodes``, ``data-dag-nodes`` and
``data-errors`` (script errors caught on the page) on ``<body>``: the test suite opens
the report in a headless Chromium and reads them.
"""

from __future__ import annotations

import html
from typing import Any

from .._json import dumps as finite_dumps

__all__ = ["render_page"]


def embed_json(data: Any) -> str:
    """``data`` as JSON that can stand inside a ``<script>`` element: no ``<``, ``>`` or
    ``&`` in it, so no text of a run can close the element or open another. A number
    JSON cannot hold (infinity, NaN: a cost that overflowed) is null, shown as unknown."""
    text = finite_dumps(data, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def html_document(
    *, title: str, style: str, body: str, script: str, data: Any, data_id: str
) -> str:
    """One self-contained page (fetches nothing): ``body``, then ``data`` as JSON in
    ``<script type="application/json" id=data_id>`` and the page's ``script``. ``title``
    is escaped here; ``body`` is the caller's HTML, already escaped."""
    return (
        _HEAD.replace("__TITLE__", html.escape(title)).replace("__STYLE__", style)
        + body
        + f'<script type="application/json" id="{data_id}">{embed_json(data)}</script>\n'
        + f"<script>{script}</script>\n</body>\n</html>\n"
    )


def render_page(data: dict[str, Any]) -> str:
    """The whole HTML document for `report_data` output."""
    title = str(data.get("title", "rlm-graph run"))
    return html_document(
        title=title,
        style=_STYLE,
        body=_BODY.replace("__TITLE__", html.escape(title)),
        script=_SCRIPT,
        data=data,
        data_id="run-data",
    )


_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body data-errors="0">
"""

_BODY = """<header><h1>__TITLE__</h1><div id="summary"></div></header>
<main>
<section id="views">
  <div class="legend" id="legend"></div>
  <h2>Timeline <small>one lane per node in flight; red outline: failed; grey: cancelled</small>
    <button id="zoom-out" title="zoom out">&minus;</button><button id="zoom-in" title="zoom in">+</button></h2>
  <div class="scroll" id="timeline-box"><canvas id="timeline" width="10" height="10"></canvas></div>
  <h2>Graph <small>columns by dependency; orange: critical path; dashed: spawned by</small></h2>
  <div class="scroll" id="dag-box"><canvas id="dag" width="10" height="10"></canvas></div>
</section>
<aside>
  <h2>Node</h2><div id="details"><p class="muted">Click a node in the timeline or the graph.</p></div>
  <h2>Models</h2><table id="models"></table>
  <h2>Errors and limit stops</h2><div id="errors"></div>
</aside>
</main>
<section id="trajectory" hidden>
  <h2>Trajectory <small>every turn's reply, every block's code and output, every sub-call's
    prompt and answer, in the order they ran</small>
    <input id="trajectory-search" type="search" placeholder="search the run" aria-label="search the run">
    <span id="trajectory-count" class="muted"></span></h2>
  <div id="steps"></div>
</section>
"""

_STYLE = """
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1f2328;background:#fff}
header{padding:10px 16px;border-bottom:1px solid #d0d7de;background:#f6f8fa}
h1{font-size:17px;margin:0 0 4px}
h2{font-size:14px;margin:14px 0 6px}
h2 small{font-weight:normal;color:#656d76}
main{display:flex;gap:16px;padding:0 16px 16px}
#views{flex:1 1 auto;min-width:0}
aside{flex:0 0 400px;min-width:0}
.scroll{overflow:auto;max-height:46vh;border:1px solid #d0d7de;border-radius:4px}
canvas{display:block;cursor:crosshair}
.legend span{display:inline-block;margin:8px 12px 0 0}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
table{border-collapse:collapse;width:100%}
td,th{padding:2px 4px;border-bottom:1px solid #eaeef2;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
#details dl{display:grid;grid-template-columns:auto 1fr;gap:2px 8px;margin:0}
#details dt{color:#656d76}
#details dd{margin:0;overflow-wrap:anywhere}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;padding:6px;margin:4px 0;max-height:180px;overflow:auto}
.muted{color:#656d76}
button{margin-left:6px;min-width:24px;font:inherit;cursor:pointer}
.err{color:#cf222e}
#errors li{cursor:pointer}
#trajectory{padding:0 16px 24px}
#trajectory-search{margin-left:12px;font:inherit;padding:2px 6px;width:260px}
.step{border-left:3px solid #d0d7de;margin:6px 0;padding:2px 0 2px 8px}
.step h3{font-size:12px;margin:0;font-weight:600;cursor:pointer}
.step pre{max-height:24em}
.step .label{color:#656d76;font-size:11px;margin:4px 0 0}
"""

_SCRIPT = r"""
"use strict";
(function () {
  var body = document.body;
  var errors = 0;
  function fail() { errors += 1; body.setAttribute("data-errors", String(errors)); }
  window.addEventListener("error", fail);
  window.addEventListener("unhandledrejection", fail);

  var D = JSON.parse(document.getElementById("run-data").textContent);
  var N = D.nodes, n = N.id.length;
  var PALETTE = {root_turn: "#0969da", repl_block: "#8250df", llm_call: "#1a7f37",
                 rlm_call: "#bf8700", compaction: "#57606a", function: "#0a7e8c"};
  var kindColor = D.kinds.map(function (k) { return PALETTE[k] || "#6e7781"; });
  var ERROR = D.statuses.indexOf("error"), CANCELLED = D.statuses.indexOf("cancelled");
  var selected = -1;

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function decoded(text) {  // a stray % (run.html?q=50%) is text, not a broken page
    try { return decodeURIComponent(text); } catch (e) { return text; }
  }
  function fmt(x, digits) { return x == null ? "-" : Number(x).toFixed(digits); }
  function num(x) { return Number(x).toLocaleString("en-US"); }

  // -- summary, legend, tables ---------------------------------------------------------
  var failed = D.errors.length;
  var summary = n + " nodes, makespan " + fmt(D.makespan, 3) + " s, critical path " +
    fmt(D.critical_seconds, 3) + " s, " + failed + " failed, " + D.cancelled + " cancelled";
  // How the run ended: a journal keeps only a run's status, said in words (D.ended).
  var ending = D.ended || (D.stop_reason ? "stopped by " + D.stop_reason : "");
  if (ending) summary += ", " + ending;
  document.getElementById("summary").textContent = summary;
  var legend = document.getElementById("legend");
  D.kinds.forEach(function (k, i) {
    var s = el("span"); var sw = el("i"); sw.style.background = kindColor[i];
    s.appendChild(sw); s.appendChild(document.createTextNode(k)); legend.appendChild(s);
  });
  var models = document.getElementById("models");
  var head = el("tr");
  ["model", "calls", "in tokens", "out tokens", "cost $"].forEach(function (h) { head.appendChild(el("th", h)); });
  models.appendChild(head);
  D.usage.forEach(function (u) {
    var tr = el("tr");
    [u.model, num(u.calls), num(u.input_tokens), num(u.output_tokens), fmt(u.cost, 4)].forEach(function (v) { tr.appendChild(el("td", v)); });
    models.appendChild(tr);
  });
  if (!D.usage.length) { var tr = el("tr"); tr.appendChild(el("td", "no model calls", "muted")); models.appendChild(tr); }
  var errorsBox = document.getElementById("errors");
  if (ending) errorsBox.appendChild(el("p", "The run " + (D.ended || "was " + ending) + ".", "err"));
  if (D.cancelled) errorsBox.appendChild(el("p", D.cancelled + " node(s) cancelled.", "muted"));
  if (failed) {
    var ul = el("ul");
    D.errors.slice(0, 500).forEach(function (i) {
      var li = el("li", N.id[i] + " — " + N.error[i], "err");
      li.addEventListener("click", function () { select(i); });
      ul.appendChild(li);
    });
    if (failed > 500) ul.appendChild(el("li", "… and " + (failed - 500) + " more", "muted"));
    errorsBox.appendChild(ul);
  } else if (!ending) {
    errorsBox.appendChild(el("p", "No failed node.", "muted"));
  }

  // -- timeline ------------------------------------------------------------------------
  var MAX_CANVAS = 30000, AXIS = 18;
  var tl = document.getElementById("timeline"), tlBox = document.getElementById("timeline-box");
  var lanes = 0, timed = [];
  for (var i = 0; i < n; i++) {
    if (N.start[i] != null && N.lane[i] >= 0) { timed.push(i); lanes = Math.max(lanes, N.lane[i] + 1); }
  }
  var tlWidth = Math.max(600, tlBox.clientWidth - 2);
  // Lanes are 3 pixels at least, until the canvas would pass 30,000 (browsers draw no
  // larger one): past that, lanes share pixels.
  var laneH = Math.min(14, Math.max(3, Math.floor(12000 / Math.max(1, lanes))),
                       (MAX_CANVAS - AXIS - 2) / Math.max(1, lanes));
  var span = Math.max(D.makespan, 1e-9);
  for (var t = 0; t < timed.length; t++) { var e0 = N.end[timed[t]]; if (e0 != null && e0 > span) span = e0; }
  var baseScale = (tlWidth - 20) / span, scaleX = baseScale;
  function zoom(factor) {
    // A canvas past ~32,000 pixels is not drawn by browsers: the zoom stops there.
    var next = Math.min(Math.max(scaleX * factor, baseScale), (MAX_CANVAS - 20) / span);
    var centre = (tlBox.scrollLeft + tlBox.clientWidth / 2 - 10) / scaleX;
    scaleX = next; tlWidth = Math.round(20 + span * scaleX);
    drawTimeline();
    tlBox.scrollLeft = Math.max(0, 10 + centre * scaleX - tlBox.clientWidth / 2);
  }
  var byLane = [];
  for (var l = 0; l < lanes; l++) byLane.push([]);
  timed.forEach(function (i) { byLane[N.lane[i]].push(i); });
  byLane.forEach(function (list) { list.sort(function (a, b) { return N.start[a] - N.start[b]; }); });
  function tlRect(i) {
    var x = 10 + N.start[i] * scaleX;
    var end = N.end[i] == null ? N.start[i] : N.end[i];
    var w = Math.max(1, (end - N.start[i]) * scaleX);
    return [x, AXIS + N.lane[i] * laneH + 1, w, Math.max(1, laneH - 2)];
  }
  function drawAxis(c) {
    var raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (m) { return m * mag; }).filter(function (s) { return s >= raw; })[0];
    c.fillStyle = "#656d76"; c.strokeStyle = "#eaeef2"; c.lineWidth = 1; c.font = "11px sans-serif";
    for (var t = 0; t <= span + 1e-12; t += step) {
      var x = Math.round(10 + t * scaleX) + 0.5;
      c.beginPath(); c.moveTo(x, AXIS - 4); c.lineTo(x, tl.height); c.stroke();
      c.fillText(t.toFixed(Math.max(0, -Math.floor(Math.log10(step)))) + " s", x + 2, 11);
    }
  }
  function drawTimeline() {
    tl.width = tlWidth; tl.height = Math.max(20, Math.ceil(AXIS + lanes * laneH + 2));
    var c = tl.getContext("2d"), drawn = 0;
    c.clearRect(0, 0, tl.width, tl.height);
    drawAxis(c);
    for (var k = 0; k < timed.length; k++) {
      var i = timed[k], r = tlRect(i);
      c.fillStyle = N.status[i] === CANCELLED ? "#afb8c1" : kindColor[N.kind[i]];
      c.fillRect(r[0], r[1], r[2], r[3]);
      drawn += 1;
    }
    c.strokeStyle = "#cf222e"; c.lineWidth = 1.5;
    for (var k2 = 0; k2 < timed.length; k2++) {
      var j = timed[k2];
      if (N.status[j] === ERROR) { var q = tlRect(j); c.strokeRect(q[0], q[1], q[2], q[3]); }
    }
    if (selected >= 0 && N.lane[selected] >= 0 && N.start[selected] != null) {
      var s = tlRect(selected); c.strokeStyle = "#000"; c.lineWidth = 2;
      c.strokeRect(s[0] - 1, s[1] - 1, s[2] + 2, s[3] + 2);
    }
    return drawn;
  }
  function hitTimeline(x, y) {
    var lane = Math.floor((y - AXIS) / laneH);
    if (lane < 0 || lane >= lanes) return -1;
    var list = byLane[lane], t = (x - 10) / scaleX, lo = 0, hi = list.length - 1, found = -1;
    while (lo <= hi) {  // the last node of the lane that starts at or before t
      var mid = (lo + hi) >> 1;
      if (N.start[list[mid]] <= t) { found = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    // Of the nodes drawn at x (within 2 px), the one x is inside, else the nearest; among
    // those, the one whose centre is nearest: nodes shorter than a pixel are drawn a pixel
    // wide, so several may cover x, and the search by start time lands on the last.
    var best = -1, bestScore = Infinity;
    function consider(k) {
      var r = tlRect(list[k]);
      var outside = x < r[0] ? r[0] - x : x > r[0] + r[2] ? x - r[0] - r[2] : 0;
      if (outside > 2) return false;
      var score = outside * 1e6 + Math.abs(x - (r[0] + r[2] / 2));
      if (score < bestScore) { best = list[k]; bestScore = score; }
      return true;
    }
    for (var k = found; k >= 0 && found - k < 64; k--) if (!consider(k) && k < found) break;
    for (var k2 = found + 1; k2 < list.length && k2 - found < 64; k2++) if (!consider(k2)) break;
    return best;
  }

  // -- DAG -----------------------------------------------------------------------------
  var dag = document.getElementById("dag"), DAG_MAX = 8000;
  var cols = 0, rowsMax = 0;
  for (var d = 0; d < n; d++) { cols = Math.max(cols, N.col[d] + 1); rowsMax = Math.max(rowsMax, N.row[d] + 1); }
  // 8,000 pixels across and down at most: past that, columns (rows) share pixels.
  var colW = Math.min(90, (DAG_MAX - 24) / Math.max(1, cols));
  var rowH = Math.min(22, (DAG_MAX - 20) / Math.max(1, rowsMax));
  var radius = Math.max(1, Math.min(6, Math.floor(Math.min(colW, rowH) / 2) - 1));
  var byCol = [];
  for (var cc = 0; cc < cols; cc++) byCol.push([]);
  for (var d2 = 0; d2 < n; d2++) byCol[N.col[d2]].push(d2);
  byCol.forEach(function (list) { list.sort(function (a, b) { return N.row[a] - N.row[b]; }); });
  function px(i) { return 12 + N.col[i] * colW; }
  function py(i) { return 10 + N.row[i] * rowH; }
  var onPath = new Uint8Array(n);
  D.critical.forEach(function (i) { onPath[i] = 1; });
  function drawDag() {
    dag.width = Math.max(600, Math.ceil(24 + cols * colW));
    dag.height = Math.max(40, Math.ceil(20 + rowsMax * rowH));
    var c = dag.getContext("2d"), E = D.edges, drawn = 0;
    c.clearRect(0, 0, dag.width, dag.height);
    [0, 1].forEach(function (spawn) {
      c.beginPath();
      for (var k = 0; k < E.length; k += 3) {
        if (E[k + 2] !== spawn) continue;
        c.moveTo(px(E[k]), py(E[k])); c.lineTo(px(E[k + 1]), py(E[k + 1]));
      }
      c.strokeStyle = spawn ? "#c5ccd3" : "#8c959f"; c.lineWidth = 1;
      c.setLineDash(spawn ? [3, 3] : []); c.stroke();
    });
    c.setLineDash([]);
    if (D.critical.length > 1) {
      c.beginPath(); c.moveTo(px(D.critical[0]), py(D.critical[0]));
      for (var p = 1; p < D.critical.length; p++) c.lineTo(px(D.critical[p]), py(D.critical[p]));
      c.strokeStyle = "#fb8500"; c.lineWidth = 3; c.stroke();
    }
    for (var i = 0; i < n; i++) {
      c.fillStyle = N.status[i] === CANCELLED ? "#afb8c1" : kindColor[N.kind[i]];
      c.fillRect(px(i) - radius, py(i) - radius, 2 * radius + 1, 2 * radius + 1);
      if (N.status[i] === ERROR || onPath[i]) {
        c.strokeStyle = N.status[i] === ERROR ? "#cf222e" : "#fb8500"; c.lineWidth = 2;
        c.strokeRect(px(i) - radius - 1, py(i) - radius - 1, 2 * radius + 3, 2 * radius + 3);
      }
      drawn += 1;
    }
    if (selected >= 0) {
      c.strokeStyle = "#000"; c.lineWidth = 2;
      c.strokeRect(px(selected) - radius - 3, py(selected) - radius - 3, 2 * radius + 7, 2 * radius + 7);
    }
    return drawn;
  }
  function hitDag(x, y) {
    var col = Math.round((x - 12) / colW);
    if (col < 0 || col >= cols) return -1;
    var list = byCol[col], lo = 0, hi = list.length - 1, best = -1, bestD = Infinity;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (py(list[mid]) < y) lo = mid + 1; else hi = mid - 1;
    }
    for (var k = Math.max(0, lo - 1); k <= Math.min(list.length - 1, lo); k++) {
      var dd = Math.abs(py(list[k]) - y);
      if (dd < bestD) { bestD = dd; best = list[k]; }
    }
    return bestD <= Math.max(rowH, 6) ? best : -1;
  }

  // -- details -------------------------------------------------------------------------
  function select(i) {
    selected = i;
    var box = document.getElementById("details");
    box.textContent = "";
    var dl = el("dl");
    function row(k, v) { dl.appendChild(el("dt", k)); dl.appendChild(el("dd", v)); }
    row("id", N.id[i]); row("kind", D.kinds[N.kind[i]]); row("status", D.statuses[N.status[i]]);
    row("depth", String(N.depth[i]));
    if (N.model[i] >= 0) row("model", D.models[N.model[i]]);
    row("start", fmt(N.start[i], 3) + " s"); row("end", fmt(N.end[i], 3) + " s");
    if (N.start[i] != null && N.end[i] != null) row("duration", fmt(N.end[i] - N.start[i], 3) + " s");
    if (N.tokens[i]) row("tokens", num(N.tokens[i]));
    if (N.cost[i] != null) row("cost", "$" + fmt(N.cost[i], 5));
    if (onPath[i]) row("critical path", "yes");
    box.appendChild(dl);
    if (N.error[i]) { box.appendChild(el("h2", "Error")); box.appendChild(el("pre", N.error[i], "err")); }
    box.appendChild(el("h2", "Input")); box.appendChild(el("pre", N.input[i] || "(none)"));
    box.appendChild(el("h2", "Output")); box.appendChild(el("pre", N.output[i] || "(none)"));
    body.setAttribute("data-selected", N.id[i]);
    drawTimeline(); drawDag();
  }
  function clickHandler(canvas, hit) {
    canvas.addEventListener("click", function (ev) {
      var r = canvas.getBoundingClientRect();
      var i = hit(ev.clientX - r.left, ev.clientY - r.top);
      if (i >= 0) select(i);
    });
  }
  clickHandler(tl, hitTimeline);
  document.getElementById("zoom-in").addEventListener("click", function () { zoom(2); });
  document.getElementById("zoom-out").addEventListener("click", function () { zoom(0.5); });
  clickHandler(dag, hitDag);
  window.rlmReport = {select: select, zoom: zoom, hitTimeline: hitTimeline, hitDag: hitDag, tlRect: tlRect,
                      dagPoint: function (i) { return [px(i), py(i)]; }};

  body.setAttribute("data-timeline-nodes", String(drawTimeline()));
  body.setAttribute("data-dag-nodes", String(drawDag()));
  body.setAttribute("data-lanes", String(lanes));
  // Milliseconds from navigation start to both views drawn (bench/report_scale.py).
  body.setAttribute("data-drawn-ms", String(Math.round(performance.now())));
  if (location.hash === "#selftest") {
    // What a click would find at the centre of each node: itself (the test suite checks).
    var misses = 0, exact = 0, tried = 0, step = Math.max(1, Math.floor(n / 2000));
    for (var h = 0; h < n; h += step) {
      if (N.start[h] != null && N.lane[h] >= 0) {
        var r0 = tlRect(h), got = hitTimeline(r0[0] + r0[2] / 2, r0[1] + r0[3] / 2);
        tried += 1; if (got < 0) misses += 1; else if (got === h) exact += 1;
      }
      var hd = hitDag(px(h), py(h));
      tried += 1; if (hd < 0) misses += 1; else if (hd === h) exact += 1;
    }
    body.setAttribute("data-hit-tried", String(tried));
    body.setAttribute("data-hit-misses", String(misses));
    body.setAttribute("data-hit-exact", String(exact));
    body.setAttribute("data-hit-misses", String(misses));
  }
  // -- the trajectory (runs that recorded content) --------------------------------------
  var LABELS = {root_turn: ["new message", "reply"], repl_block: ["code", "output"],
                llm_call: ["prompt", "answer"], rlm_call: ["prompt", "answer"],
                compaction: ["history", "rewritten"], function: ["input", "output"]};
  var steps = [];
  if (D.trajectory) {
    var box = document.getElementById("steps");
    document.getElementById("trajectory").hidden = false;
    D.trajectory.forEach(function (row) {
      var i = row[0], kind = D.kinds[N.kind[i]], labels = LABELS[kind] || ["input", "output"];
      var step = el("div", undefined, "step");
      step.style.marginLeft = (row[1] * 18) + "px";
      step.style.borderLeftColor = kindColor[N.kind[i]];
      step.setAttribute("data-node", N.id[i]);
      var title = el("h3", kind + " " + N.id[i] + (N.model[i] >= 0 ? "  " + D.models[N.model[i]] : "") +
                     "  " + D.statuses[N.status[i]]);
      title.addEventListener("click", function () { select(i); });
      step.appendChild(title);
      var cut = N.content_preview[i] ? " (its preview only: the node did not finish)" : "";
      [[labels[0] + cut, N.content_in[i]], [labels[1], N.content_out[i]]].forEach(function (part) {
        if (part[1] == null) return;
        step.appendChild(el("p", part[0], "label"));
        step.appendChild(el("pre", part[1] === "" ? "(empty)" : part[1]));
      });
      if (N.error[i]) step.appendChild(el("pre", N.error[i], "err"));
      box.appendChild(step);
      steps.push(step);
    });
    var count = document.getElementById("trajectory-count");
    var search = document.getElementById("trajectory-search");
    function filter() {
      var q = search.value.toLowerCase(), shown = 0;
      steps.forEach(function (s) {
        var hit = !q || s.textContent.toLowerCase().indexOf(q) >= 0;
        s.hidden = !hit; shown += hit ? 1 : 0;
      });
      count.textContent = shown + " of " + steps.length + " steps";
      body.setAttribute("data-trajectory-shown", String(shown));
    }
    search.addEventListener("input", filter);
    var query = /[?&]q=([^&#]*)/.exec(location.search);  // run.html?q=... opens searched
    if (query) search.value = decoded(query[1].replace(/\+/g, " "));
    filter();
  }
  body.setAttribute("data-trajectory-steps", String(steps.length));
  window.rlmReport.search = function (q) {
    var s = document.getElementById("trajectory-search"); s.value = q; s.dispatchEvent(new Event("input"));
  };

  var wanted = decoded(location.hash.replace(/^#node=/, ""));
  if (location.hash.indexOf("#node=") === 0) {
    var at = N.id.indexOf(wanted);
    if (at >= 0) select(at);
  }
})();
"""
