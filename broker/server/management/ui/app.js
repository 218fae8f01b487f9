// Postroom's web UI: one page, plain JavaScript (no build step, nothing from a CDN), reading and
// changing the broker through the same management API, as the logged-in user. Names that come
// from the broker are always set as text, never parsed as HTML.

const REFRESH_MS = 5000;
const HISTORY = 60; // chart samples kept: five minutes at one every 5 s
const PAGE_SIZE = 100;

const state = { user: null, timer: null, route: "" };

// -- helpers --------------------------------------------------------------------------------------

function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === false || value === null || value === undefined) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "text") element.textContent = value;
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

function credentials() {
  return sessionStorage.getItem("postroom.credentials");
}

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.reason ? `${status}: ${typeof body.reason === "string" ? body.reason : JSON.stringify(body.reason)}` : `HTTP ${status}`);
    this.status = status;
  }
}

async function api(path, method = "GET", body = undefined, headers = {}) {
  const response = await fetch("api/" + path, {
    method,
    headers: { Authorization: "Basic " + credentials(), "Content-Type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const answer = text ? JSON.parse(text) : null;
  if (response.status === 401 && method === "GET" && path === "whoami") throw new ApiError(401, answer);
  if (!response.ok) throw new ApiError(response.status, answer);
  return answer;
}

const q = encodeURIComponent;
const tags = () => (state.user ? state.user.tags : []);
const isAdmin = () => tags().includes("administrator");
const canSeeAll = () => isAdmin() || tags().includes("monitoring");
const canPolicy = () => isAdmin() || tags().includes("policymaker");

function say(text, bad = false) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = bad ? "error" : "ok";
}

function refused(error) {
  say(error.status === 401 ? `Refused: ${error.message}` : `Failed: ${error.message}`, true);
}

function number(value) {
  return value === undefined || value === null ? "" : Number(value).toLocaleString("en");
}

function rate(value) {
  return value === undefined || value === null ? "" : Number(value).toFixed(1);
}

function table(columns, rows, options = {}) {
  const head = h("tr", {}, columns.map((column) => {
    const cell = h("th", { class: column.num ? "num" : null, scope: "col" });
    if (options.sort && column.sort) {
      const current = options.sort.key === column.sort;
      const arrow = current ? (options.sort.reverse ? " ▼" : " ▲") : "";
      cell.append(h("button", { onclick: () => options.onSort(column.sort), "aria-label": `sort by ${column.title}` }, column.title + arrow));
      if (current) cell.setAttribute("aria-sort", options.sort.reverse ? "descending" : "ascending");
    } else cell.textContent = column.title;
    return cell;
  }));
  const body = rows.map((row) => h("tr", {}, columns.map((column) => {
    const value = column.render ? column.render(row) : row[column.key];
    return h("td", { class: column.num ? "num" : null }, value instanceof Node ? value : String(value ?? ""));
  })));
  if (!rows.length) body.push(h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, options.empty || "None.")));
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

function link(text, route) {
  return h("a", { href: "#" + route }, text);
}

function confirmed(question, action) {
  return async () => {
    if (!window.confirm(question)) return;
    try {
      await action();
    } catch (error) {
      refused(error);
    }
    render();
  };
}

function field(label, input) {
  return h("label", {}, label, input);
}

// -- charts ---------------------------------------------------------------------------------------

const SERIES = [
  ["publish", "#2457c5"], ["deliver_get", "#1e7a3c"], ["ack", "#8a5cc2"], ["redeliver", "#d08a00"], ["dead_lettered", "#b3261e"],
];

function chart(samples, series = SERIES) {
  const canvas = h("canvas", { width: 1200, height: 220, role: "img", "aria-label": "message rates over the last minutes" });
  const context = canvas.getContext("2d");
  const top = Math.max(1, ...samples.flatMap((sample) => series.map(([key]) => sample[key] || 0)));
  context.font = "12px system-ui";
  context.fillStyle = "#5b6475";
  context.fillText(`${top.toFixed(1)}/s`, 4, 12);
  context.strokeStyle = "#d9dde5";
  context.beginPath();
  context.moveTo(0, 210);
  context.lineTo(1200, 210);
  context.stroke();
  for (const [key, colour] of series) {
    context.strokeStyle = colour;
    context.lineWidth = 2;
    context.beginPath();
    samples.forEach((sample, index) => {
      const x = (index / Math.max(1, HISTORY - 1)) * 1200;
      const y = 210 - ((sample[key] || 0) / top) * 190;
      if (index) context.lineTo(x, y);
      else context.moveTo(x, y);
    });
    context.stroke();
  }
  // (a class per series, not an inline style: the page's content security policy allows none)
  const legend = h("div", { class: "legend" }, series.map(([key]) => h("span", {}, h("i", { class: `series-${key}` }), key.replace("_", " "))));
  return h("div", {}, canvas, legend);
}

// -- pages ----------------------------------------------------------------------------------------

// Rates between the broker's own samples (it keeps ten minutes of them), oldest first.
function ratesFrom(stats) {
  const series = SERIES.map(([key]) => [key, (stats[`${key}_details`]?.samples || []).slice().reverse()]);
  const length = Math.min(...series.map(([, samples]) => samples.length));
  const rates = [];
  for (let index = 1; index < length; index += 1) {
    const rate = {};
    for (const [key, samples] of series) {
      const seconds = (samples[index].timestamp - samples[index - 1].timestamp) / 1000;
      rate[key] = seconds > 0 ? Math.max(0, samples[index].sample - samples[index - 1].sample) / seconds : 0;
    }
    rates.push(rate);
  }
  return rates.slice(-HISTORY);
}

async function overviewPage(main) {
  const [overview, nodes, deadLetters] = await Promise.all([
    api(`overview?msg_rates_age=${HISTORY * 5}&msg_rates_incr=5`),
    canSeeAll() ? api("nodes") : Promise.resolve([]),
    api("dead-letters").catch(() => []),
  ]);
  const stats = overview.message_stats || {};
  const node = nodes.find((entry) => entry.name === overview.node) || nodes[0] || {};
  const cluster = nodes.filter((entry) => entry.postroom_cluster);
  const totals = overview.queue_totals || {};
  const objects = overview.object_totals || {};
  const alarms = [node.mem_alarm && "memory", node.disk_free_alarm && "disk"].filter(Boolean);
  const card = (label, value, id) => h("div", { class: "card", id }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
  main.append(
    h("h1", {}, "Overview"),
    h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "value text" }, overview.node), h("div", { class: "label" }, "node")),
      card(`${overview.product_name} version`, overview.product_version),
      card("uptime", node.uptime !== undefined ? `${Math.floor(node.uptime / 60000)} min` : "—"),
      card("ready", number(totals.messages_ready), "total-ready"), card("unacked", number(totals.messages_unacknowledged), "total-unacked"),
      card("dead letters waiting", number(deadLetters.reduce((sum, queue) => sum + queue.messages, 0)), "total-dead"),
      card("connections", number(objects.connections)), card("channels", number(objects.channels)),
      card("queues", number(objects.queues)), card("consumers", number(objects.consumers))),
    h("h2", {}, "Alarms"),
    alarms.length ? h("p", {}, alarms.map((alarm) => h("span", { class: "alarm" }, `${alarm} alarm`))) : h("p", { class: "muted" }, "None in force."),
    h("h2", {}, "Message rates (last minutes)"),
    chart(ratesFrom(stats)),
    cluster.length > 0 && h("h2", {}, "Nodes"),
    cluster.length > 0 && h("div", { id: "nodes" }, table([
      { title: "node", render: (entry) => (entry.name === overview.node ? `${entry.name} (serving this page)` : entry.name) },
      { title: "role", render: (entry) => entry.postroom_cluster.role }, { title: "running", render: (entry) => (entry.running ? "yes" : "no") },
      { title: "in sync", render: (entry) => (entry.postroom_cluster.in_sync ? "yes" : "no") },
      { title: "link", render: (entry) => entry.postroom_cluster.state || "" },
      { title: "lag (bytes)", render: (entry) => lag(entry.postroom_cluster.lag_bytes), num: true },
      { title: "lag (batches)", render: (entry) => lag(entry.postroom_cluster.lag_batches), num: true },
      { title: "lag (s)", render: (entry) => lag(entry.postroom_cluster.lag_seconds, 3), num: true },
    ], cluster)),
    h("h2", {}, "Listeners"),
    table([{ title: "protocol", key: "protocol" }, { title: "interface", key: "ip_address" }, { title: "port", key: "port", num: true }], overview.listeners || []),
  );
}

