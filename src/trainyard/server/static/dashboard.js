// trainyard dashboard: charts (uPlot) and live logs (Server-Sent Events). No build step.
// Text from tasks is only ever put in the page through textContent, never as HTML.
"use strict";

const PREFERRED = ["val_loss", "train_loss", "loss", "val_accuracy", "accuracy",
                   "throughput_images_per_s", "images_per_s"];
// Charted unless the user picks otherwise: losses, accuracies, throughputs.
const DEFAULT_METRIC = /loss|acc|throughput|per_s$/i;
const DEFAULT_COUNT = 3;  // charts shown when no metric has such a name
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                "#e377c2", "#17becf"];

// What the chart controls say; kept across refreshes (null: the defaults).
const view = { chosen: null, smooth: 0, log: false, x: "data", plots: [], part: "",
               curvesKey: null, usageKey: null, saved: null };

// The chart choices are kept in the browser (localStorage) across page loads, one set for
// every workflow and /compare: a user's way of looking at curves (log scale, smoothing, time
// axis) is a habit, and runs of one trainer share their metric names, so a choice made on
// one run applies to the next run at once (per workflow, each new run would start from the
// defaults again). Metrics a page does not have are ignored there; none left: the defaults.
const CHART_CHOICES = "trainyard.charts";
const LOG_DETAIL = "trainyard.logs.detail";

function stored(key) {
  try { return window.localStorage.getItem(key); } catch (e) { return null; }
}

function store(key, value) {
  try { window.localStorage.setItem(key, value); } catch (e) { /* storage off: not kept */ }
}

function loadChartChoices() {
  let saved = null;
  try { saved = JSON.parse(stored(CHART_CHOICES) || "null"); } catch (e) { saved = null; }
  if (!saved || typeof saved !== "object") return;
  if (Array.isArray(saved.chosen)) view.saved = saved.chosen.map(String);
  const smoothing = Number(saved.smooth);
  if (smoothing >= 0 && smoothing <= 0.99) view.smooth = smoothing;
  view.log = saved.log === true;
  if (saved.x === "time" || saved.x === "data") view.x = saved.x;
}

// Save the controls; the picker keeps the saved metrics this page does not show (`names`).
function saveChartChoices(names) {
  const here = new Set(names);
  const elsewhere = (view.saved || []).filter((n) => !here.has(n));
  const chosen = view.chosen ? [...elsewhere, ...view.chosen] : view.saved;
  view.saved = chosen;
  store(CHART_CHOICES, JSON.stringify({ chosen, smooth: view.smooth, log: view.log, x: view.x }));
}

