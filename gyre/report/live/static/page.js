// The live run page: polls the JSON routes of gyre/report/live/app.py and draws four views
// (cells, steps, executions, one execution's tree). Plain ES module; plots with uPlot (vendored).
// Read-only: it never sends anything but GETs.

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
};
const api = async (path) => {
  const r = await fetch(path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
};
const pct = (x) => (x === null || x === undefined ? "n/a" : `${(100 * x).toFixed(1)}%`);
const num = (x, d = 2) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d));
const KIND_COLOURS = { rollout: "#4e8fdc", train: "#e0803a", step: "#b23a3a", load: "#9a7fd1",
  switch: "#aaaaaa", idle: "#eeeeee" };

const state = { info: null, view: "cells", cursor: { intervals: 0, roles: 0, water: 0 },
  intervals: [], roles: [], water: [], steps: 0, page: 0, filter: "", query: "", execution: null,
  plots: {} };

// ---- cells ------------------------------------------------------------------------------------
async function refreshCells() {
  const c = state.cursor;
  const d = await api(`/api/cells?intervals=${c.intervals}&roles=${c.roles}&water=${c.water}`);
  state.intervals.push(...d.intervals); state.roles.push(...d.roles); state.water.push(...d.water);
  state.cursor = d.cursor;
  const n = Math.max(d.num_cells, 0);
  const lastRole = {};
  for (const [t, cell, role] of state.roles) lastRole[cell] = role;
  const live = d.live;
  const body = $("#cells-table tbody");
  body.replaceChildren();
  for (let i = 0; i < n; i++) {
    const lc = live ? live.cells.find((x) => x.index === i) : null;
    body.append(el("tr", { class: "cell-row", "data-cell": i },
      el("td", {}, lc ? lc.name : `cell-${i}`), el("td", { class: "role" }, lc ? lc.role : (lastRole[i] ?? "")),
      el("td", {}, lc?.target ?? ""), el("td", {}, lc ? lc.kind + (lc.alive ? "" : " (dead)") : ""),
      el("td", {}, lc ? lc.executions : ""), el("td", {}, lc?.engine_version ?? ""),
      el("td", {}, lc?.trainer_version ?? "")));
  }
  const counters = $("#cell-counters");
  const last = state.water[state.water.length - 1];
  const items = [["cells", n], ["role changes", state.roles.length],
    ["water level", live ? live.water_level : last ? last[1] : "n/a"],
    ["rollout capacity", live ? live.rollout_capacity : last ? last[2] : "n/a"]];
  if (live) {
    items.push(["steps done", live.steps_done], ["switches", live.switches],
      ["redirections", live.router.requests_redirected], ["migrations", live.router.requests_migrated],
      ["tokens migrated", live.router.tokens_migrated]);
  }
  counters.replaceChildren(...items.map(([k, v]) => el("span", {}, `${k}: `, el("b", { class: k.replace(/ /g, "-") }, v))));
  const list = $("#role-changes");
  list.replaceChildren(...state.roles.slice(-200).map(([t, cell, role]) =>
    el("li", { class: "role-change" }, `${num(t, 1)} s: cell-${cell} -> ${role}`)));
  drawGantt(n, live);
  drawWater();
}

