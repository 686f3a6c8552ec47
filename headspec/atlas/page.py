"""The atlas page: one self-contained HTML file (inline CSS, inline vanilla JS, the data as one JSON blob,
images as data: URIs) written atomically to RUN/atlas.html (RUN may be a URL, gs://bucket/run: one object).

Why hand-written HTML + vanilla JS rather than Vega-Lite: the page is a coloured layer × head grid, a
menu, a step slider and a card per head. In plain DOM code that is a few hundred lines with nothing to
vendor. Vega-Lite would need vega, vega-lite and vega-embed inlined (about 1 MB of minified JS to pin
and refresh) or a CDN (which breaks "opens offline from disk"), and what the page is mostly about —
focusable cells with arrow-key navigation, Enter/Space opening a card of tables and pictures — is not
what a Vega-Lite spec describes; it would be DOM code next to the spec anyway. A Content-Security-Policy
meta tag forbids every network fetch, so an accidental external reference fails loudly in the browser
test instead of silently needing a network.
"""

from __future__ import annotations

import html
import json
import pathlib

from etils import epath

from headspec.io import remote

PAGE_NAME = "atlas.html"


def _json_for_script(data) -> str:
  """JSON safe inside <script>: no '<', '>' or '&' outside string escapes (so no '</script>')."""
  text = json.dumps(data, separators=(",", ":"), allow_nan=False)
  return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: dict) -> str:
  """The page's HTML for `atlas_data(...)`."""
  title = "headspec atlas — " + " vs ".join(r["name"] for r in data["runs"])
  return (
    _TEMPLATE.replace("@@TITLE@@", html.escape(title))
    .replace("@@CSS@@", _CSS)
    .replace("@@JS@@", _JS)
    .replace("@@DATA@@", _json_for_script(data))
  )


def write_page(path, text: str) -> pathlib.Path | epath.Path:
  """Writes `text` to `path` atomically (locally a temporary file beside it, then renamed; remote: one object).
  A write that fails (a full disk, a quota) leaves the page as it was and no temporary (not even an empty
  one), and its OSError names the page (the CLI prints it as one line)."""
  path = epath.Path(path)
  try:
    remote.write_bytes_atomic(path, text.encode("utf-8"))
  except OSError as e:
    if not remote.is_remote(path):
      remote.temp_beside(path).unlink(missing_ok=True)  # write_bytes_atomic's temporary (named by the pid)
    raise OSError(e.errno, e.strerror, str(path)) from None
  return remote.native_path(path)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<link rel="icon" href="data:,">
<title>@@TITLE@@</title>
<style>@@CSS@@</style>
</head>
<body>
<header>
  <h1>@@TITLE@@</h1>
  <p id="summary"></p>
</header>
<section id="controls" aria-label="What the grid shows">
  <label for="metric">Colour heads by</label>
  <select id="metric"></select>
  <span id="step-box"><label for="step">step</label>
    <input id="step" type="range" min="0" max="0" value="0" step="1">
    <output id="step-label" for="step"></output></span>
  <div id="legend" aria-hidden="true"><span id="legend-min"></span><span id="legend-bar"></span><span id="legend-max"></span></div>
  <p id="metric-description"></p>
</section>
<main id="panels"></main>
<section id="card" aria-live="polite" tabindex="-1">
  <p class="hint">Click a head (or focus it with Tab, move with the arrow keys, press Enter) to open its card.</p>
