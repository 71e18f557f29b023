// The client against a real hub on the memory store: exchange, typed errors,
// replay without duplicates, idempotent sends and their retries, a hub
// restart, deregister and close.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { ClientClosedError, MarconiError, dial } from '@marconihub/client';
import { Inbox, LogRecorder, apiKey, buildGo, routeState, startHub, waitFor } from './support/hub.js';
import { Proxy } from './support/proxy.js';

/** @type {{bins: Record<string, string>, cleanup: () => Promise<void>}} */
let build;
/** @type {import('./support/hub.js').Hub} */
let hub;

before(async () => {
  build = await buildGo({ marconi: './cmd/marconi' });
  hub = await startHub(build.bins.marconi);
});
after(async () => {
  await hub?.stop();
  await build?.cleanup();
});

/**
 * @param {string} sessionID
 * @param {Partial<import('@marconihub/client').Config>} [extra]
 */
async function agent(sessionID, extra = {}) {
  const inbox = new Inbox();
  const client = await dial({ hubURL: hub.url, apiKey, surface: 'claude_code', sessionID, onSignal: inbox.on, ...extra });
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
  await waitFor('the hub to see 1..5 acknowledged', async () => (await routeState(hub, 'ex-b')).pending_signals === 0);
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
  await assert.rejects(dial({ hubURL: hub.url, apiKey: 'not-a-key', surface: 'claude_code' }), (err) => {
    assert.ok(err instanceof MarconiError);
    assert.equal(err.status, 401);
    assert.equal(err.code, 'unauthorized');
    return true;
  });
  await assert.rejects(dial({ hubURL: hub.url, apiKey, surface: 'not_a_surface' }), { code: 'invalid_surface', status: 400 });
  await assert.rejects(dial({ hubURL: hub.url, apiKey, surface: 'claude_code', runtimeMode: 'pinned' }), { code: 'reserved_runtime_mode' });
  await assert.rejects(dial({ hubURL: 'ftp://x', apiKey, surface: 'claude_code' }), TypeError);
  await assert.rejects(dial({ hubURL: hub.url, apiKey: '', surface: 'claude_code' }), TypeError);
  await assert.rejects(dial({ hubURL: hub.url, apiKey, surface: 'claude_code', reconnectBaseDelayMs: 500, reconnectMaxDelayMs: 100 }), TypeError);
});

test('replay after reconnects delivers each signal once, in order', async (t) => {
  const proxy = new Proxy(hub.port);
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
  await waitFor('the hub to see everything acknowledged', async () => (await routeState(hub, 'replay-b')).pending_signals === 0);
  assert.deepEqual(inbox.ns(), [1, 2, 3, 4]);
  assert.equal(new Set(inbox.signals.map((s) => s.id)).size, 4);
});

test('an idempotency key makes a repeat a no-op; a send whose answer was lost is retried with its key', async (t) => {
  const proxy = new Proxy(hub.port);
  const url = await proxy.listen();
  t.after(() => proxy.close());
  const log = new LogRecorder();
  const a = await agent('idem-a', { hubURL: url, logger: log });
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

test('a hub restart on the memory store: the session is registered again and the application told', async (t) => {
  // Its own hub: this one is restarted.
  const own = await startHub(build.bins.marconi);
  /** @type {import('./support/hub.js').Hub} */
  let current = own;
  t.after(() => current.stop());
  /** @type {import('@marconihub/client').AffinityReset[]} */
  const resets = [];
  const inB = new Inbox();
  const fast = { reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 200 };
  const a = await dial({ hubURL: own.url, apiKey, surface: 'claude_code', sessionID: 'restart-a', ...fast });
  const b = await dial({
    hubURL: own.url, apiKey, surface: 'claude_code', sessionID: 'restart-b', ...fast,
    onSignal: inB.on, onAffinityReset: (r) => { resets.push(r); },
  });
  t.after(async () => { await a.close(); await b.close(); });
  await a.send('restart-b', 'chat', { n: 1 });
  await waitFor('b to get 1', () => inB.signals.length === 1);

  await own.stop(); // graceful: WebSockets close with 1012, every session is forgotten
  current = await startHub(build.bins.marconi, { port: own.port });
  for (const c of [a, b]) {
    await waitFor(`${c.sessionID} to register again and reattach`, () => c.stats().reregistrations === 1 && c.stats().reconnects >= 1, { timeoutMs: 15000 });
  }
  await waitFor('b attached on the new hub', async () => (await routeState(current, 'restart-b')).route_state === 'attached');
  await waitFor('b told its state is gone', () => resets.length === 1);
  assert.deepEqual(resets, [{ reason: 'reregistered', dropped: 0 }]);
  const res = await a.send('restart-b', 'chat', { n: 2 });
  assert.equal(res.seq, 1, 'a new session on the new hub numbers afresh');
  assert.equal(res.delivery, 'pushed_to_ws');
  await waitFor('b to get 2', () => inB.signals.length === 2);
  assert.deepEqual(inB.ns(), [1, 2]);
  assert.equal(b.sessionID, 'restart-b');
});

test('deregister ends the session on the hub and closes the client; close is idempotent', async () => {
  const a = await agent('dereg-a');
  const b = await agent('dereg-b');
  await b.client.deregister();
  assert.equal((await routeState(hub, 'dereg-b')).route_state, 'not_registered');
  await assert.rejects(a.client.send('dereg-b', 'chat', {}), { code: 'recipient_not_registered' });
  await assert.rejects(b.client.send('dereg-a', 'chat', {}), ClientClosedError);
  await assert.rejects(b.client.deregister(), ClientClosedError);

  await a.client.close();
  await a.client.close();
  await assert.rejects(a.client.send('dereg-b', 'chat', {}), ClientClosedError);
  await waitFor('the hub to see a detached', async () => (await routeState(hub, 'dereg-a')).route_state === 'route_without_queue');
});
