// quorumq management UI: hash routes, polling the node's /api, no page reload.
"use strict";

const REFRESH_MS = 1500;       // tables and node states
const CHART_REFRESH_MS = 5000; // the node samples every 5 s
const AUTO_PEEK_MAX = 10000;   // larger queues are peeked on request (a grouped one sorts them all)
let session = null;            // {user, rights, csrf, node, cluster}
let timer = null, chartTimer = null, generation = 0;

// --- DOM helpers: text only, never HTML from data -------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function table(id, headers, rows) {
  return h("table", {id}, h("tr", {}, headers.map((x) => h("th", {class: x[1] || ""}, x[0]))), rows);
}
function card(label, value, id) {
  return h("div", {class: "card"}, h("div", {class: "label"}, label),
           h("div", {class: "value", id}, typeof value === "number" ? formatNumber(value) : value));
}
function setMain(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}
function status(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = isError ? "error" : "";
}
function staleNote(stale) { return stale ? h("p", {class: "stale"}, "Possibly stale: " + stale) : null; }
function rate(v) { return v === null || v === undefined ? "–" : formatNumber(v) + "/s"; }

// --- API ------------------------------------------------------------------------------------
class Unauthorized extends Error {}
async function api(path, method, body) {
  const headers = {"X-Requested-With": "quorumq-ui"};
  if (method && method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (session && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  }
  const response = await fetch(path, {method: method || "GET", headers, credentials: "same-origin",
                                      body: body === undefined ? undefined : JSON.stringify(body)});
  if (response.status === 401) throw new Unauthorized("log in");
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}
const q = encodeURIComponent;

// --- login ----------------------------------------------------------------------------------
function showLogin(message) {
  stopTimers();
  document.getElementById("who").textContent = "";
  const user = h("input", {id: "login-user", autocomplete: "username", value: "admin"});
  const password = h("input", {id: "login-password", type: "password",
                               autocomplete: "current-password"});
  const error = h("p", {class: "error", id: "login-error"}, message || "");
  const form = h("form", {class: "login", id: "login-form", onsubmit: async (e) => {
    e.preventDefault();
    try {
      session = await api("/api/login", "POST", {user: user.value, password: password.value});
      route();
    } catch (err) { error.textContent = err.message; }
  }}, h("h1", {}, "Log in"), h("label", {}, "User"), user, h("label", {}, "Password"), password,
     h("p", {class: "muted"}, "admin's password is the cluster's client key (D/client.key)."),
     h("button", {type: "submit", id: "login-submit"}, "Log in"), error);
  setMain(form);
}
async function logout() {
  try { await api("/api/logout", "POST", {}); } catch (e) { /* gone anyway */ }
  session = null;
  showLogin("");
}
function showWho() {
  const who = document.getElementById("who");
  who.replaceChildren(`${session.user} (${session.rights}) on ${session.node} · ${session.cluster}`,
                      h("button", {onclick: logout, id: "logout"}, "Log out"));
}
function isAdmin() { return session && session.rights === "admin"; }

// --- routing and polling --------------------------------------------------------------------
const PAGES = [
  [/^#\/?$/, overviewPage], [/^#\/queues$/, queuesPage], [/^#\/queue\/(.+)$/, queuePage],
  [/^#\/groups$/, groupsPage], [/^#\/consumer-groups$/, consumerGroupsPage],
  [/^#\/consumer-group\/(.+)$/, consumerGroupPage], [/^#\/nodes$/, nodesPage],
];
function stopTimers() { clearInterval(timer); clearInterval(chartTimer); generation++; }

async function route() {
  stopTimers();
  if (!session) {
    try { session = await api("/api/whoami"); } catch (e) { showLogin(""); return; }
  }
  showWho();
  const hash = location.hash || "#/";
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.getAttribute("href") === hash.split("/").slice(0, 2).join("/"));
  }
  for (const [pattern, page] of PAGES) {
    const m = hash.match(pattern);
    if (m) { start(page, m[1] ? decodeURIComponent(m[1]) : null); return; }
  }
  setMain(h("p", {}, "No such page."));
}
function start(page, arg) {
  const mine = generation;
  const state = {arg, built: false};
  const tick = async () => {
    if (mine !== generation) return;
    try {
      await page(state);
      status(`updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      if (err instanceof Unauthorized) { session = null; showLogin("Your session ended."); }
      else status(err.message, true);
    }
  };
  tick();
  timer = setInterval(tick, REFRESH_MS);
}
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

// --- charts ---------------------------------------------------------------------------------
function chartBox(id, series, unit) {
  const legend = h("div", {}, series.map(([key, label], k) => h("span",
    {class: "legend", "data-series": key},
    h("span", {class: "swatch", id: `${id}-swatch-${k}`}), label + " ",
    h("span", {class: "value"}, "–"))));
  const box = h("div", {class: "chart", id}, h("canvas", {}), legend);
  box.dataset.unit = unit || "";
  return box;
}
async function updateChart(id, url, keys) {
  const box = document.getElementById(id);
  if (!box) return;
  const data = await api(url);
  const series = keys.map(([key, label]) => ({name: key, label, values: data[key] || []}));
  drawChart(box.querySelector("canvas"), data.t, series, box.dataset.unit);
  series.forEach((s, k) => {
    const legend = box.querySelector(`[data-series="${s.name}"] .value`);
    const last = s.values.length ? s.values[s.values.length - 1] : null;
    legend.textContent = formatNumber(last);
    document.getElementById(`${id}-swatch-${k}`).style.background =
      CHART_COLORS[k % CHART_COLORS.length];
  });
}
function startCharts(charts) {
  const mine = generation;
  const run = () => {
    if (mine !== generation) return;
    for (const [id, url, keys] of charts) updateChart(id, url, keys).catch((e) => status(e.message, true));
  };
  run();
  chartTimer = setInterval(run, CHART_REFRESH_MS);
}
const DEPTH = [["ready", "ready"], ["unacked", "unacked"]];
const RATES = [["publish_rate", "publish"], ["deliver_rate", "deliver"], ["ack_rate", "ack"],
               ["return_rate", "return"], ["dead_letter_rate", "dead-letter"]];

// --- pages ----------------------------------------------------------------------------------
async function overviewPage(state) {
  const data = await api("/api/overview");
  const rows = data.nodes.map((n) => h("tr", {"data-node": n.id, class: n.up ? "node-up" : "node-down"},
    h("td", {}, n.id, n.this_node ? " (this node)" : ""), h("td", {class: "state"}, n.up ? "up" : "down"),
    h("td", {class: "role"}, n.role || "member"), h("td", {}, n.address),
    h("td", {}, n.http_port ? h("a", {href: `http://${location.hostname}:${n.http_port}/`}, n.http_port) : "–")));
  const nodes = table("nodes-table", [["node"], ["state"], ["role"], ["client address"], ["http"]], rows);
  const cards = h("div", {class: "cards"}, card("leader", data.leader || "none", "leader"),
    card("term", data.term), card("queues", data.queues), card("messages", data.messages.total),
    card("ready", data.messages.ready), card("unacked", data.messages.unacked),
    card("publish", rate(data.rates.publish_rate)), card("deliver", rate(data.rates.deliver_rate)),
    card("connections here", data.connections));
  const top = [h("h1", {}, `Cluster ${data.cluster}`), staleNote(data.stale), cards, h("h2", {}, "Nodes"), nodes];
  if (!state.built) {
    state.charts = [chartBox("chart-depth", DEPTH), chartBox("chart-rates", RATES, "/s")];
    state.top = h("div", {});
    setMain(state.top, h("h2", {}, "Messages (all queues)"), state.charts[0],
            h("h2", {}, "Rates (this node's clients)"), state.charts[1]);
    startCharts([["chart-depth", "/api/samples", DEPTH], ["chart-rates", "/api/samples", RATES]]);
    state.built = true;
  }
  state.top.replaceChildren(...top.filter((x) => x));
}

async function queuesPage(state) {
  const data = await api("/api/queues");
  const rows = data.queues.map((x) => h("tr", {"data-queue": x.name},
    h("td", {}, h("a", {href: "#/queue/" + q(x.name)}, x.name)),
    h("td", {class: "num"}, x.ready), h("td", {class: "num"}, x.unacked),
    h("td", {class: "num"}, x.total), h("td", {class: "num"}, x.bytes),
    h("td", {class: "num"}, x.consumers), h("td", {class: "num"}, rate(x.rates.publish_rate)),
    h("td", {class: "num"}, rate(x.rates.deliver_rate)), h("td", {class: "num"}, rate(x.rates.ack_rate)),
    h("td", {}, x.config.single_active_consumer ? "SAC" : "", x.grouped ? " groups" : "")));
  const list = table("queues-table", [["queue"], ["ready", "num"], ["unacked", "num"], ["total", "num"],
    ["bytes", "num"], ["consumers", "num"], ["publish", "num"], ["deliver", "num"], ["ack", "num"],
    ["features"]], rows);
  if (!state.built) {
    state.list = h("div", {});
    setMain(h("h1", {}, "Queues"), state.list, isAdmin() ? declareForm() : null);
    state.built = true;
  }
  const more = data.count > data.queues.length
    ? h("p", {class: "muted"}, `The first ${data.queues.length} of ${data.count} queues, by name.`) : null;
  state.list.replaceChildren(...[staleNote(data.stale), list, more].filter((x) => x));
}
function declareForm() {
  const name = h("input", {id: "declare-name", placeholder: "queue name", required: true});
  const sac = h("input", {id: "declare-sac", type: "checkbox"});
  const result = h("span", {class: "muted"});
  return h("div", {}, h("h2", {}, "Declare a queue"), h("form", {class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api("/api/queues/" + q(name.value), "PUT", {config: {single_active_consumer: sac.checked}});
      result.textContent = `declared ${name.value}`;
    } catch (err) { result.textContent = err.message; }
  }}, name, h("label", {}, sac, " single active consumer"), h("button", {id: "declare-submit"}, "Declare"), result));
}

async function queuePage(state) {
  const name = state.arg;
  const data = await api("/api/queues/" + q(name));
  const sac = data.config.single_active_consumer;
  const cards = h("div", {class: "cards"}, card("depth", data.total, "queue-depth"),
    card("ready", data.ready, "queue-ready"), card("unacked", data.unacked, "queue-unacked"),
    card("bytes", data.bytes), card("consumers", data.consumers),
    card("waiting consumers", data.waiting_consumers),
    card("published here", data.counters.published || 0, "queue-published"),
    card("publish", rate(data.rates.publish_rate)), card("deliver", rate(data.rates.deliver_rate)));
  const consumers = table("consumers-table", [["key"], ["tag"], ["connection"], ["status"], ["active"],
    ["credit", "num"], ["checked out", "num"], ["priority", "num"]],
    data.consumers_list.map((c) => h("tr", {}, h("td", {}, c.key), h("td", {}, c.tag),
      h("td", {}, c.connection), h("td", {}, c.status), h("td", {}, c.active ? "yes" : ""),
      h("td", {class: "num"}, c.credit), h("td", {class: "num"}, c.num_checked_out),
      h("td", {class: "num"}, c.priority))));
  const config = table("config-table", [["setting"], ["value"]], Object.entries(data.config)
    .filter(([k]) => k !== "type").map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v ?? "–"))));
  const details = [h("h2", {}, "Consumers" + (sac ? ` (single active consumer: ${data.active_consumer ?? "none"})` : "")),
    consumers, h("h2", {}, "Config"), config];
  if (!state.built) {
    state.info = h("div", {});
    state.details = h("div", {});
    state.peek = h("div", {id: "peek"});
    setMain(state.info, h("h2", {}, "Depth"), chartBox("chart-queue-depth", DEPTH),
      h("h2", {}, "Rates (this node's clients)"), chartBox("chart-queue-rates", RATES, "/s"),
      state.details, h("h2", {}, "Messages (peek, nothing consumed)"), state.peek,
      isAdmin() ? queueActions(name) : null);
    const base = "/api/queues/" + q(name) + "/samples";
    startCharts([["chart-queue-depth", base, DEPTH], ["chart-queue-rates", base, RATES]]);
    state.built = true;
  }
  state.info.replaceChildren(...[h("h1", {}, `Queue ${name}`), staleNote(data.stale), cards].filter((x) => x));
  state.details.replaceChildren(...details);
  if (data.total <= AUTO_PEEK_MAX) await renderPeek(state, name, null);
  else if (!state.peek.firstChild) {  // a large queue: peeked when asked, never on each refresh
    const button = h("button", {id: "peek-button", type: "button",
      onclick: () => renderPeek(state, name, button).catch((e) => status(e.message, true))},
      "Peek at the first 10");
    state.peek.replaceChildren(button);
  }
}
async function renderPeek(state, name, button) {
  const peek = await api("/api/queues/" + q(name) + "/messages?limit=10");
  state.peek.replaceChildren(...[button, table("peek-table", [["position", "num"], ["returned"],
    ["delivery count", "num"], ["body"]], peek.messages.map((m) => h("tr", {},
      h("td", {class: "num"}, m.position), h("td", {}, m.returned ? "yes" : ""),
      h("td", {class: "num"}, m.delivery_count), h("td", {}, h("pre", {}, bodyText(m.body))))))]
    .filter((x) => x));
}
function bodyText(body) {
  const text = body.text !== undefined ? body.text : "base64: " + body.base64;
  return text + (body.truncated ? ` … (${body.bytes} bytes)` : "");
}
function queueActions(name) {
  const result = h("p", {class: "muted", id: "action-result"});
  const say = (text) => { result.textContent = text; };
  const body = h("input", {id: "publish-body", placeholder: "message body"});
  const publish = h("form", {class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    try { await api(`/api/queues/${q(name)}/publish`, "POST", {body: body.value}); say("published"); }
    catch (err) { say(err.message); }
  }}, body, h("button", {id: "publish-submit"}, "Publish"));
  const mode = h("select", {id: "get-mode"}, h("option", {value: "requeue"}, "requeue"),
                 h("option", {value: "ack"}, "ack (remove)"));
  const got = h("div", {id: "got"});
  const get = h("form", {class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const found = await api(`/api/queues/${q(name)}/get`, "POST", {count: 1, mode: mode.value});
      got.replaceChildren(...found.messages.map((m) => h("pre", {}, bodyText(m.body))));
      say(found.messages.length ? `got ${found.messages.length}` : "the queue had nothing ready");
    } catch (err) { say(err.message); }
  }}, h("button", {id: "get-submit"}, "Get one"), mode);
  const confirm = h("button", {class: "danger", id: "purge-confirm", type: "button", hidden: true,
    onclick: async () => {
      confirm.hidden = true;
      try { const r = await api(`/api/queues/${q(name)}/purge`, "POST", {}); say(`purged ${r.count}`); }
      catch (err) { say(err.message); }
    }}, "Really purge " + name);
  const purge = h("button", {class: "danger", id: "purge-button", type: "button",
                             onclick: () => { confirm.hidden = false; }}, "Purge");
  const remove = h("button", {class: "danger", id: "delete-button", type: "button", onclick: async () => {
    if (!window.confirm(`Delete queue ${name} and every message in it?`)) return;
    try { await api(`/api/queues/${q(name)}`, "DELETE"); location.hash = "#/queues"; }
    catch (err) { say(err.message); }
  }}, "Delete");
  return h("div", {}, h("h2", {}, "Actions"), publish, get, got,
           h("div", {class: "inline"}, purge, " ", confirm, " ", remove), result);
}