</section>
<section id="run-figures"></section>
<footer>Written by <code>headspec atlas</code>. Opens offline: every script, style and picture is in this file.</footer>
<script type="application/json" id="atlas-data">@@DATA@@</script>
<script>@@JS@@</script>
</body>
</html>
"""

_CSS = """
:root { --cell: 44px; --fg: #1d1d1f; --muted: #5f6368; --line: #d0d4da; --accent: #1a73e8; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0 24px 24px; }
h1 { font-size: 20px; margin: 16px 0 4px; }
h2 { font-size: 16px; margin: 0 0 6px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
#summary, .hint, #metric-description, footer, .muted { color: var(--muted); }
#controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid var(--line); z-index: 2;
  display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: center; }
#metric { max-width: 46em; font-size: 14px; padding: 3px; }
#step { width: 220px; vertical-align: middle; }
#metric-description { flex-basis: 100%; margin: 0; }
#legend { display: flex; align-items: center; gap: 6px; font-variant-numeric: tabular-nums; }
#legend-bar { display: inline-block; width: 160px; height: 12px; border: 1px solid var(--line); }
#panels { display: flex; flex-wrap: wrap; gap: 24px; margin-top: 12px; }
.panel { min-width: 0; }
.grid { display: grid; gap: 2px; align-items: center; }
.axis { font-size: 11px; color: var(--muted); text-align: center; font-variant-numeric: tabular-nums; }
.axis.row { text-align: right; padding-right: 4px; }
.cell { width: var(--cell); height: calc(var(--cell) * 0.72); border: 1px solid rgba(0,0,0,.08); border-radius: 3px;
  font: 11px/1 system-ui, sans-serif; font-variant-numeric: tabular-nums; padding: 0; cursor: pointer; overflow: hidden;
  white-space: nowrap; text-overflow: ellipsis; }
.cell.missing { background: repeating-linear-gradient(45deg, #f3f4f6, #f3f4f6 4px, #e5e7eb 4px, #e5e7eb 8px); color: #9aa0a6; }
.cell:focus-visible, .cell:focus { outline: 3px solid var(--accent); outline-offset: 1px; z-index: 1; }
.cell.selected { box-shadow: inset 0 0 0 2px #000, inset 0 0 0 3px #fff; }
.resid { width: var(--cell); height: calc(var(--cell) * 0.72); font-size: 11px; display: flex; align-items: center;
  justify-content: center; border-radius: 3px; border: 1px dashed #9aa0a6; font-variant-numeric: tabular-nums; }
.panel-note { font-size: 12px; color: var(--muted); margin: 6px 0 0; max-width: 40em; }
#card { margin-top: 20px; border-top: 2px solid var(--line); padding-top: 4px; outline: none; }
#card table, #run-figures table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
#card th, #card td { text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid #eceff1; vertical-align: top; }
#card th { font-weight: 600; }
#card td.num { text-align: right; }
.label-chip { display: inline-block; padding: 2px 8px; border-radius: 10px; background: #e8f0fe; font-weight: 600; }
.images { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; }
figure img { max-width: min(100%, 720px); border: 1px solid var(--line); }
figcaption { font-size: 12px; color: var(--muted); }
svg.spark { border: 1px solid var(--line); background: #fafafa; }
mark { background: #fde68a; padding: 0 1px; }
table.sae-features td div { white-space: nowrap; }
"""

_JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("atlas-data").textContent);
const RUNS = DATA.runs;
const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
const DIVERGING = ["#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"];
const CATEGORICAL = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"];
const state = { metric: null, step: null, selected: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v; else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}
function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "string") return v;
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 0.001 || a === 0 ? v.toFixed(3) : v.toExponential(1);
}
function hex(c) { return [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)); }
function ramp(stops, t) {
  t = Math.min(1, Math.max(0, t));
  const x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const a = hex(stops[i]), b = hex(stops[i + 1]);
  return "rgb(" + a.map((v, k) => Math.round(v + f * (b[k] - v))).join(",") + ")";
}
function textColour(rgb) {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 140 ? "#111" : "#fff";
}

// Metrics by id across runs (the same id is the same quantity in every run).
const METRICS = new Map();
RUNS.forEach((run, r) => run.metrics.forEach(m => {
  if (!METRICS.has(m.id)) METRICS.set(m.id, { spec: m, perRun: [] });
  METRICS.get(m.id).perRun[r] = m;
}));
function metricSteps(id) {
  const steps = new Set();
  METRICS.get(id).perRun.forEach(m => m && m.steps.forEach(s => steps.add(s)));
  return [...steps].sort((a, b) => a - b);
}
function atStep(m, step) {
  // The grid of metric `m` at `step`, or at its latest step not after it (or its first step).
  if (!m) return null;
  let best = m.steps[0];
  for (const s of m.steps) if (s <= step) best = s;
  return { step: best, grid: m.grids[String(best)] };
}
function scaleOf(id) {
  const entry = METRICS.get(id), spec = entry.spec;
  if (spec.categorical) {
    const cats = new Set();
    entry.perRun.forEach(m => m && Object.values(m.grids).forEach(g => g.flat().forEach(c => c && cats.add(c.v))));
    const list = [...cats].sort();
    return { categorical: true, list, colour: v => CATEGORICAL[list.indexOf(v) % CATEGORICAL.length] };
  }
  let lo = Infinity, hi = -Infinity;
  const see = v => { if (typeof v === "number") { lo = Math.min(lo, v); hi = Math.max(hi, v); } };
  entry.perRun.forEach(m => m && Object.values(m.grids).forEach(g => g.flat().forEach(c => c && see(c.v))));
  RUNS.forEach(run => {  // the residual-stream column shares the heads' scale
    const notes = run.layer_notes[id];
    if (notes) Object.values(notes.residual).forEach(byLayer => Object.values(byLayer).forEach(see));
  });
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (spec.diverging) { const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1; lo = -m; hi = m; }
  if (hi === lo) hi = lo + 1;
  const stops = spec.diverging ? DIVERGING : VIRIDIS;
  return { lo, hi, stops, colour: v => ramp(stops, (v - lo) / (hi - lo)) };
}

function buildMenu() {
  const select = document.getElementById("metric");
  const groups = new Map();
  for (const [id, entry] of METRICS) {
    if (!groups.has(entry.spec.group)) groups.set(entry.spec.group, []);
    groups.get(entry.spec.group).push([id, entry.spec.label]);
  }
  for (const [group, items] of groups) {
    const og = el("optgroup", { label: group });
    items.forEach(([id, label]) => og.append(el("option", { value: id, text: label })));
    select.append(og);
  }
  select.addEventListener("change", () => setMetric(select.value));
  document.getElementById("step").addEventListener("input", e => {
    state.step = metricSteps(state.metric)[Number(e.target.value)];
    draw();
  });
}

function setMetric(id) {
  state.metric = id;
  document.getElementById("metric").value = id;
  const steps = metricSteps(id);
  const slider = document.getElementById("step");
  slider.max = String(steps.length - 1);
  let i = steps.indexOf(state.step);
  if (i < 0) i = steps.length - 1;
  slider.value = String(i);
  state.step = steps[i];
  slider.hidden = steps.length < 2;
  document.getElementById("metric-description").textContent = METRICS.get(id).spec.description;
  draw();
}

function buildPanels() {
  const main = document.getElementById("panels");
  RUNS.forEach((run, r) => {
    const grid = el("div", { class: "grid", role: "grid", "aria-label": run.name + ": layers by heads",
      id: "grid-" + r, "data-run": r });
    const hasResid = Object.keys(run.layer_notes).length > 0;
    grid.style.gridTemplateColumns = "auto repeat(" + run.heads + ", var(--cell))" + (hasResid ? " 10px var(--cell)" : "");
    const head = el("div", { role: "row", style: "display: contents" }, el("div", { class: "axis", text: "L \\ H" }));
    for (let h = 0; h < run.heads; h++) head.append(el("div", { class: "axis", role: "columnheader", text: "h" + h }));
    if (hasResid) head.append(el("div"), el("div", { class: "axis", text: "resid", title: "the layer's whole residual stream" }));
    grid.append(head);
    for (let l = 0; l < run.layers; l++) {
      const row = el("div", { role: "row", style: "display: contents" }, el("div", { class: "axis row", role: "rowheader", text: "L" + l }));
      for (let h = 0; h < run.heads; h++) {
        const cell = el("button", { class: "cell", role: "gridcell", type: "button", "data-run": r, "data-layer": l, "data-head": h,
          tabindex: l === 0 && h === 0 ? 0 : -1, id: "cell-" + r + "-" + l + "-" + h });
        cell.addEventListener("click", () => openCard(r, l, h));
        cell.addEventListener("keydown", e => moveFocus(e, r, l, h));
        row.append(cell);
      }
      if (hasResid) row.append(el("div"), el("div", { class: "resid", id: "resid-" + r + "-" + l }));
      grid.append(row);
    }
    main.append(el("section", { class: "panel", "aria-label": run.name },
      el("h2", { text: run.name + " (" + run.model + ", " + run.layers + " layers × " + run.heads + " heads)" }),
      grid, el("p", { class: "panel-note", id: "note-" + r })));
  });
}

function moveFocus(e, r, l, h) {
  const run = RUNS[r];
  const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  let target = null;
  if (moves[e.key]) {
    const [dl, dh] = moves[e.key];
    target = [Math.min(run.layers - 1, Math.max(0, l + dl)), Math.min(run.heads - 1, Math.max(0, h + dh))];
  } else if (e.key === "Home") target = [l, 0];
  else if (e.key === "End") target = [l, run.heads - 1];
  if (!target) return;  // Enter and Space click the button, which opens the card
  e.preventDefault();
  focusCell(r, target[0], target[1]);
}
function focusCell(r, l, h) {
  document.querySelectorAll("#grid-" + r + " .cell").forEach(c => c.tabIndex = -1);
  const cell = document.getElementById("cell-" + r + "-" + l + "-" + h);
  cell.tabIndex = 0;
  cell.focus();
}

function draw() {
  const id = state.metric, entry = METRICS.get(id), scale = scaleOf(id);
  const steps = metricSteps(id);
  document.getElementById("step-label").textContent = steps.length > 1 ? String(state.step) + " (" + steps.length + " steps)" : String(state.step);
  const bar = document.getElementById("legend-bar");
  if (scale.categorical) {
    bar.style.background = "linear-gradient(90deg," + scale.list.map((c, i) => scale.colour(c) + " " + (100 * i / scale.list.length) + "% " + (100 * (i + 1) / scale.list.length) + "%").join(",") + ")";
    document.getElementById("legend-min").textContent = scale.list[0] || "";
    document.getElementById("legend-max").textContent = scale.list.length > 1 ? scale.list[scale.list.length - 1] : "";
  } else {
    bar.style.background = "linear-gradient(90deg," + scale.stops.join(",") + ")";
    document.getElementById("legend-min").textContent = fmt(scale.lo);
    document.getElementById("legend-max").textContent = fmt(scale.hi);
  }
  RUNS.forEach((run, r) => {
    const m = entry.perRun[r], at = atStep(m, state.step);
    const note = document.getElementById("note-" + r);
    note.textContent = !m ? "This run has no " + entry.spec.label + "." : at.step !== state.step ? "Showing step " + at.step + " (this run has no step " + state.step + " for this metric)." : "";
    for (let l = 0; l < run.layers; l++) for (let h = 0; h < run.heads; h++) {
      const cell = document.getElementById("cell-" + r + "-" + l + "-" + h);
      const c = at ? at.grid[l][h] : null;
      const label = "layer " + l + " head " + h;
      if (!c || c.v === null || c.v === undefined) {
        cell.className = "cell missing"; cell.style.background = ""; cell.style.color = ""; cell.textContent = "·";
        cell.title = label + ": no value"; cell.setAttribute("aria-label", label + ": no value");
      } else {
        const bg = scale.colour(c.v);
        cell.className = "cell"; cell.style.background = bg; cell.style.color = bg.startsWith("rgb") ? textColour(bg) : "#111";
        cell.textContent = entry.spec.integer ? count(c.v) : fmt(c.v);
        const ci = c.ci ? " [" + fmt(c.ci[0]) + ", " + fmt(c.ci[1]) + "]" : "";
        cell.title = label + ": " + cell.textContent + ci + (c.note ? " (" + c.note + ")" : "");
        cell.setAttribute("aria-label", cell.title);
      }
      if (state.selected && state.selected.join() === [r, l, h].join()) cell.classList.add("selected");
    }
    const notes = run.layer_notes[id];
    for (let l = 0; l < run.layers; l++) {
      const box = document.getElementById("resid-" + r + "-" + l);
      if (!box) continue;
      const resid = notes && at ? notes.residual[String(at.step)] : null, v = resid ? resid[String(l)] : null;
      box.textContent = v === null || v === undefined ? "" : fmt(v);
      box.style.background = v === null || v === undefined || scale.categorical ? "" : scale.colour(v);
      box.style.color = box.style.background ? textColour(box.style.background) : "";
      box.title = "layer " + l + " residual stream" + (v === null || v === undefined ? ": –" : ": " + fmt(v));
    }
    const emb = notes && at ? notes.embedding[String(at.step)] : null;
    if (emb !== null && emb !== undefined) note.textContent += (note.textContent ? " " : "") + "Embedding output: " + fmt(emb) + ".";
  });
  if (state.selected) renderCard(...state.selected);
}

function openCard(r, l, h) {
  state.selected = [r, l, h];
  document.querySelectorAll(".cell.selected").forEach(c => c.classList.remove("selected"));
  document.getElementById("cell-" + r + "-" + l + "-" + h).classList.add("selected");
  focusCell(r, l, h);
  renderCard(r, l, h);
}

function renderCard(r, l, h) {
  const run = RUNS[r], card = document.getElementById("card");
  const extra = run.heads_extra[l + "," + h] || {};
  card.replaceChildren(el("h2", { id: "card-title", text: run.name + " · layer " + l + ", head " + h }));
  card.setAttribute("data-head", l + "," + h);
  if (run.kv_groups) {  // grouped-query attention: the heads that share this head's keys and values
    const g = run.kv_groups[h], shared = run.kv_groups.map((x, i) => x === g && i !== h ? "h" + i : null).filter(x => x);
    card.append(el("p", { class: "kv-group", text: "K/V group " + g + (shared.length ? " (same keys and values as " + shared.join(", ") + ")" : "") }));
  }
  // Role label and the scores behind it.
  const labelMetric = run.metrics.find(m => m.id === "label"), roleRows = [];
  const label = labelMetric ? atStep(labelMetric, state.step) : null, lc = label ? label.grid[l][h] : null;
  run.metrics.filter(m => m.id.startsWith("role/") && !m.id.includes("@")).forEach(m => {
    const at = atStep(m, state.step), c = at.grid[l][h];
    if (c) roleRows.push([m.label, c, at.step]);
  });
  card.append(el("h3", { text: "Role" }));
  if (lc) card.append(el("p", {}, el("span", { class: "label-chip", text: lc.v }), " ", el("span", { class: "muted", text: "rule: " + (lc.note || "–") + " (step " + label.step + ")" })));
  else card.append(el("p", { class: "muted", text: "No role label (attention/labels.csv; run headspec attention)." }));
  if (roleRows.length) card.append(numbersTable(roleRows));
  // Every number of the head, grouped as in the menu (Clark relations and roles have their own sections;
  // a probe's selectivity is a column of its accuracy's row; other models' rows fold away).
  const groups = new Map(), byId = new Map(run.metrics.map(m => [m.id, m]));
  run.metrics.forEach(m => {
    if (/^(clark|role)\//.test(m.id) || m.categorical || /^probe\/.*\/selectivity/.test(m.id)) return;
    const at = atStep(m, state.step), c = at.grid[l][h];
    if (!c) return;
    let sel;
    if (/^probe\//.test(m.id)) {
      const s = byId.get(m.id.replace("/accuracy", "/selectivity")), sa = s ? atStep(s, state.step) : null;
      sel = sa && sa.grid[l][h] ? sa.grid[l][h].v : null;
    }
    const key = m.group + (m.id.includes("@") ? "@" : "");
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push([m.label, c, at.step, sel, m.integer]);
  });
  for (const [key, rows] of groups) {
    if (key.endsWith("@")) {
      card.append(el("details", {}, el("summary", { text: key.slice(0, -1) + ": other models (" + rows.length + " rows)" }), numbersTable(rows)));
    } else {
      card.append(el("h3", { text: key }));
      card.append(numbersTable(rows));
    }
  }
  // Best-matched dependency relations.
  card.append(el("h3", { text: "Best-matched dependency relations (Clark et al. 2019)" }));
  if (extra.relations && extra.relations.length) {
    card.append(el("table", { class: "relations" },
      el("tr", {}, ["relation", "direction", "split", "accuracy", "best fixed offset"].map(t => el("th", { text: t }))),
      extra.relations.map(x => el("tr", {}, el("td", { text: x.relation }), el("td", { text: x.direction }), el("td", { text: x.split }),
        el("td", { class: "num", text: fmt(x.accuracy) }),
        el("td", { text: x.baseline ? fmt(x.baseline.accuracy) + " (offset " + (x.baseline.offset > 0 ? "+" : "") + x.baseline.offset + ")" : "–" })))));
  } else card.append(el("p", { class: "muted", text: "None measured (attention/clark.csv; run headspec attention)." }));
  if (extra.interactions && extra.interactions.length) {
    card.append(el("h3", { text: "Strongest pairwise interactions" }));
    card.append(el("table", {},
      el("tr", {}, ["with head", "metric", "joint", "sum of singles", "interaction"].map(t => el("th", { text: t }))),
      extra.interactions.map(x => el("tr", {}, el("td", { text: "L" + x.other[0] + " H" + x.other[1] }), el("td", { text: x.metric }),
        el("td", { class: "num", text: fmt(x.joint) }), el("td", { class: "num", text: fmt(x.sum_of_singles) }),
        el("td", { class: "num", text: fmt(x.interaction) })))));
  }
  if (extra.patching && extra.patching.length) {  // the head's patching effect at every position
    const positions = [...new Set(extra.patching.flatMap(x => x.positions.map(p => p[0])))].sort((a, b) => a - b);
    card.append(el("h3", { text: "Patching by position (fraction of the logit difference restored)" }));
    card.append(el("table", { class: "patching" },
      el("tr", {}, el("th", { text: "task · site" }), positions.map(t => el("th", { text: "t=" + t })), el("th", { text: "step" })),
      extra.patching.map(x => {
        const at = new Map(x.positions);
        return el("tr", {}, el("td", { text: x.label }), positions.map(t => el("td", { class: "num", text: fmt(at.get(t)) })),
          el("td", { class: "num", text: String(x.step) }));
      })));
  }
  if (extra.sae && extra.sae.length) saeSection(card, l, h, extra.sae);
  if (extra.circuit && extra.circuit.length) circuitSection(card, l, h, extra.circuit);
  // Attention pictures on the example sentences.
  card.append(el("h3", { text: "Attention on the example sentences" }));
  if (extra.images && extra.images.length) {
    card.append(el("div", { class: "images" }, extra.images.map(im =>
      el("figure", {}, el("img", { src: im.src, alt: "attention of layer " + l + " head " + h + ": " + im.name }), el("figcaption", { text: "attention/" + im.name })))));
  } else card.append(el("p", { class: "muted", text: "No per-head pictures under " + run.name + "/attention/ (run headspec attention)." }));
}

function count(v) { return v === null || v === undefined ? "–" : String(Math.round(v)); }
function marked(context) {
  // A context "… [[word]] …" with the word in <mark> (text nodes only: table text is never markup).
  const m = /^(.*?)\[\[(.*?)\]\](.*)$/s.exec(context);
  return m ? [m[1], el("mark", { text: m[2] }), m[3]] : [context];
}
function saeSection(card, l, h, saes) {
  // The head's strongest SAE features (sae/*.csv), per SAE of its layer.
  card.append(el("h3", { text: "Strongest SAE features (decoder-norm share, Kissane et al. 2024)" }));
  saes.forEach(s => {
    const head = [s.sae + " on " + s.site + " of layer " + s.layer + ", step " + s.step + ": carries " + s.carried + " live features",
      s.exclusive_features !== null && s.exclusive_features !== undefined ? count(s.exclusive_features) + " exclusive" : null,
      s.specialization !== null && s.specialization !== undefined ? "feature specialization S_h " + fmt(s.specialization) : null,
      s.quality || null].filter(x => x);
    card.append(el("p", { class: "sae-summary" }, head.join("; ") + "."));
    if (!s.features.length) return;
    const sets = [...new Set(s.features.flatMap(f => f.labels.map(x => x.set)))];
    card.append(el("table", { class: "sae-features" },
      el("tr", {}, ["feature", "share a_fh", "heads", "fires", "mean act."].map(t => el("th", { text: t })),
        sets.map(t => el("th", { text: t.replace("_", " ") })), el("th", { text: "top contexts (activation)" })),
      s.features.map(f => el("tr", {},
        el("td", {}, f.page ? el("a", { class: "feature-link", href: f.page, text: "f" + f.feature, title: "the feature's page" }) : "f" + f.feature),
        el("td", { class: "num", text: f.place === 0 ? fmt(f.share) : "#" + (f.place + 1) + " of " + f.heads.length,
          title: f.place === 0 ? "the head's share of the feature's squared decoder norm (its largest)" : "a smaller share than the heads before it" }),
        el("td", { text: f.heads.map(x => "h" + x).join(", ") }),
        el("td", { class: "num", text: fmt(f.firing_rate) }),
        el("td", { class: "num", text: fmt(f.mean_activation) }),
        sets.map(set => {
          const x = f.labels.find(y => y.set === set);
          if (!x) return el("td", { text: "–" });
          return el("td", {}, x.top.map(([label, frac]) => el("div", { text: label + " " + fmt(frac) })),
            x.best ? el("div", { class: "muted", text: "selectivity " + x.best + " " + fmt(x.selectivity) }) : null);
        }),
        el("td", {}, f.contexts.length ? f.contexts.map(([c, a]) => el("div", {}, marked(c), el("span", { class: "muted", text: " (" + fmt(a) + ")" })))
          : el("span", { class: "muted", text: "–" }))))));
    const more = s.carried - s.features.length;
    const links = (s.more || []).flatMap(([f, page], i) => [i ? ", " : ": ", page ? el("a", { href: page, text: "f" + f }) : "f" + f]);
    if (more > 0) card.append(el("p", { class: "muted sae-more" }, more + " more carried feature" + (more > 1 ? "s" : "") + " in sae/features.csv",
      links, links.length && links.length / 2 < more ? ", …" : "", "."));
  });
}
function circuitSection(card, l, h, circuits) {
  // The head's strongest incoming and outgoing edges (circuit/edges.csv), per task.
  circuits.forEach(c => {
    card.append(el("h3", { text: "Circuit edges · " + c.task + " (step " + c.step + ")" }));
    card.append(el("p", { class: "muted", text: "Score: the change of the logit difference when the edge alone carries its corrupted value in the clean run (noising; a *_denoising method: its clean value in the corrupted run), "
      + "estimated by EAP (Syed et al. 2023) or EAP-IG (Hanna et al. 2024), or measured (exact). Ranked by |" + c.methods[0] + "|." }));
    for (const [side, title] of [["incoming", "Strongest incoming edges (into its q, k, v)"], ["outgoing", "Strongest outgoing edges"]]) {
      const edges = c[side];
      if (!edges.length) continue;
      card.append(el("p", {}, el("strong", { text: title }), " — " + edges.length + " of " + c[side + "_total"]));
      card.append(el("table", { class: "circuit-" + side },
        el("tr", {}, el("th", { text: side === "incoming" ? "from" : "to" }), el("th", { text: "input" }), c.methods.map(m => el("th", { text: m }))),
        edges.map(e => el("tr", {},
          el("td", { text: side === "incoming" ? e.upstream : e.downstream }),
          el("td", { text: side === "incoming" && e.downstream !== "L" + l + "H" + h ? e.input + " (" + e.downstream + ", K/V group)" : e.input }),
          e.scores.map(v => el("td", { class: "num", text: fmt(v) }))))));
    }
  });
}

function numbersTable(rows) {
  const withSel = rows.some(r => r[3] !== undefined);
  const heads = ["metric", "value", "95% CI"].concat(withSel ? ["selectivity"] : [], ["notes", "step"]);
  return el("table", {},
    el("tr", {}, heads.map(t => el("th", { text: t }))),
    rows.map(([label, c, step, sel, integer]) => el("tr", {}, el("td", { text: label }), el("td", { class: "num", text: integer ? count(c.v) : fmt(c.v) }),
      el("td", { class: "num", text: c.ci ? "[" + fmt(c.ci[0]) + ", " + fmt(c.ci[1]) + "]" : "–" }),
      withSel ? el("td", { class: "num", text: fmt(sel) }) : null,
      el("td", { text: c.note || "" }), el("td", { class: "num", text: String(step) }))));
}

function sparkline(points) {
  const W = 320, H = 80, P = 6, NS = "http://www.w3.org/2000/svg";
  const xs = points.map(p => p.step), ys = points.map(p => p.loss);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = s => P + (W - 2 * P) * (s - x0) / ((x1 - x0) || 1), sy = v => H - P - (H - 2 * P) * (v - y0) / ((y1 - y0) || 1);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "training loss from " + fmt(ys[0]) + " to " + fmt(ys[ys.length - 1]));
  const path = document.createElementNS(NS, "polyline");
  path.setAttribute("points", points.map(p => sx(p.step) + "," + sy(p.loss)).join(" "));
  path.setAttribute("fill", "none"); path.setAttribute("stroke", "#1a73e8"); path.setAttribute("stroke-width", "1.5");
  svg.append(path);
  return svg;
}

function runFigures() {
  const box = document.getElementById("run-figures");
  RUNS.forEach(run => {
    const parts = [];
    if (run.training.length > 1) {
      const last = run.training[run.training.length - 1];
      parts.push(el("p", {}, "Training loss (metrics.jsonl), step " + run.training[0].step + "–" + last.step + ", last " + fmt(last.loss) + ": "), sparkline(run.training));
    }
    if (run.images.length) parts.push(el("div", { class: "images" }, run.images.map(im =>
      el("figure", {}, el("img", { src: im.src, alt: im.name }), el("figcaption", { text: "attention/" + im.name })))));
    if (run.images_skipped) parts.push(el("p", { class: "muted", text: run.images_skipped + " larger pictures left out to keep the page small." }));
    if (parts.length) box.append(el("details", {}, el("summary", { text: run.name + ": training and run-level attention figures" }), parts));
  });
}

document.getElementById("summary").textContent = RUNS.map(r =>
  r.name + " — tables: " + r.tables.join(", ")).join(" · ");
buildMenu();
buildPanels();
runFigures();
const first = [...METRICS.keys()].find(id => /^probe\/[^@]*\/selectivity$/.test(id)) || [...METRICS.keys()][0];
setMetric(first);
// atlas.html#L<layer>H<head> (a feature page's link back) opens that head's card of the first run.
const wanted = /^#L(\d+)H(\d+)$/.exec(location.hash);
if (wanted && +wanted[1] < RUNS[0].layers && +wanted[2] < RUNS[0].heads) openCard(0, +wanted[1], +wanted[2]);
"""