// The saved picker's metrics among `names` (null: none saved, or none of them here).
function savedChoice(names) {
  if (!view.saved) return null;
  const chosen = names.filter((n) => view.saved.includes(n));
  return chosen.length ? new Set(chosen) : null;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The one time format of the dashboard: UTC, "YYYY-MM-DD HH:MM:SS" (as the server's pages).
function utc(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 19).replace("T", " ");
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

// Exponential moving average of a series' points (weight `alpha` on the past), as
// TensorBoard's smoothing; 0 leaves them as they are.
function smooth(points, alpha) {
  if (!alpha) return points;
  let last = null;
  return points.map(([x, y]) => {
    last = last === null ? y : alpha * last + (1 - alpha) * y;
    return [x, last];
  });
}

function xAxis(xName) {
  const time = xName === "time";
  const label = time ? "time (UTC)" : xName;
  const axis = { label, labelSize: 18 };
  if (!time) {  // steps and epochs are counted: whole-number ticks
    axis.incrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4,
                  5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];
  } else {
    axis.values = (u, splits) => splits.map((s) => (s == null ? "" : utc(s).replace(" ", "\n")));
    axis.size = 52;
    axis.space = 90;
  }
  return { label, time, axis,
           value: (u, v) => (v == null ? "--" : time ? utc(v) : String(v)) };
}

// One chart: `runs` [{label, points: [[x, y]]}]; `sync` the hover group it shares.
function chart(parent, title, xName, runs, sync, opts = {}) {
  const box = el("figure", "chart");
  box.appendChild(el("figcaption", null, title));
  box.dataset.scale = opts.log ? "log" : "linear";
  parent.appendChild(box);
  const x = xAxis(xName);
  const width = Math.min(560, Math.max(320, parent.clientWidth / 2 - 24));
  const lines = opts.log ? runs.map((r) => ({ ...r,
    points: r.points.map(([px, py]) => [px, py > 0 ? py : null]) })) : runs;
  const plot = new uPlot({
    width, height: 220,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    scales: { x: { time: x.time }, y: opts.log ? { distr: 3, log: 10 } : {} },
    axes: [x.axis, { size: 64 }],
    cursor: { sync: { key: sync, setSeries: true } },
    series: [{ label: x.label, value: x.value }, ...lines.map((r, i) => ({
      label: r.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
      points: { show: true, size: 4 } }))],
  }, align(lines), box);
  view.plots.push({ part: view.part, plot });
}

// Metric -> {x name -> [{label, points}]}, and which metrics never change value.
function metricTable(runs) {
  const table = new Map();
  const values = new Map();
  for (const r of runs) {
    for (const [name, points] of Object.entries(r.series)) {
      if (!table.has(name)) table.set(name, new Map());
      const byX = table.get(name);
      const xName = r.x || "step";
      if (!byX.has(xName)) byX.set(xName, []);
      byX.get(xName).push({ label: r.run, points });
      if (!values.has(name)) values.set(name, new Set());
      points.forEach((p) => values.get(name).add(p[1]));
    }
  }
  const rank = (n) => (PREFERRED.indexOf(n) < 0 ? 100 : PREFERRED.indexOf(n));
  const names = [...table.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  // Constant: one value over several points (a single point is not called constant yet).
  const counts = new Map(names.map((n) => [n, 0]));
  runs.forEach((r) => Object.entries(r.series).forEach(([n, pts]) => {
    counts.set(n, counts.get(n) + pts.length);
  }));
  const constant = new Set(names.filter((n) => values.get(n).size < 2 && counts.get(n) > 1));
  return { table, names, constant };
}

function defaultChoice(names, constant) {
  const varying = names.filter((n) => !constant.has(n));
  const preferred = varying.filter((n) => DEFAULT_METRIC.test(n));
  return new Set(preferred.length ? preferred : varying.slice(0, DEFAULT_COUNT));
}

// The controls above the curves: which metrics, smoothing, log scale.
function controls(parent, names, constant, chosen, redraw, runs) {
  const changed = () => { saveChartChoices(names); redraw(); };
  const bar = el("div", "chart-controls");
  bar.id = "chart-controls";
  const picker = el("fieldset", "chart-picker");
  picker.id = "chart-picker";
  picker.appendChild(el("legend", null, "Charts"));
  for (const name of names) {
    const label = el("label");
    label.dataset.metric = name;
    const box = el("input");
    Object.assign(box, { type: "checkbox", name: "metric", value: name, checked: chosen.has(name) });
    box.addEventListener("change", () => {
      view.chosen = new Set([...picker.querySelectorAll("input:checked")].map((i) => i.value));
      changed();
    });
    label.append(box, ` ${name}`);
    if (constant.has(name)) label.appendChild(el("small", "constant", " (constant)"));
    picker.appendChild(label);
  }
  const smoothing = el("label", "smoothing", "Smoothing ");
  const slider = el("input");
  Object.assign(slider, { type: "range", id: "chart-smooth", min: "0", max: "0.99",
                          step: "0.01", value: String(view.smooth) });
  const shown = el("span", null, view.smooth.toFixed(2));
  shown.id = "chart-smooth-value";
  slider.addEventListener("input", () => {
    view.smooth = Number(slider.value);
    shown.textContent = view.smooth.toFixed(2);
    changed();
  });
  smoothing.append(slider, " ", shown);
  const log = el("label", "log-scale");
  const logBox = el("input");
  Object.assign(logBox, { type: "checkbox", id: "chart-log", checked: view.log });
  logBox.addEventListener("change", () => { view.log = logBox.checked; changed(); });
  log.append(logBox, " log scale");
  bar.append(picker, smoothing, log);
  if (hasTimes(runs)) {  // the rows carry a time too: step (or epoch) or time, as the user likes
    const axis = el("label", "x-axis", "x axis ");
    const select = el("select");
    select.id = "chart-x";
    const own = [...new Set(runs.map((r) => r.x || "step"))].join(" / ");
    for (const [value, text] of [["data", own], ["time", "time (UTC)"]]) {
      const option = el("option", null, text);
      option.value = value;
      option.selected = view.x === value;
      select.appendChild(option);
    }
    select.addEventListener("change", () => { view.x = select.value; changed(); });
    axis.appendChild(select);
    bar.appendChild(axis);
  }
  parent.appendChild(bar);
}

// Whether some run's rows carry a time beside their step or epoch (a second x axis).
function hasTimes(runs) {
  return runs.some((r) => r.x !== "time" && r.times && Object.keys(r.times).length);
}

// The runs with each point at its row's time (points without one left out); a run without
// times keeps its own x axis.
function onTime(runs) {
  return runs.map((r) => {
    if (r.x === "time" || !r.times || !Object.keys(r.times).length) return r;
    const series = {};
    for (const [name, points] of Object.entries(r.series)) {
      const times = r.times[name] || [];
      series[name] = points.map((p, i) => [times[i], p[1]]).filter((p) => p[0] != null);
    }
    return { ...r, x: "time", series };
  });
}

function drawCurves(parent, allRuns, redraw) {
  if (!allRuns.length) return;
  const runs = view.x === "time" ? onTime(allRuns) : allRuns;
  const { table, names, constant } = metricTable(runs);
  const chosen = view.chosen || savedChoice(names) || defaultChoice(names, constant);
  const section = el("div", "charts curves");
  section.appendChild(el("h3", null, "Training curves"));
  parent.appendChild(section);
  controls(section, names, constant, chosen, redraw, allRuns);
  const xNames = new Set(runs.map((r) => r.x || "step"));
  for (const name of names.filter((n) => chosen.has(n))) {
    for (const [xName, lines] of table.get(name)) {
      const title = xNames.size > 1 ? `${name} by ${xName}` : name;
      const shown = lines.map((l) => ({ label: l.label, points: smooth(l.points, view.smooth) }));
      chart(section, title, xName, shown, `curves-${xName}`, { log: view.log });
    }
  }
}

function drawUsage(parent, usage) {
  if (!usage.length) return;
  const section = el("div", "charts usage");
  section.appendChild(el("h3", null, "Utilisation (sampled by the runner)"));
  parent.appendChild(section);
  const pick = (fn) => usage.map((u) => ({ label: `${u.task}/${u.retry_id}`,
    points: u.samples.map((s) => [s.time_s, fn(s)]) }));
  const sync = "usage-time";
  chart(section, "CPU % (100 = one core)", "time", pick((s) => s.cpu_percent), sync);
  chart(section, "Memory RSS (MiB)", "time", pick((s) => s.rss_bytes / 1048576), sync);
  if (usage.some((u) => u.samples.some((s) => s.gpus && s.gpus.length))) {
    const sum = (s, key) => (s.gpus || []).reduce((a, g) => a + (g[key] || 0), 0);
    chart(section, "GPU utilisation % (sum of the task's GPUs)", "time",
      pick((s) => sum(s, "util_percent")), sync);
    chart(section, "GPU memory (MiB)", "time",
      pick((s) => sum(s, "memory_used_bytes") / 1048576), sync);
  }
}

// (Re)draw the charts of `data` ({curves, usage}); a part whose data did not change since
// the last call is left as it is (its hover stays), unless `force`.
function draw(parent, data, force) {
  if (!parent.querySelector(":scope > .curves-part")) {
    parent.replaceChildren(el("div", "curves-part"), el("div", "usage-part"),
                           el("p", "empty no-charts"));
  }
  const parts = [
    ["curves", JSON.stringify(data.curves || []),
     (box) => drawCurves(box, data.curves || [], () => draw(parent, data, true))],
    ["usage", JSON.stringify(data.usage || []), (box) => drawUsage(box, data.usage || [])],
  ];
  for (const [part, key, paint] of parts) {
    if (key === view[`${part}Key`] && !(force && part === "curves")) continue;
    view.plots.filter((p) => p.part === part).forEach((p) => p.plot.destroy());
    view.plots = view.plots.filter((p) => p.part !== part);
    const box = parent.querySelector(`:scope > .${part}-part`);
    box.replaceChildren();
    view.part = part;
    paint(box);
    view[`${part}Key`] = key;
  }
  const empty = parent.querySelector(":scope > .no-charts");
  empty.textContent = parent.querySelector("figure.chart") ? "" :
    "No metrics yet: the trainer's metrics.jsonl, or any metrics.jsonl a task writes under " +
    "its output folder (docs/dashboard.md), shows here.";
  parent.dataset.drawn = String(Number(parent.dataset.drawn || 0) + 1);
}

function followCharts(parent) {
  let last = "";
  const refresh = () => fetch(parent.dataset.metricsUrl, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((text) => {
      const data = JSON.parse(text);
      if (text !== last) { last = text; draw(parent, data, false); }
      if (!/^(COMPLETED|FAILED)/.test(data.status)) setTimeout(refresh, 5000);
    })
    .catch(() => setTimeout(refresh, 10000));
  refresh();
}

function followLogs(pre) {
  const search = document.getElementById("log-search");
  const count = document.getElementById("log-count");
  const state = document.getElementById("log-state");
  const tail = document.getElementById("log-tail");
  // The runner's isolation detail lines: hidden unless asked (as `workflow logs` without
  // --verbose); the choice is kept in the browser across page loads.
  const detail = document.getElementById("log-detail");
  detail.checked = stored(LOG_DETAIL) === "1";
  const listed = (node) => detail.checked || !node.classList.contains("detail");
  const matches = (node) => !search.value ||
    node.textContent.toLowerCase().includes(search.value.toLowerCase());
  let total = 0;
  const counted = () => {
    count.textContent = search.value ? count.textContent : `${total} lines`;
  };
  const recount = () => {
    let shown = 0;
    total = 0;
    for (const node of pre.children) {
      const on = listed(node);
      node.hidden = !on || !matches(node);
      total += on ? 1 : 0;
      shown += node.hidden ? 0 : 1;
    }
    count.textContent = search.value ? `${shown} of ${total} lines` : `${total} lines`;
  };
  search.addEventListener("input", recount);
  detail.addEventListener("change", () => { store(LOG_DETAIL, detail.checked ? "1" : "0"); recount(); });
  const source = new EventSource(pre.dataset.stream);
  source.onopen = () => { state.textContent = "following"; };
  source.onmessage = (event) => {
    const line = JSON.parse(event.data);
    const when = line.time ? Date.parse(line.time) : NaN;
    const time = Number.isNaN(when) ? "" : utc(when / 1000);
    const node = el("span", line.source === "detail" ? "line detail" : "line",
                    `${time} [${line.task}#${line.retry_id}] ${line.line}\n`);
    node.hidden = !listed(node) || !matches(node);
    pre.appendChild(node);
    total += listed(node) ? 1 : 0;
    counted();
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
  loadChartChoices();
  const charts = document.getElementById("charts");
  if (charts && charts.dataset.metricsUrl) followCharts(charts);
  if (charts && charts.dataset.runs) {
    draw(charts, { curves: JSON.parse(charts.dataset.runs) }, false);
  }
  const log = document.getElementById("log");
  if (log && log.dataset.stream) followLogs(log);
});