// A follower's lag as its leader sees it (none shown for the leader, or on a follower's page).
function lag(value, digits = 0) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

async function vhostNames() {
  const vhosts = await api("vhosts");
  return vhosts.map((vhost) => vhost.name);
}

const queueView = { vhost: "", name: "", regex: false, sort: { key: "name", reverse: false }, page: 1 };

function argumentsSummary(queue) {
  const args = queue.arguments || {};
  const effective = queue.effective_policy_definition || {};
  const parts = [];
  const pick = (argument, policyKey, label, unit = "") => {
    const value = args[argument] ?? effective[policyKey];
    if (value !== undefined) parts.push(`${label} ${value}${unit}`);
  };
  pick("x-visibility-timeout", "visibility-timeout", "visibility", " ms");
  pick("x-delivery-limit", "delivery-limit", "delivery limit");
  pick("x-dead-letter-exchange", "dead-letter-exchange", "DLX");
  pick("x-message-ttl", "message-ttl", "TTL", " ms");
  pick("x-max-length", "max-length", "max length");
  if (queue.policy) parts.push(`policy ${queue.policy}`);
  return parts.join(", ");
}

async function queuesPage(main) {
  const names = await vhostNames();
  const params = new URLSearchParams({ page: queueView.page, page_size: PAGE_SIZE, sort: queueView.sort.key, sort_reverse: queueView.sort.reverse });
  if (queueView.name) params.set("name", queueView.name);
  if (queueView.regex) params.set("use_regex", "true");
  params.set("columns", "name,vhost,type,arguments,policy,effective_policy_definition,messages_ready,messages_unacknowledged,consumers,message_stats");
  const path = queueView.vhost ? `queues/${q(queueView.vhost)}` : "queues";
  const answer = await api(`${path}?${params}`);
  const vhostSelect = h("select", { id: "queue-vhost", onchange: (event) => { queueView.vhost = event.target.value; queueView.page = 1; render(); } },
    h("option", { value: "" }, "all vhosts"), names.map((name) => h("option", { value: name, selected: name === queueView.vhost }, name)));
  const filter = h("input", { id: "queue-filter", value: queueView.name, placeholder: "part of a name", "aria-label": "filter by name" });
  const regex = h("input", { type: "checkbox", id: "queue-regex", checked: queueView.regex });
  const apply = (event) => { event.preventDefault(); queueView.name = filter.value; queueView.regex = regex.checked; queueView.page = 1; render(); };
  const onSort = (key) => { queueView.sort = { key, reverse: queueView.sort.key === key ? !queueView.sort.reverse : false }; render(); };
  const columns = [
    { title: "vhost", key: "vhost", sort: "vhost" },
    { title: "name", sort: "name", render: (queue) => link(queue.name, `/queue/${q(queue.vhost)}/${q(queue.name)}`) },
    { title: "kind", key: "type" },
    { title: "arguments and policy", render: argumentsSummary },
    { title: "ready", key: "messages_ready", num: true, sort: "messages_ready", render: (queue) => number(queue.messages_ready) },
    { title: "unacked", num: true, sort: "messages_unacknowledged", render: (queue) => number(queue.messages_unacknowledged) },
    { title: "consumers", key: "consumers", num: true, sort: "consumers" },
    { title: "publish/s", num: true, render: (queue) => rate(queue.message_stats?.publish_details?.rate) },
    { title: "deliver/s", num: true, render: (queue) => rate(queue.message_stats?.deliver_get_details?.rate) },
  ];
  const pages = answer.page_count || 1;
  const go = (page) => () => { queueView.page = page; render(); };
  main.append(
    h("h1", {}, "Queues"),
    h("form", { class: "toolbar", onsubmit: apply }, field("vhost", vhostSelect), field("name", filter), h("label", {}, h("span", {}, "regular expression"), regex), h("button", { type: "submit" }, "Filter")),
    h("p", { class: "muted", id: "queue-count" }, `${number(answer.filtered_count)} of ${number(answer.total_count)} queues`),
    table(columns, answer.items, { sort: queueView.sort, onSort, empty: "No queues." }),
    h("div", { class: "pager" },
      h("button", { class: "secondary", disabled: queueView.page <= 1, onclick: go(queueView.page - 1) }, "Previous"),
      `page ${answer.page} of ${pages}`,
      h("button", { class: "secondary", disabled: queueView.page >= pages, onclick: go(queueView.page + 1) }, "Next")),
    h("h2", {}, "Add a queue"), addQueueForm(names),
  );
}

