// The client against a real hub on the memory store: exchange, typed errors,
// replay without duplicates, idempotent sends and their retries, a hub
// restart, deregister and close.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import WebSocket from 'ws';
import { ClientClosedError, MarconiError, TransportError, dial } from '@marconihub/client';
import { Inbox, LogRecorder, apiKey, freePort, routeState, startHub, useHub, waitFor } from './support/hub.js';
import { Proxy } from './support/proxy.js';

const env = useHub();

/**
 * @param {string} sessionID
 * @param {Partial<import('@marconihub/client').Config>} [extra]
 */
async function agent(sessionID, extra = {}) {
  const inbox = new Inbox();
  const client = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID, onSignal: inbox.on, ...extra });
  return { client, inbox };
}

test('two agents exchange signals once each, in order, and acknowledge them', async (t) => {
  const a = await agent('ex-a');
  const b = await agent('ex-b');
  t.after(async () => { await a.client.close(); await b.client.close(); });
  assert.equal(a.client.sessionID, 'ex-a');

  for (let n = 1; n <= 5; n++) {
    const res = await a.client.send('ex-b', 'chat', { n });
    assert.equal(res.seq, n);
    assert.equal(res.delivery, 'pushed_to_ws');
    assert.equal(res.duplicate, false);
    assert.match(res.idempotencyKey, /^[0-9a-f-]{36}$/);
  }
  await waitFor('b to get 1..5', () => b.inbox.signals.length === 5);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3, 4, 5]);
  const s = b.inbox.signals[0];
  assert.equal(s.fromSession, 'ex-a');
  assert.equal(s.toSession, 'ex-b');
  assert.equal(s.kind, 'chat');
  assert.ok(s.createdAt instanceof Date && !Number.isNaN(s.createdAt.getTime()));
  await waitFor('the hub to see 1..5 acknowledged', async () => (await routeState(env.hub, 'ex-b')).pending_signals === 0);
  const acks = b.client.stats().acks;
  assert.ok(acks >= 1 && acks <= 5, `b's stats().acks = ${acks}, want 1 to 5 (one ack covers every signal handled before it)`);
  assert.equal(a.client.stats().acks, 0, 'a received nothing, so acknowledged nothing');
});

test('errors of the hub are MarconiError with the hub\'s code; bad config is a TypeError', async (t) => {
  const a = await agent('err-a');
  t.after(() => a.client.close());
  await assert.rejects(a.client.send('nobody-here', 'chat', {}), (err) => {
    assert.ok(err instanceof MarconiError);
    assert.equal(err.status, 404);
    assert.equal(err.code, 'recipient_not_registered');
    return true;
  });
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey: 'not-a-key', surface: 'claude_code' }), (err) => {
    assert.ok(err instanceof MarconiError);
    assert.equal(err.status, 401);
    assert.equal(err.code, 'unauthorized');
    return true;
  });
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'not_a_surface' }), { code: 'invalid_surface', status: 400 });
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', runtimeMode: 'pinned' }), { code: 'reserved_runtime_mode' });
  await assert.rejects(dial({ hubURL: 'ftp://x', apiKey, surface: 'claude_code' }), TypeError);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey: '', surface: 'claude_code' }), TypeError);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', reconnectBaseDelayMs: 500, reconnectMaxDelayMs: 100 }), TypeError);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sendAttempts: 1.5 }), TypeError);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', requestTimeoutMs: -1 }), TypeError);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', pingIntervalMs: -1 }), /pingIntervalMs/);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', pingTimeoutMs: 0 }), /pingTimeoutMs/);
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: /** @type {any} */ (42) }), TypeError);
});

