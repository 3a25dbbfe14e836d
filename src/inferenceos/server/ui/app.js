// InferenceOS dashboard: reads the same routes any client does (/api/ps, /api/budget,
// /api/events, /metrics) and streams chat from /v1/chat/completions. Hand-written, no
// dependencies: it must work offline, served by the server itself.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120; // points per chart (two minutes at one a second)
const state = { lastEvent: 0, prev: null, tps: [], ttft: [], models: [] };

function fmtBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// The page itself is public (it holds no data); every data route needs the server's
// API key when it has one. The key comes from the link (/ui#key=KEY, removed from the
// address bar at once) or is asked once, and is kept for this tab only.
(function keyFromLink() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {
    sessionStorage.setItem("inferenceos-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
})();

function withKey(headers) {
  const key = sessionStorage.getItem("inferenceos-key");
  return key ? { ...headers, Authorization: "Bearer " + key } : headers;
}

async function authed(path, init) {
  let r = await fetch(path, { ...(init || {}), headers: withKey((init || {}).headers || {}) });
  if (r.status === 401) {
    const key = window.prompt("This server needs its API key:");
    if (key) {
      sessionStorage.setItem("inferenceos-key", key);
      r = await fetch(path, { ...(init || {}), headers: withKey((init || {}).headers || {}) });
    }
  }
  return r;
}

async function getJSON(path) {
  const r = await authed(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(path + " answered " + r.status);
  return r.json();
}

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const i = line.lastIndexOf(" ");
    const name = line.slice(0, i).split("{")[0];
    const v = parseFloat(line.slice(i + 1));
    if (!Number.isNaN(v)) out[name] = (out[name] || 0) + v;
  }
  return out;
}

function renderModels(ps) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren();
  const models = ps.models || [];
  if (!models.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "none loaded")));
  for (const m of models) {
    const mem = Object.entries(m.memory_by_device || {}).map(([d, b]) => d + " " + fmtBytes(b)).join(", ");
    body.append(el("tr", {},
      el("td", {}, m.name), el("td", { class: "state-" + m.state }, m.state), el("td", {}, mem),
      el("td", {}, m.context_length + "×" + (m.slots || 1)), el("td", {}, m.in_use || 0),
      el("td", { class: "why" }, m.reason || "")));
  }
  const names = models.map((m) => m.name);
  if (names.join() !== state.models.join()) {
    state.models = names;
    const sel = document.getElementById("chat-model");
    const keep = sel.value;
    sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(keep)) sel.value = keep;
  }
}

function renderDevices(budget) {
  const box = document.getElementById("devices");
  box.replaceChildren();
  const pressured = (budget.pressure && budget.pressure.pressured) || [];
  for (const d of budget.devices || []) {
    const total = d.total_bytes || 0;
    const ours = d.used_bytes || 0;
    const used = total && d.free_bytes !== null ? total - d.free_bytes : 0;
    const other = Math.max(0, used - ours);
    const bar = el("div", { class: "bar" });
    if (total) {
      bar.append(el("span", { class: "ours", style: `width:${(100 * ours) / total}%` }));
      bar.append(el("span", { class: "other", style: `width:${(100 * other) / total}%` }));
    }
    const cap = d.cap_bytes !== null && d.cap_bytes !== undefined
      ? el("span", { class: "cap" }, " · cap " + fmtBytes(d.cap_bytes)) : "";
    const sig = pressured.includes(d.name) ? el("span", { class: "cap" }, " · under pressure") : "";
    box.append(el("div", { class: "dev" },
      el("div", {}, el("b", {}, d.name), " ours " + fmtBytes(ours) + " · free " + fmtBytes(d.free_bytes)
        + (total ? " of " + fmtBytes(total) : ""), cap, sig), bar));
  }
}

function renderEvents(events) {
  const list = document.getElementById("events");
  for (const e of events) {
    const t = new Date(e.ts * 1000).toLocaleTimeString();
    // the server writes each event's detail as a person reads it ("load 0.97 s, ...")
    list.prepend(el("li", { class: e.kind }, `${t} ${e.kind} ${e.model || ""} ${e.text || ""}`));
  }
  while (list.children.length > 50) list.lastChild.remove();
}

// The top of a chart's axis: the smallest 1, 2 or 5 × 10^k at or above `v` (1 when
// there is nothing above zero to show), so the labels are round numbers.
function axisTop(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p * (1 + 1e-9)) return m * p;
  return 10 * p;
}

function axisLabel(n) {
  return Number(n.toPrecision(3)).toLocaleString("en-US", { maximumFractionDigits: 3 });
}