function addQueueForm(names) {
  const inputs = { vhost: vhostSelect("new-queue-vhost", names), name: h("input", { id: "new-queue-name", required: true }),
    kind: h("select", { id: "new-queue-kind" }, ["classic", "quorum", "stream"].map((kind) => h("option", { value: kind }, kind))),
    durable: h("input", { id: "new-queue-durable", type: "checkbox", checked: true }),
    arguments: jsonInput("new-queue-arguments", '{"x-visibility-timeout": 30000, "x-delivery-limit": 5}') };
  const add = async (event) => {
    event.preventDefault();
    try {
      const args = parsed(inputs.arguments, "arguments");
      if (inputs.kind.value !== "classic") args["x-queue-type"] = inputs.kind.value;
      await api(`queues/${q(inputs.vhost.value)}/${q(inputs.name.value)}`, "PUT", { durable: inputs.durable.checked, auto_delete: false, arguments: args });
      say(`Queue ${inputs.name.value} declared.`);
    } catch (error) { refused(error); }
    render();
  };
  return h("form", { class: "inline", onsubmit: add }, ...Object.entries(inputs).map(([key, input]) => field(key, input)), h("button", { type: "submit", id: "add-queue" }, "Add queue"));
}

function bodyShown(message, mode) {
  const bytes = message.payload_encoding === "base64" ? atob(message.payload) : message.payload;
  if (mode === "hex") {
    const raw = message.payload_encoding === "base64" ? bytes : new TextEncoder().encode(bytes);
    const codes = typeof raw === "string" ? Array.from(raw, (c) => c.charCodeAt(0)) : Array.from(raw);
    return codes.map((code) => code.toString(16).padStart(2, "0")).join(" ");
  }
  if (mode === "json") {
    try { return JSON.stringify(JSON.parse(bytes), null, 2); } catch { return "(not JSON) " + bytes; }
  }
  return bytes;
}

const queueHistory = new Map();

// What getting messages does to them: the broker's own peek takes nothing; RabbitMQ's modes.
const GET_MODES = [["peek", "leave them (peek)"], ["ack_requeue_true", "requeue them"], ["reject_requeue_true", "reject, requeue"], ["ack_requeue_false", "take them (ack)"]];
let peekState = { key: null };

async function queuePage(main, vhost, name) {
  const [queue, bindings] = await Promise.all([api(`queues/${q(vhost)}/${q(name)}`), api(`queues/${q(vhost)}/${q(name)}/bindings`)]);
  const key = `${vhost}/${name}`;
  const samples = queueHistory.get(key) || [];
  samples.push({ publish: queue.message_stats?.publish_details?.rate || 0, deliver_get: queue.message_stats?.deliver_get_details?.rate || 0, ack: queue.message_stats?.ack_details?.rate || 0, redeliver: queue.message_stats?.redeliver_details?.rate || 0 });
  if (samples.length > HISTORY) samples.shift();
  queueHistory.set(key, samples);
  // What was peeked stays on the page through its refreshes, until the next peek.
  const kept = peekState.key === key ? peekState : { key, messages: null, count: 10, mode: "text", ackmode: "peek" };
  const count = h("input", { id: "peek-count", type: "number", min: 1, max: 100, value: kept.count });
  const mode = h("select", { id: "peek-mode" }, ["text", "json", "hex"].map((value) => h("option", { value, selected: value === kept.mode }, value)));
  const peeked = h("div", { id: "peeked" });
  const show = () => {
    if (!kept.messages) return;
    peeked.replaceChildren(kept.messages.length ? "" : h("p", { class: "muted" }, "No ready messages."), ...kept.messages.map((message, index) => h("details", { open: index === 0, class: "message" },
      h("summary", {}, `#${index + 1}: ${message.payload_bytes} bytes, routing key ${message.routing_key}${message.redelivered ? ", redelivered" : ""}`),
      h("pre", { class: "properties" }, JSON.stringify(message.properties, null, 2)),
      h("pre", { class: "body" }, bodyShown(message, kept.mode)))));
  };
  const ackmode = h("select", { id: "peek-ackmode" }, GET_MODES.map(([value, title]) => h("option", { value, selected: value === kept.ackmode }, title)));
  const peek = async (event) => {
    event.preventDefault();
    try {
      kept.messages = await api(`queues/${q(vhost)}/${q(name)}/get`, "POST", { count: Number(count.value), ackmode: ackmode.value, encoding: "auto" });
      kept.ackmode = ackmode.value;
      kept.count = Number(count.value);
      kept.mode = mode.value;
      peekState = kept;
      show();
    } catch (error) { refused(error); }
  };
  show();
  main.append(
    h("h1", {}, `Queue ${name}`, h("span", { class: "muted" }, ` in vhost ${vhost}`)),
    h("div", { class: "cards" },
      [["ready", queue.messages_ready, "queue-ready"], ["unacked", queue.messages_unacknowledged, "queue-unacked"], ["consumers", queue.consumers], ["kind", queue.type], ["durable", String(queue.durable)]]
        .map(([label, value, id]) => h("div", { class: "card", id }, h("div", { class: "value" }, typeof value === "number" ? number(value) : value), h("div", { class: "label" }, label)))),
    h("p", {}, argumentsSummary(queue) || h("span", { class: "muted" }, "No arguments or policy.")),
    h("h2", {}, "Rates"), chart(samples, SERIES.slice(0, 4)),
    h("h2", {}, "Bindings"),
    table([{ title: "from exchange", render: (b) => (b.source ? link(b.source, `/exchange/${q(vhost)}/${q(b.source)}`) : "(AMQP default)") },
      { title: "routing key", key: "routing_key" }, { title: "arguments", render: (b) => JSON.stringify(b.arguments) },
      { title: "", render: (b) => (b.source ? unbindButton(b) : "") }], bindings),
    bindForm(vhost, { destination: name }),
    h("h2", {}, "Consumers"),
    table([{ title: "tag", key: "consumer_tag" }, { title: "channel", render: (c) => c.channel_details?.name }, { title: "prefetch", key: "prefetch_count", num: true }, { title: "active", render: (c) => String(c.active) }], queue.consumer_details || []),
    h("h2", {}, "Messages"),
    h("form", { class: "toolbar", onsubmit: peek }, field("first", count), field("body as", mode), field("and", ackmode), h("button", { type: "submit", id: "peek" }, "Get messages")),
    peeked,
    h("h2", {}, "Publish a message to this queue"), publishForm(vhost, "amq.default", name),
    h("h2", {}, "Actions"),
    h("div", { class: "toolbar" },
      h("button", { class: "danger", id: "purge", onclick: confirmed(`Purge every ready message of ${name}?`, () => api(`queues/${q(vhost)}/${q(name)}/contents`, "DELETE")) }, "Purge"),
      h("button", { class: "danger", id: "delete-queue", onclick: confirmed(`Delete queue ${name}?`, async () => { await api(`queues/${q(vhost)}/${q(name)}`, "DELETE"); location.hash = "#/queues"; }) }, "Delete")),
  );
}