// Without waiting out the Retry-After, a backoff of at most 50 ms would be
// refused again and again within the hub's window (about two seconds).
test('an attach refused 429 is tried again after its Retry-After, not at the backoff\'s pace', async (t) => {
  // 0.5 attaches a second, a burst of one: the dial's attach spends it.
  const tight = await startHub(env.bins.marconi, { env: { MARCONI_QUOTA_ATTACHES_PER_SECOND: '0.5' } });
  t.after(() => tight.stop());
  const proxy = new Proxy(tight.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const c = await dial({ hubURL: url, apiKey, surface: 'claude_code', sessionID: 'attach-429', reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 50 });
  t.after(() => c.close());

  proxy.severWebSockets();
  await waitFor('the client to attach again', () => c.stats().reconnects === 1, { timeoutMs: 10000 });
  const metrics = await (await fetch(`${tight.url}/metrics`)).text();
  const refusals = metrics.match(/^marconi_quota_refusals_total\{quota="attaches_per_session"\} (\S+)$/m);
  assert.ok(refusals, 'the hub counts attach refusals');
  assert.equal(Number(refusals[1]), 1, 'refused once, then attached after the Retry-After');
  assert.equal(c.stats().rateLimited, 1);
});

test('a 429 is waited out for its Retry-After and the send stored once; with rateLimitWaitMs 0 it is returned at once', async (t) => {
  const slow = await startHub(env.bins.marconi, { env: { MARCONI_SEND_RATE_PER_SECOND: '1' } }); // burst 2
  t.after(() => slow.stop());
  const inbox = new Inbox();
  const a = await dial({ hubURL: slow.url, apiKey, surface: 'claude_code', sessionID: 'rate-a' });
  const b = await dial({ hubURL: slow.url, apiKey, surface: 'claude_code', sessionID: 'rate-b', onSignal: inbox.on });
  const c = await dial({ hubURL: slow.url, apiKey, surface: 'claude_code', sessionID: 'rate-c', rateLimitWaitMs: 0 });
  t.after(async () => { await a.close(); await b.close(); await c.close(); });

  const sent = await Promise.all([1, 2, 3, 4].map((n) => a.send('rate-b', 'chat', { n })));
  assert.deepEqual(sent.map((r) => r.seq).sort(), [1, 2, 3, 4]);
  assert.ok(a.stats().rateLimited >= 1, 'the burst of two was exceeded and waited out');
  assert.equal(a.stats().sendRetries, 0);
  await waitFor('b to get 1..4', () => inbox.signals.length === 4);

  const results = await Promise.allSettled([1, 2, 3, 4].map((n) => c.send('rate-b', 'chat', { n })));
  const refused = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
  assert.ok(refused.length >= 1, 'the burst of two is exceeded');
  for (const err of refused) {
    assert.ok(err instanceof MarconiError);
    assert.equal(err.status, 429);
    assert.equal(err.code, 'too_many_requests');
    assert.equal(err.retryAfterSeconds, 1);
  }
  assert.equal(c.stats().rateLimited, 0);
});

test('close 4409: a newer connection of the session replaces the client\'s, and the client does not fight it', async (t) => {
  const proxy = new Proxy(env.hub.port); // to read the token off the client's handshake
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const logs = new LogRecorder();
  const a = await agent('rep-a');
  const b = await agent('rep-b', { hubURL: url, logger: logs, reconnectBaseDelayMs: 5, reconnectMaxDelayMs: 20 });
  t.after(async () => { await a.client.close(); await b.client.close(); });

  // Another process of the same session attaches with its token.
  const token = proxy.webSocketToken;
  assert.ok(token, 'the client attached through the proxy');
  const newer = new WebSocket(`${env.hub.url.replace(/^http/, 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${token}` } });
  /** @type {any[]} */
  const frames = [];
  newer.on('message', (d) => frames.push(JSON.parse(d.toString())));
  /** @type {number | null} */
  let newerClosed = null;
  newer.on('close', (code) => (newerClosed = code));
  t.after(() => newer.terminate());
  await waitFor('the newer connection\'s welcome', () => frames.some((f) => f.type === 'welcome'));
  await waitFor('the client to be told it was replaced', () =>
    logs.find('marconi: connection replaced by a newer one of this session; not redialing').length === 1);

  // The newer connection holds the session: a signal to rep-b reaches it,
  // not the client, and it stays open (a client that redialed would have
  // replaced it in turn with 4409).
  assert.equal((await a.client.send('rep-b', 'chat', { n: 1 })).delivery, 'pushed_to_ws');
  await waitFor('the newer connection to get the signal', () => frames.some((f) => f.type === 'signal' && f.payload?.n === 1));
  assert.equal(newerClosed, null, 'the newer connection was closed');
  assert.equal(newer.readyState, WebSocket.OPEN);
  assert.equal(b.inbox.signals.length, 0);
  assert.equal(b.client.stats().reconnects, 0);
  assert.equal(logs.find('marconi: WebSocket ended, reconnecting').length, 0, 'the client set out to redial');
  assert.equal((await routeState(env.hub, 'rep-b')).route_state, 'attached');

  // Sending still works while the token is valid.
  assert.equal((await b.client.send('rep-a', 'chat', { n: 1 })).delivery, 'pushed_to_ws');
  await waitFor('a to get b\'s signal', () => a.inbox.signals.length === 1);
});

