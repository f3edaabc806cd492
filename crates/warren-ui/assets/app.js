// The Warren dashboard: one page, routed by the URL's fragment (#/, #/sandboxes, #/sandbox/ID,
// #/images, #/pools). It reads the JSON API of the server that served it, node or gateway,
// follows its event stream (`/v1/events`) and polls for the rest. Text from the API is always
// set as text, never as HTML.
'use strict';

const TOKEN_KEY = 'warren-token';
const PAGE_SIZE = 50;
const POLL_MS = 2000;
const CHART_POINTS = 150;

// ---- errors: every script error and failed call is shown in #errors -----------------------

function showError(kind, message) {
  const box = document.getElementById('errors');
  if (!box) return;
  // Also on the console, where a headless browser's log shows it.
  console.error('warren-ui ' + kind + ': ' + message);
  const div = document.createElement('div');
  div.className = kind;
  div.textContent = message;
  box.appendChild(div);
  while (box.childElementCount > 5) box.removeChild(box.firstChild);
}

window.addEventListener('error', (e) => {
  showError('js-error', 'Script error: ' + (e.message || e.type));
});
window.addEventListener('unhandledrejection', (e) => {
  const r = e.reason;
  if (r && r.apiError) {
    showError('api-error', r.message);
  } else {
    showError('js-error', 'Script error: ' + (r && r.message ? r.message : String(r)));
  }
});

// ---- the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message, requestId) {
    super(message);
    this.apiError = true;
    this.status = status;
    this.code = code;
    this.requestId = requestId;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

// A token handed over in the fragment (`#/page?token=…`: a fragment is never sent to the
// server, so it stays out of its logs) is kept for this tab and taken out of the address at
// once, before anything is fetched.
function takeTokenFromHash() {
  const raw = location.hash.replace(/^#/, '');
  const at = raw.indexOf('?');
  if (at < 0) return false;
  const q = new URLSearchParams(raw.slice(at + 1));
  if (!q.has('token')) return false;
  const t = q.get('token');
  q.delete('token');
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  const rest = q.toString();
  history.replaceState(null, '', location.pathname + location.search + '#'
    + (raw.slice(0, at) || '/') + (rest ? '?' + rest : ''));
  caller = null;
  return true;
}

// Who the server takes us for ({tenant, role}, from /v1/health), asked once per token. Only
// an admin is offered pause, resume and delete: the dashboard is read-only for users.
let caller = null;

async function whoami() {
  if (caller === null) {
    const h = await api('/v1/health');
    caller = h.caller || { tenant: null, role: 'admin' };
    const who = caller.tenant ? caller.tenant + ' (' + caller.role + ')' : caller.role;
    document.getElementById('server').textContent = (h.gateway ? 'gateway ' : 'node ') + h.node
      + ' · ' + h.version + ' · ' + who;
  }
  return caller;
}

function mayChange() {
  return caller !== null && caller.role === 'admin';
}

// Calls the API; answers parsed JSON, NDJSON as an array, or null for an empty answer.
async function api(path, opts) {
  opts = opts || {};
  const headers = {};
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, {
    method: opts.method || 'GET',
    headers: headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    cache: 'no-store',
  });
  const ctype = resp.headers.get('content-type') || '';
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch (_) { /* not JSON */ }
    const err = body && body.error ? body.error : {};
    const rid = err.request_id || resp.headers.get('x-request-id') || '';
    let msg = (opts.method || 'GET') + ' ' + path.split('?')[0] + ': ' + resp.status + ' '
      + (err.code || '') + (err.message ? ' — ' + err.message : '');
    if (rid) msg += ' (request ' + rid + ')';
    if (resp.status === 401) msg += '. Enter a token above.';
    throw new ApiError(resp.status, err.code, msg, rid);
  }
  if (resp.status === 204) return null;
  if (ctype.includes('ndjson')) {
    const text = await resp.text();
    return text.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
  }
  if (ctype.includes('json')) return resp.json();
  return resp.text();
}

// ---- DOM helpers ---------------------------------------------------------------------------

// el('td', {class: 'num'}, 'text', child, ...): strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function table(headers, rows, attrs) {
  return el('table', attrs || {},
    el('thead', {}, el('tr', {}, headers.map((h) =>
      typeof h === 'string' ? el('th', {}, h) : el('th', { class: h.cls }, h.name)))),
    el('tbody', {}, rows));
}

function card(label, value, id) {
  return el('div', { class: 'card' },
    el('div', { class: 'label' }, label),
    el('div', { class: 'value', id: id }, value));
}

function badge(text) {
  return el('span', { class: 'badge ' + text }, text);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(1)) + ' ' + units[i];
}

function fmtPct(x) {
  return x === null || x === undefined ? '—' : (100 * x).toFixed(1) + ' %';
}