// `points`: one value a poll, null where there was nothing to measure yet (a gap).
function drawChart(id, points, unit) {
  const c = document.getElementById(id);
  const g = c.getContext("2d");
  const w = c.width, h = c.height, pad = 24;
  g.clearRect(0, 0, w, h);
  const values = points.filter((p) => p !== null);
  const max = axisTop(Math.max(0, ...values));
  g.strokeStyle = "#2a323c";
  g.fillStyle = "#8a96a3";
  g.font = "11px sans-serif";
  for (let i = 0; i <= 2; i++) {
    const y = pad / 2 + ((h - pad) * i) / 2;
    g.beginPath(); g.moveTo(pad * 2, y); g.lineTo(w, y); g.stroke();
    g.fillText(axisLabel(max * (1 - i / 2)), 2, y + 4);
  }
  g.fillText(unit, w - 40, 12);
  if (!values.length) {
    g.textAlign = "center";
    g.fillText("no data yet", pad + w / 2, h / 2);
    g.textAlign = "start";
    return;
  }
  g.strokeStyle = g.fillStyle = "#58a6ff";
  g.lineWidth = 2;
  const at = (i) => [pad * 2 + ((w - pad * 2) * i) / (HISTORY - 1),
    pad / 2 + (h - pad) * (1 - points[i] / max)];
  const known = (i) => i >= 0 && i < points.length && points[i] !== null;
  g.beginPath();
  points.forEach((p, i) => {
    if (p === null) return;
    const [x, y] = at(i);
    if (known(i - 1)) g.lineTo(x, y); else g.moveTo(x, y);
  });
  g.stroke();
  points.forEach((p, i) => { // a point with no neighbour is a dot, not nothing
    if (p === null || known(i - 1) || known(i + 1)) return;
    const [x, y] = at(i);
    g.beginPath(); g.arc(x, y, 2.5, 0, 2 * Math.PI); g.fill();
  });
}

function updateCharts(m) {
  const now = performance.now() / 1000;
  const gen = m["inferenceos:generation_tokens_total"] || 0;
  const tSum = m["inferenceos:time_to_first_token_seconds_sum"] || 0;
  const tCount = m["inferenceos:time_to_first_token_seconds_count"] || 0;
  if (state.prev) {
    const dt = now - state.prev.at;
    const tps = dt > 0 ? (gen - state.prev.gen) / dt : 0;
    const dn = tCount - state.prev.tCount;
    // the last TTFT holds until a new request measures one; none before the first
    const ttft = dn > 0 ? ((tSum - state.prev.tSum) / dn) * 1000 : (state.ttft.at(-1) ?? null);
    state.tps.push(Math.max(0, tps));
    state.ttft.push(ttft);
    if (state.tps.length > HISTORY) state.tps.shift();
    if (state.ttft.length > HISTORY) state.ttft.shift();
    document.getElementById("tps-now").textContent = tps.toFixed(1) + " tok/s";
    document.getElementById("ttft-now").textContent =
      ttft === null ? "" : ttft.toFixed(ttft < 10 ? 1 : 0) + " ms" + (dn > 0 ? "" : " (last)");
  }
  // first poll: TTFT counts from zero, so the first point is the mean of the requests
  // before the page opened (the rate needs two readings of the counter either way)
  state.prev = state.prev ? { at: now, gen, tSum, tCount } : { at: now, gen, tSum: 0, tCount: 0 };
  drawChart("tps", state.tps, "tok/s");
  drawChart("ttft", state.ttft, "ms");
  document.getElementById("summary").textContent =
    `running ${m["inferenceos:num_requests_running"] || 0} · waiting ${m["inferenceos:num_requests_waiting"] || 0}`
    + ` · KV ${Math.round(100 * (m["inferenceos:kv_cache_usage_perc"] || 0))} %`;
}

async function poll() {
  try {
    const [ps, budget, metrics, ev] = await Promise.all([
      getJSON("/api/ps"), getJSON("/api/budget"),
      authed("/metrics").then((r) => r.text()), getJSON("/api/events?since=" + state.lastEvent),
    ]);
    renderModels(ps);
    renderDevices(budget);
    updateCharts(parseMetrics(metrics));
    renderEvents(ev.events || []);
    state.lastEvent = ev.last_id || state.lastEvent;
    document.getElementById("status").textContent = "live";
  } catch (err) {
    document.getElementById("status").textContent = "disconnected: " + err.message;
  }
}

async function chat(ev) {
  ev.preventDefault();
  const input = document.getElementById("chat-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  const log = document.getElementById("chat-log");
  log.append(el("div", { class: "msg user" }, text));
  const reply = el("div", { class: "msg assistant", id: "reply-" + log.children.length });
  log.append(reply);
  const model = document.getElementById("chat-model").value || undefined;
  try {
    const r = await authed("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: text }] }),
    });
    if (!r.ok) throw new Error((await r.text()).slice(0, 200));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) reply.textContent += delta.content;
      }
    }
    reply.classList.add("done");
  } catch (err) {
    reply.classList.add("error");
    reply.textContent = "error: " + err.message;
  }
}

document.getElementById("chat-form").addEventListener("submit", chat);
poll();
setInterval(poll, POLL_MS);