test('replay after reconnects delivers each signal once, in order', async (t) => {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const a = await agent('replay-a');
  // B's handler holds signal 1 until released: it is pushed but not yet
  // acknowledged when B's connection dies, so the hub replays it on the next
  // attach, and drains and piggybacks may bring it again.
  /** @type {() => void} */
  let release = () => {};
  const gate = new Promise((r) => (release = () => r(undefined)));
  const inbox = new Inbox();
  const b = await dial({
    hubURL: url, apiKey, surface: 'claude_code', sessionID: 'replay-b', reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 50,
    onSignal: async (s) => {
      inbox.on(s);
      if (inbox.signals.length === 1) await gate;
    },
  });
  t.after(async () => { await a.client.close(); await b.close(); });

  await a.client.send('replay-b', 'chat', { n: 1 });
  await waitFor('b to hold 1', () => inbox.signals.length === 1);
  for (let round = 1; round <= 3; round++) {
    proxy.severWebSockets();
    await waitFor(`reconnect ${round}`, () => b.stats().reconnects === round);
    await a.client.send('replay-b', 'chat', { n: round + 1 });
  }
  release();
  await waitFor('b to get 1..4', () => inbox.signals.length >= 4);
  await waitFor('the hub to see everything acknowledged', async () => (await routeState(env.hub, 'replay-b')).pending_signals === 0);
  assert.deepEqual(inbox.ns(), [1, 2, 3, 4]);
  assert.equal(new Set(inbox.signals.map((s) => s.id)).size, 4);
});

test('while the WebSocket cannot attach, signals are drained over HTTP; once it can, nothing comes twice', async (t) => {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const a = await agent('drain-a');
  const b = await agent('drain-b', { hubURL: url, reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 100 });
  t.after(async () => { await a.client.close(); await b.client.close(); });

  proxy.refuseWebSockets(true);
  proxy.severWebSockets();
  await waitFor('the hub to detach b', async () => (await routeState(env.hub, 'drain-b')).route_state === 'route_without_queue');
  for (const n of [1, 2, 3]) assert.equal((await a.client.send('drain-b', 'chat', { n })).delivery, 'queued_offline');
  await waitFor('b to drain 1..3', () => b.inbox.signals.length === 3);
  await waitFor('the drained signals acknowledged over HTTP', async () => (await routeState(env.hub, 'drain-b')).pending_signals === 0);
  assert.equal(b.client.stats().reconnects, 0, 'still detached');

  proxy.refuseWebSockets(false);
  await waitFor('b to reattach', () => b.client.stats().reconnects === 1);
  await a.client.send('drain-b', 'chat', { n: 4 });
  await waitFor('b to get 4 live', () => b.inbox.signals.length === 4);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3, 4]);
});

test('an idempotency key makes a repeat a no-op; a send whose answer was lost is retried with its key', async (t) => {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const log = new LogRecorder();
  // Every send must cross the proxy, which loses an answer: a hint naming
  // the recipient's instance (the hub's own URL, not the proxy's) must not
  // take the sends round it.
  const a = await agent('idem-a', { hubURL: url, logger: log, noHolderRouting: true });
  const b = await agent('idem-b');
  t.after(async () => { await a.client.close(); await b.client.close(); });

  const first = await a.client.send('idem-b', 'chat', { n: 1 }, { idempotencyKey: 'order-42' });
  const repeat = await a.client.send('idem-b', 'chat', { n: 1 }, { idempotencyKey: 'order-42' });
  assert.equal(first.duplicate, false);
  assert.equal(repeat.duplicate, true);
  assert.equal(repeat.signalID, first.signalID);
  assert.equal(repeat.idempotencyKey, 'order-42');

  // The hub stores the next send, but its answer never reaches the client.
  proxy.loseNextAnswer('POST /v1/signals ');
  const retried = await a.client.send('idem-b', 'chat', { n: 2 });
  assert.equal(proxy.lost, 1, 'the answer was lost on the way');
  assert.equal(retried.duplicate, true, 'the retry found the stored signal by its key');
  assert.equal(retried.seq, 2);
  assert.equal(a.client.stats().sendRetries, 1);
  assert.equal(log.find('marconi: send got no usable answer; retrying with the same idempotency key')[0].fields.idempotency_key, retried.idempotencyKey);

  await a.client.send('idem-b', 'chat', { n: 3 });
  await waitFor('b to get 1..3', () => b.inbox.signals.length === 3);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3], 'each signal once, the repeat and the retry stored nothing new');
});

