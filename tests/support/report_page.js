// Runs a report page's own script under node with a stub DOM (no browser needed) and
// prints the sizes it gives its two canvases, the nodes it drew, its script errors and
// the texts of its summary and its errors box: node report_page.js run.html
"use strict";
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const data = page.match(/<script type="application\/json" id="run-data">([\s\S]*?)<\/script>/)[1];
const scripts = [...page.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
const context = new Proxy({}, {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => { t[k] = v; return true; }});
const elements = {};
function element(id) {
  return {id, attrs: {}, children: [], style: {}, hidden: false, value: "", scrollLeft: 0,
    textContent: id === "run-data" ? data : "", clientWidth: 1200, width: 10, height: 10,
    setAttribute(k, v) { this.attrs[k] = v; }, getAttribute(k) { return this.attrs[k]; },
    appendChild(c) { this.children.push(c); return c; }, addEventListener() {},
    getContext() { return context; }, getBoundingClientRect() { return {left: 0, top: 0}; },
    dispatchEvent() {}};
}
const body = element("body");
global.document = {getElementById: (id) => elements[id] || (elements[id] = element(id)),
  createElement: (tag) => element(tag), createTextNode: () => element("#text"), body};
global.window = {addEventListener() {}};
global.location = {hash: "", search: ""};
global.performance = {now: () => 1};
global.Event = function () {};
for (const script of scripts) eval(script);
const dag = elements.dag, timeline = elements.timeline;
console.log(JSON.stringify({
  dag: [dag.width, dag.height], timeline: [timeline.width, timeline.height],
  drawn: [Number(body.attrs["data-timeline-nodes"]), Number(body.attrs["data-dag-nodes"])],
  errors: body.attrs["data-errors"] || "0",
  summary: elements.summary.textContent,
  problems: elements.errors.children.map((child) => child.textContent),
  steps: (elements.steps || element("steps")).children.map((step) => step.children.map((part) => part.textContent)),
}));