function fmtTime(ms) {
  if (!ms) return '—';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function fmtAge(ms) {
  if (!ms) return '—';
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return Math.floor(s) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h';
  return Math.floor(s / 86400) + 'd';
}

function fmtMode(m) {
  return '0' + (m & 0o7777).toString(8).padStart(3, '0');
}

// ---- charts (canvas) -----------------------------------------------------------------------

// A chart's axis: from 0 to a top at or above `high` (or `max`, for a fixed scale) in at
// most four equal steps of a round size (1, 2, 2.5 or 5 times a power of ten; whole numbers
// for counts), with as many decimals as the step needs, so no two ticks read the same.
// An axis is at least 1 high: a chart of an idle sandbox reads 0 to 1 %, not 0.0 five times.
function axisTicks(high, max, integer) {
  const want = max || Math.max(high, 1);
  const raw = want / 4;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 2.5, 5, 10].find((m) => m * mag >= raw - 1e-9 * mag) * mag;
  if (integer) step = Math.max(1, Math.ceil(step));
  const n = Math.max(1, Math.ceil(want / step - 1e-9));
  let decimals = 0;
  while (decimals < 6 && Math.abs(Math.round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6) {
    decimals++;
  }
  const values = [];
  for (let i = 0; i <= n; i++) values.push(i * step);
  return { values: values, top: n * step, decimals: decimals };
}

class Chart {
  constructor(title, unit, color, opts) {
    this.title = title;
    this.unit = unit;
    this.color = color;
    this.max = opts && opts.max;
    this.integer = Boolean(opts && opts.integer);
    this.format = (opts && opts.format) || ((v) => v.toFixed(1));
    this.points = [];
    this.canvas = el('canvas', { width: 420, height: 140 });
    this.latest = el('span', { class: 'latest' }, '—');
    this.node = el('div', { class: 'chart', dataset: { chart: title } },
      el('div', { class: 'title' }, title + ': ', this.latest), this.canvas);
    this.draw();
  }

  push(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return;
    this.points.push(v);
    if (this.points.length > CHART_POINTS) this.points.shift();
    this.latest.textContent = this.format(v) + (this.unit ? ' ' + this.unit : '');
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const ticks = axisTicks(Math.max(0, ...this.points), this.max, this.integer);
    const labels = ticks.values.map((v) => v.toFixed(ticks.decimals) + (this.unit ? ' ' + this.unit : ''));
    // The axis as drawn, for a reader of the page (and its tests).
    this.node.dataset.ticks = labels.join('|');
    const g = c.getContext('2d');
    if (!g) return;
    const w = c.width;
    const h = c.height;
    const pad = 24;
    g.clearRect(0, 0, w, h);
    const top = ticks.top;
    g.strokeStyle = '#dde1e8';
    g.fillStyle = '#6b7385';
    g.font = '10px sans-serif';
    g.lineWidth = 1;
    const left = Math.ceil(Math.max(...labels.map((l) => g.measureText(l).width))) + 6;
    ticks.values.forEach((v, i) => {
      const y = pad / 2 + (h - pad) * (1 - v / top);
      g.beginPath();
      g.moveTo(left, y);
      g.lineTo(w, y);
      g.stroke();
      g.fillText(labels[i], 0, y + 3);
    });
    if (this.points.length === 0) return;
    const step = (w - left) / (CHART_POINTS - 1);
    const x0 = w - step * (this.points.length - 1);
    g.strokeStyle = this.color;
    g.lineWidth = 2;
    g.beginPath();
    this.points.forEach((v, i) => {
      const x = x0 + i * step;
      const y = pad / 2 + (h - pad) * (1 - v / top);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  }
}

// ---- routing and polling -------------------------------------------------------------------

let timers = [];
let streams = [];
let generation = 0;

// Follows `GET /v1/events` (Server-Sent Events, read with fetch: EventSource cannot send the
// token) and calls `on[name](data)` for each event, until the page changes. It reconnects
// after an error or the end of the stream, backing off up to 30 s; `body[data-live]` says
// whether the page is live. Pages poll slowly beside it, so an older server without the
// route still shows fresh figures.
function live(path, on) {
  const gen = generation;
  let backoff = 1000;
  const connect = async () => {
    if (gen !== generation) return;
    const ctl = new AbortController();
    streams.push(ctl);
    const headers = {};
    if (token()) headers.Authorization = 'Bearer ' + token();
    try {
      const resp = await fetch(path, { headers: headers, cache: 'no-store', signal: ctl.signal });
      if (!resp.ok || !resp.body) throw new Error('events: ' + resp.status);
      document.body.dataset.live = 'sse';
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done || gen !== generation) break;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const raw = buf.slice(0, end);
          buf = buf.slice(end + 2);
          let name = 'message';
          let data = '';
          for (const line of raw.split('\n')) {
            if (line.startsWith('event:')) name = line.slice(6).trim();
            else if (line.startsWith('data:')) data += line.slice(5).trim();
          }
          backoff = 1000;
          if (!data || !on[name]) continue;
          document.body.dataset.liveEvents = String(Number(document.body.dataset.liveEvents || 0) + 1);
          try { await on[name](JSON.parse(data)); } catch (e) { reportError(e); }
        }
      }
    } catch (_) {
      // Not live for now: the page's slow polling goes on meanwhile.
    }
    if (gen !== generation) return;
    document.body.dataset.live = 'polling';
    timers.push(setTimeout(connect, backoff));
    backoff = Math.min(backoff * 2, 30000);
  };
  connect();
}