const deadView = { queue: null, reason: "", source: "", header: "", age: "", selected: new Set(), job: null };

async function deadLettersPage(main) {
  const queues = await api("dead-letters");
  main.append(h("h1", {}, "Dead letters"));
  main.append(table([
    { title: "dead-letter queue", render: (d) => h("a", { href: "#/dead-letters", onclick: (event) => { event.preventDefault(); deadView.queue = { vhost: d.vhost, name: d.name }; deadView.selected.clear(); render(); } }, `${d.vhost} ${d.name}`) },
    { title: "waiting", num: true, render: (d) => number(d.messages) },
    { title: "by reason", render: (d) => Object.entries(d.reasons).map(([reason, n]) => `${reason} ${n}`).join(", ") },
    { title: "by source queue", render: (d) => Object.entries(d.sources).map(([source, n]) => `${source} ${n}`).join(", ") },
  ], queues, { empty: "No dead-letter queues." }));
  if (!deadView.queue) return;
  const { vhost, name } = deadView.queue;
  const params = new URLSearchParams({ limit: 200 });
  for (const key of ["reason", "source", "header", "age"]) if (deadView[key]) params.set(key, deadView[key]);
  const listed = await api(`dead-letters/${q(vhost)}/${q(name)}?${params}`);
  const input = (key, label, placeholder) => field(label, h("input", { id: `dead-${key}`, value: deadView[key], placeholder, oninput: (event) => { deadView[key] = event.target.value; } }));
  const filters = h("form", { class: "toolbar", onsubmit: (event) => { event.preventDefault(); deadView.selected.clear(); render(); } },
    field("reason", h("select", { id: "dead-reason", onchange: (event) => { deadView.reason = event.target.value; } },
      ["", "rejected", "expired", "maxlen", "delivery_limit"].map((reason) => h("option", { value: reason, selected: reason === deadView.reason }, reason || "any")))),
    input("source", "source queue", "orders"), input("header", "header", "name=value"), input("age", "older than (s)", "60"),
    h("button", { type: "submit", id: "dead-filter" }, "Filter"));
  const to = h("input", { id: "redrive-to", placeholder: "exchange/routing key (empty: where each died)" });
  const limit = h("input", { id: "redrive-rate", type: "number", min: 1, value: 500 });
  const progress = h("p", { id: "redrive-progress", class: "muted" }, deadView.job ? jobText(deadView.job) : "");
  const redrive = async (which) => {
    const body = { rate: Number(limit.value) };
    if (which === "selected") body.ids = [...deadView.selected];
    else body.filter = { reason: deadView.reason, source: deadView.source, header: deadView.header, age: deadView.age };
    if (to.value) { const [exchange, ...key] = to.value.split("/"); body.to = { exchange, routing_key: key.join("/") }; }
    try {
      deadView.job = await api(`dead-letters/${q(vhost)}/${q(name)}/redrive`, "POST", body);
      pollJob();
    } catch (error) { refused(error); }
  };
  const check = (message) => h("input", { type: "checkbox", "aria-label": `select ${message.dead_letter_id}`, checked: deadView.selected.has(message.dead_letter_id),
    onchange: (event) => { if (event.target.checked) deadView.selected.add(message.dead_letter_id); else deadView.selected.delete(message.dead_letter_id); } });
  main.append(
    h("h2", {}, `${name} in vhost ${vhost}`), filters,
    h("p", { class: "muted", id: "dead-count" }, `${listed.matched} of ${listed.scanned} looked at match`),
    table([
      { title: "", render: (m) => (m.dead_letter_id !== null ? check(m) : "") },
      { title: "reason", render: (m) => m.deaths[0]?.reason ?? "" },
      { title: "died in", render: (m) => m.deaths[0]?.queue ?? "" },
      { title: "when", render: (m) => (m.deaths[0]?.time ? new Date(m.deaths[0].time * 1000).toISOString() : "") },
      { title: "x-death history", render: (m) => h("details", {}, h("summary", {}, `${m.deaths.length} entr${m.deaths.length === 1 ? "y" : "ies"}`), h("pre", {}, JSON.stringify(m.deaths, null, 2))) },
      { title: "body", render: (m) => h("code", {}, m.preview) },
    ], listed.messages, { empty: "No dead letters match." }),
    h("h2", {}, "Redrive"),
    h("div", { class: "toolbar" }, field("to", to), field("at most per second", limit),
      h("button", { id: "redrive-selected", onclick: () => redrive("selected") }, "Redrive selected"),
      h("button", { id: "redrive-filtered", class: "secondary", onclick: () => redrive("filtered") }, "Redrive all that match"),
      h("button", { class: "danger", id: "dead-purge", onclick: confirmed(`Purge every dead letter waiting in ${name}?`, () => api(`queues/${q(vhost)}/${q(name)}/contents`, "DELETE")) }, "Purge")),
    progress,
  );
}

