// The tap's live page: the fleet's sync state, objects, rollouts and verdicts as they come.
// Reads only the tap's own /status, /objects, /rollouts, /verdicts and /events (in a tier the first
// four answer for the tier, /events for this tap); every string from the network goes into the
// page as text (textContent), never as markup.
"use strict";

const TYPES = ["CDS", "LDS", "EDS", "RDS", "SDS"];
const FEED_KEPT = 200;
const ROLLOUTS_SHOWN = 12;
const CURVES = 4;
// Rows drawn at most (a filter narrows a larger fleet).
const ROWS_SHOWN = 500;
// The views are asked for again at most this often while verdicts stream in (the feed itself
// is live): ten open pages cost the tap a few answers a second, not one per verdict.
const REFRESH_GAP_MS = 2000;

let config = { trace_url: "" };
let status = null;
let rollouts = null;
let objects = null;
// The object whose nodes are shown, and its view.
let openObject = null;
let objectView = null;
let verdicts = [];
const open = new Set();
const resources = new Map();
// In a tier: each open node's recent verdicts as the tap it is connected to has them.
const nodeVerdicts = new Map();
const tier = () => !!(status && (status.taps || []).length);

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function age(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function traceLink(traceId, text) {
  if (!config.trace_url || !traceId) return null;
  const href = config.trace_url.split("{trace_id}").join(encodeURIComponent(traceId));
  if (!/^https?:\/\//.test(href)) return null;
  return el("a", { href, target: "_blank", rel: "noopener noreferrer", text });
}

// `*` any run, `?` one character, everything else itself.
function globMatcher(glob) {
  if (!glob) return () => true;
  const re = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  const r = new RegExp("^" + re + "$");
  return (s) => r.test(s);
}

function typeState(t) {
  if (!t) return "IGNORED";
  if (t.state === "NACKED" && t.nack && t.nack.scope === "PARTIAL") return "PARTIAL";
  return t.state;
}

function stateLabel(state) {
  return state.replace("_", " ");
}

function cell(t) {
  const state = typeState(t);
  let text = stateLabel(state);
  if (t && state !== "SYNCED" && t.state_since) text += " " + age(t.state_seconds);
  if (t && !t.subscribed) text += "*";
  const td = el("td", { "data-state": state }, el("span", { class: "state " + state, text }));
  if (t && t.version_accepted) td.title = "runs " + t.version_accepted;
  return td;
}

// "DestinationRule default/reviews", with " section S" when it has one.
// A word of an object as lists show it: as it is when plain, else quoted, so that no name can
// pass for two objects (the tap's labels do the same).
function shown(s) {
  return /^[A-Za-z0-9._~|:-]+$/.test(s) ? s : JSON.stringify(s);
}

function objectLabel(o) {
  return shown(o.kind) + " " + (o.namespace ? shown(o.namespace) + "/" : "") + shown(o.name) +
    (o.section ? " section " + shown(o.section) : "") + (o.via ? " (via " + o.via + ")" : "");
}

// The command that shows an object, or why there is none.
function objectCommand(o) {
  return o.kubectl || "no command: a word of it is no Kubernetes name";
}

// The objects behind a node's NACKs now, each once.
function nodeObjects(n) {
  const out = [];
  for (const t of n.types) {
    if (t.state !== "NACKED" || !t.nack) continue;
    for (const o of t.nack.objects || []) {
      const label = objectLabel(o);
      if (!out.includes(label)) out.push(label);
    }
  }
  return out;
}

function renderObjects() {
  const list = $("objects");
  list.replaceChildren();
  if (!status) return;
  const objects = status.rejected_objects || [];
  $("objects-count").textContent = objects.length ? objects.length + " now" : "none now";
  for (const r of objects) {
    const o = r.object || {};
    list.append(el("li", { class: "object" },
      el("strong", { text: objectLabel(o) }),
      el("span", { text: " rejected by " + r.nodes + " node" + (r.nodes === 1 ? "" : "s") + " since " + r.since +
        " (" + r.types.join(", ") + ": " + r.resources.join(", ") + ", from " + o.format.toLowerCase().replace(/_/g, "-") + " metadata)" }),
      el("div", { class: "msg", text: objectCommand(o) })));
  }
}

// An object as /objects?object= asks for it: kind/namespace/name.
function objectSpec(o) {
  return o.kind + "/" + (o.namespace ? o.namespace + "/" : "") + o.name;
}

function renderObjectTable() {
  const tbody = $("object-table").tBodies[0];
  tbody.replaceChildren();
  if (!objects) return;
  const filter = $("objects-filter").value.trim().toLowerCase();
  const all = objects.objects || [];
  const shown = all.filter((s) => !filter || objectLabel(s.object || {}).toLowerCase().includes(filter));
  $("all-objects-count").textContent = shown.length + " of " + all.length;
  for (const s of shown.slice(0, ROWS_SHOWN)) {
    const o = s.object || {};
    const spec = objectSpec(o);
    const made = s.resources.map((r) => r.type + " " + r.name).join(", ") +
      (s.resource_count > s.resources.length ? " and " + (s.resource_count - s.resources.length) + " more" : "");
    tbody.append(el("tr", { class: "object-row", "data-object": spec, onclick: () => toggleObject(spec) },
      el("td", { text: objectLabel(o) }), el("td", { text: made }),
      ...[s.nodes, s.taken, s.pending, s.rejected, s.disconnected, s.out_of_scope].map((n) => el("td", { text: String(n) })),
      el("td", { text: s.last_pushed || "-" })));
    if (openObject === spec && objectView) tbody.append(objectDetail(objectView));
  }
  if (!all.length) tbody.append(el("tr", {}, el("td", { colspan: "9", class: "muted", text: "no resource seen names an object" })));
}

function toggleObject(spec) {
  openObject = openObject === spec ? null : spec;
  objectView = null;
  if (openObject) loadObject(openObject);
  renderObjectTable();
}

async function loadObject(spec) {
  try {
    const r = await fetch("/objects?object=" + encodeURIComponent(spec));
    if (!r.ok) return;
    const report = await r.json();
    if (openObject !== spec) return;
    objectView = (report.objects || [])[0] || null;
    renderObjectTable();
  } catch (_) { /* the link state says it */ }
}

// One object's nodes: each resource made from it, what the node runs and what was last
// pushed to it (version and the first 8 of the content digest).
function objectDetail(s) {
  const box = el("td", { colspan: "9", class: "detail" });
  box.append(el("div", { class: "msg", text: objectCommand(s.object || {}) }));
  const table = el("table", { class: "object-nodes" },
    el("tr", {}, ...["node", "state", "resource", "runs", "last pushed", "error"].map((h) => el("th", { text: h }))));
  const content = (v, d) => d ? v + " " + d.slice(0, 8) : "-";
  for (const n of s.node_states || []) {
    for (const r of n.resources) {
      table.append(el("tr", { class: "object-node", "data-node": n.node, "data-digest": r.digest },
        el("td", { text: n.node }),
        el("td", {}, el("span", { class: "state " + (n.state === "TAKEN" ? "SYNCED" : n.state === "REJECTED" ? "NACKED" : "PENDING"), text: n.state.replace("_", " ") })),
        el("td", { text: r.type + " " + r.name }),
        el("td", { text: content(r.version, r.digest) }),
        el("td", { text: content(r.pushed_version, r.pushed_digest) + (r.pushed_at ? " at " + r.pushed_at : "") }),
        el("td", { class: "msg", text: r.error || "-" })));
    }
  }
  box.append(table);
  return el("tr", { class: "detail-row" }, box);
}

// Whose clients the page shows: this tap's, or the tier's (admin.peers), naming any tap that
// did not answer.
function renderScope() {
  const taps = status.taps || [];
  const missing = taps.filter((t) => t.error);
  const named = (t) => t.admin + ((t.also || []).length ? " (also " + t.also.join(", ") + ")" : "");
  $("scope").textContent = taps.length
    ? "The tier: " + (taps.length - missing.length) + " of " + taps.length + " taps answered (" +
      taps.filter((t) => !t.error).map(named).join("; ") + "); each node once, with the tap it is connected to."
    : "This tap only: the clients connected to it (admin.peers makes the page show the whole tier).";
  // What the tier's answers cover, and what stays this tap's own, in the headings.
  $("rollouts-heading").textContent = taps.length ? "Rollouts, the tier's" : "Rollouts";
  $("feed-heading").textContent = taps.length ? "Verdicts as they come, this tap's clients only" : "Verdicts as they come";
  const list = $("missing-taps");
  list.replaceChildren();
  // The error names the tap, in the CLI's words.
  for (const t of missing) list.append(el("li", { class: "missing", "data-tap": t.admin, text: "not answering: " + t.error }));
}

function renderFleet() {
  const tbody = $("fleet").tBodies[0];
  tbody.replaceChildren();
  renderObjects();
  if (!status) return;
  renderScope();
  const byNode = globMatcher($("node-filter").value.trim());
  const cluster = $("cluster-filter").value.trim();
  const object = $("object-filter").value.trim().toLowerCase();
  const byObject = (n) => !object || nodeObjects(n).some((l) => l.toLowerCase().includes(object));
  const shown = status.nodes.filter((n) => byNode(n.id) && (!cluster || n.cluster === cluster) && byObject(n));
  $("fleet-count").textContent = shown.length + " of " + status.nodes.length + " nodes" +
    (shown.length > ROWS_SHOWN ? " (the first " + ROWS_SHOWN + " shown: filter to narrow)" : "");
  for (const n of shown.slice(0, ROWS_SHOWN)) {
    const row = el("tr", { class: "node", "data-node": n.id, onclick: () => toggle(n.id) },
      el("td", { text: n.id }), el("td", { text: n.cluster }));
    for (const ty of TYPES) {
      const td = cell(n.types.find((t) => t.type === ty));
      td.setAttribute("data-type", ty);
      row.append(td);
    }
    const rest = n.types.filter((t) => !TYPES.includes(t.type));
    row.append(el("td", { text: rest.length ? rest.map((t) => t.type + " " + stateLabel(typeState(t))).join(", ") : "-" }));
    row.append(el("td", { text: n.connected ? "yes" : "no (since " + (n.disconnected_at || "?") + ")" }));
    const objects = nodeObjects(n);
    row.append(el("td", { class: "objects", text: objects.length ? objects.join(", ") : "-" }));
    row.append(el("td", { class: "tap", text: (n.taps || []).join(", ") || "this tap" }));
    tbody.append(row);
    if (open.has(n.id)) tbody.append(detail(n));
  }
  if (!status.nodes.length) tbody.append(el("tr", {}, el("td", { colspan: "11", class: "muted", text: "no xDS clients seen yet" })));
}

function toggle(id) {
  if (open.has(id)) open.delete(id);
  else {
    open.add(id);
    loadResources(id);
    loadVerdicts(id);
  }
  renderFleet();
}

async function loadVerdicts(id) {
  if (!tier()) return;
  try {
    const r = await fetch("/verdicts?node=" + encodeURIComponent(id));
    if (!r.ok) return;
    nodeVerdicts.set(id, await r.json());
    renderFleet();
  } catch (_) { /* the link state says it */ }
}

async function loadResources(id) {
  try {
    const r = await fetch("/status?node=" + encodeURIComponent(id));
    if (!r.ok) return;
    const report = await r.json();
    resources.set(id, (report.nodes[0] || {}).resources || []);
    renderFleet();
  } catch (_) { /* the link state says it */ }
}

function detail(n) {
  const box = el("td", { colspan: "11", class: "detail" });
  for (const t of n.types) {
    if (!t.nack) continue;
    const nack = t.nack;
    box.append(el("p", {},
      el("strong", { text: t.type + " rejected " + nack.version + " (" + nack.scope.toLowerCase() + ")" }),
      nack.suspects.length ? el("span", { text: " suspects: " + nack.suspects.join(", ") }) : null,
      nack.applied.length ? el("span", { text: "; applied all the same: " + nack.applied.join(", ") }) : null,
      el("div", { class: "msg", text: nack.message }),
      el("div", { class: "made-from", text: (nack.objects || []).length
        ? "made from: " + nack.objects.map((o) => objectLabel(o) + " (" + objectCommand(o) + ")").join("; ")
        : "no object named in the resources' metadata" })));
  }
  // In a tier, from the tap the node is connected to; otherwise this tap's feed.
  const theirs = tier() ? nodeVerdicts.get(n.id) : null;
  const mine = theirs ? theirs.verdicts.slice().reverse().slice(0, 20) : verdicts.filter((v) => v.node === n.id).slice(0, 20);
  box.append(el("h3", { text: theirs ? "recent verdicts, from its tap " + theirs.tap : "recent verdicts" }));
  if (theirs && theirs.error) box.append(el("p", { class: "missing", text: "its tap gave none: " + theirs.error }));
  else if (!mine.length) box.append(el("p", { class: "muted", text: "none since the page opened or in the tap's recent ones" }));
  else {
    const list = el("ul");
    for (const v of mine) list.append(el("li", {}, verdictLine(v)));
    box.append(list);
  }
  const res = resources.get(n.id);
  if (res && res.length) {
    box.append(el("h3", { text: "resources" }));
    const table = el("table", {}, el("tr", {}, ...["type", "name", "runs", "client", "control plane", "error"].map((h) => el("th", { text: h }))));
    for (const r of res) {
      table.append(el("tr", {}, el("td", { text: r.type }), el("td", { text: r.name }), el("td", { text: r.version || "-" }),
        el("td", {}, el("span", { class: "state " + (r.client === "ACKED" ? "SYNCED" : r.client === "NACKED" ? "NACKED" : "PENDING"), text: r.client })),
        el("td", { text: r.config }),
        el("td", { class: "msg", text: r.error ? r.error + (r.rejected_version ? " (rejected " + r.rejected_version + ")" : "") : "-" })));
    }
    box.append(table);
  }
  return el("tr", { class: "detail-row" }, box);
}

function renderRollouts() {
  const box = $("rollouts");
  box.replaceChildren();
  if (!rollouts) return;
  if (!rollouts.rollouts.length) box.append(el("p", { class: "muted", text: "no versions pushed yet" }));
  for (const r of rollouts.rollouts.slice(0, ROLLOUTS_SHOWN)) {
    const parts = [["acked", r.acked], ["nacked", r.nacked], ["pending", r.pending], ["superseded", r.superseded], ["unanswered", r.unanswered]];
    const bar = el("div", { class: "bar" });
    for (const [k, v] of parts) {
      bar.setAttribute("data-" + k, String(v));
      if (v > 0 && r.pushed > 0) {
        // Through the CSSOM: the page's policy allows no style attributes.
        const part = el("span", { class: k, title: v + " " + k });
        part.style.width = (100 * v / r.pushed) + "%";
        bar.append(part);
      }
    }
    bar.setAttribute("data-pushed", String(r.pushed));
    const counts = el("div", { class: "counts" }, ...parts.map(([k, v]) => el("span", { text: v + " " + k })),
      el("span", { class: "muted", text: "of " + r.pushed + " pushed; last push " + age(r.since_last_push_seconds) + " ago" }));
    const title = el("div", { class: "title" }, el("strong", { text: r.type + " " + r.version }), " ", traceLink(r.trace_id, "trace"));
    const card = el("div", { class: "rollout", "data-type": r.type, "data-version": r.version },
      el("div", { class: "line" }, title, bar, counts));
    for (const g of r.nacks) {
      card.append(el("div", { class: "nack-group" },
        el("span", { text: "rejected by " + g.nodes + " node" + (g.nodes === 1 ? "" : "s") + " (" + g.examples.join(", ") + ")" + (g.scope && g.scope !== "NACK_SCOPE_UNSPECIFIED" ? ", " + g.scope.toLowerCase() : "") }),
        g.suspects.length ? el("span", { text: "; suspects: " + g.suspects.join(", ") }) : null,
        el("div", { class: "msg", text: g.message })));
    }
    box.append(card);
  }
  renderCurve();
}

// Nodes running V against seconds since V was first pushed, for the newest versions.
function renderCurve() {
  const box = $("curve");
  box.replaceChildren();
  const shown = rollouts.rollouts.filter((r) => r.acceptance && r.acceptance.length).slice(0, CURVES);
  if (!shown.length) return;
  const NS = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  };
  const W = 560, H = 170, L = 40, B = 24;
  const maxX = Math.max(0.001, ...shown.flatMap((r) => r.acceptance.map((p) => p.seconds)));
  const maxY = Math.max(1, ...shown.map((r) => r.pushed));
  const x = (s) => L + (W - L - 10) * s / maxX;
  const y = (n) => H - B - (H - B - 10) * n / maxY;
  const root = svg("svg", { width: W, height: H, role: "img" });
  root.append(svg("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, class: "axis" }));
  root.append(svg("line", { x1: L, y1: 10, x2: L, y2: H - B, class: "axis" }));
  const label = (text, attrs) => { const t = svg("text", attrs); t.textContent = text; root.append(t); };
  const span = (s) => s < 1 ? (s * 1000).toFixed(s < 0.01 ? 1 : 0) + "ms" : s.toFixed(s < 10 ? 1 : 0) + "s";
  label("nodes running it", { x: 2, y: 8 });
  label(String(maxY), { x: L - 24, y: 16 });
  label("0", { x: L - 12, y: H - B });
  label("since its first push", { x: L + 10, y: H - 6 });
  label(span(maxX), { x: W - 60, y: H - 6 });
  const colors = ["#2e7d32", "#1565c0", "#ef6c00", "#6a1b9a"];
  const legend = el("div", { class: "legend" });
  shown.forEach((r, i) => {
    // A step for each node that took it, when it answered.
    let d = "M" + x(0) + "," + y(0);
    let nodes = 0;
    for (const p of r.acceptance) {
      d += " L" + x(p.seconds) + "," + y(nodes) + " L" + x(p.seconds) + "," + y(p.nodes);
      nodes = p.nodes;
    }
    d += " L" + x(maxX) + "," + y(nodes);
    root.append(svg("path", { d, fill: "none", stroke: colors[i], "stroke-width": 2 }));
    const key = el("span", { class: "key", text: r.type + " " + r.version + ": " + nodes + " of " + r.pushed });
    key.style.borderColor = colors[i];
    legend.append(key);
  });
  box.append(root, legend);
}

function verdictLine(v) {
  const parts = [v.time, v.node, v.type, v.kind.replace(/_/g, "-"), v.version];
  if (v.kind === "ACK" || v.kind === "NACK") parts.push(Math.round(v.latency_ms) + "ms");
  const line = el("span", { text: parts.join("  ") });
  const out = el("span", {}, line);
  if (v.kind === "NACK") {
    if (v.nack_scope === "PARTIAL") out.append(el("span", { text: "  " + v.rejected.join(", ") + " rejected; " + (v.applied.join(", ") || "nothing else") + " applied" }));
    if (v.suspects.length && v.nack_scope !== "PARTIAL") out.append(el("span", { text: "  suspects: " + v.suspects.join(", ") }));
    out.append(el("div", { class: "msg", text: v.error_message }));
    if ((v.objects || []).length) out.append(el("div", { class: "made-from", text: "made from: " + v.objects.map(objectLabel).join(", ") }));
  }
  const link = traceLink(v.trace_id, "trace");
  if (link) out.append(" ", link);
  return out;
}

function addVerdict(v, fresh) {
  const key = [v.time, v.node, v.type_url, v.nonce, v.kind].join("|");
  if (verdicts.some((w) => w.key === key)) return;
  v.key = key;
  verdicts.unshift(v);
  verdicts.length = Math.min(verdicts.length, FEED_KEPT);
  const kind = v.kind.toLowerCase().replace(/_/g, "-");
  const li = el("li", { class: kind + (fresh ? " fresh" : ""), "data-kind": kind, "data-node": v.node }, verdictLine(v));
  const feed = $("feed");
  feed.prepend(li);
  while (feed.children.length > FEED_KEPT) feed.lastChild.remove();
}

function linkState(live, text) {
  const l = $("link");
  l.className = "link " + (live ? "live" : "lost");
  l.textContent = text;
}

let pending = null;
let lastRefresh = 0;
let unlisted = 0;
function refreshSoon(ms) {
  if (pending) return;
  const wait = Math.max(ms, lastRefresh + REFRESH_GAP_MS - Date.now());
  pending = setTimeout(() => { pending = null; refresh(); }, wait);
}

async function refresh() {
  lastRefresh = Date.now();
  try {
    const [s, r, o] = await Promise.all([fetch("/status"), fetch("/rollouts"), fetch("/objects")]);
    if (!s.ok || !r.ok || !o.ok) throw new Error("HTTP " + s.status + "/" + r.status + "/" + o.status);
    status = await s.json();
    rollouts = await r.json();
    objects = await o.json();
    $("updated").textContent = "as of " + status.generated_at;
    renderFleet();
    renderRollouts();
    renderObjectTable();
    if (openObject) loadObject(openObject);
    for (const id of open) { loadResources(id); loadVerdicts(id); }
  } catch (e) {
    linkState(false, "lost the tap (" + e.message + "); trying again");
  }
}

function listen() {
  const events = new EventSource("/events");
  events.onopen = () => linkState(true, "live");
  events.onerror = () => linkState(false, "lost the tap; reconnecting…");
  // Each message: the verdicts decided since the last, oldest first, and how many more there
  // were than the tap listed (in a storm it sends every NACK and a sample of the rest).
  events.onmessage = (m) => {
    let batch;
    try { batch = JSON.parse(m.data); } catch (_) { return; }
    for (const v of batch.verdicts) addVerdict(v, true);
    if (batch.more > 0) {
      unlisted += batch.more;
      $("unlisted").textContent = unlisted + " more verdicts decided than listed here (every NACK is)";
    }
    if (batch.verdicts.length || batch.more) {
      refreshSoon(batch.verdicts.some((v) => v.kind === "NACK") ? 100 : 500);
    }
  };
}

async function start() {
  for (const id of ["node-filter", "cluster-filter", "object-filter"]) $(id).addEventListener("input", renderFleet);
  $("objects-filter").addEventListener("input", renderObjectTable);
  try {
    const c = await fetch("/ui/config");
    if (c.ok) config = await c.json();
  } catch (_) { /* no trace links */ }
  await refresh();
  listen();
  setInterval(refresh, 5000);
}

start();