// Runs `fn` once, `ms` after the last of a burst of calls.
function debounce(ms, fn) {
  let t = null;
  return () => {
    if (t !== null) clearTimeout(t);
    t = setTimeout(() => { t = null; fn().catch(reportError); }, ms);
    timers.push(t);
  };
}

function isLive() {
  return document.body.dataset.live === 'sse';
}

function every(ms, fn) {
  const gen = generation;
  const tick = async () => {
    if (gen !== generation) return;
    try { await fn(); } catch (e) { reportError(e); }
    if (gen === generation) timers.push(setTimeout(tick, ms));
  };
  timers.push(setTimeout(tick, ms));
}

function reportError(e) {
  if (e && e.apiError) showError('api-error', e.message);
  else showError('js-error', 'Script error: ' + (e && e.message ? e.message : String(e)));
}

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, query] = raw.split('?');
  return { parts: path.split('/').filter((p) => p.length > 0).map(decodeURIComponent),
    params: new URLSearchParams(query || '') };
}

function go(path, params) {
  const q = params ? params.toString() : '';
  location.hash = '#' + path + (q ? '?' + q : '');
}

const PAGES = {
  '': overview,
  sandboxes: sandboxes,
  sandbox: sandboxPage,
  images: images,
  pools: pools,
};

async function route() {
  takeTokenFromHash();
  generation++;
  timers.forEach(clearTimeout);
  timers = [];
  streams.forEach((c) => c.abort());
  streams = [];
  delete document.body.dataset.live;
  delete document.body.dataset.liveEvents;
  delete document.body.dataset.ready;
  delete document.body.dataset.readyMs;
  const { parts, params } = parseHash();
  const name = parts[0] || '';
  const page = PAGES[name];
  for (const a of document.querySelectorAll('nav a')) {
    a.classList.toggle('active', a.dataset.nav === (name || 'overview')
      || (name === 'sandbox' && a.dataset.nav === 'sandboxes'));
  }
  const main = document.getElementById('main');
  main.replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
  const gen = generation;
  try {
    if (!page) throw new Error('no page ' + location.hash);
    await whoami();
    await page(main, parts.slice(1), params, gen);
    if (gen === generation) {
      document.body.dataset.ready = name || 'overview';
      document.body.dataset.readyMs = String(Math.round(performance.now()));
    }
  } catch (e) {
    if (gen !== generation) return;
    main.replaceChildren(el('p', { class: 'muted' }, 'This page could not be shown.'));
    reportError(e);
  }
}

// ---- health: a node's, or a gateway's with its nodes ---------------------------------------

// The nodes behind this server, each {id, state, load, memory_total_mb, version}.
async function nodes(health) {
  if (!health.gateway) {
    return [{ id: health.node, state: 'ready', load: health.load || {}, version: health.version,
      memory_total_mb: health.host ? health.host.memory_total_mb : null }];
  }
  // The cluster view (every tenant's load) is an administrator's.
  if (!health.caller || health.caller.role !== 'admin') return [];
  const cluster = await api('/v1/cluster');
  return (cluster.nodes || []).map((n) => ({ id: n.id, state: n.state, load: n.load || {},
    version: n.version, memory_total_mb: n.capacity ? n.capacity.memory_total_mb : null }));
}

const STATES = ['creating', 'running', 'paused', 'stopped', 'failed'];
const SUBSTRATES = ['container', 'microvm', 'vm', 'function'];

function totals(ns) {
  const t = { by_state: {}, by_substrate: {}, sandboxes: 0, memory_available_mb: 0,
    memory_total_mb: 0, cpu_pressure: 0 };
  for (const s of STATES) t.by_state[s] = 0;
  for (const n of ns) {
    if (n.state === 'lost') continue;
    for (const s of STATES) {
      t.by_state[s] += n.load[s] || 0;
      t.sandboxes += n.load[s] || 0;
    }
    for (const [k, v] of Object.entries(n.load.by_substrate || {})) {
      t.by_substrate[k] = (t.by_substrate[k] || 0) + v;
    }
    t.memory_available_mb += n.load.memory_available_mb || 0;
    t.memory_total_mb += n.memory_total_mb || 0;
    t.cpu_pressure = Math.max(t.cpu_pressure, n.load.cpu_pressure || 0);
  }
  return t;
}

// ---- overview ------------------------------------------------------------------------------