function jobText(job) {
  return `redrive ${job.state}: ${job.moved} moved, ${job.refused} left where they are${job.refusals && job.refusals.length ? ` (${job.refusals.join("; ")})` : ""}, ${job.skipped} not matching`;
}

async function pollJob() {
  const job = deadView.job;
  if (!job) return;
  try {
    deadView.job = await api(`dead-letters/jobs/${job.id}`);
  } catch (error) { refused(error); return; }
  const progress = document.getElementById("redrive-progress");
  if (progress) progress.textContent = jobText(deadView.job);
  if (deadView.job.state === "running") setTimeout(pollJob, 300);
  else render();
}

async function usersPage(main) {
  const [users, permissions, vhosts] = await Promise.all([api("users"), api("permissions"), vhostNames()]);
  const name = h("input", { id: "new-user", required: true, autocomplete: "off" });
  const password = h("input", { id: "new-password", type: "password", autocomplete: "new-password" });
  const userTags = h("input", { id: "new-tags", placeholder: "management, monitoring" });
  const addUser = async (event) => {
    event.preventDefault();
    try { await api(`users/${q(name.value)}`, "PUT", { password: password.value, tags: userTags.value }); say(`User ${name.value} saved.`); } catch (error) { refused(error); }
    render();
  };
  const who = h("select", { id: "perm-user" }, users.map((user) => h("option", { value: user.name }, user.name)));
  const where = h("select", { id: "perm-vhost" }, vhosts.map((vhost) => h("option", { value: vhost }, vhost)));
  const patterns = ["configure", "write", "read"].map((kind) => h("input", { id: `perm-${kind}`, value: ".*", "aria-label": kind }));
  const grant = async (event) => {
    event.preventDefault();
    try {
      await api(`permissions/${q(where.value)}/${q(who.value)}`, "PUT", { configure: patterns[0].value, write: patterns[1].value, read: patterns[2].value });
      say(`Permissions of ${who.value} on ${where.value} set.`);
    } catch (error) { refused(error); }
    render();
  };
  main.append(
    h("h1", {}, "Users"),
    table([{ title: "name", key: "name" }, { title: "tags", render: (u) => u.tags.join(", ") }, { title: "limits", render: (u) => JSON.stringify(u.limits) },
      { title: "", render: (u) => h("button", { class: "danger", onclick: confirmed(`Delete user ${u.name}? Its connections are closed.`, () => api(`users/${q(u.name)}`, "DELETE")) }, "Delete") }], users),
    h("h2", {}, "Add or change a user"),
    h("form", { class: "inline", onsubmit: addUser }, field("name", name), field("password", password), field("tags", userTags), h("button", { type: "submit", id: "add-user" }, "Save user")),
    h("h2", {}, "Permissions"),
    table([{ title: "user", key: "user" }, { title: "vhost", key: "vhost" }, { title: "configure", key: "configure" }, { title: "write", key: "write" }, { title: "read", key: "read" },
      { title: "", render: (p) => h("button", { class: "danger", onclick: confirmed(`Clear ${p.user}'s permissions on ${p.vhost}?`, () => api(`permissions/${q(p.vhost)}/${q(p.user)}`, "DELETE")) }, "Clear") }], permissions),
    h("form", { class: "inline", onsubmit: grant }, field("user", who), field("vhost", where), ...patterns.map((input, index) => field(["configure", "write", "read"][index], input)), h("button", { type: "submit", id: "grant" }, "Set permissions")),
  );
}

async function vhostsPage(main) {
  const vhosts = await api("vhosts");
  const name = h("input", { id: "new-vhost", required: true });
  const description = h("input", { id: "new-vhost-description" });
  main.append(
    h("h1", {}, "Virtual hosts"),
    table([{ title: "name", key: "name" }, { title: "description", key: "description" }, { title: "tags", render: (v) => v.tags.join(", ") },
      { title: "ready", num: true, render: (v) => number(v.messages_ready) }, { title: "unacked", num: true, render: (v) => number(v.messages_unacknowledged) },
      isAdmin() && { title: "", render: (v) => h("button", { class: "danger", onclick: confirmed(`Delete vhost ${v.name} with every queue and message in it?`, () => api(`vhosts/${q(v.name)}`, "DELETE")) }, "Delete") }].filter(Boolean), vhosts),
    isAdmin() && h("form", { class: "inline", onsubmit: async (event) => { event.preventDefault(); try { await api(`vhosts/${q(name.value)}`, "PUT", { description: description.value }); } catch (error) { refused(error); } render(); } },
      field("name", name), field("description", description), h("button", { type: "submit" }, "Add vhost")),
  );
}

const EXCHANGE_TYPES = ["direct", "fanout", "topic", "headers"];

function jsonInput(id, placeholder) {
  return h("input", { id, placeholder, "aria-label": "arguments as JSON" });
}

function parsed(input, what) {
  const text = input.value.trim();
  if (!text) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError(400, { reason: `${what} must be JSON, such as {"x-max-length": 1000}` });
  }
}

function vhostSelect(id, names) {
  return h("select", { id }, names.map((name) => h("option", { value: name }, name)));
}

// A binding's route in the API: the source exchange, the destination's kind and name, and
// (to delete it) its properties key.
function bindingPath(b, withKey = false) {
  const kind = b.destination_type === "exchange" ? "e" : "q";
  const path = `bindings/${q(b.vhost)}/e/${q(b.source)}/${kind}/${q(b.destination)}`;
  return withKey ? `${path}/${q(b.properties_key)}` : path;
}