function drawGantt(n, live) {
  const canvas = $("#gantt");
  const ctx = canvas.getContext("2d");
  const rows = Math.max(n, 1), rowH = 24, left = 60;
  canvas.height = rows * rowH + 20;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const open = live ? live.cells.filter((c) => c.alive).map((c) => [c.index, c.since_s, c.kind]) : [];
  const end = Math.max(1, ...state.intervals.map((iv) => iv[2]), ...state.roles.map((r) => r[0]),
    ...state.water.map((w) => w[0]), ...open.map((o) => o[1]));
  const x = (t) => left + (canvas.width - left - 10) * (t / end);
  ctx.font = "11px sans-serif";
  for (let i = 0; i < rows; i++) { ctx.fillStyle = "#333"; ctx.fillText(`cell-${i}`, 4, i * rowH + 16); }
  for (const [cell, a, b, kind] of state.intervals) {
    ctx.fillStyle = KIND_COLOURS[kind] ?? "#777";
    ctx.fillRect(x(a), cell * rowH + 4, Math.max(1, x(b) - x(a)), rowH - 8);
  }
  for (const [cell, since, kind] of open) { // the activity each cell is in now, still open
    ctx.fillStyle = KIND_COLOURS[kind] ?? "#777";
    ctx.globalAlpha = 0.5;
    ctx.fillRect(x(since), cell * rowH + 4, Math.max(1, x(end) - x(since)), rowH - 8);
    ctx.globalAlpha = 1;
  }
  ctx.fillStyle = "#000";
  for (const [t, cell] of state.roles) ctx.fillRect(x(t), cell * rowH + 2, 1.5, rowH - 4);
  ctx.fillText(`${num(end, 1)} s`, canvas.width - 50, canvas.height - 4);
  $("#gantt-legend").replaceChildren(...Object.entries(KIND_COLOURS).map(([k, c]) =>
    el("span", {}, Object.assign(el("i"), { style: `background:${c}` }), k)));
}

function plot(id, title, series, data) {
  const host = $(`#${id}`);
  if (!window.uPlot || data[0].length === 0) return;
  if (state.plots[id]) { state.plots[id].setData(data); return; }
  const opts = { title, width: 360, height: 200, series: [{}, ...series], scales: { x: { time: false } } };
  state.plots[id] = new uPlot(opts, data, host);
}

function drawWater() {
  const w = state.water;
  plot("water-plot", "unfinished executions vs rollout slots",
    [{ label: "water level", stroke: "#4e8fdc", paths: uPlot.paths?.stepped?.({ align: 1 }) },
     { label: "capacity", stroke: "#e0803a", paths: uPlot.paths?.stepped?.({ align: 1 }) }],
    [w.map((r) => r[0]), w.map((r) => r[1]), w.map((r) => r[2])]);
}

// ---- steps ------------------------------------------------------------------------------------
async function refreshSteps() {
  const d = await api("/api/steps");
  const body = $("#steps-table tbody");
  if (d.steps.length !== state.steps) {
    body.replaceChildren(...d.steps.map((s) => el("tr", { class: s.applied ? "step-row" : "step-row skipped",
      "data-step": s.step },
      el("td", {}, s.step), el("td", {}, s.version), el("td", {}, s.executions), el("td", {}, pct(s.pass_rate)),
      el("td", {}, num(s.mean_reward, 3)), el("td", {}, `${s.finished} / ${s.partial} / ${s.failed}`),
      el("td", {}, s.model_calls), el("td", {}, s.policy_tokens), el("td", {}, num(s.dedup_ratio)),
      el("td", {}, s.logprob_abs_diff_mean === null ? "n/a" : Number(s.logprob_abs_diff_mean).toExponential(2)),
      el("td", {}, num(s.rollout_s, 1)), el("td", {}, num(s.train_s, 1)), el("td", {}, num(s.sync_s, 1)),
      el("td", {}, num(s.step_s, 1)), el("td", {}, s.applied ? "yes" : "skipped"))));
    state.steps = d.steps.length;
  }
  $("#evals-table tbody").replaceChildren(...d.evals.map((e) => el("tr", { class: "eval-row" },
    el("td", {}, e.step), el("td", {}, e.version), el("td", {}, e.split), el("td", {}, e.executions),
    el("td", {}, pct(e.pass_rate)), el("td", {}, num(e.mean_reward, 3)), el("td", {}, num(e.eval_s, 1)))));
  const x = d.steps.map((s) => s.step);
  plot("plot-pass", "pass rate / mean reward", [{ label: "pass rate", stroke: "#2a7" },
    { label: "mean reward", stroke: "#46c" }], [x, d.steps.map((s) => s.pass_rate), d.steps.map((s) => s.mean_reward)]);
  plot("plot-time", "time split (s)", [{ label: "rollout", stroke: "#4e8fdc" }, { label: "train", stroke: "#e0803a" },
    { label: "sync", stroke: "#999" }], [x, d.steps.map((s) => s.rollout_s), d.steps.map((s) => s.train_s),
    d.steps.map((s) => s.sync_s)]);
  plot("plot-mismatch", "|trainer - behaviour| logprob", [{ label: "mean", stroke: "#b23a3a" }],
    [x, d.steps.map((s) => s.logprob_abs_diff_mean)]);
}