async function groupsPage(state) {
  const data = await api("/api/queues");
  const grouped = data.queues.filter((x) => x.grouped).map((x) => x.name);
  if (!state.built) {
    state.select = h("select", {id: "groups-queue"}, grouped.map((n) => h("option", {value: n}, n)));
    state.body = h("div", {});
    setMain(h("h1", {}, "Message groups"), h("p", {}, "Queue ", state.select), state.body);
    state.built = true;
  }
  if (!grouped.length) { state.body.replaceChildren(h("p", {class: "muted"}, "No queue has message groups.")); return; }
  const name = state.select.value || grouped[0];
  const found = await api(`/api/queues/${q(name)}/groups`);
  state.body.replaceChildren(table("groups-table", [["group"], ["owner"], ["waiting", "num"],
    ["returned", "num"], ["checked out", "num"], ["age of head (ms)", "num"]],
    found.groups.map((g) => h("tr", {}, h("td", {}, g.group ?? "(default)"),
      h("td", {}, g.owner_tag ?? g.owner ?? ""), h("td", {class: "num"}, g.ready),
      h("td", {class: "num"}, g.returned), h("td", {class: "num"}, g.checked_out),
      h("td", {class: "num"}, g.oldest_age_ms ?? "")))));
}

async function consumerGroupsPage() {
  const data = await api("/api/consumer-groups");
  setMain(h("h1", {}, "Consumer groups"), staleNote(data.stale), table("consumer-groups-table",
    [["group"], ["queue"], ["partitions", "num"], ["members", "num"], ["epoch", "num"],
     ["pending", "num"], ["last moves", "num"]],
    data.groups.map((g) => h("tr", {"data-group": g.group},
      h("td", {}, h("a", {href: "#/consumer-group/" + q(g.group)}, g.group)), h("td", {}, g.queue),
      h("td", {class: "num"}, g.partitions), h("td", {class: "num"}, g.members),
      h("td", {class: "num"}, g.epoch), h("td", {class: "num"}, g.pending),
      h("td", {class: "num"}, g.last_moves)))));
}