function unbindButton(b) {
  return h("button", { class: "danger", onclick: confirmed(`Unbind ${b.destination} from ${b.source}?`, () => api(bindingPath(b, true), "DELETE")) }, "Unbind");
}

// A form that binds: a queue to an exchange it names (``destination`` given), or a queue or an
// exchange it names to an exchange (``source`` given).
function bindForm(vhost, { source, destination }) {
  const kind = h("select", { id: "bind-kind" }, h("option", { value: "q" }, "to queue"), h("option", { value: "e" }, "to exchange"));
  const other = h("input", { id: destination ? "bind-source" : "bind-destination", required: true, "aria-label": destination ? "exchange" : "destination" });
  const routingKey = h("input", { id: "bind-key", "aria-label": "routing key" });
  const args = jsonInput("bind-arguments", '{"x-match": "all"}');
  const bind = async (event) => {
    event.preventDefault();
    const [from, to, toKind] = destination ? [other.value, destination, "q"] : [source, other.value, kind.value];
    try {
      await api(`bindings/${q(vhost)}/e/${q(from)}/${toKind}/${q(to)}`, "POST", { routing_key: routingKey.value, arguments: parsed(args, "arguments") });
      say(`Bound ${to} to ${from}.`);
    } catch (error) { refused(error); }
    render();
  };
  const which = destination ? [field("from exchange", other)] : [field("bind", kind), field("destination", other)];
  return h("form", { class: "inline", onsubmit: bind }, ...which, field("routing key", routingKey), field("arguments", args), h("button", { type: "submit", id: "bind" }, "Bind"));
}

async function exchangesPage(main) {
  const [exchanges, names] = await Promise.all([api("exchanges?columns=vhost,name,type,durable,auto_delete,internal,arguments,policy"), vhostNames()]);
  const inputs = { vhost: vhostSelect("exchange-vhost", names), name: h("input", { id: "exchange-name", required: true }),
    type: h("select", { id: "exchange-type" }, EXCHANGE_TYPES.map((type) => h("option", { value: type }, type))),
    durable: h("input", { id: "exchange-durable", type: "checkbox", checked: true }), arguments: jsonInput("exchange-arguments", '{"alternate-exchange": "unrouted"}') };
  const add = async (event) => {
    event.preventDefault();
    try {
      await api(`exchanges/${q(inputs.vhost.value)}/${q(inputs.name.value)}`, "PUT",
        { type: inputs.type.value, durable: inputs.durable.checked, auto_delete: false, internal: false, arguments: parsed(inputs.arguments, "arguments") });
      say(`Exchange ${inputs.name.value} declared.`);
    } catch (error) { refused(error); }
    render();
  };
  main.append(h("h1", {}, "Exchanges"), table([
    { title: "vhost", key: "vhost" },
    { title: "name", render: (e) => link(e.name || "(AMQP default)", `/exchange/${q(e.vhost)}/${q(e.name || "amq.default")}`) }, { title: "type", key: "type" },
    { title: "flags", render: (e) => [e.durable && "durable", e.auto_delete && "auto-delete", e.internal && "internal"].filter(Boolean).join(", ") },
    { title: "arguments", render: (e) => JSON.stringify(e.arguments) }, { title: "policy", key: "policy" },
    { title: "", render: (e) => (e.name && !e.name.startsWith("amq.") ? h("button", { class: "danger", onclick: confirmed(`Delete exchange ${e.name}?`, () => api(`exchanges/${q(e.vhost)}/${q(e.name)}`, "DELETE")) }, "Delete") : "") },
  ], exchanges), h("h2", {}, "Add an exchange"),
  h("form", { class: "inline", onsubmit: add }, ...Object.entries(inputs).map(([key, input]) => field(key, input)), h("button", { type: "submit", id: "add-exchange" }, "Add exchange")));
}

let publishState = { place: null, text: "" };

function publishForm(vhost, exchange, fixedKey) {
  const key = h("input", { id: "publish-key", value: fixedKey ?? "", disabled: fixedKey !== undefined, "aria-label": "routing key" });
  const persistent = h("input", { id: "publish-persistent", type: "checkbox", checked: true });
  const headers = h("input", { id: "publish-headers", placeholder: '{"region": "eu"}', "aria-label": "headers as JSON" });
  const body = h("textarea", { id: "publish-body", rows: 3, "aria-label": "body" });
  // The last answer stays on the page through its refreshes, until the next publish.
  const place = `${vhost}/${exchange}/${fixedKey ?? ""}`;
  const result = h("span", { id: "publish-result", class: "muted" }, publishState.place === place ? publishState.text : "");
  const publish = async (event) => {
    event.preventDefault();
    try {
      const properties = { delivery_mode: persistent.checked ? 2 : 1, headers: parsed(headers, "headers") };
      const answer = await api(`exchanges/${q(vhost)}/${q(exchange)}/publish`, "POST", { properties, routing_key: key.value, payload: body.value, payload_encoding: "string" });
      publishState = { place, text: answer.routed ? "Published and routed." : "Published, but no queue took it (not routed)." };
      // (a refresh may have replaced this form while the answer was on its way)
      (document.getElementById("publish-result") || result).textContent = publishState.text;
    } catch (error) { refused(error); }
  };
  return h("form", { class: "inline", onsubmit: publish }, field("routing key", key), field("persistent", persistent), field("headers", headers), field("body", body),
    h("button", { type: "submit", id: "publish" }, "Publish"), result);
}

