"use strict";
// Draws the page from status.json and polls it. Every value goes in as text
// (textContent, attributes), never as markup.
// A gateway answer's outcome is its reason: members' failures in purple,
// sites' in blue-grey, the pool's in orange, the client's in grey.
const COLORS = {
  ok: "#2e7d32", granted: "#2e7d32", rate_limited: "#f9a825", banned: "#c62828",
  upstream_failed: "#6a1b9a", member_timeout: "#8e24aa",
  target_unreachable: "#546e7a", dns: "#78909c", site_certificate: "#37474f", timeout: "#607d8b",
  no_member: "#ef6c00", no_match: "#ef6c00", pool_unreachable: "#f57c00", pool_error: "#fb8c00",
  shutting_down: "#ffb74d", private_target: "#455a64", loop: "#455a64",
  auth: "#8d6e63", unauthorized: "#8d6e63", bad_params: "#a1887f", bad_request: "#90a4ae", invalid: "#90a4ae",
  client_gone: "#b0bec5", client_timeout: "#cfd8dc", internal: "#ad1457", gateway_overloaded: "#ad1457", error: "#ad1457",
  other: "#9e9e9e"
};
const SVGNS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

// table fills box with rows; columns are [heading, value(row), class(row)?, numeric?].
function table(box, columns, rows, empty) {
  box.replaceChildren();
  if (!rows || rows.length === 0) {
    box.append(el("p", empty, "empty"));
    return;
  }
  const t = el("table"), head = el("tr");
  for (const c of columns) head.append(el("th", c[0]));
  t.append(head);
  for (const r of rows) {
    const tr = el("tr");
    for (const c of columns) {
      const td = el("td", c[1](r));
      const cls = ((c[3] ? "num " : "") + ((c[2] && c[2](r)) || "")).trim();
      if (cls) td.className = cls;
      tr.append(td);
    }
    t.append(tr);
  }
  box.append(t);
}

function ms(v) { return v > 0 ? v + " ms" : "—"; }
function attrs(a) { return Object.keys(a || {}).sort().map((k) => k + "=" + a[k]).join(" "); }
function age(s) {
  if (s < 120) return s + "s";
  if (s < 7200) return Math.floor(s / 60) + "m";
  if (s < 172800) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function show(id, on) { $(id).hidden = !on; }

function chart(c) {
  const box = $("chart"), legend = $("legend");
  box.replaceChildren();
  legend.replaceChildren();
  const W = 720, H = 170, top = 16, bottom = 18, n = c.bars || 1;
  const s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "requests by outcome" });
  let peak = 0;
  const stacks = new Array(n).fill(0);
  for (const se of c.series) se.counts.forEach((v, i) => { stacks[i] += v; });
  for (const v of stacks) peak = Math.max(peak, v);
  const bw = W / n, plot = H - top - bottom;
  if (peak === 0) {
    s.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "nothing in the last " + Math.round(n * c.bucketSeconds / 60) + " minutes"));
  }
  const base = new Array(n).fill(0);
  for (const se of c.series) {
    const color = COLORS[se.outcome] || COLORS.other;
    se.counts.forEach((v, i) => {
      if (v <= 0) return;
      const h = Math.max(plot * v / peak, 1);
      const y = H - bottom - base[i] - h;
      base[i] += h;
      const r = svg("rect", { x: (i * bw + 1).toFixed(1), y: y.toFixed(1), width: Math.max(bw - 2, 1).toFixed(1), height: h.toFixed(1), fill: color, class: "bar", "data-outcome": se.outcome });
      r.append(svg("title", {}, se.outcome + ": " + v));
      s.append(r);
    });
    const item = el("span");
    const sw = el("i");
    sw.style.background = color;
    item.append(sw, document.createTextNode(se.outcome + " " + se.total));
    legend.append(item);
  }
  s.append(svg("text", { x: 4, y: 12 }, "max " + peak + " per " + c.bucketSeconds + "s"));
  s.append(svg("text", { x: 4, y: H - 4 }, "-" + Math.round(n * c.bucketSeconds / 60) + " min"));
  s.append(svg("text", { x: W - 4, y: H - 4, "text-anchor": "end" }, "now"));
  s.append(svg("line", { x1: 0, y1: H - bottom, x2: W, y2: H - bottom, stroke: "#bbb" }));
  box.append(s);
  if (c.series.length === 0) legend.append(el("span", "no requests", "empty"));
}

// reasons says why the members rest: the reason alone when there is one,
// else how many for each, most first.
function reasons(rs) {
  const all = Object.entries(rs || {}).sort((a, b) => b[1] - a[1]);
  if (all.length === 1) return all[0][0] || "not reported";
  return all.map(([r, n]) => (r || "not reported") + " " + n).join(", ");
}

// topReason is the reason most members rest for (the row's class).
function topReason(rs) {
  const top = Object.entries(rs || {}).sort((a, b) => b[1] - a[1])[0];
  return top ? top[0] : "";
}