async function overview(main) {
  const health = await api('/v1/health');
  const sbChart = new Chart('Sandboxes', '', '#2b6cb0', { format: (v) => v.toFixed(0), integer: true });
  const cpuChart = health.gateway
    ? new Chart('CPU pressure (highest node)', '%', '#c05621', { max: 100 })
    : new Chart('Host CPU busy', '%', '#c05621', { max: 100 });
  const cards = el('div', { class: 'cards', id: 'overview-cards' });
  const bySub = el('div', { id: 'by-substrate' });
  const nodeBox = el('div', { id: 'nodes' });
  main.replaceChildren(
    el('h1', {}, health.gateway ? 'Cluster ' + health.node : 'Node ' + health.node),
    cards,
    el('h2', {}, 'Live'),
    el('div', { class: 'charts' }, sbChart.node, cpuChart.node),
    el('div', { class: 'grid2' },
      el('div', {}, el('h2', {}, 'Sandboxes by substrate'), bySub),
      el('div', {}, el('h2', {}, health.gateway ? 'Nodes' : 'Node'), nodeBox)));

  let lastCpu = null;
  const draw = async (h) => {
    const ns = await nodes(h);
    const t = totals(ns);
    cards.replaceChildren(
      card('Sandboxes', t.sandboxes, 'count-sandboxes'),
      ...STATES.map((s) => el('a', { href: '#/sandboxes?state=' + s, class: 'plain' },
        card(s, t.by_state[s], 'count-' + s))),
      card('Memory available', t.memory_total_mb
        ? fmtBytes(t.memory_available_mb * 1048576) + ' of ' + fmtBytes(t.memory_total_mb * 1048576)
        : fmtBytes(t.memory_available_mb * 1048576), 'memory'),
      card('CPU pressure', t.cpu_pressure.toFixed(1) + ' %', 'cpu-pressure'));
    const subs = Object.keys(t.by_substrate).sort();
    bySub.replaceChildren(table(['Substrate', { name: 'Sandboxes', cls: 'num' }],
      subs.length === 0
        ? [el('tr', {}, el('td', { colspan: 2, class: 'muted' }, 'No sandboxes'))]
        : subs.map((s) => el('tr', { dataset: { substrate: s } },
          el('td', {}, el('a', { href: '#/sandboxes?substrate=' + s }, s)),
          el('td', { class: 'num' }, t.by_substrate[s])))));
    nodeBox.replaceChildren(table(['Node', 'State', { name: 'Sandboxes', cls: 'num' },
      { name: 'Running', cls: 'num' }, { name: 'Memory available', cls: 'num' },
      { name: 'CPU pressure', cls: 'num' }, 'Version'],
    ns.map((n) => el('tr', { dataset: { node: n.id } },
      el('td', {}, n.id), el('td', {}, badge(n.state)),
      el('td', { class: 'num' }, STATES.reduce((a, s) => a + (n.load[s] || 0), 0)),
      el('td', { class: 'num' }, n.load.running || 0),
      el('td', { class: 'num' }, fmtBytes((n.load.memory_available_mb || 0) * 1048576)
        + (n.memory_total_mb ? ' / ' + fmtBytes(n.memory_total_mb * 1048576) : '')),
      el('td', { class: 'num' }, (n.load.cpu_pressure || 0).toFixed(1) + ' %'),
      el('td', {}, n.version || '')))));
    sbChart.push(t.sandboxes);
    if (h.gateway) {
      cpuChart.push(t.cpu_pressure);
    } else if (h.host && h.host.cpu_total_ms !== null && h.host.cpu_total_ms !== undefined) {
      if (lastCpu && h.host.cpu_total_ms > lastCpu.total) {
        cpuChart.push(100 * (h.host.cpu_busy_ms - lastCpu.busy) / (h.host.cpu_total_ms - lastCpu.total));
      }
      lastCpu = { busy: h.host.cpu_busy_ms, total: h.host.cpu_total_ms };
    }
  };
  await draw(health);
  if (health.gateway) {
    every(POLL_MS, async () => draw(await api('/v1/health')));
  } else {
    // A node pushes its load (with the host's CPU) every POLL_MS; polling stands in while
    // the stream is down.
    live('/v1/events?interval_ms=' + POLL_MS, {
      load: (ev) => draw(Object.assign({}, health, { load: ev.load, host: ev.host,
        sandboxes: ev.sandboxes })),
    });
    every(POLL_MS, async () => { if (!isLive()) await draw(await api('/v1/health')); });
  }
}

// ---- sandboxes -----------------------------------------------------------------------------

// Cursors of the pages before the current one, for "Previous".
let pageStack = [];
let pageFilter = '';

function sandboxQuery(params) {
  const q = new URLSearchParams();
  const limit = Number(params.get('limit'));
  q.set('limit', String(limit >= 1 && limit <= 1000 ? Math.floor(limit) : PAGE_SIZE));
  for (const k of ['state', 'substrate', 'after']) {
    if (params.get(k)) q.set(k, params.get(k));
  }
  for (const l of (params.get('label') || '').split(',').map((s) => s.trim()).filter(Boolean)) {
    q.append('label', l);
  }
  return q;
}

