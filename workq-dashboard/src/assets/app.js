// The dashboard page: polls the JSON API and draws plain DOM and SVG (no framework, no
// secret: a token lives in an HttpOnly cookie). Every action is a POST with X-Wq-Csrf.
// Nothing here knows which backend a queue lives on: every queue carries its source's label.
"use strict";

const POLL_MS = 2000;
const MAX_ROWS = 200;
const KEEP_MS = 3600 * 1000;
const STATES = [["ready", "Ready"], ["delayed", "Delayed"], ["in_flight", "In flight"], ["failing", "Failing"], ["dead", "Dead"]];
const COUNT_OF = { ready: "depth", delayed: "delayed", in_flight: "in_flight", failing: "failing", dead: "dead" };
const ENDS = {
  ready: ["Next out", "Last in"], delayed: ["Soonest", "Latest"], in_flight: ["Nearest deadline", "Latest deadline"],
  failing: ["First", "Last"], dead: ["Oldest", "Newest"],
};

let sel = readHash();
let paused = false, running = false, timer = null;
let rows = new Map(); // "source/name" -> last known view
let sources = [], readOnly = true, pageLimit = 50;
let view = null; // the selected queue's figures
let items = { state: "ready", from: "first", cursor: null, stack: [], search: "", page: null };
let openItem = null;
let samples = [], samplesKey = "";

const $ = (id) => document.getElementById(id);

function readHash() {
  const h = location.hash.slice(1);
  if (!h) return null;
  const i = h.indexOf("/");
  if (i < 0) return { source: null, name: decodeURIComponent(h) };
  return { source: decodeURIComponent(h.slice(0, i)), name: decodeURIComponent(h.slice(i + 1)) };
}

function key(q) { return q.source + "/" + q.name; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") p.set(k, v);
  const s = p.toString();
  return s ? "?" + s : "";
}

function queuePath(rest, params) {
  return "api/queues/" + encodeURIComponent(sel.name) + (rest ? "/" + rest : "") + qs({ source: sel.source, ...params });
}

// GETs JSON; an error answer (a server that is down, say) still hands back its body.
async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin" });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (!r.ok) {
    const e = new Error(path.split("?")[0] + ": " + r.status + " " + ((body && body.error) || ""));
    e.status = r.status; e.body = body;
    throw e;
  }
  return body;
}

function clock(ms) { return new Date(ms).toLocaleTimeString(); }
function secs(s) { return s == null ? "" : s < 100 ? s.toFixed(1) : Math.round(s).toLocaleString(); }
function num(n) { return n == null ? "" : Number(n).toLocaleString(); }
// A count of a source that stops counting at a cap (`capped_at`): past it, "10,000+".
function capped(n, of) { return of && of.capped_at != null && n > of.capped_at ? num(of.capped_at) + "+" : num(n); }

async function act(path, body, what) {
  const notice = $("notice");
  try {
    const r = await fetch(queuePath(path), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-Wq-Csrf": "1", "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    });
    const answer = await r.json().catch(() => ({}));
    notice.className = r.ok ? "note" : "note error";
    notice.textContent = (what || path) + ": " + (r.ok ? answer.message + " (" + answer.changed + " changed)" : answer.error || r.status);
  } catch (e) {
    notice.className = "note error";
    notice.textContent = (what || path) + ": " + e.message;
  }
  await refreshNow();
}

function stateCell(q) {
  if (q.broken) return el("span", { class: "broken-state", title: q.broken }, "broken");
  if (q.shut_down) return el("span", { class: "shut" }, "shut down");
  if (q.paused) return el("span", { class: "paused" }, "paused");
  return el("span", { class: "running" }, "running");
}

function renderSources() {
  const out = [];
  for (const s of sources) {
    if (!s.up) {
      const since = s.down_since_ms ? " since " + clock(s.down_since_ms) : "";
      out.push(el("div", { class: "down", "data-source": s.label }, s.label + " (" + s.server + ") is down" + since + ": " + (s.error || "no answer") + ". Figures and charts are the last ones seen."));
    }
    for (const w of s.warnings || []) out.push(el("div", { class: "warning" }, s.label + " persistence: " + w));
  }
  $("sources").replaceChildren(...out);
}