function members(d, title) {
  show("members-section", true);
  $("members-title").textContent = title;
  table($("members"), [
    ["member", (m) => m.name],
    ["address", (m) => m.url],
    ["state", (m) => m.state, (m) => m.state],
    ["latency", (m) => ms(m.latencyMillis), null, true],
    ["leases", (m) => m.activeLeases, null, true],
    ["cooldowns", (m) => m.cooldowns, null, true],
    ["attributes", (m) => attrs(m.attributes)]
  ], d.members, "no members");
  show("cooldowns-section", true);
  // One row per site, worst first (the server groups and bounds them): a
  // crawl through dead links rests thousands of {member, site} pairs.
  table($("cooldowns"), [
    ["site", (c) => c.site === "*" ? "every site" : c.site],
    ["members", (c) => c.members, null, true],
    ["why", (c) => reasons(c.reasons), (c) => topReason(c.reasons)],
    ["until", (c) => new Date(c.until).toLocaleTimeString()],
    ["left", (c) => c.secondsLeft + "s", null, true]
  ], d.cooldownSites, "no member is cooling down");
  show("paces-section", true);
  table($("paces"), [
    ["site", (p) => p.site],
    ["interval", (p) => p.minIntervalMillis ? ms(p.minIntervalMillis) : "none", null, true],
    ["concurrency", (p) => p.maxConcurrency || "unlimited", null, true],
    ["learnt", (p) => p.learntIntervalMillis ? ms(p.learntIntervalMillis) : "unlimited", null, true],
    ["slowed by", (p) => p.slowedBy ? p.slowedBy + " at " + new Date(p.slowedAt).toLocaleTimeString() + " (" + p.cuts + " cuts)" : ""],
    ["in flight", (p) => p.inFlight, null, true],
    ["queued", (p) => p.queued, null, true],
    ["waited", (p) => p.waited + " (" + p.waitedSeconds.toFixed(1) + "s)", null, true],
    ["paced 503", (p) => p.refused, null, true],
    ["limit", (p) => p.limit || ""]
  ], d.paces || [], "no site is paced");
  const more = (d.pacesTotal || 0) - (d.paces || []).length;
  if (more > 0) $("paces").append(el("p", "and " + more + " more paced sites (the page shows the " + d.paces.length + " most held)", "empty"));
}

function summary(parts) {
  const box = $("summary");
  box.replaceChildren();
  box.className = "summary";
  for (const p of parts) box.append(el("span", p));
}

function gateway(d) {
  const healthy = d.members.filter((m) => m.state === "ok").length;
  summary([d.members.length + " members, " + healthy + " in service", d.activeLeases + " active leases",
    d.cooldownsTotal + " cooldowns", d.requests.total + " requests in the window",
    d.pool === "pool-api" ? "pool: lease API " + d.poolAPI : "pool: own"]);
  $("chart-title").textContent = "Requests by outcome, last 15 minutes";
  show("chart-section", true);
  chart(d.requests);
  members(d, d.pool === "pool-api" ? "Members (from the lease API)" : "Members");
}

function controller(d) {
  const phases = Object.keys(d.phases).sort().map((p) => p + " " + d.phases[p]);
  summary([d.proxies.length + " Proxies" + (phases.length ? " (" + phases.join(", ") + ")" : ""),
    d.pools.length + " ProxyPools", d.activeLeases + " active leases", d.cooldownsTotal + " cooldowns",
    d.namespace ? "namespace " + d.namespace : "all namespaces"]);
  show("proxies-section", true);
  table($("proxies"), [
    ["namespace", (p) => p.namespace],
    ["name", (p) => p.name],
    ["phase", (p) => p.phase, (p) => p.phase],
    ["mode", (p) => p.mode],
    ["provider", (p) => p.provider || "—"],
    ["address", (p) => p.address || "—"],
    ["latency", (p) => ms(p.latencyMillis), null, true],
    ["pool", (p) => p.pool || "—"],
    ["age", (p) => age(p.ageSeconds), null, true],
    ["message", (p) => p.message]
  ], d.proxies, "no Proxies");
  show("pools-section", true);
  table($("pools"), [
    ["namespace", (p) => p.namespace],
    ["name", (p) => p.name],
    ["desired", (p) => p.desired, null, true],
    ["current", (p) => p.current, null, true],
    ["ready", (p) => p.ready, (p) => p.ready < p.desired ? "false" : "true", true],
    ["draining", (p) => p.draining, null, true]
  ], d.pools, "no ProxyPools");
  show("providers-section", true);
  table($("providers"), [
    ["provider", (p) => p.name],
    ["type", (p) => p.type],
    ["ready", (p) => p.ready ? "ready" : "not ready", (p) => String(p.ready)],
    ["targets", (p) => p.targetsReady],
    ["failing", (p) => p.targets.filter((t) => !t.ready).map((t) => t.name + ": " + (t.reason || "") + (t.message ? " (" + t.message + ")" : "")).join("; ")],
    ["last check", (p) => p.lastCheck ? new Date(p.lastCheck).toLocaleTimeString() : "—"]
  ], d.providers, "no provider checks (none configured, or this replica is not the leader)");
  if (d.leaseStore) {
    $("chart-title").textContent = "Lease requests by outcome, last 15 minutes";
    show("chart-section", true);
    chart(d.leaseRequests);
    members(d, "Lease store members");
  } else {
    show("chart-section", false);
    show("members-section", false);
    show("cooldowns-section", false);
  }
}

function list(id, items) {
  const ul = $(id);
  ul.replaceChildren();
  for (const t of items || []) ul.append(el("li", t));
}

function render(d) {
  list("errors", d.errors);
  list("notes", d.notes);
  if (d.kind === "controller") controller(d); else gateway(d);
}

let refresh = 2;
async function poll() {
  try {
    const r = await fetch("status.json", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const d = await r.json();
    refresh = d.refreshSeconds || refresh;
    render(d);
    document.body.dataset.state = "live";
    $("state").textContent = "live, updated " + new Date(d.generatedAt).toLocaleTimeString();
  } catch (e) {
    document.body.dataset.state = "stale";
    $("state").textContent = "not updating: " + e.message;
  } finally {
    setTimeout(poll, refresh * 1000);
  }
}
poll();