async function exchangePage(main, vhost, name) {
  const shown = name === "amq.default" ? "" : name;
  const [exchange, bindings] = await Promise.all([api(`exchanges/${q(vhost)}/${q(name)}`),
    shown ? api(`exchanges/${q(vhost)}/${q(name)}/bindings/source`) : Promise.resolve([])]);
  main.append(
    h("h1", {}, `Exchange ${shown || "(AMQP default)"}`, h("span", { class: "muted" }, ` in vhost ${vhost}`)),
    h("div", { class: "cards" }, [["type", exchange.type], ["durable", String(exchange.durable)], ["internal", String(exchange.internal)], ["policy", exchange.policy || "none"]]
      .map(([label, value]) => h("div", { class: "card" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label)))),
    h("p", {}, `Arguments: ${JSON.stringify(exchange.arguments)}`),
    shown && h("h2", {}, "Bindings from this exchange"),
    shown && table([{ title: "to", render: (b) => (b.destination_type === "queue" ? link(b.destination, `/queue/${q(vhost)}/${q(b.destination)}`) : b.destination) },
      { title: "kind", key: "destination_type" }, { title: "routing key", key: "routing_key" }, { title: "arguments", render: (b) => JSON.stringify(b.arguments) },
      { title: "", render: unbindButton }], bindings, { empty: "No bindings." }),
    shown && bindForm(vhost, { source: name }),
    h("h2", {}, "Publish a message"), publishForm(vhost, name),
  );
}

async function bindingsPage(main) {
  const bindings = await api("bindings");
  main.append(h("h1", {}, "Bindings"), table([
    { title: "vhost", key: "vhost" }, { title: "from", render: (b) => (b.source ? link(b.source, `/exchange/${q(b.vhost)}/${q(b.source)}`) : "(AMQP default)") },
    { title: "to", render: (b) => (b.destination_type === "queue" ? link(b.destination, `/queue/${q(b.vhost)}/${q(b.destination)}`) : link(b.destination, `/exchange/${q(b.vhost)}/${q(b.destination)}`)) },
    { title: "kind", key: "destination_type" }, { title: "routing key", key: "routing_key" }, { title: "arguments", render: (b) => JSON.stringify(b.arguments) },
    { title: "", render: (b) => (b.source ? unbindButton(b) : "") },
  ], bindings, { empty: "No bindings." }));
}

async function connectionsPage(main) {
  const connections = await api("connections");
  main.append(h("h1", {}, "Connections"), table([
    { title: "name", key: "name" }, { title: "user", key: "user" }, { title: "vhost", key: "vhost" }, { title: "state", key: "state" },
    { title: "channels", key: "channels", num: true }, { title: "client", render: (c) => (c.client_properties || {}).product || "" },
    { title: "", render: (c) => h("button", { class: "danger", onclick: confirmed(`Close connection ${c.name}?`, () => api(`connections/${q(c.name)}`, "DELETE", undefined, { "X-Reason": "Closed from the web UI" })) }, "Close") },
  ], connections), h("h2", {}, "Channels"), table([
    { title: "name", key: "name" }, { title: "user", key: "user" }, { title: "consumers", key: "consumer_count", num: true },
    { title: "unacked", key: "messages_unacknowledged", num: true }, { title: "prefetch", key: "prefetch_count", num: true }, { title: "confirm", render: (c) => String(c.confirm) },
  ], await api("channels")));
}

async function policiesPage(main) {
  const policies = await api("policies");
  const vhosts = await vhostNames();
  const inputs = { vhost: h("select", { id: "policy-vhost" }, vhosts.map((v) => h("option", { value: v }, v))), name: h("input", { id: "policy-name", required: true }),
    pattern: h("input", { id: "policy-pattern", required: true }), definition: h("input", { id: "policy-definition", placeholder: '{"max-length": 1000}' }),
    priority: h("input", { id: "policy-priority", type: "number", value: 0 }) };
  const save = async (event) => {
    event.preventDefault();
    try {
      await api(`policies/${q(inputs.vhost.value)}/${q(inputs.name.value)}`, "PUT", { pattern: inputs.pattern.value, definition: JSON.parse(inputs.definition.value || "{}"), priority: Number(inputs.priority.value), "apply-to": "all" });
    } catch (error) { refused(error); }
    render();
  };
  main.append(h("h1", {}, "Policies"), table([
    { title: "vhost", key: "vhost" }, { title: "name", key: "name" }, { title: "pattern", key: "pattern" }, { title: "applies to", key: "apply-to" },
    { title: "definition", render: (p) => JSON.stringify(p.definition) }, { title: "priority", key: "priority", num: true },
    canPolicy() && { title: "", render: (p) => h("button", { class: "danger", onclick: confirmed(`Clear policy ${p.name}?`, () => api(`policies/${q(p.vhost)}/${q(p.name)}`, "DELETE")) }, "Clear") },
  ].filter(Boolean), policies), canPolicy() && h("form", { class: "inline", onsubmit: save }, ...Object.entries(inputs).map(([key, input]) => field(key, input)), h("button", { type: "submit" }, "Set policy")));
}

async function shovelsPage(main) {
  const shovels = await api("shovels");
  const action = (shovel, path, question) => confirmed(question, () => api(`shovels/vhost/${q(shovel.vhost)}/${q(shovel.name)}${path}`, "DELETE"));
  main.append(h("h1", {}, "Shovels"), h("p", { class: "muted" }, "Dynamic shovels (declared as parameters of component shovel), as /api/shovels shows them."),
    table([
      { title: "vhost", key: "vhost" }, { title: "name", key: "name" }, { title: "state", key: "state" },
      { title: "from", render: (s) => [s.src_uri, s.src_queue || s.src_exchange].filter(Boolean).join(" ") },
      { title: "to", render: (s) => [s.dest_uri, s.dest_queue || s.dest_exchange].filter(Boolean).join(" ") },
      { title: "since", key: "timestamp" }, { title: "reason", key: "reason" },
      { title: "", render: (s) => h("span", {},
        h("button", { class: "secondary", onclick: action(s, "/restart", `Restart shovel ${s.name}?`) }, "Restart"), " ",
        h("button", { class: "danger", onclick: action(s, "", `Delete shovel ${s.name}? Its parameter is cleared.`) }, "Delete")) },
    ], shovels, { empty: "No shovels." }));
}

const reportView = { name: null };