function renderQueues(data) {
  const up = new Set(sources.filter((s) => s.up).map((s) => s.label));
  const fresh = new Map();
  for (const q of data.queues) fresh.set(key(q), { ...q, stale: false });
  // A source that is down keeps its last rows, marked stale.
  for (const [k, q] of rows) if (!up.has(q.source) && !fresh.has(k)) fresh.set(k, { ...q, stale: true });
  rows = new Map([...fresh.entries()].sort((a, b) => (a[1].name + a[1].source).localeCompare(b[1].name + b[1].source)));
  const filter = $("queue-filter").value.trim().toLowerCase();
  const shown = [...rows.values()].filter((q) => !filter || q.name.toLowerCase().includes(filter));
  // With more than one source, a narrow screen (no source column) names it under the queue.
  const several = sources.length > 1;
  const body = document.querySelector("#queues tbody");
  body.replaceChildren(...shown.slice(0, MAX_ROWS).map((q) => {
    const cell = (field, v, cls, ...more) => el("td", { "data-field": field, class: cls || null }, v, ...more);
    const selected = sel && q.name === sel.name && (!sel.source || sel.source === q.source);
    return el("tr", {
      class: "queue" + (selected ? " selected" : "") + (q.broken ? " broken" : "") + (q.stale ? " stale" : ""),
      "data-queue": q.name, "data-source": q.source,
      onclick: () => select(q),
    }, cell("name", q.name, null, several ? el("span", { class: "src" }, q.source) : ""), cell("source", q.source, "opt"), cell("state", stateCell(q)), cell("depth", capped(q.depth, q)),
      cell("delayed", capped(q.delayed, q)), cell("in_flight", capped(q.in_flight, q)), cell("failing", capped(q.failing, q), "opt"),
      cell("stalled", capped(q.stalled, q), "opt"), cell("dead", capped(q.dead, q)), cell("longest_running", secs(q.longest_running_s), "opt"));
  }));
  $("queues-more").textContent = shown.length > MAX_ROWS ? "showing " + MAX_ROWS + " of " + shown.length + " queues: filter to find the others" : "";
  if (!sel && rows.size > 0) {
    const first = rows.values().next().value;
    sel = { source: first.source, name: first.name };
  }
  if (sel && !sel.source) {
    const match = [...rows.values()].find((q) => q.name === sel.name);
    if (match) sel.source = match.source;
  }
}

function select(q) {
  sel = { source: q.source, name: q.name };
  location.hash = encodeURIComponent(q.source) + "/" + encodeURIComponent(q.name);
  items = { state: "ready", from: "first", cursor: null, stack: [], search: "", page: null };
  $("search").value = "";
  openItem = null;
  $("notice").textContent = "";
  refreshNow();
}

function button(label, id, onclick, cls) {
  return el("button", { type: "button", "data-action": id, class: cls || null, disabled: readOnly ? "" : null, onclick }, label);
}

function renderDetail() {
  $("detail").hidden = false;
  $("detail-name").replaceChildren(view.name + " ", el("span", { class: "note" }, "(" + view.source + ") "), stateCell(view));
  if (readOnly) {
    $("actions").replaceChildren(el("em", {}, "read-only"));
  } else {
    $("actions").replaceChildren(
      view.paused ? button("Resume", "resume", () => act("resume", {}, "resume")) : button("Pause", "pause", () => act("pause", {}, "pause")),
      button("Requeue all dead letters", "requeue-all", () => act("dead-letters/requeue-all", {}, "requeue all")),
      button("Purge dead letters", "purge", () => { if (confirm("Drop every dead letter of " + view.name + "?")) act("dead-letters/purge", {}, "purge"); }, "danger"));
  }
  $("tabs").replaceChildren(...STATES.map(([s, label]) => el("button", {
    type: "button", class: "tab", role: "tab", "data-state": s, "aria-selected": String(items.state === s),
    onclick: () => { items = { state: s, from: "first", cursor: null, stack: [], search: items.search, page: null }; refreshNow(); },
  }, label + " (" + capped(view[COUNT_OF[s]], view) + ")")));
  const [firstLabel, lastLabel] = ENDS[items.state];
  document.querySelector('[data-action="first"]').textContent = firstLabel;
  document.querySelector('[data-action="last"]').textContent = lastLabel;
}

