// SkipMQ web console: plain ES module, no build step, no hosted assets (works offline).
// It talks only to the admin API of the broker that served it (/admin/v1/*, HTTP Basic with an
// admin user), which answers for the whole cluster.

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (v) => String(v ?? "-").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#65a30d"];
let auth = sessionStorage.getItem("skipmq-auth");
let view = "cluster";
let timer = null;

async function api(method, path, body) {
  const headers = { Authorization: auth, "X-SkipMQ-Console": "1" };
  if (method !== "GET") headers["X-Requested-By"] = "skipmq-console";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const type = response.headers.get("Content-Type") || "";
  const data = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) {
    const detail = typeof data === "object" ? `${data.status} ${data.title}: ${data.detail}` : `${response.status}`;
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return data;
}

function table(rows, columns, extra) {
  if (!rows.length) return '<p class="muted">(none)</p>';
  const head = columns.map(([, label]) => `<th>${esc(label)}</th>`).join("") + (extra ? "<th></th>" : "");
  const body = rows
    .map((row) => "<tr>" + columns.map(([key, , fmt]) => `<td>${fmt ? fmt(row[key], row) : esc(row[key])}</td>`).join("") + (extra ? `<td>${extra(row)}</td>` : "") + "</tr>")
    .join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

const yes = (v) => (v ? '<span class="ok">yes</span>' : '<span class="muted">no</span>');
const missing = (answer) =>
  (answer.missing || []).length
    ? `<p class="bad">Not answered: ${answer.missing.map((m) => `${esc(m.broker)} (${esc(m.reason)})`).join("; ")}</p>`
    : "";

// ------------------------------------------------------------------ views
const views = {
  async cluster(el) {
    const [brokers, listeners] = await Promise.all([api("GET", "/admin/v1/brokers"), api("GET", "/admin/v1/listeners")]);
    const cards = brokers.brokers
      .map(
        (b) => `<div class="card broker" data-node="${esc(b.node_id)}"><h3>${esc(b.node_id)}</h3>
        <div class="${b.status === "ready" ? "ok" : "bad"}">${esc(b.status)}</div>
        <div>peer ${esc(b.peer_id)}</div><div>${b.connections} connections, ${b.sessions} sessions</div>
        <div>${b.subscriptions} subscriptions, ${b.retained} retained</div>
        <div>links: ${b.links.map((l) => `<span class="${l.connected ? "ok" : "bad"}">${esc(l.peer_id)}</span>`).join(", ") || "-"}</div>
        <div class="muted">up ${Math.round(b.uptime_s)} s, ${b.virtual_nodes} virtual nodes</div></div>`,
      )
      .join("");
    el.innerHTML = `<h2>Cluster</h2><div class="cards">${cards}</div>${missing(brokers)}<h3>Listeners</h3>` +
      table(listeners.listeners.filter((l) => l.enabled), [["broker", "Broker"], ["name", "Listener"], ["host", "Host"], ["port", "Port"], ["scheme", "Scheme"], ["connections", "Connections"]]);
  },

  async overlay(el) {
    const [overlay, classes] = await Promise.all([api("GET", "/admin/v1/overlay"), api("GET", "/admin/v1/classes")]);
    const selected = el.dataset.cls || (classes.classes.find((c) => c.routes.length && c.subscriber_brokers.length) || classes.classes[0] || {}).class;
    const options = classes.classes.map((c) => `<option ${c.class === selected ? "selected" : ""}>${esc(c.class)}</option>`).join("");
    const cls = classes.classes.find((c) => c.class === selected);
    el.innerHTML = `<h2>Overlay: Skip Graph levels and topic-class routes</h2>
      <div class="toolbar"><label>Topic class <select id="cls">${options}</select></label>
      <span id="route-summary">${cls ? routeText(cls) : ""}</span></div>
      ${drawOverlay(overlay, selected, cls)}${missing(overlay)}
      <h3>Topic classes</h3>` +
      table(classes.classes, [["class", "Class"], ["route", "Route", (v) => esc(v || "-")], ["subscriber_brokers", "Subscriber brokers", (v) => esc(v.join(", "))],
        ["routes", "From each publisher", (v) => esc(v.map((r) => `${r.broker}: ${r.route}${r.via_others.length ? " via " + r.via_others.join(",") : ""}`).join("; "))],
        ["hops_mean", "Mean hops"], ["rates", "Publishes/s", (v) => esc(v.publishes_per_s ?? "-")]]);
    $("#cls", el).onchange = (e) => { el.dataset.cls = e.target.value; refresh(); };
  },

  async clients(el) {
    const filter = el.dataset.prefix || "";
    const answer = await api("GET", `/admin/v1/sessions?limit=200&prefix=${encodeURIComponent(filter)}`);
    el.innerHTML = `<h2>Clients and sessions</h2><div class="toolbar"><label>Client id prefix <input id="prefix" value="${esc(filter)}"></label>
      <span class="muted">${answer.items.length} shown${answer.next_cursor ? " (more: narrow the prefix)" : ""}</span></div>` +
      table(answer.items, [["client_id", "Client id"], ["broker", "Broker"], ["username", "User"], ["connected", "Connected", yes], ["protocol", "MQTT"], ["peer", "Address"],
        ["subscriptions", "Subs"], ["queued", "Queued"], ["inflight", "In flight"]],
        (row) => `<button class="kick" data-client="${esc(row.client_id)}">${row.connected ? "Disconnect" : "Discard"}</button>`) + missing(answer);
    $("#prefix", el).onchange = (e) => { el.dataset.prefix = e.target.value; refresh(); };
    el.querySelectorAll("button.kick").forEach((button) => {
      button.onclick = async () => {
        const connected = button.textContent === "Disconnect";
        await api("POST", `/admin/v1/clients/${encodeURIComponent(button.dataset.client)}/disconnect`, { discard_session: !connected });
        button.textContent = connected ? "Disconnected" : "Discarded";
        button.disabled = true;
        setTimeout(refresh, 500);
      };
    });
  },

  async topics(el) {
    const filter = el.dataset.filter || "#";
    const [retained, subs] = await Promise.all([
      api("GET", `/admin/v1/retained?limit=200&filter=${encodeURIComponent(filter)}`),
      api("GET", `/admin/v1/subscriptions?limit=200&filter=${encodeURIComponent(filter)}`),
    ]);
    el.innerHTML = `<h2>Topics</h2><div class="toolbar"><label>Topic filter <input id="tfilter" value="${esc(filter)}"></label></div>
      <h3>Subscriptions that can get ${esc(filter)}</h3>` +
      table(subs.items, [["filter", "Filter"], ["client_id", "Client id"], ["broker", "Broker"], ["qos", "QoS"], ["share_group", "Share group"], ["connected", "Connected", yes]]) +
      `<h3>Retained</h3>` +
      table(retained.items, [["topic", "Topic"], ["qos", "QoS"], ["origin", "Published on"], ["payload", "Payload", (p) => esc(p.text ?? `<${p.size} bytes binary>`)]],
        (row) => `<button class="unretain" data-topic="${esc(row.topic)}">Delete</button>`) + missing(subs);
    $("#tfilter", el).onchange = (e) => { el.dataset.filter = e.target.value || "#"; refresh(); };
    el.querySelectorAll("button.unretain").forEach((button) => {
      button.onclick = async () => { await api("DELETE", `/admin/v1/retained?topic=${encodeURIComponent(button.dataset.topic)}`); refresh(); };
    });
  },

  async users(el) {
    const [users, acl] = await Promise.all([api("GET", "/admin/v1/users"), api("GET", "/admin/v1/acl")]);
    el.innerHTML = `<h2>MQTT users</h2>` +
      table(users.users, [["name", "User"], ["source", "Source"], ["updated_by", "Changed by"]], (row) => `<button class="rmuser" data-name="${esc(row.name)}">Remove</button>`) +
      `<form id="adduser" class="toolbar"><input name="name" placeholder="user name" required><input name="password" type="password" placeholder="password" required><button>Add / change password</button></form>
      <h2>ACL</h2><p class="${acl.active ? "bad" : "muted"}">${acl.active ? "ACL active: anything not granted is denied" : "No ACL: every client may publish and subscribe anywhere"}</p>` +
      table(acl.sections, [["kind", "Section"], ["user", "User"], ["source", "Source"], ["rules", "Rules", (r) => esc(r.map((x) => `${x.access} ${x.filter}`).join(", "))]]) +
      `<form id="setacl" class="toolbar"><input name="user" placeholder="user name" required><input name="rules" placeholder="read:plant7/# readwrite:cmd/#" size="40"><button>Set user's rules</button></form>`;
    el.querySelectorAll("button.rmuser").forEach((b) => { b.onclick = async () => { await api("DELETE", `/admin/v1/users/${encodeURIComponent(b.dataset.name)}`); refresh(); }; });
    $("#adduser", el).onsubmit = async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      await api("PUT", `/admin/v1/users/${encodeURIComponent(f.get("name"))}`, { password: f.get("password") });
      refresh();
    };
    $("#setacl", el).onsubmit = async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      const rules = String(f.get("rules")).split(/\s+/).filter(Boolean).map((r) => { const i = r.indexOf(":"); return { access: r.slice(0, i), filter: r.slice(i + 1) }; });
      await api("PUT", `/admin/v1/acl/users/${encodeURIComponent(f.get("user"))}`, { rules });
      refresh();
    };
  },

  async publish(el) {
    if ($("#pubform", el)) return; // a form: not redrawn by the refresh
    el.innerHTML = `<h2>Publish</h2><form id="pubform">
      <label>Topic <input name="topic" required></label>
      <label>Payload <input name="payload" size="50"></label>
      <label>QoS <select name="qos"><option>0</option><option selected>1</option><option>2</option></select></label>
      <label><input type="checkbox" name="retain"> retain</label>
      <button type="submit">Publish</button></form><p id="pubresult"></p>`;
    $("#pubform", el).onsubmit = async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      try {
        const r = await api("POST", "/admin/v1/publish", { topic: f.get("topic"), payload: f.get("payload"), qos: Number(f.get("qos")), retain: f.get("retain") === "on" });
        $("#pubresult").textContent = `Published ${r.size} bytes to ${r.topic} from ${r.broker}.`;
      } catch (err) {
        $("#pubresult").textContent = err.message;
      }
    };
  },
};

