// trainyard dashboard: charts (uPlot) and live logs (Server-Sent Events). No build step.
// Text from tasks is only ever put in the page through textContent, never as HTML.
"use strict";

const PREFERRED = ["val_loss", "train_loss", "loss", "val_accuracy", "accuracy",
                   "throughput_images_per_s", "images_per_s"];
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                "#e377c2", "#17becf"];

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Rows of [x, y] per run -> uPlot's aligned columns (x union, null where a run has no point).
function align(runs) {
  const xs = [...new Set(runs.flatMap((r) => r.points.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const columns = runs.map((r) => {
    const col = new Array(xs.length).fill(null);
    r.points.forEach((p) => { col[index.get(p[0])] = p[1]; });
    return col;
  });
  return [xs, ...columns];
}

function chart(parent, title, xLabel, runs, timeAxis) {
  const box = el("figure", "chart");
  box.appendChild(el("figcaption", null, title));
  parent.appendChild(box);
  const width = Math.min(560, Math.max(320, parent.clientWidth / 2 - 24));
  const opts = {
    width, height: 220, scales: { x: { time: !!timeAxis } },
    axes: [{ label: xLabel }, { size: 64 }],
    series: [{ label: xLabel }, ...runs.map((r, i) => ({
      label: r.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
      points: { show: true, size: 4 } }))],
  };
  new uPlot(opts, align(runs), box);
}

function metricNames(runs) {
  const names = [...new Set(runs.flatMap((r) => Object.keys(r.series)))];
  const rank = (n) => (PREFERRED.indexOf(n) < 0 ? 100 : PREFERRED.indexOf(n));
  return names.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b)).slice(0, 12);
}

function drawCurves(parent, runs) {
  if (!runs.length) return;
  const section = el("div", "charts curves");
  section.appendChild(el("h3", null, "Training curves"));
  parent.appendChild(section);
  for (const name of metricNames(runs)) {
    const lines = runs.filter((r) => r.series[name])
      .map((r) => ({ label: r.run, points: r.series[name] }));
    chart(section, name, "epoch", lines, false);
  }
}

function drawUsage(parent, usage) {
  if (!usage.length) return;
  const section = el("div", "charts usage");
  section.appendChild(el("h3", null, "Utilisation (sampled by the runner)"));
  parent.appendChild(section);
  const pick = (fn) => usage.map((u) => ({ label: `${u.task}/${u.retry_id}`,
    points: u.samples.map((s) => [s.time_s, fn(s)]) }));
  chart(section, "CPU % (100 = one core)", "time", pick((s) => s.cpu_percent), true);
  chart(section, "Memory RSS (MiB)", "time", pick((s) => s.rss_bytes / 1048576), true);
  if (usage.some((u) => u.samples.some((s) => s.gpus && s.gpus.length))) {
    const sum = (s, key) => (s.gpus || []).reduce((a, g) => a + (g[key] || 0), 0);
    chart(section, "GPU utilisation % (sum of the task's GPUs)", "time",
      pick((s) => sum(s, "util_percent")), true);
    chart(section, "GPU memory (MiB)", "time",
      pick((s) => sum(s, "memory_used_bytes") / 1048576), true);
  }
}

function draw(parent, data) {
  parent.replaceChildren();
  drawCurves(parent, data.curves || []);
  drawUsage(parent, data.usage || []);
  if (!parent.children.length) {
    parent.appendChild(el("p", "empty", "No metrics yet: the trainer's metrics.jsonl, or any " +
      "metrics.jsonl a task writes under its output folder (docs/dashboard.md), shows here."));
  }
  parent.dataset.drawn = "1";
}

function followCharts(parent) {
  let last = "";
  const refresh = () => fetch(parent.dataset.metricsUrl, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((text) => {
      if (text !== last) { last = text; draw(parent, JSON.parse(text)); }
      const ended = JSON.parse(text).status;
      if (!/^(COMPLETED|FAILED)/.test(ended)) setTimeout(refresh, 5000);
    })
    .catch(() => setTimeout(refresh, 10000));
  refresh();
}

function followLogs(pre) {
  const search = document.getElementById("log-search");
  const count = document.getElementById("log-count");
  const state = document.getElementById("log-state");
  const tail = document.getElementById("log-tail");
  let total = 0;
  const matches = (node) => !search.value ||
    node.textContent.toLowerCase().includes(search.value.toLowerCase());
  const recount = () => {
    let shown = 0;
    for (const node of pre.children) { node.hidden = !matches(node); shown += node.hidden ? 0 : 1; }
    count.textContent = search.value ? `${shown} of ${total} lines` : `${total} lines`;
  };
  search.addEventListener("input", recount);
  const source = new EventSource(pre.dataset.stream);
  source.onopen = () => { state.textContent = "following"; };
  source.onmessage = (event) => {
    const line = JSON.parse(event.data);
    const time = line.time ? line.time.slice(11, 19) : "";
    const node = el("span", "line", `${time} [${line.task}#${line.retry_id}] ${line.line}\n`);
    node.hidden = !matches(node);
    pre.appendChild(node);
    total += 1;
    count.textContent = search.value ? count.textContent : `${total} lines`;
    if (tail.checked) pre.scrollTop = pre.scrollHeight;
  };
  source.addEventListener("end", () => {
    source.close();
    state.textContent = "ended";
    state.className = "ended";
    recount();
  });
  source.onerror = () => { if (state.className !== "ended") state.textContent = "reconnecting…"; };
}

// The list refreshes itself every 5 s (htmx); not while a row is ticked for comparison.
document.addEventListener("htmx:beforeRequest", (event) => {
  const target = event.detail.elt;
  if (target.id === "wf-table" && target.querySelector("input:checked")) event.preventDefault();
});

// Cancel and Restart ask first (forms with data-confirm; delegated, so htmx swaps keep it).
document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

document.addEventListener("DOMContentLoaded", () => {
  const charts = document.getElementById("charts");
  if (charts && charts.dataset.metricsUrl) followCharts(charts);
  if (charts && charts.dataset.runs) draw(charts, { curves: JSON.parse(charts.dataset.runs) });
  const log = document.getElementById("log");
  if (log && log.dataset.stream) followLogs(log);
});
