// Marconi operator dashboard. Plain JavaScript, no build step, nothing loaded
// from outside the hub. Reads /v1/ops/* with the admin token (kept in
// sessionStorage only) and /metrics (no credential).
'use strict';

(() => {
  const TOKEN_KEY = 'marconi.adminToken';
  const REFRESH_MS = 2000;        // views refresh by themselves this often
  const METRICS_MS = 5000;        // /metrics sampling period (pending signals, mismatches)
  const WINDOW_MS = 10 * 60 * 1000; // the chart shows this much history
  const BUCKET_MS = 30 * 1000;    // one chart bar per this many ms
  const LIST_LIMIT = 500;         // sessions table: rows asked of the hub
  const COUNT_LIMIT = 1000;       // overview: sessions counted by state
  const GONE_AFTER_MS = 5 * 60 * 1000; // an unhealthy instance silent this long is hidden as gone
  const DETAIL_PENDING = 20;      // pending signals listed in a session's detail
  const OUTCOMES = ['attempted', 'rate_limited', 'stale_recency', 'unsupported_surface',
    'succeeded', 'no_listener', 'failed'];
  const RESERVED_OUTCOMES = ['succeeded', 'no_listener', 'failed'];
  const STATE_ORDER = { route_without_queue: 0, stale: 1, attached: 2, not_registered: 3 };
  const STATE_LABEL = {
    attached: 'attached',
    route_without_queue: 'route without queue',
    stale: 'stale',
    not_registered: 'not registered',
  };

  const $ = (id) => document.getElementById(id);

  const st = {
    token: null,
    paused: false,
    inflight: false,
    again: false,
    lastOk: null,        // Date of the last successful refresh
    errorText: '',       // the refresh error shown in the live region, '' when none
    skewMs: 0,           // hub clock minus ours, from the Date header
    metricsError: '',
    lastMetrics: null,   // {mismatches, pending} from /metrics
    route: { view: 'overview', detail: null, filters: { tenant: '', project: '', state: '', session: '' } },
    history: null,       // GET /v1/ops/selfheal/history, kept by the hub
    historyError: '',
    showGone: false,     // list instances that are gone too
    confirming: '',      // the detail action waiting for its confirmation: '', 'disconnect' or 'deregister'
    actionNote: null,    // {kind, text} the last detail action's result
    detailOpenedByUser: false,
    summary: null,
    summaryError: '',    // why the last fabric summary could not be read, '' when it was (or is missing)
  };

  // ---------- DOM helpers (text only: hub data never goes through innerHTML) ----------

  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    setAttrs(n, attrs);
    append(n, children);
    return n;
  }

  function svg(tag, attrs, ...children) {
    const n = document.createElementNS('http://www.w3.org/2000/svg', tag);
    setAttrs(n, attrs);
    append(n, children);
    return n;
  }

  function setAttrs(n, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') n.textContent = String(v);
      else if (k === 'class') n.setAttribute('class', v);
      else if (k.startsWith('on')) n.addEventListener(k.slice(2), v);
      else n.setAttribute(k, v === true ? '' : String(v));
    }
  }

  function append(n, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function replace(container, ...children) {
    container.replaceChildren();
    append(container, children);
  }

  function code(text) { return el('code', null, text); }

  function empty(text, testid) { return el('p', { class: 'empty', 'data-testid': testid || 'empty' }, text); }

  function badge(text, kind, testid) {
    return el('span', { class: 'badge badge-' + kind, 'data-testid': testid || null }, text);
  }

  // ---------- time ----------

  function hubNow() { return Date.now() + st.skewMs; }

  function parseTime(iso) {
    if (!iso) return null;
    const t = Date.parse(iso);
    if (Number.isNaN(t) || t < Date.UTC(1971, 0, 1)) return null; // zero time means "never"
    return t;
  }

  function agoText(sec) {
    if (sec === null || sec === undefined || Number.isNaN(sec)) return 'never';
    const s = Math.max(0, Math.round(sec));
    if (s < 120) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min ago';
    return Math.floor(s / 86400) + ' d ago';
  }

  function inText(sec) {
    const s = Math.round(sec);
    if (s <= 0) return 'now';
    if (s < 120) return 'in ' + s + ' s';
    if (s < 3600) return 'in ' + Math.floor(s / 60) + ' min';
    return 'in ' + Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  }

  function clock(t) {
    const d = new Date(t);
    const pad = (x) => String(x).padStart(2, '0');
    const hms = pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
    const today = new Date();
    if (d.toDateString() === today.toDateString()) return hms;
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' + hms;
  }

  // A <time> element: local clock time, UTC in the tooltip.
  function timeEl(iso) {
    const t = parseTime(iso);
    if (t === null) return el('span', { class: 'muted' }, 'never');
    return el('time', { datetime: new Date(t).toISOString(), title: new Date(t).toISOString() }, clock(t));
  }

  // timeAgo shows a time and its age; now is the hub's clock (ms) when known.
  function timeAgo(iso, now) {
    const t = parseTime(iso);
    if (t === null) return el('span', { class: 'muted' }, 'never');
    return el('span', null, timeEl(iso), ' ', el('span', { class: 'muted' }, '(' + agoText(((now || hubNow()) - t) / 1000) + ')'));
  }

  // rsNow is the hub's clock when it answered a route_state: its freshest
  // proof of life plus that proof's age. It does not depend on this
  // browser's clock, nor on the hub's wall clock if its store uses another.
  function rsNow(rs) {
    const t = parseTime(rs.freshest_proof_of_life);
    if (t === null || typeof rs.proof_of_life_age_seconds !== 'number') return hubNow();
    return t + rs.proof_of_life_age_seconds * 1000;
  }

  function num(n) {
    if (n === null || n === undefined) return '—';
    if (typeof n === 'number' && !Number.isInteger(n)) return n.toFixed(1);
    return String(n);
  }

  function plural(n, one, many) { return n + ' ' + (n === 1 ? one : (many || one + 's')); }

  // ---------- talking to the hub ----------

  class HubError extends Error {
    constructor(kind, status, code, message) {
      super(message || kind);
      this.kind = kind;     // unreachable | unauthorized | store | draining | http | bad_response
      this.hubMessage = message || ''; // the hub's own error message, if any
      this.status = status;
      this.code = code;
    }
  }

  function describe(err) {
    if (!(err instanceof HubError)) return 'Unexpected error in the dashboard: ' + String(err && err.message || err);
    switch (err.kind) {
      case 'unreachable':
        return 'The hub is unreachable. Check that it is running and that this address still reaches it.';
      case 'unauthorized':
        return 'That admin token was refused.';
      case 'store':
        // The hub's message names the class of failure (connection refused,
        // Postgres is read-only during a failover, ...).
        return 'The hub cannot reach its store (503 registry_unavailable' + (err.hubMessage ? ': ' + err.hubMessage : '') +
          '). It fails closed and recovers by itself when the store is back.';
      case 'draining':
        return 'The hub is draining (shutting down or restarting): 503 draining.';
      case 'bad_response':
        return 'The hub sent a response this dashboard cannot read (HTTP ' + err.status + ').';
      default:
        return 'The hub answered HTTP ' + err.status + (err.code ? ' ' + err.code : '') +
          (err.message ? ': ' + err.message : '') + '.';
    }
  }

  // shortReason names an error in a few words, for a card.
  function shortReason(err) {
    if (!(err instanceof HubError)) return 'an error in the dashboard';
    switch (err.kind) {
      case 'unreachable': return 'the hub is unreachable';
      case 'store': return 'the hub cannot reach its store (503 registry_unavailable)';
      case 'draining': return 'the hub is draining (503)';
      case 'bad_response': return 'an unreadable response (HTTP ' + err.status + ')';
      default: return 'HTTP ' + err.status + (err.code ? ' ' + err.code : '');
    }
  }

  function noteSkew(res) {
    const d = Date.parse(res.headers.get('Date') || '');
    if (!Number.isNaN(d)) st.skewMs = d - Date.now();
  }

  async function api(path, token, method) {
    let res, text;
    try {
      res = await fetch(path, {
        method: method || 'GET',
        headers: { Authorization: 'Bearer ' + token, Accept: 'application/json' },
        cache: 'no-store',
        credentials: 'omit',
      });
      text = await res.text();
    } catch (e) {
      throw new HubError('unreachable', 0, '', String(e && e.message || e));
    }
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
    if (!res.ok) {
      const code = (body && body.error && body.error.code) || '';
      const msg = (body && body.error && body.error.message) || '';
      if (res.status === 401) throw new HubError('unauthorized', 401, code, msg);
      if (res.status === 503 && code === 'registry_unavailable') throw new HubError('store', 503, code, msg);
      if (res.status === 503 && code === 'draining') throw new HubError('draining', 503, code, msg);
      if (res.status === 502 || res.status === 504) throw new HubError('unreachable', res.status, code, msg);
      throw new HubError('http', res.status, code, msg);
    }
    if (res.status === 204) return {};
    if (body === null || typeof body !== 'object') throw new HubError('bad_response', res.status, '', '');
    noteSkew(res);
    return body;
  }

  // parseMetrics reads Prometheus text and returns {name: [{labels, value}]}
  // for the metric names asked for.
  function parseMetrics(text, names) {
    const out = {};
    for (const n of names) out[n] = [];
    const lineRe = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
    const labelRe = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const line of text.split('\n')) {
      if (!line || line[0] === '#') continue;
      const m = lineRe.exec(line);
      if (!m || !(m[1] in out)) continue;
      const labels = {};
      if (m[2]) {
        let lm;
        labelRe.lastIndex = 0;
        while ((lm = labelRe.exec(m[2])) !== null) labels[lm[1]] = lm[2].replace(/\\(.)/g, '$1');
      }
      const value = Number(m[3]);
      if (!Number.isNaN(value)) out[m[1]].push({ labels, value });
    }
    return out;
  }

  // sampleMetrics reads this instance's /metrics for the gauges the
  // overview shows beside the ops API: pending signals and mismatches.
  async function sampleMetrics() {
    if (!st.token) return;
    let text;
    try {
      const res = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      text = await res.text();
    } catch (e) {
      st.metricsError = 'Could not read /metrics: ' + (e && e.message || e) + '.';
      return;
    }
    const m = parseMetrics(text, ['marconi_adaptive_placement_mismatches_total', 'marconi_pending_signals']);
    const mm = m.marconi_adaptive_placement_mismatches_total.reduce((a, s) => a + s.value, 0);
    st.metricsError = '';
    st.lastMetrics = {
      mismatches: m.marconi_adaptive_placement_mismatches_total.length ? mm : null,
      pending: m.marconi_pending_signals.length ? m.marconi_pending_signals[0].value : null,
    };
    if (st.route.view === 'overview') { renderGate(); renderPending(); }
  }

  // ---------- status (aria-live) ----------

  function setStatus(text) {
    const s = $('status');
    if (text === st.errorText) return; // announce changes only
    st.errorText = text;
    s.textContent = text;
    s.hidden = !text;
    document.body.classList.toggle('has-error', !!text);
  }

  function updateRefreshInfo() {
    const parts = [];
    if (st.paused) parts.push('Refresh paused');
    else parts.push('Refreshes every ' + (REFRESH_MS / 1000) + ' s');
    if (st.lastOk) parts.push('updated ' + clock(st.lastOk));
    $('refresh-info').textContent = parts.join(' · ');
  }

  // ---------- routing ----------

  function parseHash() {
    const h = decodeURIComponentSafe(location.hash.replace(/^#/, ''));
    const route = { view: 'overview', detail: null, filters: st.route.filters };
    if (h.startsWith('session/')) {
      const parts = location.hash.replace(/^#session\//, '').split('/').map(decodeURIComponentSafe);
      if (parts.length === 3 && parts.every((p) => p)) {
        route.view = 'sessions';
        route.detail = { tenant: parts[0], project: parts[1], session: parts[2] };
      } else {
        route.view = 'sessions';
      }
    } else if (h.startsWith('sessions')) {
      route.view = 'sessions';
      const q = location.hash.indexOf('?');
      if (q >= 0) {
        const p = new URLSearchParams(location.hash.slice(q + 1));
        route.filters = { tenant: p.get('tenant') || '', project: p.get('project') || '', state: p.get('state') || '', session: p.get('session') || '' };
      }
    } else if (h === 'fabric') {
      route.view = 'fabric';
    }
    return route;
  }

  function decodeURIComponentSafe(s) {
    try { return decodeURIComponent(s); } catch (_) { return s; }
  }

  function sessionHref(t, p, s) {
    return '#session/' + [t, p, s].map(encodeURIComponent).join('/');
  }

  function sessionsHref(filters) {
    const p = new URLSearchParams();
    for (const k of ['tenant', 'project', 'state', 'session']) if (filters[k]) p.set(k, filters[k]);
    const q = p.toString();
    return '#sessions' + (q ? '?' + q : '');
  }

  function onRoute(userAction) {
    if (!st.token) { showSignIn(); return; }
    const prev = st.route;
    st.route = parseHash();
    for (const v of ['overview', 'sessions', 'fabric']) {
      $('view-' + v).hidden = st.route.view !== v;
      const a = $('nav-' + v);
      if (st.route.view === v) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    $('view-signin').hidden = true;
    $('f-tenant').value = st.route.filters.tenant;
    $('f-project').value = st.route.filters.project;
    $('f-state').value = st.route.filters.state;
    $('f-session').value = st.route.filters.session || '';

    $('detail-close').setAttribute('href', sessionsHref(st.route.filters));
    const d = st.route.detail;
    const prevD = prev.detail;
    const sameDetail = d && prevD && d.tenant === prevD.tenant && d.project === prevD.project && d.session === prevD.session;
    if (!d) {
      $('detail').hidden = true;
      $('sessions-wrap').classList.remove('with-detail');
      replace($('detail-body'));
      if (prevD && userAction) focusSessionLink(prevD);
    } else if (!sameDetail) {
      $('detail').hidden = false;
      $('sessions-wrap').classList.add('with-detail');
      $('detail-h').textContent = 'Session ' + d.session;
      replace($('detail-body'), empty('Loading…'));
      st.detailOpenedByUser = !!userAction;
      st.confirming = '';
      st.actionNote = null;
    }
    document.title = 'Marconi · ' + (d ? 'Session ' + d.session : st.route.view[0].toUpperCase() + st.route.view.slice(1));
    if (userAction && !d && prev.view !== st.route.view) {
      const h = $(st.route.view + '-h');
      h.setAttribute('tabindex', '-1');
      h.focus();
    }
    markSelectedRow();
    refresh();
  }

  function focusSessionLink(key) {
    const a = document.querySelector('[data-testid="session-link"][data-key="' + CSS.escape(keyOf(key)) + '"]');
    if (a) a.focus();
  }

  function keyOf(k) { return k.tenant + '\u0000' + k.project + '\u0000' + k.session; }

  // ---------- sign-in / sign-out ----------

  function showSignIn(message) {
    $('nav').hidden = true;
    $('who').hidden = true;
    for (const v of ['overview', 'sessions', 'fabric']) $('view-' + v).hidden = true;
    $('view-signin').hidden = false;
    setStatus('');
    const e = $('signin-error');
    e.textContent = message || '';
    e.hidden = !message;
    $('token').setAttribute('aria-invalid', message ? 'true' : 'false');
    document.title = 'Marconi · Sign in';
    $('token').focus();
  }

  function clearViews() {
    for (const id of ['ov-states', 'ov-gate', 'ov-instances', 'ov-selfheal', 'sessions-body', 'fabric-body']) {
      replace($(id), empty('Loading…'));
    }
    replace($('detail-body'));
    $('sessions-caption').textContent = '';
    replace($('ov-pending'));
    st.summary = null;
    st.summaryError = '';
    st.lastOk = null;
  }

  function signIn(token) {
    st.token = token;
    try { sessionStorage.setItem(TOKEN_KEY, token); } catch (_) { /* private mode: keep it in memory */ }
    $('token').value = '';
    $('signin-error').hidden = true;
    $('nav').hidden = false;
    $('who').hidden = false;
    updateRefreshInfo();
    if (!location.hash || location.hash === '#') history.replaceState(null, '', '#overview');
    onRoute(false);
    $(st.route.view + '-h').setAttribute('tabindex', '-1');
    $(st.route.view + '-h').focus();
    sampleMetrics();
  }

  function signOut(message) {
    st.token = null;
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* nothing stored */ }
    clearViews();
    showSignIn(message);
  }

  async function onSignInSubmit(ev) {
    ev.preventDefault();
    const token = $('token').value.trim();
    const errEl = $('signin-error');
    if (!token) {
      errEl.textContent = 'Enter the admin token.';
      errEl.hidden = false;
      $('token').setAttribute('aria-invalid', 'true');
      return;
    }
    const btn = $('signin-submit');
    btn.disabled = true;
    btn.textContent = 'Signing in…';
    try {
      // The cheapest call that needs the admin token.
      await api('/v1/ops/route_state?limit=1', token);
      signIn(token);
    } catch (e) {
      if (e instanceof HubError && (e.kind === 'store' || e.kind === 'draining')) {
        // The token was accepted; the hub just cannot serve data right now.
        signIn(token);
        setStatus(describe(e));
      } else {
        errEl.textContent = describe(e);
        errEl.hidden = false;
        $('token').setAttribute('aria-invalid', 'true');
        $('token').focus();
      }
    } finally {
      btn.disabled = false;
      btn.textContent = 'Sign in';
    }
  }

  // ---------- refresh loop ----------

  async function refresh() {
    if (!st.token) return;
    if (st.inflight) { st.again = true; return; }
    st.inflight = true;
    const token = st.token;
    const route = st.route;
    let partial = ''; // a part of the view failed; the rest refreshed
    try {
      if (route.view === 'overview') {
        // The route-state counts do not depend on the fabric summary: a
        // summary that cannot be read is shown in its own cards.
        const [summary, list] = await Promise.all([
          loadSummary(token).catch((e) => {
            if (e instanceof HubError && e.kind === 'unauthorized') throw e;
            return e;
          }),
          api('/v1/ops/route_state?limit=' + COUNT_LIMIT, token),
          loadHistory(token),
        ]);
        if (token !== st.token) return;
        st.summaryError = summary instanceof Error ? shortReason(summary) : '';
        if (summary instanceof Error) st.summary = null;
        renderOverview(summary instanceof Error ? null : summary, list);
        partial = summary instanceof Error ? 'The fabric summary could not be read: ' + describe(summary) + ' Route-state counts are current.' : '';
      } else if (route.view === 'sessions') {
        const f = route.filters;
        const q = new URLSearchParams({ limit: String(LIST_LIMIT) });
        if (f.tenant) q.set('tenant_id', f.tenant);
        if (f.project) q.set('project_id', f.project);
        if (f.state) q.set('state', f.state);
        const d = route.detail;
        const path = d ? [d.tenant, d.project, d.session].map(encodeURIComponent).join('/') : '';
        const [list, detail, pending] = await Promise.all([
          api('/v1/ops/route_state?' + q.toString(), token),
          d ? api('/v1/ops/route_state/' + path, token) : null,
          d ? api('/v1/ops/sessions/' + path + '/signals?limit=' + DETAIL_PENDING, token).catch((e) => {
            if (e instanceof HubError && e.kind === 'unauthorized') throw e;
            return e; // not registered (404) or an older hub: the detail says so
          }) : null,
        ]);
        if (token !== st.token) return;
        renderSessions(list, f);
        if (d && st.route.detail === d) renderDetail(detail, pending);
      } else if (route.view === 'fabric') {
        const summary = await loadSummary(token);
        if (token !== st.token) return;
        if (summary) renderFabric(summary);
        else replace($('fabric-body'), summaryMissing());
      }
      st.lastOk = new Date();
      setStatus(partial);
      document.body.classList.remove('stale-data');
    } catch (e) {
      if (token !== st.token) return;
      if (e instanceof HubError && e.kind === 'unauthorized') {
        signOut('That admin token was refused. Sign in again.');
        return;
      }
      const msg = describe(e);
      setStatus('Refresh failed: ' + msg + (st.lastOk ? ' Showing data from ' + clock(st.lastOk) + '.' : '') +
        ' Retrying every ' + (REFRESH_MS / 1000) + ' s.');
      document.body.classList.add('stale-data');
      showErrorInView(route, msg);
    } finally {
      st.inflight = false;
      updateRefreshInfo();
      if (st.again) { st.again = false; refresh(); }
    }
  }

  // loadHistory reads the self-heal history the hub keeps; a failure is
  // shown in the self-heal card only.
  async function loadHistory(token) {
    try {
      st.history = await api('/v1/ops/selfheal/history', token);
      st.historyError = '';
    } catch (e) {
      if (e instanceof HubError && e.kind === 'unauthorized') throw e;
      st.historyError = 'The self-heal history could not be read: ' + shortReason(e) + '.';
    }
  }

  // loadSummary reads the fabric summary; null when this hub does not serve
  // it (404/405: an older hub), which the views show as "not available".
  async function loadSummary(token) {
    try {
      st.summary = await api('/v1/ops/fabric/summary', token);
    } catch (e) {
      if (e instanceof HubError && e.kind === 'http' && (e.status === 404 || e.status === 405)) {
        st.summary = null;
        return null;
      }
      throw e;
    }
    return st.summary;
  }

  function summaryMissing() {
    return el('p', { class: 'empty', 'data-testid': 'summary-missing' },
      'Not available: this hub does not serve the fabric summary (GET /v1/ops/fabric/summary answered 404).');
  }

  // The hub serves the summary but could not answer it just now (store
  // down, draining, an error): not the same as an empty fabric.
  function summaryUnavailable() {
    return el('p', { class: 'error', 'data-testid': 'summary-unavailable' },
      'Unavailable: the fabric summary could not be read: ' + st.summaryError + '. Retrying every ' + (REFRESH_MS / 1000) + ' s.');
  }

  // When a view has nothing to show yet, its body shows the error itself.
  function showErrorInView(route, msg) {
    const ids = route.view === 'overview' ? ['ov-states', 'ov-gate', 'ov-instances']
      : route.view === 'sessions' ? ['sessions-body'] : ['fabric-body'];
    for (const id of ids) {
      const c = $(id);
      if (c.querySelector('[data-testid="empty"]') || c.querySelector('[data-testid="view-error"]') || !c.firstChild) {
        replace(c, el('p', { class: 'error', 'data-testid': 'view-error' }, msg));
      }
    }
    if (route.detail && $('detail-body').querySelector('[data-testid="empty"]')) {
      replace($('detail-body'), el('p', { class: 'error', 'data-testid': 'view-error' }, msg));
    }
  }

  function tick() {
    if (st.paused || document.hidden) return;
    refresh();
  }

  // ---------- overview ----------

  function renderOverview(summary, list) {
    const sessions = list.sessions || [];
    // Piggyback-only sessions (codex) never hold a WebSocket: for them
    // route_without_queue is the normal state, counted apart and neutral.
    const counts = { attached: 0, route_without_queue: 0, stale: 0, piggyback: 0 };
    for (const s of sessions) {
      const k = s.route_state === 'route_without_queue' && piggybackOnly(s) ? 'piggyback' : s.route_state;
      counts[k] = (counts[k] || 0) + 1;
    }
    const capped = sessions.length >= COUNT_LIMIT;

    const rows = ['route_without_queue', 'piggyback', 'stale', 'attached'].map((state) => {
      const n = counts[state] || 0;
      const attention = state === 'route_without_queue' && n > 0;
      const label = state === 'piggyback' ? badge('piggyback-only, no WebSocket', 'piggyback') : badge(STATE_LABEL[state], state);
      const href = sessionsHref({ state: state === 'piggyback' ? 'route_without_queue' : state });
      return el('tr', { class: attention ? 'attention' : null },
        el('th', { scope: 'row' }, label),
        el('td', { class: 'n', 'data-testid': 'count-' + state }, String(n) + (capped ? '+' : '')),
        el('td', null, n > 0 ? el('a', { href }, 'Show') : el('span', { class: 'muted' }, '—'),
          attention ? el('span', { class: 'note' }, ' needs attention: alive but unreachable') : null,
          state === 'piggyback' && n > 0 ? el('span', { class: 'muted' }, ' normal: they collect signals by heartbeat, drain or piggyback') : null));
    });
    replace($('ov-states'),
      el('table', { class: 'compact', 'data-testid': 'state-counts' },
        el('caption', { class: 'sr-only' }, 'Sessions counted by route state'),
        el('thead', null, el('tr', null, el('th', { scope: 'col' }, 'Route state'), el('th', { scope: 'col', class: 'n' }, 'Sessions'), el('th', { scope: 'col' }, el('span', { class: 'sr-only' }, 'Actions')))),
        el('tbody', null, rows)),
      el('p', { class: 'hint' }, sessions.length === 0
        ? 'No sessions registered yet. Agents appear here once they register.'
        : plural(sessions.length, 'live session') + (capped ? ' counted (the first ' + COUNT_LIMIT + ')' : '') + '.'));

    if (summary) {
      renderGate();
      replace($('ov-instances'), instancesTable(summary.instances || []));
    } else {
      const why = st.summaryError ? summaryUnavailable : summaryMissing;
      replace($('ov-gate'), why(), gateMetricOnly());
      replace($('ov-instances'), why());
    }
    renderPending();
    renderSelfHeal();
  }

  // Without the summary the mismatch metric is all there is to show.
  function gateMetricOnly() {
    const metric = st.lastMetrics && st.lastMetrics.mismatches;
    if (metric === null || metric === undefined) return null;
    return el('dl', { class: 'kv' }, el('dt', null, 'Placement mismatches (metric, this instance)'),
      el('dd', { 'data-testid': 'mismatches' }, num(metric)));
  }

  function renderGate() {
    const s = st.summary;
    if (!s) {
      if (st.lastOk) replace($('ov-gate'), st.summaryError ? summaryUnavailable() : summaryMissing(), gateMetricOnly());
      return;
    }
    const ap = s.adaptive_placement || {};
    const sum = s.summary || {};
    const bySource = (s.sessions && s.sessions.by_source) || {};
    const gate = ap.gate || 'unknown';
    const allow = ap.allowlist || [];
    const metric = st.lastMetrics && st.lastMetrics.mismatches;
    const mismatches = sum.total_adaptive_placement_mismatches || 0;
    // A gate that is off with nothing ever placed folds the card away to one
    // line, so it does not take half the overview.
    const folded = gate === 'off' && !(sum.total_adaptive_placements || 0) && !mismatches;
    $('ov-gate-card').hidden = folded;
    $('ov-states-card').classList.toggle('wide', folded);
    replace($('ov-gate-folded'), folded ? el('p', { class: 'hint', 'data-testid': 'gate-folded' },
      'Adaptive placement: ', badge('off', 'gate-off'), ' (MARCONI_ADAPTIVE_PLACEMENT); its panel shows when it is on.') : null);
    if (folded) return;
    replace($('ov-gate'),
      el('dl', { class: 'kv' },
        el('dt', null, 'Gate'), el('dd', { 'data-testid': 'gate' }, badge(gate, 'gate-' + gate)),
        el('dt', null, 'Client allowlist'), el('dd', { 'data-testid': 'allowlist' }, allow.length ? allow.map((a, i) => [i ? ', ' : '', code(a)]) : el('span', { class: 'muted' }, 'empty')),
        el('dt', null, 'Adaptive placements'), el('dd', null, num(sum.total_adaptive_placements || 0),
          el('span', { class: 'muted' }, ' (' + num(bySource['adaptive-classifier'] || 0) + ' live sessions)')),
        el('dt', null, 'Placement mismatches'), el('dd', { 'data-testid': 'mismatches', class: mismatches > 0 ? 'warn' : null },
          num(mismatches), mismatches > 0 ? el('span', { class: 'note' }, ' rollback signal: a classifier-placed session needed runtime-local state') : null),
        metric !== null && metric !== undefined
          ? [el('dt', null, 'Mismatches (metric, this instance)'), el('dd', null, num(metric))] : null));
  }

  // renderPending shows marconi_pending_signals: the backlog of signals no
  // client has acknowledged yet, across the cluster.
  function renderPending() {
    const c = $('ov-pending');
    const v = st.lastMetrics ? st.lastMetrics.pending : undefined;
    if (st.metricsError) { replace(c, el('p', { class: 'error' }, st.metricsError)); return; }
    if (v === undefined) { replace(c); return; }
    if (v === null) {
      replace(c, el('p', { class: 'hint' }, 'Pending signals: not exported by this instance (', code('marconi_pending_signals'),
        ' is cluster-wide and exported only by the reporting instance, the healthy one with the lowest id; see ', code('marconi_cluster_reporter'), ').'));
      return;
    }
    replace(c, el('p', { class: 'pending' },
      el('span', null, 'Signals waiting for an acknowledgement, cluster-wide: '),
      el('strong', { 'data-testid': 'pending-signals' }, num(v))),
    el('p', { class: 'hint' }, 'From ', code('marconi_pending_signals'),
      ', sampled by the hub\'s retention loop (every MARCONI_PRUNE_INTERVAL_SECONDS, 60 s by default), so it can lag by that much; 0 until the first run. ',
      'It grows while agents are unreachable or their clients do not ack.'));
  }

  // gone reports whether an instance has been unhealthy and silent for
  // longer than GONE_AFTER_MS: it is hidden unless asked for.
  function gone(i) {
    const t = parseTime(i.last_heartbeat_at);
    return !i.healthy && t !== null && hubNow() - t > GONE_AFTER_MS;
  }

  function instancesTable(all) {
    if (!all.length) return empty('The fabric summary lists no instance: none has heartbeated into the store yet.', 'no-instances');
    const nGone = all.filter(gone).length;
    const instances = st.showGone ? all : all.filter((i) => !gone(i));
    const toggle = nGone ? el('p', { class: 'hint', 'data-testid': 'gone-note' },
      plural(nGone, 'instance') + ' gone (unhealthy, no heartbeat for over ' + (GONE_AFTER_MS / 60000) + ' minutes) ' +
        (st.showGone ? 'listed. ' : 'hidden. '),
      el('button', { type: 'button', class: 'link', 'data-testid': 'gone-toggle',
        onclick: () => { st.showGone = !st.showGone; refresh(); } }, st.showGone ? 'Hide them' : 'Show them')) : null;
    // The newest bus key any instance seals with: one behind it has not
    // picked up a rotation yet (MARCONI_BUS_KEY_REFRESH_SECONDS).
    const newestKey = Math.max(0, ...instances.map((i) => i.bus_key_version || 0));
    const busKey = (v) => v === null || v === undefined ? el('span', { class: 'muted' }, 'unknown')
      : v < newestKey ? badge('v' + v + ', behind', 'warn') : 'v' + v;
    const rows = instances.map((i) => {
      const health = i.draining ? badge('draining', 'warn') : i.healthy ? badge('healthy', 'ok') : badge('unhealthy', 'bad');
      return el('tr', { 'data-testid': 'instance-row', 'data-instance-id': i.instance_id, class: i.healthy ? null : 'attention' },
        el('th', { scope: 'row' }, code(i.instance_id)),
        el('td', null, i.url ? code(i.url) : el('span', { class: 'muted' }, '—')),
        el('td', { 'data-testid': 'instance-health' }, health),
        el('td', { class: 'n', 'data-testid': 'instance-sessions' }, num(i.sessions)),
        el('td', { class: 'n', 'data-testid': 'instance-queues' }, num(i.attached_queues)),
        el('td', null, timeAgo(i.last_heartbeat_at)),
        el('td', { 'data-testid': 'instance-bus-key' }, busKey(i.bus_key_version)));
    });
    return [el('table', { 'data-testid': 'instances-table' },
      el('caption', { class: 'sr-only' }, 'Hub instances with health and load'),
      el('thead', null, el('tr', null,
        el('th', { scope: 'col' }, 'Instance'), el('th', { scope: 'col' }, 'URL'), el('th', { scope: 'col' }, 'Health'),
        el('th', { scope: 'col', class: 'n' }, 'Sessions'), el('th', { scope: 'col', class: 'n' }, 'Attached queues'),
        el('th', { scope: 'col' }, 'Last heartbeat'), el('th', { scope: 'col' }, 'Bus key'))),
      el('tbody', null, rows)), toggle];
  }

  // Increments per outcome per bucket over the window, from the history the
  // hub keeps (oldest first); a bucket the hub has not filled yet is null.
  function buckets() {
    const n = WINDOW_MS / BUCKET_MS;
    const out = {};
    for (const o of OUTCOMES) out[o] = new Array(n).fill(null);
    const hb = (st.history && st.history.buckets) || [];
    const from = Math.max(0, hb.length - n);
    for (let i = from; i < hb.length; i++) {
      const slot = n - (hb.length - i);
      for (const o of OUTCOMES) out[o][slot] = (hb[i].counts && hb[i].counts[o]) || 0;
    }
    return out;
  }

  function renderSelfHeal() {
    const c = $('ov-selfheal');
    if (st.historyError && !st.history) { replace(c, el('p', { class: 'error' }, st.historyError)); return; }
    if (!st.history) { replace(c, empty('Loading the self-heal history…')); return; }
    const totals = st.history.totals || {};
    // Self-heal off and nothing ever counted: the card folds to one line.
    const folded = st.history.enabled === false && !Object.values(totals).some((v) => v > 0);
    $('ov-heal-card').hidden = folded;
    replace($('ov-heal-folded'), folded ? el('p', { class: 'hint', 'data-testid': 'selfheal-folded' },
      'Self-heal hints: ', badge('off', 'gate-off'), ' on this instance (MARCONI_SELFHEAL); its panel shows when it is on.') : null);
    if (folded) return;
    const b = buckets();
    let max = 1;
    for (const o of OUTCOMES) for (const x of b[o]) if (x !== null && x > max) max = x;
    const shown = OUTCOMES.filter((o) => !RESERVED_OUTCOMES.includes(o) || (totals[o] || 0) > 0);
    const rows = shown.map((o) => {
      const series = b[o];
      const recent = series.reduce((a, x) => a + (x || 0), 0);
      return el('tr', { 'data-testid': 'selfheal-row', 'data-outcome': o },
        el('th', { scope: 'row' }, code(o)),
        el('td', { class: 'n', 'data-testid': 'selfheal-total-' + o }, num(totals[o] || 0)),
        el('td', { class: 'n', 'data-testid': 'selfheal-recent-' + o }, num(recent)),
        el('td', null, sparkline(o, series, max)));
    });
    replace(c,
      st.historyError ? el('p', { class: 'error' }, st.historyError) : null,
      el('table', { class: 'selfheal', 'data-testid': 'selfheal-table' },
        el('caption', { class: 'sr-only' }, 'Self-heal outcomes: totals and the last 10 minutes'),
        el('thead', null, el('tr', null,
          el('th', { scope: 'col' }, 'Outcome'),
          el('th', { scope: 'col', class: 'n' }, 'Since instance start'),
          el('th', { scope: 'col', class: 'n' }, 'Last 10 min'),
          el('th', { scope: 'col' }, 'Per 30 s, 10 min ago → now (scale 0–' + max + ')'))),
        el('tbody', null, rows)),
      el('p', { class: 'hint' },
        code('attempted'), ': a hint was sent (a *_route_stale field). ',
        code('rate_limited'), ': the session\'s bucket was empty, no hint. ',
        code('stale_recency'), ': older than the freshness window, treated as offline. ',
        code('unsupported_surface'), ': piggyback-only surface (codex). ',
        'Reserved and not emitted today: ', RESERVED_OUTCOMES.map((o, i) => [i ? ', ' : '', code(o)]), '.'));
  }

  function sparkline(outcome, series, max) {
    const W = 320, H = 36, n = series.length, gap = 2;
    const bw = W / n - gap;
    const total = series.reduce((a, x) => a + (x || 0), 0);
    const last = series[n - 1];
    const label = outcome + ': ' + total + ' in the last 10 minutes' +
      (last !== null ? ', ' + last + ' in the last 30 seconds' : '');
    const kids = [svg('title', null, label),
      svg('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis' })];
    series.forEach((x, i) => {
      if (x === null) return; // no sample in this bucket: nothing drawn
      const h = x === 0 ? 1 : Math.max(2, Math.round((x / max) * (H - 4)));
      kids.push(svg('rect', { x: (i * (bw + gap)).toFixed(1), y: H - h, width: bw.toFixed(1), height: h, class: x === 0 ? 'bar zero' : 'bar o-' + outcome }));
    });
    return svg('svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': label, class: 'spark' }, kids);
  }

  // ---------- sessions ----------

  function renderSessions(list, filters) {
    // The session search matches ids containing the text, among the sessions listed.
    const needle = (filters.session || '').toLowerCase();
    const sessions = (list.sessions || []).filter((s) => !needle || s.session_id.toLowerCase().includes(needle));
    // Piggyback-only sessions without a queue come after the live ones: theirs is the normal state.
    const order = (x) => (x.route_state === 'route_without_queue' && piggybackOnly(x) ? 0.5 : STATE_ORDER[x.route_state] ?? 9);
    sessions.sort((a, b) =>
      order(a) - order(b) ||
      cmp(a.tenant_id, b.tenant_id) || cmp(a.project_id, b.project_id) || cmp(a.session_id, b.session_id));
    const filtered = filters.tenant || filters.project || filters.state || filters.session;
    const capped = sessions.length >= LIST_LIMIT;
    const nWithout = sessions.filter((s) => s.route_state === 'route_without_queue' && !piggybackOnly(s)).length;
    $('sessions-caption').textContent = plural(sessions.length, 'session') + (filtered ? ' match the filters' : '') +
      (capped ? ' (the first ' + LIST_LIMIT + '; narrow the filters to see others)' : '') +
      (nWithout ? '; ' + nWithout + ' without a queue, listed first' : '') + '.';

    const body = $('sessions-body');
    const focused = document.activeElement && document.activeElement.dataset && document.activeElement.dataset.testid === 'session-link'
      ? document.activeElement.dataset.key : null;
    if (!sessions.length) {
      replace(body, empty(filtered ? 'No sessions match these filters.'
        : 'No sessions registered yet. Agents appear here once they register (POST /v1/sessions).', 'no-sessions'));
      return;
    }
    const rows = sessions.map(sessionRow);
    replace(body, el('table', { id: 'sessions-table', 'data-testid': 'sessions-table', class: 'sessions' },
      el('caption', { class: 'sr-only' }, 'Sessions. Sessions without a queue first. Select a session id for its detail.'),
      el('thead', null, el('tr', null,
        el('th', { scope: 'col' }, 'Session', el('span', { class: 'muted small' }, ' (tenant / project)')),
        el('th', { scope: 'col' }, 'Route state'),
        el('th', { scope: 'col' }, 'Proof of life'),
        el('th', { scope: 'col' }, 'Queue'),
        el('th', { scope: 'col' }, 'Surface'),
        el('th', { scope: 'col' }, 'Mode'),
        el('th', { scope: 'col', class: 'n' }, 'Pending'))),
      el('tbody', { onclick: onRowClick }, rows)));
    if (focused) {
      const a = body.querySelector('[data-testid="session-link"][data-key="' + CSS.escape(focused) + '"]');
      if (a) a.focus();
    }
    markSelectedRow();
  }

  function cmp(a, b) { return String(a).localeCompare(String(b)); }

  // piggybackOnly: a session whose surface never holds a WebSocket (codex).
  function piggybackOnly(s) { return !!(s.selfheal && s.selfheal.eligible_surface === false); }

  function stateBadge(state, s) {
    if (state === 'route_without_queue' && s && piggybackOnly(s)) {
      return el('span', { class: 'badge badge-piggyback', 'data-testid': 'route-badge', title: 'Normal for a piggyback-only surface' },
        'route_without_queue · piggyback-only');
    }
    if (state === 'route_without_queue') {
      return el('span', { class: 'badge badge-route_without_queue', 'data-testid': 'route-badge' },
        el('span', { 'aria-hidden': 'true' }, '⚠ '), 'route_without_queue');
    }
    return el('span', { class: 'badge badge-' + state, 'data-testid': 'route-badge' }, state);
  }

  function sessionRow(s) {
    const key = { tenant: s.tenant_id, project: s.project_id, session: s.session_id };
    const q = s.queue || {};
    const store = s.store || {};
    let queue;
    if (q.instance_id && q.instance_healthy) queue = code(q.instance_id);
    else if (q.instance_id) queue = el('span', null, code(q.instance_id), ' ', badge('unhealthy', 'bad'));
    else queue = el('span', { class: 'muted' }, 'none');
    return el('tr', {
      class: 'row state-' + (s.route_state === 'route_without_queue' && piggybackOnly(s) ? 'piggyback' : s.route_state),
      'data-testid': 'session-row',
      'data-session-id': s.session_id,
      'data-tenant-id': s.tenant_id,
      'data-project-id': s.project_id,
      'data-route-state': s.route_state,
    },
      el('th', { scope: 'row' }, el('a', { href: sessionHref(s.tenant_id, s.project_id, s.session_id), 'data-testid': 'session-link', 'data-key': keyOf(key) }, s.session_id),
        el('div', { class: 'muted small' }, s.tenant_id + ' / ' + s.project_id)),
      el('td', null, stateBadge(s.route_state, s)),
      el('td', { 'data-testid': 'pol-age', title: s.freshest_proof_of_life || '' }, agoText(s.proof_of_life_age_seconds)),
      el('td', null, queue),
      el('td', null, store.surface || '—'),
      el('td', null, store.runtime_mode || '—', store.runtime_mode_source ? el('span', { class: 'muted' }, ' (' + store.runtime_mode_source + ')') : null),
      el('td', { class: 'n' }, num(s.pending_signals)));
  }

  function onRowClick(ev) {
    if (ev.target.closest('a, button, input, select')) return;
    const tr = ev.target.closest('tr[data-testid="session-row"]');
    if (!tr) return;
    const a = tr.querySelector('[data-testid="session-link"]');
    if (a) location.hash = a.getAttribute('href');
  }

  function markSelectedRow() {
    const d = st.route.detail;
    const k = d ? keyOf(d) : null;
    for (const tr of document.querySelectorAll('[data-testid="session-row"]')) {
      const a = tr.querySelector('[data-testid="session-link"]');
      const sel = k !== null && a && a.dataset.key === k;
      tr.classList.toggle('selected', sel);
      if (a) { if (sel) a.setAttribute('aria-current', 'true'); else a.removeAttribute('aria-current'); }
    }
  }

  // ---------- session detail ----------

  function explain(rs) {
    const age = Math.round(rs.proof_of_life_age_seconds || 0);
    const win = rs.freshness_seconds;
    const q = rs.queue || {};
    const store = rs.store || {};
    const sh = rs.selfheal || {};
    const pending = rs.pending_signals || 0;
    const out = [];
    const pendingText = pending > 0
      ? plural(pending, 'signal') + ' wait' + (pending === 1 ? 's' : '') + ' for it, delivered on attach, by drain, or piggybacked on its own sends.'
      : 'No signals wait for it.';
    switch (rs.route_state) {
      case 'route_without_queue': {
        if (sh.eligible_surface === false) {
          out.push('The agent proved it was alive ' + age + ' s ago but holds no WebSocket: its surface (' + (store.surface || '?') +
            ') is piggyback-only and never holds one, so this is its normal state. It receives signals by drain or piggybacked on its own sends; self-heal skips it (unsupported_surface).');
        } else if (sh.enabled === false) {
          out.push('The agent proved it was alive ' + age + ' s ago but holds no WebSocket on a healthy instance. Self-heal is off on this hub (MARCONI_SELFHEAL), so its sends carry no sender_route_stale hint: the route heals only when its client reconnects by itself (a dropped WebSocket is redialed) or the agent restarts.');
        } else {
          out.push('The agent proved it was alive ' + age + ' s ago but holds no WebSocket on a healthy instance. Its own next send will carry sender_route_stale and its client will reconnect.');
          // The hub cannot tell a dropped WebSocket from a killed process: say what heals that one too.
          out.push('If its process stopped (a crash, kill -9), nothing comes until the agent starts again: a client that kept its token resumes the session and receives what waits.');
          if (sh.sender_tokens !== undefined && sh.sender_tokens !== null && sh.sender_tokens < 1) {
            out.push('Its sender bucket is empty just now: a send before a token refills is answered rate_limited with no hint.');
          }
        }
        if (q.instance_id && !q.instance_healthy) {
          out.push('Its queue is still recorded on instance ' + q.instance_id + ', which is unhealthy (heartbeat older than the dead-after window, or draining), so that queue counts as absent: the "hub restart mid-session" case.');
        } else if (!q.instance_id) {
          out.push('No instance holds a queue for it: its WebSocket closed, or it never opened one.');
        }
        out.push('Signals sent to it are stored and answered queued_offline' +
          (sh.enabled && sh.eligible_surface !== false ? '; senders see recipient_route_stale while its recipient bucket has tokens' : '') + '. ' + pendingText);
        if (win) out.push('Without another proof of life it turns stale ' + inText(win - age) + ' (freshness window ' + win + ' s).');
        break;
      }
      case 'stale':
        out.push('The agent last proved it was alive ' + agoText(age) + ', longer ago than the ' + win + ' s freshness window, and it holds no WebSocket. The hub treats it as offline: signals to it are stored (not_available_offline) with no self-heal hint (stale_recency). Nothing on the hub heals it: it recovers when the agent comes back with a heartbeat, a send or a new WebSocket.');
        out.push(pendingText);
        {
          const exp = parseTime(store.expires_at);
          if (exp !== null) out.push('Unless it proves alive first, it expires ' + inText((exp - rsNow(rs)) / 1000) + ' and then reads not_registered.');
        }
        break;
      case 'attached':
        out.push('A WebSocket queue is attached on healthy instance ' + (q.instance_id || '?') + '. Signals to it are pushed to its WebSocket (pushed_to_ws). Nothing needs healing.');
        if (pending > 0) out.push(plural(pending, 'signal') + ' not yet acknowledged by its client; they are delivered again on its next attach if never acked.');
        break;
      case 'not_registered':
        out.push('The hub holds no live row for this session: it never registered here, its TTL ran out, or it was deleted. Sends to it are refused with recipient_not_registered and its own calls get 410 session_expired; its client registers again (with the same session_id) to come back.');
        break;
      default:
        out.push('Unknown route state ' + rs.route_state + '.');
    }
    return out;
  }

  function renderDetail(rs, pending) {
    if (!rs) return;
    const body = $('detail-body');
    const store = rs.store || {};
    const q = rs.queue || {};
    const sh = rs.selfheal || {};
    const pol = [
      ['last_seen_at', 'Last seen (heartbeat, WebSocket)'],
      ['last_verb_at', 'Last verb (any session call)'],
      ['registered_at', 'Registered'],
    ];
    const now = rsNow(rs);
    const times = pol.map(([k]) => parseTime(store[k]));
    let freshest = pol.findIndex(([k]) => k === rs.freshest_proof_of_life_source);
    if (freshest < 0) times.forEach((t, i) => { if (t !== null && (freshest < 0 || t > times[freshest])) freshest = i; });
    const age = typeof rs.proof_of_life_age_seconds === 'number' ? rs.proof_of_life_age_seconds : null;
    const win = typeof rs.freshness_seconds === 'number' ? rs.freshness_seconds : null;
    const registered = rs.route_state !== 'not_registered';

    const polRows = pol.map(([k, label], i) => el('tr', { class: i === freshest ? 'freshest' : null, 'data-testid': 'pol-' + k },
      el('th', { scope: 'row' }, label, el('br'), code(k)),
      el('td', null, timeAgo(store[k], now)),
      el('td', null, i === freshest ? badge('freshest', 'ok', 'freshest') : null)));

    const queueHealth = q.instance_id
      ? (q.instance_healthy ? badge('healthy', 'ok') : badge('unhealthy', 'bad'))
      : null;

    replace(body,
      el('p', { class: 'detail-state' }, stateBadge(rs.route_state, rs), ' ',
        el('span', { class: 'muted' }, rs.tenant_id + ' / ' + rs.project_id)),
      el('div', { class: 'explain', 'data-testid': 'detail-explanation', 'data-route-state': rs.route_state },
        explain(rs).map((t) => el('p', null, t))),

      registered ? [
        el('h4', null, 'Proof of life'),
        el('p', { 'data-testid': 'detail-pol' }, 'Freshest: ',
          freshest >= 0 ? code(pol[freshest][0]) : 'none', ', ', el('strong', null, agoText(age)),
          win !== null && age !== null ? [' — freshness window ', num(win), ' s: ',
            age <= win ? badge('within', 'ok') : badge('outside', 'bad')] : null),
        el('table', { class: 'compact' },
          el('caption', { class: 'sr-only' }, 'Proof-of-life timestamps'),
          el('tbody', null, polRows))] : null,

      registered ? detailRest(rs, store, q, sh, queueHealth, now) : null,
      registered ? pendingList(pending) : null,
      registered || st.actionNote ? actionsNode(rs) : null,

      el('details', null, el('summary', null, 'Raw response'),
        el('pre', { 'data-testid': 'detail-raw' }, JSON.stringify(rs, null, 2))));

    if (st.detailOpenedByUser) {
      st.detailOpenedByUser = false;
      $('detail-h').focus();
    }
  }

  // pendingList shows the first signals waiting for the session's ack.
  function pendingList(p) {
    const head = el('h4', null, 'Pending signals');
    if (!p) return null;
    if (p instanceof Error) return [head, el('p', { class: 'error', 'data-testid': 'detail-pending-error' }, 'Could not list them: ' + shortReason(p) + '.')];
    const sigs = p.signals || [];
    if (!sigs.length) return [head, el('p', { class: 'muted', 'data-testid': 'detail-pending-none' }, 'None: every signal to it was acknowledged.')];
    const preview = (v) => { const t = JSON.stringify(v); return t.length > 80 ? t.slice(0, 79) + '…' : t; };
    return [head,
      el('table', { class: 'compact', 'data-testid': 'detail-pending-table' },
        el('caption', { class: 'sr-only' }, 'Signals waiting for this session\'s acknowledgement, oldest first'),
        el('thead', null, el('tr', null, el('th', { scope: 'col', class: 'n' }, 'Seq'), el('th', { scope: 'col' }, 'From'),
          el('th', { scope: 'col' }, 'Sent'), el('th', { scope: 'col' }, 'Payload'))),
        el('tbody', null, sigs.map((g) => el('tr', { 'data-testid': 'detail-pending-row' },
          el('td', { class: 'n' }, num(g.seq)), el('td', null, code(g.from_session || '')),
          el('td', null, timeAgo(g.created_at)), el('td', null, code(preview(g.payload))))))),
      p.total > sigs.length ? el('p', { class: 'hint' }, 'The oldest ' + sigs.length + ' of ' + num(p.total) + '.') : null];
  }

  // actionsNode returns the actions block, the same DOM node while nothing it
  // shows has changed: the 2 s refresh must not replace a button between the
  // press and the release of a click.
  function actionsNode(rs) {
    const key = JSON.stringify([keyOf(st.route.detail), rs.route_state, !!(rs.queue && rs.queue.attached), st.confirming, st.actionNote]);
    if (st.actionsKey !== key || !st.actionsEl) {
      st.actionsKey = key;
      st.actionsEl = el('div', { 'data-testid': 'detail-actions' }, actions(rs));
    }
    return st.actionsEl;
  }

  // actions: disconnect the WebSocket, deregister the session; each asks
  // for a confirmation in the page first.
  function actions(rs) {
    const d = st.route.detail;
    const note = st.actionNote ? el('p', { class: st.actionNote.kind, role: 'status', 'data-testid': 'action-note' }, st.actionNote.text) : null;
    if (rs.route_state === 'not_registered') return [el('h4', null, 'Actions'), note];
    const what = { disconnect: 'Disconnect its WebSocket? Its client reconnects (close 1012); nothing is lost.',
      deregister: 'Deregister session ' + d.session + '? It and its pending signals are deleted; its client must register again.' };
    if (st.confirming) {
      return [el('h4', null, 'Actions'), note,
        el('div', { class: 'confirm', role: 'alertdialog', 'aria-label': 'Confirm', 'data-testid': 'confirm' },
          el('p', null, what[st.confirming]),
          el('button', { type: 'button', class: 'danger', 'data-testid': 'confirm-yes', onclick: () => runAction(st.confirming) },
            st.confirming === 'disconnect' ? 'Yes, disconnect' : 'Yes, deregister'),
          ' ',
          el('button', { type: 'button', 'data-testid': 'confirm-no', onclick: () => { st.confirming = ''; refresh(); } }, 'Cancel'))];
    }
    const attached = rs.queue && rs.queue.attached;
    return [el('h4', null, 'Actions'), note,
      el('p', null,
        el('button', { type: 'button', 'data-testid': 'action-disconnect', disabled: attached ? null : true,
          title: attached ? null : 'It holds no WebSocket', onclick: () => { st.confirming = 'disconnect'; st.actionNote = null; refresh(); } }, 'Disconnect WebSocket'),
        ' ',
        el('button', { type: 'button', class: 'danger', 'data-testid': 'action-deregister',
          onclick: () => { st.confirming = 'deregister'; st.actionNote = null; refresh(); } }, 'Deregister session'))];
  }

  async function runAction(kind) {
    const d = st.route.detail;
    if (!d) return;
    const path = '/v1/ops/sessions/' + [d.tenant, d.project, d.session].map(encodeURIComponent).join('/');
    st.confirming = '';
    try {
      if (kind === 'disconnect') {
        const r = await api(path + '/disconnect', st.token, 'POST');
        st.actionNote = { kind: 'ok', text: r.disconnected ? 'Disconnected: its client reconnects.' : 'Nothing to disconnect: this instance holds no WebSocket of it.' };
      } else {
        await api(path, st.token, 'DELETE');
        st.actionNote = { kind: 'ok', text: 'Deregistered.' };
      }
    } catch (e) {
      if (e instanceof HubError && e.kind === 'http' && e.code === 'wrong_instance') {
        st.actionNote = { kind: 'error', text: e.message + '.' };
      } else {
        st.actionNote = { kind: 'error', text: describe(e) };
      }
    }
    refresh();
  }

  function detailRest(rs, store, q, sh, queueHealth, now) {
    return [
      el('h4', null, 'Queue'),
      el('dl', { class: 'kv', 'data-testid': 'detail-queue' },
        el('dt', null, 'Attached'), el('dd', null, q.attached && q.instance_healthy ? badge('yes', 'ok')
          : q.attached ? [badge('no', 'bad'), ' recorded on an unhealthy instance, so it counts as absent'] : badge('no', 'bad')),
        el('dt', null, 'Instance'), el('dd', null, q.instance_id ? [code(q.instance_id), ' ', queueHealth] : el('span', { class: 'muted' }, 'none')),
        el('dt', null, 'Since'), el('dd', null, q.attached_at ? timeAgo(q.attached_at, now) : el('span', { class: 'muted' }, '—')),
        el('dt', null, 'Last detached'), el('dd', null, store.queue_detached_at ? timeAgo(store.queue_detached_at, now) : el('span', { class: 'muted' }, 'never'))),

      el('h4', null, 'Signals and self-heal'),
      el('dl', { class: 'kv', 'data-testid': 'detail-selfheal' },
        el('dt', null, 'Pending signals'), el('dd', { 'data-testid': 'detail-pending' }, num(rs.pending_signals)),
        el('dt', null, 'Self-heal'), el('dd', null, sh.enabled ? 'on' : 'off (MARCONI_SELFHEAL)'),
        el('dt', null, 'Live-WebSocket surface'), el('dd', null, sh.eligible_surface ? 'yes' : 'no (piggyback-only)'),
        el('dt', null, 'Recipient bucket tokens'), el('dd', { 'data-testid': 'detail-recipient-tokens' }, num(sh.recipient_tokens)),
        el('dt', null, 'Sender bucket tokens'), el('dd', { 'data-testid': 'detail-sender-tokens' }, num(sh.sender_tokens))),

      el('h4', null, 'Store row'),
      el('dl', { class: 'kv', 'data-testid': 'detail-store' },
        el('dt', null, 'Surface'), el('dd', null, store.surface ? code(store.surface) : '—'),
        el('dt', null, 'Runtime mode'), el('dd', { 'data-testid': 'detail-mode' }, store.runtime_mode || '—'),
        el('dt', null, 'Mode source'), el('dd', null, store.runtime_mode_source || '—'),
        el('dt', null, 'Assigned instance'), el('dd', null, store.assigned_instance ? code(store.assigned_instance) : el('span', { class: 'muted' }, 'none')),
        el('dt', null, 'Expires'), el('dd', null, expiresText(store.expires_at, now)))];
  }

  function expiresText(iso, now) {
    const t = parseTime(iso);
    if (t === null) return el('span', { class: 'muted' }, '—');
    return el('span', null, timeEl(iso), ' ', el('span', { class: 'muted' }, '(' + inText((t - (now || hubNow())) / 1000) + ')'));
  }

  // ---------- fabric ----------

  function renderFabric(s) {
    const ap = s.adaptive_placement || {};
    const ss = s.sessions || {};
    const sum = s.summary || {};
    const events = (s.fallback_events || []).slice().sort((a, b) => (parseTime(b.at) || 0) - (parseTime(a.at) || 0));
    const kvTable = (caption, obj) => {
      const entries = Object.entries(obj || {});
      if (!entries.length) return empty('None.');
      return el('table', { class: 'compact' }, el('caption', { class: 'sr-only' }, caption),
        el('tbody', null, entries.map(([k, v]) => el('tr', null, el('th', { scope: 'row' }, code(k)), el('td', { class: 'n' }, num(v))))));
    };
    const evRows = events.map((e) => el('tr', { 'data-testid': 'fallback-row', class: e.runtime_mode_source === 'adaptive-classifier' ? 'attention' : null },
      el('td', null, timeAgo(e.at)),
      el('th', { scope: 'row' }, code(e.session_id)),
      el('td', null, code(e.from_instance || '—'), ' → ', code(e.to_instance || '—')),
      el('td', null, e.runtime_mode || '—'),
      el('td', { 'data-testid': 'fallback-source' }, e.runtime_mode_source || '—',
        e.runtime_mode_source === 'adaptive-classifier' ? el('span', { class: 'note' }, ' placed by the classifier: an expected canary client?') : null),
      el('td', { 'data-testid': 'fallback-reason' }, e.reason || '—')));

    replace($('fabric-body'),
      el('div', { class: 'grid three' },
        el('section', { class: 'card', 'aria-labelledby': 'fb-ap-h' },
          el('h3', { id: 'fb-ap-h' }, 'Adaptive placement'),
          el('dl', { class: 'kv' },
            el('dt', null, 'Gate'), el('dd', { 'data-testid': 'fabric-gate' }, badge(ap.gate || 'unknown', 'gate-' + (ap.gate || 'unknown'))),
            el('dt', null, 'Client allowlist'), el('dd', { 'data-testid': 'fabric-allowlist' }, (ap.allowlist || []).length ? ap.allowlist.map((a, i) => [i ? ', ' : '', code(a)]) : el('span', { class: 'muted' }, 'empty')))),
        el('section', { class: 'card', 'aria-labelledby': 'fb-sum-h' },
          el('h3', { id: 'fb-sum-h' }, 'Counters'),
          el('dl', { class: 'kv', 'data-testid': 'fabric-counters' },
            el('dt', null, 'Fallbacks'), el('dd', null, num(sum.total_fallbacks || 0)),
            el('dt', null, 'Reassignments'), el('dd', null, num(sum.total_reassignments || 0)),
            el('dt', null, 'Adaptive placements'), el('dd', null, num(sum.total_adaptive_placements || 0)),
            el('dt', null, 'Adaptive placement mismatches'), el('dd', { 'data-testid': 'fabric-mismatches', class: (sum.total_adaptive_placement_mismatches || 0) > 0 ? 'warn' : null }, num(sum.total_adaptive_placement_mismatches || 0)))),
        el('section', { class: 'card', 'aria-labelledby': 'fb-ses-h' },
          el('h3', { id: 'fb-ses-h' }, 'Sessions: ' + num(ss.total || 0)),
          el('h4', null, 'By runtime mode'), kvTable('Sessions by runtime mode', ss.by_mode),
          el('h4', null, 'By mode source'), kvTable('Sessions by runtime mode source', ss.by_source)),
        el('section', { class: 'card wide', 'aria-labelledby': 'fb-inst-h' },
          el('h3', { id: 'fb-inst-h' }, 'Instances'), instancesTable(s.instances || [])),
        el('section', { class: 'card wide', 'aria-labelledby': 'fb-canary-h' },
          el('h3', { id: 'fb-canary-h' }, 'Adaptive placements by client'),
          el('p', { class: 'hint' }, 'Live sessions the adaptive classifier placed, by ', code('client_id'),
            ' (most first, up to 50). Only expected canary clients should appear; a client not on the allowlist stands out.'),
          (ap.by_client || []).length
            ? el('table', { 'data-testid': 'canary-table' },
              el('caption', { class: 'sr-only' }, 'Adaptive placements by client id'),
              el('thead', null, el('tr', null,
                el('th', { scope: 'col' }, 'Client'), el('th', { scope: 'col', class: 'n' }, 'Sessions'),
                el('th', { scope: 'col', class: 'n' }, 'Sticky'), el('th', { scope: 'col', class: 'n' }, 'Stateless'),
                el('th', { scope: 'col' }, 'Allowlist'))),
              el('tbody', null, ap.by_client.map((c) => el('tr', { 'data-testid': 'canary-row', 'data-client-id': c.client_id, class: c.on_allowlist ? null : 'attention' },
                el('th', { scope: 'row' }, c.client_id ? code(c.client_id) : el('span', { class: 'muted' }, '(none)')),
                el('td', { class: 'n', 'data-testid': 'canary-sessions' }, num(c.sessions)),
                el('td', { class: 'n' }, num((c.by_mode || {}).sticky || 0)),
                el('td', { class: 'n' }, num((c.by_mode || {}).stateless || 0)),
                el('td', { 'data-testid': 'canary-allowlist' }, c.on_allowlist ? badge('on the allowlist', 'ok') : badge('not on the allowlist', 'warn'))))))
            : empty('No live session was placed by the adaptive classifier.', 'no-canary')),
        el('section', { class: 'card wide', 'aria-labelledby': 'fb-ev-h' },
          el('h3', { id: 'fb-ev-h' }, 'Fallback events'),
          el('p', { class: 'hint' }, 'A sticky session that lost its runtime-local state (its client got affinity_reset): ',
            code('instance_unhealthy'), ', taken over from an instance that stopped heartbeating or is draining (a fallback); ',
            code('grace_expired'), ', placed anew because its WebSocket stayed away longer than MARCONI_RECONNECT_GRACE_SECONDS (a reassignment). ',
            'Newest 50. Rows placed by the adaptive classifier stand out: that source should appear only for expected canary clients.'),
          events.length
            ? el('table', { 'data-testid': 'fallback-events' },
              el('caption', { class: 'sr-only' }, 'Fallback events, newest first'),
              el('thead', null, el('tr', null,
                el('th', { scope: 'col' }, 'When'), el('th', { scope: 'col' }, 'Session'), el('th', { scope: 'col' }, 'From → to'),
                el('th', { scope: 'col' }, 'Mode'), el('th', { scope: 'col' }, 'Mode source'), el('th', { scope: 'col' }, 'Reason'))),
              el('tbody', null, evRows))
            : empty('No fallback events: no sticky session has lost its placement.', 'no-fallbacks'))));
  }

  // ---------- wiring ----------

  function init() {
    $('signin-form').addEventListener('submit', onSignInSubmit);
    $('signout').addEventListener('click', () => signOut(''));
    $('pause').addEventListener('click', () => {
      st.paused = !st.paused;
      $('pause').setAttribute('aria-pressed', String(st.paused));
      $('pause').textContent = st.paused ? 'Resume refresh' : 'Pause refresh';
      updateRefreshInfo();
      if (!st.paused) refresh();
    });
    $('filters').addEventListener('submit', (ev) => {
      ev.preventDefault();
      location.hash = sessionsHref({ tenant: $('f-tenant').value.trim(), project: $('f-project').value.trim(), state: $('f-state').value,
        session: $('f-session').value.trim() });
    });
    $('f-state').addEventListener('change', () => $('filters').requestSubmit());
    $('f-clear').addEventListener('click', () => { location.hash = '#sessions'; });
    window.addEventListener('hashchange', () => onRoute(true));
    document.addEventListener('visibilitychange', () => { if (!document.hidden && !st.paused) refresh(); });
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && st.route.detail && !ev.target.closest('input, select, textarea')) {
        location.hash = sessionsHref(st.route.filters);
      }
    });
    setInterval(tick, REFRESH_MS);
    setInterval(() => { if (st.token) sampleMetrics(); }, METRICS_MS);

    let saved = null;
    try { saved = sessionStorage.getItem(TOKEN_KEY); } catch (_) { saved = null; }
    if (saved) signIn(saved); else showSignIn('');
  }

  init();
})();