// The queue's groups (the ones with the most ready items) and its limits, as the API says
// them; hidden on a queue without flow control.
function renderFlow() {
  const flow = view.flow, groups = view.groups || [], limits = view.limits_described || [];
  $("flow").hidden = !flow && !limits.length && !view.flow_error;
  let summary = "";
  if (view.flow_error) summary = "cannot be read: " + view.flow_error;
  else if (flow) {
    summary = num(flow.groups) + " kept · " + num(flow.groups_ready) + " with ready items · " + num(flow.groups_saturated) + " at their limit";
    if (groups.length < flow.groups) summary += " · the " + groups.length + " with the most ready items";
  }
  $("flow-summary").textContent = summary;
  const cell = (field, v) => el("td", { "data-field": field }, v);
  document.querySelector("#groups tbody").replaceChildren(...groups.map((g) => el("tr", { class: "group", "data-group": g.name },
    cell("name", g.name), cell("ready", num(g.ready)), cell("in_flight", num(g.in_flight)),
    cell("limit", g.limit == null ? "none" : num(g.limit)), cell("oldest_ready", secs(g.oldest_ready_s)))));
  $("limits").replaceChildren(...limits.flatMap(([what, setting]) => [el("dt", {}, what), el("dd", { "data-limit": what }, setting)]));
}

// The queue's periodic schedules, with pause and resume where the source acts; hidden when
// it has none.
function renderSchedules() {
  const list = view.schedules || [];
  $("schedules-box").hidden = !list.length && !view.schedules_error;
  $("schedules-note").textContent = view.schedules_error ? "cannot be read: " + view.schedules_error : "";
  const cell = (field, v, cls) => el("td", { "data-field": field, class: cls || null }, v);
  document.querySelector("#schedules tbody").replaceChildren(...list.map((s) => {
    const acts = [];
    if (!readOnly && !s.name_truncated) {
      const verb = s.paused ? "resume" : "pause";
      acts.push(button(s.paused ? "Resume" : "Pause", "schedule-" + verb, () => act("schedules/" + verb, { schedule: s.name }, verb + " schedule " + s.name)));
    }
    return el("tr", { class: "schedule", "data-schedule": s.name },
      cell("name", s.name), cell("spec", s.spec, "text"), cell("time_zone", s.time_zone || ""),
      cell("next_tick", s.next_tick || ""), cell("last_tick", s.last_tick || ""),
      cell("state", s.paused ? el("span", { class: "paused" }, "paused") : el("span", { class: "running" }, "running")),
      cell("since", s.since || ""), el("td", {}, ...acts));
  }));
}

// An item whose text the listing cut is opened by its reference and the page it is on; its
// detail shows it whole, with its actions.
function openRef(x) {
  return { ref: x.item_ref, state: items.state, from: items.from, cursor: items.cursor, limit: pageLimit, q: items.search, preview: x.item };
}