function actionButtons(sb, after) {
  if (!mayChange()) return el('span', { class: 'muted', 'data-readonly': true }, 'read-only');
  const act = async (what) => {
    if (what === 'delete' && !window.confirm('Delete sandbox ' + sb.id + '?')) return;
    try {
      if (what === 'delete') await api('/v1/sandboxes/' + sb.id, { method: 'DELETE' });
      else await api('/v1/sandboxes/' + sb.id + '/' + what, { method: 'POST', body: {} });
    } catch (e) {
      reportError(e);
    }
    await after();
  };
  return el('span', { class: 'actions' },
    sb.state === 'running' && sb.substrate !== 'function'
      ? el('button', { type: 'button', onclick: () => act('pause') }, 'Pause') : null,
    sb.state === 'paused' ? el('button', { type: 'button', onclick: () => act('resume') }, 'Resume') : null,
    el('button', { type: 'button', class: 'danger', onclick: () => act('delete') }, 'Delete'));
}

function labelChips(labels) {
  return Object.entries(labels || {}).map(([k, v]) => el('span', { class: 'label-chip' }, k + '=' + v));
}

async function sandboxes(main, _parts, params) {
  const filterKey = ['state', 'substrate', 'label', 'limit'].map((k) => params.get(k) || '').join('|');
  if (filterKey !== pageFilter) {
    pageFilter = filterKey;
    pageStack = [];
  }
  const select = (name, values) => el('select', { name: name },
    el('option', { value: '' }, 'any'),
    values.map((v) => el('option', { value: v, selected: params.get(name) === v }, v)));
  const form = el('form', { class: 'filters', id: 'filters' },
    el('label', {}, 'State', select('state', STATES)),
    el('label', {}, 'Substrate', select('substrate', SUBSTRATES)),
    el('label', {}, 'Labels (key=value, comma separated)',
      el('input', { name: 'label', value: params.get('label') || '', size: 30 })),
    el('button', { type: 'submit' }, 'Filter'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) p.set(k, String(v));
    go('/sandboxes', p);
  });
  const body = el('div', { id: 'sandbox-table' });
  const pager = el('div', { class: 'pager', id: 'pager' });
  main.replaceChildren(el('h1', {}, 'Sandboxes'), form, pager, body);

  const load = async () => {
    const list = await api('/v1/sandboxes?' + sandboxQuery(params).toString());
    const rows = list.sandboxes.map((sb) => el('tr', { dataset: { id: sb.id } },
      el('td', {}, el('a', { href: '#/sandbox/' + encodeURIComponent(sb.id), class: 'mono' }, sb.id)),
      el('td', {}, badge(sb.state)),
      el('td', {}, sb.substrate),
      el('td', {}, (sb.image || []).join(' + ')),
      el('td', {}, labelChips(sb.labels)),
      el('td', { class: 'num' }, sb.limits.cpus),
      el('td', { class: 'num' }, sb.limits.memory_mb + ' MiB'),
      el('td', {}, fmtAge(sb.created_at_ms)),
      el('td', {}, actionButtons(sb, load))));
    body.replaceChildren(table(['Id', 'State', 'Substrate', 'Image', 'Labels',
      { name: 'CPUs', cls: 'num' }, { name: 'Memory', cls: 'num' }, 'Age', ''],
    rows.length ? rows : [el('tr', {}, el('td', { colspan: 9, class: 'muted' }, 'No sandboxes match.'))],
    { id: 'sandboxes' }));
    const pageNo = pageStack.length + 1;
    pager.replaceChildren(
      el('button', { type: 'button', id: 'prev', disabled: pageStack.length === 0,
        onclick: () => {
          const p = new URLSearchParams(params);
          const prev = pageStack.pop();
          if (prev) p.set('after', prev); else p.delete('after');
          go('/sandboxes', p);
        } }, '← Previous'),
      el('span', { id: 'page-info' }, 'Page ' + pageNo + ': ' + list.sandboxes.length + ' shown'
        + (list.unreachable && list.unreachable.length
          ? ' (nodes not answering: ' + list.unreachable.join(', ') + ')' : '')),
      el('button', { type: 'button', id: 'next', disabled: !list.next_after,
        onclick: () => {
          pageStack.push(params.get('after') || '');
          const p = new URLSearchParams(params);
          p.set('after', list.next_after);
          go('/sandboxes', p);
        } }, 'Next →'));
  };
  await load();
  // Changes of sandboxes redraw the page (once per burst); the slow poll catches the rest.
  const soon = debounce(300, load);
  live('/v1/events?interval_ms=60000', { sandbox: soon, deleted: soon });
  every(5 * POLL_MS, load);
}

// ---- one sandbox ---------------------------------------------------------------------------

function describeRequest(e) {
  const r = e.request || {};
  switch (e.kind) {
    case 'exec':
    case 'spawn':
      return r.shell !== null && r.shell !== undefined ? '$ ' + r.shell : (r.argv || []).join(' ');
    case 'kill': return 'pid ' + r.pid + ', signal ' + r.signal;
    case 'write_file': return r.path + ' (' + fmtBytes(r.size) + ')';
    case 'write_tar': return 'tar into ' + r.path + ' (' + fmtBytes(r.size) + ')';
    case 'mkdir': return r.path + (r.parents ? ' (with parents)' : '');
    case 'remove': return r.path + (r.recursive ? ' (recursive)' : '');
    case 'chmod': return r.path + ' → ' + fmtMode(r.mode || 0);
    case 'fork': return (r.children || '?') + ' children';
    case 'pause': return r.by === 'idle' ? 'idle timeout' : 'by a call';
    case 'resume': return '';
    case 'network': return r.policy ? String(r.policy.mode || '') : '';
    case 'forked_from': return 'from ' + r.parent + ' at seq ' + r.parent_seq;
    case 'terminal': return 'terminal ' + r.session + ', part ' + (r.part + 1) + ': ' + (r.argv || []).join(' ');
    default: return JSON.stringify(r);
  }
}