test('sendAttempts 1: a lost answer is the caller\'s TransportError, and its own retry with the key stores nothing new', async (t) => {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const a = await agent('once-a', { hubURL: url, sendAttempts: 1 });
  const b = await agent('once-b');
  t.after(async () => { await a.client.close(); await b.client.close(); });
  proxy.loseNextAnswer('POST /v1/signals ');
  await assert.rejects(a.client.send('once-b', 'chat', { n: 1 }, { idempotencyKey: 'once-1' }), TransportError);
  assert.equal(a.client.stats().sendRetries, 0);
  const again = await a.client.send('once-b', 'chat', { n: 1 }, { idempotencyKey: 'once-1' });
  assert.equal(again.duplicate, true);
  await a.client.send('once-b', 'chat', { n: 2 });
  await waitFor('b to get 1..2', () => b.inbox.signals.length === 2);
  assert.deepEqual(b.inbox.ns(), [1, 2]);
});

test('a registration whose answer was lost is retried with its idempotency key: the client gets the session, another key still 403', async (t) => {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const log = new LogRecorder();
  // The hub registers lost-reg, but its answer never reaches the client.
  proxy.loseNextAnswer('POST /v1/sessions ');
  const a = await agent('lost-reg', { hubURL: url, logger: log });
  const b = await agent('lost-reg-peer');
  t.after(async () => { await a.client.close(); await b.client.close(); });
  assert.equal(proxy.lost, 1, 'the answer was lost on the way');
  const retried = log.find('marconi: registration got no usable answer; registering again with the same idempotency key');
  assert.equal(retried.length, 1);
  assert.deepEqual(Object.keys(retried[0].fields).sort(), ['attempt', 'err', 'session_id'], 'the registration key (a secret) is not logged');

  await b.client.send('lost-reg', 'chat', { n: 1 });
  await waitFor('lost-reg to receive', () => a.inbox.signals.length === 1);
  await a.client.send('lost-reg-peer', 'chat', { n: 1 });

  // No hijack: another client claiming the id has a key of its own.
  await assert.rejects(
    dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'lost-reg' }),
    (err) => err instanceof MarconiError && err.code === 'forbidden',
  );
  await a.client.send('lost-reg-peer', 'chat', { n: 2 });
  await waitFor('the peer to get both', () => b.inbox.signals.length === 2);
});

test('dial fails over from a hub URL that does not answer to the next', async (t) => {
  const dead = `http://127.0.0.1:${await freePort()}`;
  const log = new LogRecorder();
  const a = await agent('dial-failover', { hubURL: dead, hubURLs: [env.hub.url, `${env.hub.url}/`], logger: log });
  t.after(() => a.client.close());
  assert.equal(a.client.stats().failovers, 1);
  assert.equal(log.find('marconi: hub URL unreachable; failing over')[0].fields.to, env.hub.url);
  assert.equal((await routeState(env.hub, 'dial-failover')).route_state, 'attached');
  await assert.rejects(dial({ hubURL: dead, apiKey, surface: 'claude_code' }), TransportError);
});