async function reportsPage(main) {
  const reports = await api("dead-letters/reports");
  main.append(h("h1", {}, "Dead-letter reports"), h("p", { class: "muted" }, "What postroom dlq analyze wrote under the configured folder (ui.reports), newest first."),
    table([
      { title: "report", render: (r) => h("a", { href: "#/reports", onclick: (event) => { event.preventDefault(); reportView.name = r.name; render(); } }, r.name) },
      { title: "written", render: (r) => new Date(r.modified * 1000).toISOString() },
      { title: "dead letters", num: true, render: (r) => number(r.total) }, { title: "pending", num: true, render: (r) => number(r.pending) },
      { title: "by reason", render: (r) => Object.entries(r.by_reason || {}).map(([reason, n]) => `${reason} ${n}`).join(", ") },
      { title: "from", key: "first_death" }, { title: "to", key: "last_death" },
    ], reports, { empty: "No reports in the folder." }));
  if (!reportView.name) return;
  const shown = await api(`dead-letters/reports/${q(reportView.name)}`);
  const summary = shown.summary;
  const pairs = (object) => Object.entries(object || {}).map(([key, value]) => ({ key, value }));
  // (the report opens in a tab of its own, through a link that lets it in for ten minutes)
  const actions = shown.html_url ? [h("a", { href: shown.html_url, target: "_blank", rel: "noopener", id: "report-open" }, "Open the HTML report"), " ",
    h("a", { href: `${shown.html_url}&download=1`, id: "report-download" }, "Download it")] : [h("span", { class: "muted" }, "This report has no HTML page.")];
  main.append(h("h2", {}, `Report ${shown.name}`), h("p", {}, actions),
    h("h2", {}, "By reason"), table([{ title: "reason", key: "key" }, { title: "dead letters", key: "value", num: true }], pairs(summary.by_reason)),
    h("h2", {}, "By queue"), table([{ title: "queue", key: "key" }, { title: "dead letters", key: "value", num: true }], pairs(summary.by_queue)),
    h("h2", {}, "Most common header values"), table([{ title: "header", key: "header" }, { title: "value", key: "value" }, { title: "count", key: "count", num: true }], summary.top_headers || []));
}

// -- shell ----------------------------------------------------------------------------------------

const PAGES = [
  ["overview", "Overview", overviewPage, () => true],
  ["queues", "Queues", queuesPage, () => true],
  ["dead-letters", "Dead letters", deadLettersPage, () => true],
  ["exchanges", "Exchanges", exchangesPage, () => true],
  ["bindings", "Bindings", bindingsPage, () => true],
  ["connections", "Connections", connectionsPage, () => true],
  ["policies", "Policies", policiesPage, () => true],
  ["shovels", "Shovels", shovelsPage, () => canSeeAll()],
  ["vhosts", "Vhosts", vhostsPage, () => canSeeAll()],
  ["users", "Users", usersPage, () => isAdmin()],
  ["reports", "Reports", reportsPage, () => canSeeAll()],
];

function loginPage(main, problem = "") {
  const name = h("input", { id: "login-user", autocomplete: "username", required: true });
  const password = h("input", { id: "login-password", type: "password", autocomplete: "current-password" });
  main.replaceChildren(h("form", { class: "login", onsubmit: async (event) => {
    event.preventDefault();
    sessionStorage.setItem("postroom.credentials", btoa(unescape(encodeURIComponent(`${name.value}:${password.value}`))));
    await start();
  } }, h("h1", {}, "Log in to Postroom"), problem && h("p", { class: "error", id: "login-problem" }, problem),
  field("user", name), field("password", password), h("button", { type: "submit", id: "login" }, "Log in")));
  document.getElementById("nav").replaceChildren();
  document.getElementById("who").replaceChildren();
  name.focus();
}

async function render() {
  const main = document.getElementById("main");
  const [, page = "overview", ...rest] = (location.hash || "#/overview").split("/");
  const routed = PAGES.find(([key]) => key === page);
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("current", a.getAttribute("href") === `#/${page}`));
  const fresh = h("div", { id: "page", "data-page": page });
  try {
    if (page === "queue") await queuePage(fresh, decodeURIComponent(rest[0]), decodeURIComponent(rest.slice(1).join("/")));
    else if (page === "exchange") await exchangePage(fresh, decodeURIComponent(rest[0]), decodeURIComponent(rest.slice(1).join("/")));
    else if (routed && routed[3]()) await routed[2](fresh);
    else fresh.append(h("h1", {}, "Not here"), h("p", {}, "This page is not for your user's tags."));
  } catch (error) {
    if (error.status === 401) fresh.append(h("p", { class: "error" }, `Refused: ${error.message}`));
    else fresh.append(h("p", { class: "error" }, `Could not load the page: ${error.message}`));
  }
  // Keep what the user is typing in: a refresh replaces the page only when no field has focus.
  const focused = document.activeElement;
  if (focused && main.contains(focused) && ["INPUT", "SELECT", "TEXTAREA"].includes(focused.tagName) && state.route === location.hash) return;
  state.route = location.hash;
  main.replaceChildren(fresh);
}

async function start() {
  const main = document.getElementById("main");
  if (!credentials()) { loginPage(main); return; }
  try {
    state.user = await api("whoami");
  } catch (error) {
    sessionStorage.removeItem("postroom.credentials");
    loginPage(main, error.status === 401 ? "Login failed." : `Could not reach the broker: ${error.message}`);
    return;
  }
  document.getElementById("nav").replaceChildren(...PAGES.filter(([, , , allowed]) => allowed()).map(([key, title]) => h("a", { href: `#/${key}` }, title)));
  document.getElementById("who").replaceChildren(`${state.user.name} (${state.user.tags.join(", ") || "no tags"}) `,
    h("button", { class: "secondary", id: "logout", onclick: () => { sessionStorage.removeItem("postroom.credentials"); state.user = null; clearInterval(state.timer); loginPage(main); } }, "Log out"));
  await render();
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (!document.hidden && state.user) render(); }, REFRESH_MS);
}

window.addEventListener("hashchange", () => {
  if (!state.user) return;
  say(""); // (what the last action said belongs to the page it was done on)
  render();
});
start();