function itemActions(state, x) {
  if (x.item_truncated && state !== "dead") return [el("button", { type: "button", "data-action": "open", onclick: () => { openItem = openRef(x); refreshNow(); } }, "Open")];
  if (readOnly) return [];
  const retry = () => button("Retry now", "retry", () => act("items/retry", { item: x.item }, "retry now"));
  const remove = () => button("Remove", "remove", () => { if (confirm("Remove " + x.item + " from the queue?")) act("items/remove", { item: x.item }, "remove"); }, "danger");
  switch (state) {
    case "ready": return [remove()];
    case "delayed": return [retry(), remove()];
    case "failing": return [retry(), button("Forget", "forget", () => act("forget", { item: x.item }, "forget")), remove()];
    case "dead": return [
      button("Requeue", "requeue", () => act("dead-letters/requeue", { id: x.dead.id }, "requeue")),
      button("Delete", "delete", () => { if (confirm("Delete this dead letter?")) act("dead-letters/delete", { id: x.dead.id }, "delete"); }, "danger")];
    default: return [];
  }
}

const COLUMNS = {
  ready: [["priority", (x) => x.priority]],
  delayed: [["due in (s)", (x) => secs(x.due_in_s)]],
  in_flight: [["age (s)", (x) => secs(x.lease.age_s)], ["expires in (s)", (x) => secs(x.lease.expires_in_s)], ["token", (x) => x.lease.token], ["holder", (x) => x.lease.holder || ""]],
  failing: [["failures", (x) => num(x.failures)]],
  dead: [["error", (x) => x.dead.error, "text"], ["when", (x) => new Date(x.dead.at_ms).toISOString()], ["stalls", (x) => x.dead.stalls], ["failures", (x) => x.dead.failures]],
};

function renderItems() {
  const page = items.page;
  const cols = COLUMNS[items.state];
  document.querySelector("#items thead").replaceChildren(el("tr", {}, el("th", {}, "item"), ...cols.map((c) => el("th", {}, c[0])), el("th", {}, "")));
  document.querySelector("#items tbody").replaceChildren(...(page ? page.items : []).map((x) =>
    el("tr", { class: "item-row", "data-item": x.item },
      el("td", { class: "item", title: x.item_truncated ? "show this item whole (" + num(x.item_bytes) + " bytes)" : "show this item", onclick: () => { openItem = x.item_truncated ? openRef(x) : x.item; refreshNow(); } }, x.item),
      ...cols.map((c) => el("td", { class: c[2] || null }, c[1](x))),
      el("td", {}, ...itemActions(items.state, x)))));
  const at = items.stack.length * pageLimit;
  let info = "";
  if (page) {
    const end = items.from === "first" ? ENDS[items.state][0].toLowerCase() : ENDS[items.state][1].toLowerCase();
    info = items.search
      ? page.items.length + " matching on this page of " + capped(page.total, page) + (page.next ? " (more to search)" : "")
      : (page.items.length ? num(at + 1) + "–" + num(at + page.items.length) : "none") + " of " + capped(page.total, page) + ", from the " + end;
  }
  $("page-info").textContent = info;
  document.querySelector('[data-action="next"]').disabled = !(page && page.next);
  document.querySelector('[data-action="prev"]').disabled = items.stack.length === 0 && !(page && page.prev);
}