async function consumerGroupPage(state) {
  const data = await api("/api/consumer-groups/" + q(state.arg));
  const o = data.overview;
  const members = table("members-table", [["member"], ["epoch", "num"], ["join", "num"], ["tag"],
    ["partitions"]], data.members.map((m) => h("tr", {"data-member": m.member}, h("td", {}, m.member),
      h("td", {class: "num"}, m.epoch), h("td", {class: "num"}, m.join_seq), h("td", {}, m.tag),
      h("td", {class: "partitions"}, m.partitions.join(", ")))));
  const partitions = table("partitions-table", [["partition"], ["member"], ["holder"], ["hand-over"],
    ["backlog", "num"], ["checked out", "num"]], data.partitions.map((p) => h("tr",
      {"data-partition": p.partition}, h("td", {}, h("a", {href: "#/queue/" + q(p.partition)}, p.partition)),
      h("td", {class: "member"}, p.member ?? "–"), h("td", {}, p.holder ?? "–"),
      h("td", {}, p.pending ? "pending" : ""), h("td", {class: "num"}, p.lag),
      h("td", {class: "num"}, p.checked_out))));
  const rebalances = table("rebalances-table", [["when"], ["epoch", "num"], ["moved"]],
    data.rebalances.map((r) => h("tr", {}, h("td", {}, new Date(r.at_ms).toLocaleTimeString()),
      h("td", {class: "num"}, r.epoch),
      h("td", {}, r.moved.map((m) => `${m.partition}: ${m.from ?? "–"} → ${m.to ?? "–"}`).join("; ")))));
  setMain(h("h1", {}, `Consumer group ${o.group}`), staleNote(data.stale),
    h("div", {class: "cards"}, card("queue", o.queue), card("partitions", o.partitions),
      card("members", o.members), card("epoch", o.epoch, "group-epoch"), card("pending", o.pending)),
    h("h2", {}, "Members"), members, h("h2", {}, "Partitions"), partitions,
    h("h2", {}, "Recent rebalances (seen by this node)"), rebalances);
}