function outputBlock(name, text, omitted, truncated, bytes, encoding) {
  if (omitted) return el('div', { class: 'muted' }, name + ': ' + fmtBytes(bytes) + ' (not kept)');
  if (!text) return null;
  // The export writes output as base64 only when it is not UTF-8.
  if (encoding === 'base64') return el('div', { class: 'muted' }, name + ': ' + fmtBytes(bytes) + ' of binary output');
  return el('div', {},
    el('div', { class: 'muted' }, name + (truncated ? ' (truncated, ' + fmtBytes(bytes) + ' written)' : '')),
    el('pre', { class: name }, text.length > 8192 ? text.slice(0, 8192) + '\n…' : text));
}

// Escape sequences (colours, cursor moves) and carriage returns make a terminal's bytes hard
// to read as text; the transcript leaves them out.
const ANSI = /\x1b\[[0-?]*[ -\/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-_]|\r/g;

// A terminal part as a transcript: printed text as is, typed text marked.
function terminalBlock(res) {
  const chunks = res.chunks || [];
  if (!chunks.length && !res.ended) return null;
  const pre = el('pre', { class: 'terminal' });
  let shown = 0;
  for (const c of chunks) {
    if (shown > 16384) { pre.append('\n…'); break; }
    let text;
    if (c.omitted) text = '[' + fmtBytes(c.len) + ' not kept]';
    else if (c.encoding === 'base64') text = '[' + fmtBytes(c.len) + ' binary]';
    else text = c.data.replace(ANSI, '');
    shown += text.length;
    pre.append(c.stream === 'input' ? el('span', { class: 'typed', title: fmtTime(c.at_ms) }, text) : text);
  }
  const end = res.ended
    ? el('div', { class: 'muted' }, 'ended' + (res.exit_code !== undefined && res.exit_code !== null
      ? ', exit ' + res.exit_code : (res.signal ? ', signal ' + res.signal : '')))
    : null;
  return [chunks.length ? pre : null, end];
}

function timelineItem(e) {
  const res = e.result || {};
  const failed = e.error || (e.kind === 'exec' && res.exit_code !== 0 && res.exit_code !== undefined);
  const marks = [];
  if (e.step !== null && e.step !== undefined) marks.push(el('span', { class: 'badge replayed' }, 'step ' + e.step));
  if (e.cancelled) marks.push(badge('cancelled'));
  if (res.timed_out) marks.push(el('span', { class: 'badge bad' }, 'timed out'));
  if (res.oom_killed) marks.push(el('span', { class: 'badge bad' }, 'OOM'));
  return el('li', { class: failed ? 'failed' : '', dataset: { seq: e.seq, kind: e.kind } },
    el('div', { class: 'head' },
      el('strong', {}, '#' + e.seq), el('span', {}, e.kind), ...marks,
      el('code', {}, describeRequest(e)),
      e.kind === 'exec' && res.exit_code !== undefined
        ? el('span', { class: 'exit' }, 'exit ' + (res.exit_code === null ? 'signal ' + res.signal : res.exit_code))
        : null,
      e.kind === 'spawn' && res.pid ? el('span', {}, 'pid ' + res.pid) : null,
      el('span', { class: 'muted' }, fmtTime(e.started_at_ms) + ', ' + Number(e.duration_ms).toFixed(1) + ' ms')),
    e.error ? el('div', { class: 'muted' }, 'error: ' + e.error.code + ' — ' + e.error.message) : null,
    e.kind === 'exec'
      ? [outputBlock('stdout', res.stdout, res.stdout_omitted, res.stdout_truncated, res.stdout_bytes, res.encoding),
        outputBlock('stderr', res.stderr, res.stderr_omitted, res.stderr_truncated, res.stderr_bytes, res.encoding)]
      : (e.kind === 'terminal' ? terminalBlock(res) : null));
}

async function sandboxPage(main, parts, params) {
  const id = parts[0];
  if (!id) throw new Error('no sandbox id');
  const base = '/v1/sandboxes/' + encodeURIComponent(id);
  const info = el('div', { id: 'info' });
  const statCards = el('div', { class: 'cards', id: 'stats' });
  const cpu = new Chart('CPU', '%', '#c05621');
  const mem = new Chart('Memory', 'MiB', '#2b6cb0');
  const procs = el('div', { id: 'processes' });
  const traj = el('div', { id: 'trajectory' });
  const files = el('div', { id: 'files' });
  const actions = el('div', { class: 'actions', id: 'actions' });
  main.replaceChildren(
    el('h1', {}, 'Sandbox ', el('span', { class: 'mono' }, id)), actions, info,
    el('h2', {}, 'Resources'), statCards, el('div', { class: 'charts' }, cpu.node, mem.node),
    el('div', { class: 'grid2' },
      el('div', {}, el('h2', {}, 'Processes'), procs),
      el('div', {}, el('h2', {}, 'Files'), files)),
    el('h2', {}, 'Trajectory'), traj);

  const drawInfo = async () => {
    const sb = await api(base);
    actions.replaceChildren(actionButtons(sb, async () => {
      try { await drawInfo(); } catch (e) {
        if (e.status === 404) go('/sandboxes'); else throw e;
      }
    }));
    const kv = [
      ['State', badge(sb.state)], ['Substrate', sb.substrate], ['Image', (sb.image || []).join(' + ')],
      ['Limits', sb.limits.cpus + ' CPUs, ' + sb.limits.memory_mb + ' MiB memory, '
        + sb.limits.disk_mb + ' MiB disk, ' + sb.limits.pids + ' pids'],
      ['Labels', Object.keys(sb.labels || {}).length ? labelChips(sb.labels) : '—'],
      ['Created', fmtTime(sb.created_at_ms)], ['Expires', fmtTime(sb.expires_at_ms)],
      ['Last activity', fmtTime(sb.last_activity_ms)],
    ];
    if (sb.tenant) kv.push(['Tenant', sb.tenant]);
    if (sb.reason) kv.push(['Reason', sb.reason]);
    current = sb.state;
    info.replaceChildren(el('dl', { class: 'kv' }, kv.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])));
    return sb;
  };

  const drawStats = async () => {
    const s = await api(base + '/stats');
    statCards.replaceChildren(
      card('CPU', fmtPct(s.cpu_share) + ' of ' + s.cpus, 'stat-cpu'),
      card('Memory', fmtBytes(s.memory_bytes) + ' / ' + fmtBytes(s.memory_limit_bytes), 'stat-memory'),
      card('Peak memory', fmtBytes(s.memory_peak_bytes), 'stat-peak'),
      card('Disk', fmtBytes(s.disk_bytes) + ' / ' + fmtBytes(s.disk_limit_bytes), 'stat-disk'),
      card('Processes', (s.pids === null ? '—' : s.pids) + ' / ' + s.pids_limit, 'stat-pids'),
      card('OOM kills', s.oom_kills === null ? '—' : s.oom_kills, 'stat-oom'),
      card('Trajectory', fmtBytes(s.trajectory_bytes) + ' / ' + fmtBytes(s.trajectory_budget_bytes), 'stat-trajectory'),
      card('Idle', s.idle_secs.toFixed(0) + ' s', 'stat-idle'));
    if (s.cpu_share !== null) cpu.push(100 * s.cpu_share);
    if (s.memory_bytes !== null) mem.push(s.memory_bytes / 1048576);
  };

  // Listing processes or files asks the agent, which would resume a paused sandbox: a page
  // that only looks leaves it paused.
  let current = null;
  const drawProcs = async () => {
    if (current !== 'running') {
      procs.replaceChildren(el('p', { class: 'muted' }, 'Not listed while the sandbox is ' + current + '.'));
      return;
    }
    const list = await api(base + '/processes');
    procs.replaceChildren(table([{ name: 'Pid', cls: 'num' }, 'Command', 'State', 'Exit', 'Started'],
      list.processes.length === 0
        ? [el('tr', {}, el('td', { colspan: 5, class: 'muted' }, 'No processes started through the API'))]
        : list.processes.map((p) => el('tr', { dataset: { pid: p.pid } },
          el('td', { class: 'num' }, p.pid), el('td', {}, el('code', {}, p.argv.join(' '))),
          el('td', {}, badge(p.state)),
          el('td', {}, p.exit_code !== null ? p.exit_code : (p.signal !== null ? 'signal ' + p.signal : '')),
          el('td', {}, fmtAge(p.started_at_ms))))));
  };

  let trajSeen = 0;
  const list = el('ol', { class: 'timeline', id: 'timeline' });
  const trajNote = el('p', { class: 'muted', id: 'trajectory-note' });
  traj.replaceChildren(trajNote, list);
  const drawTraj = async () => {
    const entries = await api(base + '/trajectory?from_seq=' + (trajSeen + 1));
    for (const e of entries) {
      list.appendChild(timelineItem(e));
      trajSeen = Math.max(trajSeen, e.seq);
    }
    while (list.childElementCount > 500) list.removeChild(list.firstChild);
    trajNote.textContent = trajSeen === 0 ? 'No calls logged yet.'
      : trajSeen + ' calls logged' + (trajSeen > 500 ? ' (the last 500 shown)' : '') + '.';
  };

  const drawFiles = async (dir) => {
    const listing = await api(base + '/files/list?' + new URLSearchParams({ path: dir, limit: '500' }));
    const up = dir === '/' ? null : dir.replace(/\/[^/]+\/?$/, '') || '/';
    const join = (name) => (dir.endsWith('/') ? dir : dir + '/') + name;
    const rows = listing.entries.map((f) => el('tr', { dataset: { name: f.name } },
      el('td', {}, f.kind === 'dir'
        ? el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); drawFiles(join(f.name)).catch(reportError); } }, f.name + '/')
        : (f.kind === 'symlink' ? f.name + ' → ' + (f.link_target || '') : f.name)),
      el('td', {}, f.kind), el('td', { class: 'num' }, f.kind === 'file' ? fmtBytes(f.size) : ''),
      el('td', { class: 'mono' }, fmtMode(f.mode)), el('td', {}, fmtTime(f.mtime_ms))));
    files.replaceChildren(
      el('div', { class: 'pager' }, el('code', { id: 'cwd' }, dir),
        up ? el('button', { type: 'button', onclick: () => drawFiles(up).catch(reportError) }, 'Up') : null,
        listing.next ? el('span', { class: 'muted' }, '(first 500 entries)') : null),
      table(['Name', 'Kind', { name: 'Size', cls: 'num' }, 'Mode', 'Modified'], rows, { id: 'file-table' }));
  };

  const sb = await drawInfo();
  await Promise.all([
    drawStats().catch(reportError),
    drawTraj(),
    drawProcs(),
    sb.state === 'running' ? drawFiles(params.get('path') || '/')
      : Promise.resolve(files.replaceChildren(el('p', { class: 'muted' }, 'Not listed while the sandbox is ' + sb.state + '.'))),
  ]);
  every(POLL_MS, drawStats);
  every(POLL_MS, drawInfo);
  every(2 * POLL_MS, drawTraj);
  every(2 * POLL_MS, drawProcs);
}