// ---- executions -------------------------------------------------------------------------------
async function refreshExecutions() {
  const q = new URLSearchParams({ state: state.filter, q: state.query, page: state.page, page_size: 50 });
  const d = await api(`/api/executions?${q}`);
  $("#state-counts").replaceChildren(...Object.entries(d.counts).map(([k, v]) => el("span", {}, `${k}: ${v}`)));
  const pages = Math.max(1, Math.ceil(d.total / d.page_size));
  $("#page-info").textContent = `page ${d.page + 1} of ${pages} (${d.total})`;
  const roles = (r) => Object.entries(r).map(([k, v]) => `${k} ${v}`).join(", ");
  $("#executions-table tbody").replaceChildren(...d.rows.map((r) => {
    const tr = el("tr", { class: "execution-row", "data-state": r.state, "data-id": r.execution_id },
      el("td", {}, r.execution_id), el("td", { class: `state state-${r.state}` }, r.state), el("td", {}, r.task_id ?? ""),
      el("td", {}, r.step ?? ""), el("td", {}, r.score === null ? "" : `${num(r.score)} (${r.passed}/${r.total})`),
      el("td", {}, roles(r.roles)), el("td", {}, r.calls), el("td", {}, `${r.prompt_tokens} / ${r.completion_tokens}`),
      el("td", {}, roles(r.divergences)), el("td", {}, r.reason ?? r.termination ?? ""));
    tr.onclick = () => { location.hash = `#execution/${encodeURIComponent(r.execution_id)}`; };
    return tr;
  }));
}

// ---- one execution ----------------------------------------------------------------------------
async function refreshExecution() {
  const eid = state.execution;
  const d = await api(`/api/executions/${encodeURIComponent(eid)}`);
  $("#execution-title").textContent = eid;
  const r = d.row;
  $("#execution-summary").textContent = `state ${r.state}` + (r.reason ? ` (${r.reason})` : "") +
    `, task ${r.task_id ?? "?"}, ${r.calls} calls, ${r.completion_tokens} completion tokens`;
  const v = d.verifier;
  $("#verifier").replaceChildren(v ? el("div", { id: "verifier-result" },
    `verifier: ${v.passed}/${v.total} tests passed, score ${num(v.score, 3)}` + (v.partial ? " (partial score)" : "") +
    (v.failed_tests.length ? `; failed: ${v.failed_tests.join(", ")}` : "")) : "verifier: no result yet");
  if (!d.tree) return;
  const key = `${eid}:${d.tree.statistics.calls}`;
  if ($("#tree").dataset.key === key) return; // unchanged: keep what the user expanded
  $("#tree").dataset.key = key;
  const st = d.tree.statistics;
  $("#tree-stats").replaceChildren(...Object.entries(st).map(([k, x]) => el("span", {}, `${k}: ${x}`)),
    el("span", {}, `Jmax selected: ${d.tree.selected_leaves.length}`));
  const depth = {};
  const rows = d.tree.segments.map((s) => {
    depth[s.id] = s.parent_segment < 0 ? 0 : (depth[s.parent_segment] ?? 0) + 1;
    const head = el("div", { class: "head" }, `call ${s.call_id} `, el("b", {}, s.role), ` +${s.length} tokens`,
      ` (${s.policy_tokens} policy)`);
    if (s.parent_segment >= 0) head.append(` from call ${d.tree.segments[s.parent_segment].call_id} at token ${s.parent_offset}`);
    if (s.divergence) head.append(el("span", { class: "badge divergence", "data-reason": s.divergence.reason },
      `branch: ${s.divergence.reason} at prompt token ${s.divergence.index}`));
    if (s.selected_leaf) head.append(el("span", { class: "badge jmax" }, "Jmax selected path"));
    else if (s.selected) head.append(el("span", { class: "badge jmax" }, "on a selected path"));
    const box = el("div", { class: s.selected ? "segment selected" : "segment", "data-segment": s.id,
      style: `margin-left:${16 * depth[s.id]}px` }, head);
    head.onclick = () => toggleTokens(eid, s, box);
    return box;
  });
  $("#tree").replaceChildren(...rows);
}