test('a hub restart on the memory store: the session is registered again, drained afresh while detached, and the app told', async (t) => {
  // Its own hub: this one is restarted on the same port.
  const own = await startHub(env.bins.marconi);
  /** @type {import('./support/hub.js').Hub} */
  let current = own;
  t.after(() => current.stop());
  const proxy = new Proxy(own.port); // b's way to the hub, to keep its WebSocket out for a while
  const viaProxy = await proxy.listen();
  t.after(() => proxy.close());
  /** @type {import('@marconihub/client').AffinityReset[]} */
  const resets = [];
  const inB = new Inbox();
  const fast = { reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 200 };
  const a = await dial({ hubURL: own.url, apiKey, surface: 'claude_code', sessionID: 'restart-a', ...fast });
  const b = await dial({
    hubURL: viaProxy, apiKey, surface: 'claude_code', sessionID: 'restart-b', ...fast,
    onSignal: inB.on, onAffinityReset: (r) => { resets.push(r); },
  });
  t.after(async () => { await a.close(); await b.close(); });
  await a.send('restart-b', 'chat', { n: 1 });
  await waitFor('b to get 1', () => inB.signals.length === 1);

  proxy.refuseWebSockets(true);
  await own.stop(); // graceful: WebSockets close with 1012, every session is forgotten
  current = await startHub(env.bins.marconi, { port: own.port });
  await waitFor('a to register again and reattach', () => a.stats().reregistrations === 1 && a.stats().reconnects === 1, { timeoutMs: 15000 });
  await waitFor('b to register again', () => b.stats().reregistrations === 1, { timeoutMs: 15000 });
  await waitFor('b told its state is gone', () => resets.length === 1);
  assert.deepEqual(resets, [{ reason: 'reregistered', dropped: 0 }]);

  // b is registered but cannot attach: the new registration's signal 1 comes by drain.
  const res = await a.send('restart-b', 'chat', { n: 2 });
  assert.equal(res.seq, 1, 'a new session on the new hub numbers afresh');
  await waitFor('b to drain 2', () => inB.signals.length === 2);
  assert.equal(b.stats().reconnects, 0);

  proxy.refuseWebSockets(false);
  await waitFor('b attached on the new hub', async () => (await routeState(current, 'restart-b')).route_state === 'attached');
  assert.equal((await a.send('restart-b', 'chat', { n: 3 })).delivery, 'pushed_to_ws');
  await waitFor('b to get 3', () => inB.signals.length === 3);
  assert.deepEqual(inB.ns(), [1, 2, 3]);
  assert.equal(b.sessionID, 'restart-b');
  assert.equal(resets.length, 1);
});

test('after a 1012 the redial backoff is capped at reconnectRestartMaxDelayMs, not reconnectMaxDelayMs', async (t) => {
  // Its own hub, stopped gracefully (1012) and kept down while the client
  // fails 20 times. With an hour's cap those failures would reach ceilings
  // of hours (5 ms doubled 20 times); capped at 50 ms they take about a second.
  const own = await startHub(env.bins.marconi);
  /** @type {import('./support/hub.js').Hub} */
  let current = own;
  t.after(() => current.stop());
  const logs = new LogRecorder();
  const c = await dial({
    hubURL: own.url, apiKey, surface: 'claude_code', sessionID: 'restart-cap', logger: logs,
    reconnectBaseDelayMs: 5, reconnectMaxDelayMs: 3_600_000, reconnectRestartMaxDelayMs: 50,
  });
  t.after(() => c.close());
  await own.stop();
  await waitFor('20 failed redials while the hub is down', () => logs.find('marconi: reconnect failed').length >= 20, { timeoutMs: 15000 });
  current = await startHub(env.bins.marconi, { port: own.port });
  await waitFor('attached to the hub that came back', () => c.stats().reconnects === 1, { timeoutMs: 15000 });
});

test('a session that expired on the hub is registered again under its id, and the app is told', async (t) => {
  // Its own hub, with sessions that expire three seconds after their last proof of life.
  const short = await startHub(env.bins.marconi, {
    env: { MARCONI_SESSION_TTL_SECONDS: '3', MARCONI_HEARTBEAT_INTERVAL_SECONDS: '60', MARCONI_WS_PING_SECONDS: '60', MARCONI_TOUCH_INTERVAL_SECONDS: '1' },
  });
  t.after(() => short.stop());
  /** @type {import('@marconihub/client').AffinityReset[]} */
  const resets = [];
  const inB = new Inbox();
  const a = await dial({ hubURL: short.url, apiKey, surface: 'claude_code', sessionID: 'ttl-a' });
  const b = await dial({ hubURL: short.url, apiKey, surface: 'claude_code', sessionID: 'ttl-b', onSignal: inB.on, onAffinityReset: (r) => { resets.push(r); } });
  t.after(async () => { await a.close(); await b.close(); });
  assert.equal((await a.send('ttl-b', 'chat', { n: 1 })).seq, 1);
  await waitFor('b to get 1', () => inB.signals.length === 1);

  // Idle past the TTL, both sessions expire; the hub closes their WebSockets
  // with 4410, and each client registers its id again.
  for (const c of [a, b]) await waitFor(`${c.sessionID} to be registered again`, () => c.stats().reregistrations === 1, { timeoutMs: 20000 });
  await waitFor('b told its state is gone', () => resets.length === 1);
  assert.deepEqual(resets, [{ reason: 'reregistered', dropped: 0 }]);
  await waitFor('b attached again', async () => (await routeState(short, 'ttl-b')).route_state === 'attached');
  const res = await a.send('ttl-b', 'chat', { n: 2 });
  assert.equal(res.seq, 1, 'the new registration numbers afresh');
  await waitFor('b to get 2', () => inB.signals.length === 2);
  assert.deepEqual(inB.ns(), [1, 2]);
  assert.equal(b.sessionID, 'ttl-b');
});