function routeText(cls) {
  const how = cls.routes.map((r) => `${r.broker} → ${r.route === "one_hop" ? "one hop" : r.route === "multi_hop" ? "multi-hop" : "no subscribers"}` +
    (r.direct.length ? ` (direct: ${r.direct.join(", ")})` : "") + (r.via_others.length ? ` (via others: ${r.via_others.join(", ")})` : "")).join("; ");
  return `<b>${esc(cls.class)}</b>: subscribed on ${esc(cls.subscriber_brokers.join(", ") || "no broker")}; ${esc(how || "not published yet")}`;
}

// The Skip Graph: level 0 is every virtual node in key order; level l splits the nodes by the
// first l digits of their membership vectors. Each list is one row of dots joined by lines.
function drawOverlay(overlay, selected, cls) {
  const nodes = [];
  const brokers = overlay.brokers.map((b) => b.peer_id);
  const nodeOf = Object.fromEntries(overlay.brokers.map((b) => [b.peer_id, b.broker]));
  for (const part of overlay.brokers) for (const v of part.vnodes) nodes.push(v);
  const role = (r) => (r === "publisher" ? 0 : 1);
  nodes.sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : role(a.role) - role(b.role) || (a.peer < b.peer ? -1 : a.peer > b.peer ? 1 : 0)));
  const levels = [];
  for (let level = 0; level <= 8; level++) {
    const groups = new Map();
    for (const v of nodes) {
      const key = v.mv.slice(0, level);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(v);
    }
    levels.push(groups);
    if ([...groups.values()].every((g) => g.length <= 1)) break;
  }
  const dx = Math.max(14, Math.min(40, 1100 / Math.max(1, nodes.length)));
  const width = 90 + nodes.length * dx, rowH = 46, height = 40 + levels.length * rowH + 30;
  const x = new Map(nodes.map((v, i) => [v, 80 + i * dx]));
  let svg = `<svg id="skipgraph" width="${width}" height="${height}" role="img" aria-label="Skip Graph levels">`;
  levels.forEach((groups, level) => {
    const y = 30 + level * rowH;
    svg += `<text x="4" y="${y + 4}" font-size="11">level ${level}</text>`;
    for (const group of groups.values()) {
      for (let i = 1; i < group.length; i++) svg += `<line x1="${x.get(group[i - 1])}" y1="${y}" x2="${x.get(group[i])}" y2="${y}" stroke="#c3c9d4"/>`;
      for (const v of group) {
        const hot = v.topic === selected;
        const color = COLORS[brokers.indexOf(v.peer) % COLORS.length];
        svg += `<circle cx="${x.get(v)}" cy="${y}" r="${hot ? 6 : 4}" fill="${v.role === "publisher" ? color : "#fff"}" stroke="${color}" stroke-width="${hot ? 3 : 1.5}"><title>${esc(v.topic || "(anchor)")} ${v.role} on ${esc(nodeOf[v.peer])} mv ${v.mv.slice(0, 8)}</title></circle>`;
      }
    }
  });
  // the selected class's route at level 0: arrows from each publisher to the subscribers it reaches directly
  if (cls) {
    const y0 = 30;
    for (const route of cls.routes) {
      const pub = nodes.find((v) => v.topic === selected && v.role === "publisher" && nodeOf[v.peer] === route.broker);
      if (!pub) continue;
      for (const target of [...route.direct.map((d) => [d, false]), ...route.via_others.map((d) => [d, true])]) {
        const sub = nodes.find((v) => v.topic === selected && v.role === "subscriber" && nodeOf[v.peer] === target[0]);
        if (!sub) continue;
        const x1 = x.get(pub), x2 = x.get(sub), mid = (x1 + x2) / 2;
        svg += `<path class="route" d="M${x1},${y0} Q${mid},${y0 - 26} ${x2},${y0}" fill="none" stroke="#f59e0b" stroke-width="2" ${target[1] ? 'stroke-dasharray="5,4"' : ""}/>`;
      }
    }
  }
  svg += "</svg>";
  const legend = overlay.brokers.map((b, i) => `<span><svg width="10" height="10"><circle cx="5" cy="5" r="5" fill="${COLORS[i % COLORS.length]}"/></svg> ${esc(b.broker)}</span>`).join("");
  return `<div class="legend">${legend}<span>filled: publisher, hollow: subscriber; orange: the selected class's PUB from each publisher (dashed: through other brokers)</span></div>${svg}`;
}