async function toggleTokens(eid, seg, box, offset = 0) {
  let tokens = box.querySelector(".tokens");
  if (tokens && offset === 0) { tokens.remove(); return; }
  if (!tokens) { tokens = el("div", { class: "tokens" }); box.append(tokens); }
  const d = await api(`/api/executions/${encodeURIComponent(eid)}/segments/${seg.id}?offset=${offset}&limit=1024`);
  tokens.querySelector(".more")?.remove();
  for (const t of d.tokens) {
    const span = el("span", { class: `tok${t.policy ? " policy" : ""}${t.selected ? " selected" : ""}`,
      "data-node": t.node, "data-weight": t.loss_weight, "data-logprob": t.logprob ?? "" }, t.text);
    span.onmouseenter = (ev) => showTip(ev, t);
    span.onmouseleave = () => { $("#tooltip").hidden = true; };
    tokens.append(span);
  }
  const next = d.offset + d.tokens.length;
  if (next < d.length) {
    const more = el("button", { class: "more" }, `${d.length - next} more tokens`);
    more.onclick = () => toggleTokens(eid, seg, box, next);
    tokens.append(more);
  }
}

function showTip(ev, t) {
  const tip = $("#tooltip");
  tip.textContent = `token ${t.id}${t.policy ? " (policy)" : " (context)"} | loss weight ${t.loss_weight}` +
    ` | behaviour logprob ${t.logprob === null ? "n/a" : t.logprob}` + (t.version >= 0 ? ` | v${t.version}` : "");
  tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 12}px`;
  tip.hidden = false;
}

// ---- routing and polling ----------------------------------------------------------------------
function route() {
  const h = location.hash.slice(1) || "cells";
  if (h.startsWith("execution/")) { state.view = "execution"; state.execution = decodeURIComponent(h.slice(10)); }
  else state.view = ["cells", "steps", "executions"].includes(h) ? h : "cells";
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${state.view}`);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  $("#tree").dataset.key = "";
  tick();
}

const REFRESH = { cells: refreshCells, steps: refreshSteps, executions: refreshExecutions, execution: refreshExecution };
let busy = false;
async function tick() {
  if (busy) return;
  busy = true;
  try { await REFRESH[state.view](); $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`; }
  catch (e) { $("#updated").textContent = String(e); }
  finally { busy = false; }
}

async function main() {
  state.info = await api("/api/info");
  $("#run-dir").textContent = state.info.run_dir;
  $("#live-badge").textContent = state.info.live ? "live" : "offline";
  const sel = $("#state-filter");
  for (const s of state.info.states) sel.append(el("option", { value: s }, s));
  sel.onchange = () => { state.filter = sel.value; state.page = 0; tick(); };
  $("#query").oninput = (e) => { state.query = e.target.value; state.page = 0; tick(); };
  $("#prev").onclick = () => { state.page = Math.max(0, state.page - 1); tick(); };
  $("#next").onclick = () => { state.page += 1; tick(); };
  window.addEventListener("hashchange", route);
  route();
  setInterval(tick, 1000 * state.info.poll_interval_s);
}
main();