test('heartbeats at the interval the hub gives keep an idle session alive past its TTL', async (t) => {
  const hb = await startHub(env.bins.marconi, {
    env: { MARCONI_SESSION_TTL_SECONDS: '3', MARCONI_HEARTBEAT_INTERVAL_SECONDS: '1', MARCONI_WS_PING_SECONDS: '60', MARCONI_TOUCH_INTERVAL_SECONDS: '1' },
  });
  t.after(() => hb.stop());
  const a = await dial({ hubURL: hb.url, apiKey, surface: 'claude_code', sessionID: 'hb-a' });
  t.after(() => a.close());
  // Nothing else proves a alive (no sends, no pings): each new last_seen_at is a heartbeat.
  const seen = new Set();
  const firstExpiry = Date.parse((await routeState(hb, 'hb-a')).store.expires_at);
  await waitFor('four heartbeats', async () => {
    seen.add((await routeState(hb, 'hb-a')).store.last_seen_at);
    return seen.size >= 5;
  }, { timeoutMs: 20000, everyMs: 200 });
  const rs = await routeState(hb, 'hb-a');
  assert.equal(rs.route_state, 'attached');
  assert.ok(Date.now() > firstExpiry, 'the first expiry has passed');
  assert.ok(Date.parse(rs.store.expires_at) > Date.now(), 'the heartbeats moved the expiry on');
  assert.equal(a.stats().reregistrations, 0);
});

test('deregister ends the session on the hub and closes the client; close is idempotent', async () => {
  const a = await agent('dereg-a');
  const b = await agent('dereg-b');
  await b.client.deregister();
  assert.equal((await routeState(env.hub, 'dereg-b')).route_state, 'not_registered');
  await assert.rejects(a.client.send('dereg-b', 'chat', {}), { code: 'recipient_not_registered' });
  await assert.rejects(b.client.send('dereg-a', 'chat', {}), ClientClosedError);
  await assert.rejects(b.client.deregister(), ClientClosedError);

  await a.client.close();
  await a.client.close();
  await assert.rejects(a.client.send('dereg-b', 'chat', {}), ClientClosedError);
  await waitFor('the hub to see a detached', async () => (await routeState(env.hub, 'dereg-a')).route_state === 'route_without_queue');
});

test('every call for a registered session names its project (x-marconi-project) for the balancer; the registration does not', async (t) => {
  const proxy = new Proxy(env.hub.port); // records each request's head
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const a = await agent('proj-a', { hubURL: url });
  const b = await agent('proj-b', { hubURL: url });
  t.after(async () => { await a.client.close(); await b.client.close(); });
  assert.equal((await a.client.send('proj-b', 'chat', { n: 1 })).delivery, 'pushed_to_ws');
  await waitFor('b to get the signal', () => b.inbox.signals.length === 1);
  await b.client.deregister();

  const heads = proxy.requests();
  const seen = (/** @type {string} */ method, /** @type {string} */ path) => heads.filter((h) => h.method === method && h.path.split('?')[0] === path);
  const registrations = seen('POST', '/v1/sessions');
  assert.equal(registrations.length, 2);
  for (const r of registrations) assert.equal(r.headers['x-marconi-project'], undefined, 'a registration named a project it does not know yet');
  const session = heads.filter((h) => !(h.method === 'POST' && h.path === '/v1/sessions'));
  assert.equal(seen('GET', '/v1/ws').length, 2, 'both attaches went through the proxy');
  assert.equal(seen('POST', '/v1/signals').length, 1, 'the send went through the proxy');
  assert.equal(seen('DELETE', '/v1/session').length, 1, 'the deregistration went through the proxy');
  for (const h of session) assert.equal(h.headers['x-marconi-project'], 't1/p1', `${h.method} ${h.path}`);
});
