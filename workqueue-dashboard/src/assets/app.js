// The dashboard page: polls the JSON API and draws plain DOM and SVG (no framework, no
// secret: a token lives in an HttpOnly cookie). Every action is a POST with X-Wq-Csrf.
"use strict";

const POLL_MS = 2000;
let selected = decodeURIComponent(location.hash.slice(1)) || null;
let readOnly = true;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return r.json();
}

async function act(queue, path, body) {
  const r = await fetch("api/queues/" + encodeURIComponent(queue) + "/" + path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-Wq-Csrf": "1", "Content-Type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  const text = await r.text();
  document.getElementById("status").textContent = r.ok ? path + ": done " + text : path + ": " + text;
  await refresh();
}

function state(q) {
  if (q.shut_down) return el("span", { class: "shut" }, "shut down");
  if (q.paused) return el("span", { class: "paused" }, "paused");
  return el("span", { class: "running" }, "running");
}

function renderQueues(data) {
  readOnly = data.read_only;
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...data.warnings.map((w) => el("div", { class: "warning" }, "Redis persistence: " + w)));
  const body = document.querySelector("#queues tbody");
  body.replaceChildren(...data.queues.map((q) => {
    const cell = (field, v) => el("td", { "data-field": field }, v);
    const row = el("tr", { class: "queue" + (q.name === selected ? " selected" : ""), "data-queue": q.name,
      onclick: () => { selected = q.name; location.hash = encodeURIComponent(q.name); refresh(); } },
      cell("name", q.name), cell("state", state(q)), cell("depth", q.depth), cell("delayed", q.delayed),
      cell("in_flight", q.in_flight), cell("failing", q.failing), cell("stalled", q.stalled),
      cell("dead", q.dead), cell("longest_running", q.longest_running_s.toFixed(1)));
    return row;
  }));
  if (!selected && data.queues.length > 0) selected = data.queues[0].name;
}

function button(label, id, onclick, cls) {
  return el("button", { "data-action": id, class: cls || "", onclick }, label);
}

function renderDetail(d) {
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-name").replaceChildren(d.name + " ", state(d));
  const q = d.name;
  const actions = document.getElementById("actions");
  if (readOnly) {
    actions.replaceChildren(el("em", {}, "read-only"));
  } else {
    actions.replaceChildren(
      d.paused ? button("Resume", "resume", () => act(q, "resume")) : button("Pause", "pause", () => act(q, "pause")),
      button("Requeue all dead letters", "requeue-all", () => act(q, "dead-letters/requeue-all")),
      button("Purge dead letters", "purge", () => { if (confirm("Drop every dead letter of " + q + "?")) act(q, "dead-letters/purge"); }, "danger"));
  }
  document.querySelector("#leases tbody").replaceChildren(...d.leases.map((l) =>
    el("tr", {}, el("td", {}, l.item), el("td", {}, l.age_s.toFixed(1)), el("td", {}, l.expires_in_s.toFixed(1)), el("td", {}, l.token))));
  document.querySelector("#failures tbody").replaceChildren(...d.failure_counts.map((f) =>
    el("tr", {}, el("td", {}, f.item), el("td", {}, f.failures),
      el("td", {}, readOnly ? "" : button("Forget", "forget", () => act(q, "forget", { item: f.item }))))));
  document.querySelector("#dead tbody").replaceChildren(...d.dead_letters.map((x) =>
    el("tr", { class: "dead-letter" }, el("td", {}, x.item), el("td", {}, x.error), el("td", {}, new Date(x.at_ms).toISOString()),
      el("td", {}, x.stalls), el("td", {}, x.failures),
      el("td", {}, readOnly ? "" : button("Requeue", "requeue", () => act(q, "dead-letters/requeue", { item: x.item }))))));
}

// A line chart as an SVG polyline: hand-drawn because four sparkline-style charts need no
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
  const span = svgEl("text", { x: P, y: H - 2 }); const secs = Math.round((t1 - t0) / 1000);
  span.textContent = !points.length ? "no data yet" : secs < 120 ? "last " + secs + " s" : "last " + Math.round(secs / 60) + " min";
  svg.append(top, zero, span, svgEl("polyline", { points: points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ") }));
  return el("figure", {}, el("figcaption", {}, title), svg);
}

function rate(samples, field) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    if (a[field] == null || b[field] == null) continue;
    out.push([b.t, Math.max(0, b[field] - a[field]) / Math.max(0.001, (b.t - a.t) / 1000)]);
  }
  return out;
}

function renderCharts(history) {
  const s = history.queues[selected] || [];
  const counted = s.some((p) => p.adds != null);
  const figs = [chart("depth", s.map((p) => [p.t, p.depth]))];
  if (counted) {
    figs.push(chart("adds / s", rate(s, "adds")), chart("completions / s", rate(s, "completions")),
      chart("failures / s", rate(s, "retries")));
  } else {
    figs.push(chart("failures (sum of counts)", s.map((p) => [p.t, p.failures])));
  }
  figs.push(chart("in flight", s.map((p) => [p.t, p.in_flight])), chart("dead letters", s.map((p) => [p.t, p.dead])));
  document.getElementById("charts").replaceChildren(...figs);
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    renderQueues(await getJson("api/queues"));
    if (selected) {
      renderDetail(await getJson("api/queues/" + encodeURIComponent(selected)));
      renderCharts(await getJson("api/history"));
    }
    status.className = "";
    status.setAttribute("data-updated", Date.now());
    if (!status.textContent.includes(":")) status.textContent = "live";
  } catch (e) {
    status.className = "error";
    status.textContent = String(e.message);
  }
}

refresh();
setInterval(refresh, POLL_MS);