async function renderItem() {
  const box = $("item-detail");
  if (!openItem) { box.hidden = true; return; }
  let d;
  try {
    const { preview, ...byRef } = typeof openItem === "string" ? {} : openItem;
    d = await getJson(queuePath("item", typeof openItem === "string" ? { item: openItem } : byRef));
    // From now on by its whole text.
    openItem = d.item;
  } catch (e) {
    if (e.status === 404) { box.hidden = false; $("item-name").textContent = typeof openItem === "string" ? openItem : openItem.preview; $("item-facts").replaceChildren(el("dt", {}, "state"), el("dd", { "data-fact": "states" }, "not in the queue")); $("item-actions").replaceChildren(); document.querySelector("#item-dead tbody").replaceChildren(); return; }
    throw e;
  }
  box.hidden = false;
  $("item-name").textContent = d.item;
  const facts = [["states", d.states.join(", ") || "none"], ["priority", d.priority], ["position", d.position],
    ["due in (s)", secs(d.due_in_s)], ["lease token", d.lease && d.lease.token], ["lease holder", d.lease && d.lease.holder],
    ["lease age (s)", d.lease && secs(d.lease.age_s)], ["lease expires in (s)", d.lease && secs(d.lease.expires_in_s)],
    ["re-added while leased", d.readded ? "yes" : ""], ["failures", d.failures], ["stalls", d.stalls]];
  $("item-facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined && v !== "").flatMap(([k, v]) =>
    [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
  const x = { item: d.item };
  const acts = [];
  if (!readOnly) {
    if (d.states.includes("delayed") || d.states.includes("failing")) acts.push(button("Retry now", "retry", () => act("items/retry", x, "retry now")));
    if (d.failures > 0) acts.push(button("Forget failures", "forget", () => act("forget", x, "forget")));
    if (d.states.some((s) => s !== "dead")) acts.push(button("Remove from queue", "remove", () => { if (confirm("Remove " + d.item + " from the queue?")) act("items/remove", x, "remove"); }, "danger"));
  }
  $("item-actions").replaceChildren(...acts);
  document.querySelector("#item-dead tbody").replaceChildren(...d.dead_letters.map((l) => el("tr", {},
    el("td", { class: "text" }, l.error), el("td", {}, new Date(l.at_ms).toISOString()), el("td", {}, l.stalls), el("td", {}, l.failures),
    el("td", {}, ...itemActions("dead", { item: d.item, dead: l })))));
}

// A line chart as an SVG polyline: hand-drawn because a few sparkline-style charts need no
// more than this, and it keeps the page free of any third-party code.
function chart(title, points) {
  const W = 320, H = 110, P = 22;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-chart": title });
  const max = Math.max(1, ...points.map((p) => p[1]));
  const t0 = points.length ? points[0][0] : 0, t1 = points.length ? points[points.length - 1][0] : 1;
  const x = (t) => P + ((t - t0) / Math.max(1, t1 - t0)) * (W - P - 4);
  const y = (v) => H - 14 - (v / max) * (H - 24);
  svg.append(svgEl("line", { x1: P, y1: y(0), x2: W - 4, y2: y(0) }), svgEl("line", { x1: P, y1: y(max), x2: W - 4, y2: y(max) }));
  const top = svgEl("text", { x: 2, y: y(max) + 3 }); top.textContent = String(Math.round(max * 100) / 100);
  const zero = svgEl("text", { x: 2, y: y(0) + 3 }); zero.textContent = "0";
  const span = svgEl("text", { x: P, y: H - 2 }); const s = Math.round((t1 - t0) / 1000);
  span.textContent = !points.length ? "no data yet" : s < 120 ? "last " + s + " s" : "last " + Math.round(s / 60) + " min";
  svg.append(top, zero, span, svgEl("polyline", { points: points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ") }));
  return el("figure", {}, el("figcaption", {}, title), svg);
}

function rate(s, field) {
  const out = [];
  for (let i = 1; i < s.length; i++) {
    const a = s[i - 1], b = s[i];
    if (a[field] == null || b[field] == null) continue;
    out.push([b.t, Math.max(0, b[field] - a[field]) / Math.max(0.001, (b.t - a.t) / 1000)]);
  }
  return out;
}

// Only the selected queue's new samples are fetched; the page keeps the rest, so the charts
// stay while a server is down.
async function updateCharts() {
  const k = sel.source + "/" + sel.name;
  if (k !== samplesKey) { samples = []; samplesKey = k; }
  const since = samples.length ? samples[samples.length - 1].t : 0;
  const h = await getJson("api/history" + qs({ queue: sel.name, source: sel.source, since }));
  samples.push(...h.samples);
  const cut = Date.now() - KEEP_MS;
  while (samples.length && samples[0].t < cut) samples.shift();
  drawCharts();
}

function drawCharts() {
  const s = samples;
  const figs = [chart("depth", s.map((p) => [p.t, p.depth]))];
  if (s.some((p) => p.adds != null)) {
    figs.push(chart("adds / s", rate(s, "adds")), chart("completions / s", rate(s, "completions")), chart("failures / s", rate(s, "retries")));
  } else {
    figs.push(chart("failures (sum of counts)", s.map((p) => [p.t, p.failures])));
  }
  figs.push(chart("in flight", s.map((p) => [p.t, p.in_flight])), chart("dead letters", s.map((p) => [p.t, p.dead])));
  $("charts").replaceChildren(...figs);
}

async function refresh() {
  const status = $("status");
  let data;
  try {
    data = await getJson("api/queues");
  } catch (e) {
    data = e.body;
    if (!data || !data.sources) {
      status.className = "error";
      status.textContent = e.message + " (the dashboard does not answer)";
      return;
    }
  }
  sources = data.sources;
  readOnly = data.read_only;
  pageLimit = data.page_limit || pageLimit;
  renderSources();
  renderQueues(data);
  const down = sources.filter((s) => !s.up);
  try {
    if (sel && sel.source && sources.some((s) => s.label === sel.source && s.up)) {
      view = await getJson(queuePath(""));
      renderDetail();
      renderFlow();
      renderSchedules();
      const src = sources.find((s) => s.label === sel.source);
      if (src && src.has_items) {
        items.page = await getJson(queuePath("items", { state: items.state, from: items.from, cursor: items.cursor, limit: pageLimit, q: items.search }));
        renderItems();
        await renderItem();
      }
      await updateCharts();
    } else if (sel && view) {
      drawCharts();
    }
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
    return;
  }
  status.setAttribute("data-updated", Date.now());
  if (down.length) {
    status.className = "stale";
    status.textContent = down.map((s) => s.label).join(", ") + " down · " + clock(Date.now());
  } else {
    status.className = "";
    status.textContent = (paused ? "paused" : "live") + " · " + clock(Date.now());
  }
}

// One refresh at a time; the next is scheduled when it ends, never while the tab is hidden
// or updates are paused.
async function tick() {
  clearTimeout(timer);
  timer = null;
  if (running) return;
  running = true;
  try { await refresh(); } finally { running = false; }
  schedule();
}

function schedule() {
  clearTimeout(timer);
  timer = null;
  if (!paused && !document.hidden) timer = setTimeout(tick, POLL_MS);
}

// After an action or a click: refresh at once (or right after the refresh under way).
async function refreshNow() {
  if (running) { clearTimeout(timer); timer = setTimeout(refreshNow, 50); return; }
  await tick();
}

document.addEventListener("visibilitychange", () => { if (document.hidden) { clearTimeout(timer); timer = null; } else if (!paused) tick(); });
$("toggle-refresh").addEventListener("click", () => {
  paused = !paused;
  const b = $("toggle-refresh");
  b.setAttribute("aria-pressed", String(paused));
  b.textContent = paused ? "Resume updates" : "Pause updates";
  $("status").textContent = paused ? "paused" : "live";
  if (paused) { clearTimeout(timer); timer = null; } else tick();
});
$("queue-filter").addEventListener("input", () => renderQueues({ queues: [...rows.values()].filter((q) => !q.stale) }));
$("item-controls").addEventListener("submit", (e) => {
  e.preventDefault();
  items.search = $("search").value.trim();
  items.cursor = null; items.stack = [];
  refreshNow();
});
$("item-controls").addEventListener("click", (e) => {
  const a = e.target.getAttribute && e.target.getAttribute("data-action");
  if (a === "first" || a === "last") { items.from = a; items.cursor = null; items.stack = []; refreshNow(); }
  if (a === "next" && items.page && items.page.next) { items.stack.push(items.cursor); items.cursor = items.page.next; refreshNow(); }
  if (a === "prev") {
    if (items.stack.length) items.cursor = items.stack.pop();
    else if (items.page && items.page.prev) items.cursor = items.page.prev;
    refreshNow();
  }
});
document.querySelector('[data-action="close-item"]').addEventListener("click", () => { openItem = null; $("item-detail").hidden = true; });
tick();