// ------------------------------------------------------------------ shell
async function refresh() {
  const el = $("#view");
  try {
    await views[view](el);
    $("#error").textContent = "";
  } catch (err) {
    if (err.status === 401) return signOut("Signed out: " + err.message);
    $("#error").textContent = err.message;
  }
}

function show(name) {
  view = name;
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b.dataset.view === name));
  const el = $("#view");
  el.innerHTML = "";
  el.dataset.view = name;
  refresh();
}

function signOut(message) {
  sessionStorage.removeItem("skipmq-auth");
  auth = null;
  clearInterval(timer);
  $("#nav").hidden = true;
  $("#view").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
}

async function signIn() {
  const me = await api("GET", "/admin/v1/whoami");
  $("#who").textContent = `${me.user} (${me.role}) via ${me.broker}`;
  $("#login").hidden = true;
  $("#nav").hidden = false;
  $("#view").hidden = false;
  show(view);
  clearInterval(timer);
  timer = setInterval(() => { if (view !== "publish") refresh(); }, 3000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("nav button").forEach((b) => { b.onclick = () => show(b.dataset.view); });
  $("#login").onsubmit = async (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    auth = "Basic " + btoa(unescape(encodeURIComponent(`${f.get("user")}:${f.get("password")}`)));
    try {
      await signIn();
      sessionStorage.setItem("skipmq-auth", auth);
    } catch (err) {
      signOut(err.message);
    }
  };
  if (auth) signIn().catch(() => signOut());
});