async function nodesPage() {
  const [data, conns] = await Promise.all([api("/api/cluster"), api("/api/connections")]);
  const rows = data.nodes.map((n) => h("tr", {"data-node": n.id, class: n.up ? "node-up" : "node-down"},
    h("td", {}, n.id), h("td", {class: "state"}, n.up ? "up" : "down"), h("td", {}, n.role),
    h("td", {class: "num"}, n.term ?? "–"), h("td", {class: "num"}, n.commit_index ?? "–"),
    h("td", {class: "num"}, n.last_applied ?? "–"), h("td", {}, n.effective_machine_version ?? "–"),
    h("td", {}, n.supported_machine_version ?? "–"),
    h("td", {}, n.digest ? n.digest.slice(0, 16) : (n.digest_skipped ? "skipped" : "–")),
    h("td", {}, (n.members || []).join(", "))));
  const m = data.machine;
  setMain(h("h1", {}, "Nodes"), table("cluster-table", [["node"], ["state"], ["role"], ["term", "num"],
    ["commit", "num"], ["applied", "num"], ["machine"], ["supports"], ["digest"], ["members"]], rows),
    h("h2", {}, "Machine"), h("pre", {}, JSON.stringify(m, null, 1)),
    h("h2", {}, `Client connections on ${conns.node}`),
    table("connections-table", [["connection"], ["peer"]],
      conns.connections.map((c) => h("tr", {}, h("td", {}, c.connection), h("td", {}, c.peer)))));
}