// ---- images and function pools -------------------------------------------------------------

async function images(main) {
  const list = await api('/v1/images');
  const rows = list.images.map((im) => el('tr', { dataset: { ref: im.reference } },
    el('td', {}, el('strong', {}, im.reference)),
    el('td', {}, im.layers.map((l) => el('div', { class: 'mono' },
      l.digest.slice(0, 19) + '… ' + fmtBytes(l.size_bytes)))),
    el('td', { class: 'num' }, fmtBytes(im.size_bytes)),
    el('td', {}, im.source),
    el('td', {}, im.owner || ''),
    el('td', {}, fmtTime(im.created_ms))));
  main.replaceChildren(el('h1', {}, 'Images'),
    table(['Image', 'Layers', { name: 'Size', cls: 'num' }, 'Source', 'Owner', 'Created'],
      rows.length ? rows : [el('tr', {}, el('td', { colspan: 6, class: 'muted' }, 'No images'))],
      { id: 'images' }));
}

async function pools(main) {
  const box = el('div', { id: 'pools-box' });
  const summary = el('p', { id: 'pools-summary' });
  main.replaceChildren(el('h1', {}, 'Function pools'), summary, box);
  const draw = async () => {
    const info = await api('/v1/functions/pools');
    summary.textContent = info.pools.length + ' pools; warm memory '
      + fmtBytes((info.warm_memory_mb || 0) * 1048576) + ' of ' + fmtBytes((info.max_warm_memory_mb || 0) * 1048576);
    const n = (v) => el('td', { class: 'num' }, v === undefined ? '—' : v);
    box.replaceChildren(table(['Image', 'Tenant', 'Limits', { name: 'Idle', cls: 'num' },
      { name: 'Busy', cls: 'num' }, { name: 'Starting', cls: 'num' }, { name: 'Queued', cls: 'num' },
      { name: 'Calls', cls: 'num' }, { name: 'Rejected', cls: 'num' }, { name: 'Replaced', cls: 'num' }],
    info.pools.length === 0
      ? [el('tr', {}, el('td', { colspan: 10, class: 'muted' }, 'No warm pools (a function call makes one)'))]
      : info.pools.map((p) => el('tr', { dataset: { image: (p.image || []).join('+') } },
        el('td', {}, (p.image || []).join(' + ')), el('td', {}, p.tenant || ''),
        el('td', {}, p.cpus + ' CPUs, ' + p.memory_mb + ' MiB'),
        n(p.idle), n(p.busy), n(p.starting), n(p.queued), n(p.calls), n(p.rejected), n(p.replaced))),
    { id: 'pools' }));
  };
  await draw();
  every(POLL_MS * 2, draw);
}

// ---- start ---------------------------------------------------------------------------------

function start() {
  takeTokenFromHash();
  const form = document.getElementById('token-form');
  const input = document.getElementById('token');
  input.value = '';
  input.placeholder = token() ? 'token set (this tab)' : 'API token';
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
    caller = null;
    input.value = '';
    input.placeholder = 'token set (this tab)';
    document.getElementById('errors').replaceChildren();
    route();
  });
  document.getElementById('token-clear').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    caller = null;
    input.placeholder = 'API token';
    route();
  });
  window.addEventListener('hashchange', route);
  route();
}

start();
