// SPEC-168 against a real hub (memory store): AC-12's client test (a
// sender_route_stale reconnects, a bare recipient_route_stale does not), a
// half-open connection healed by the agent's own next send, and a path that
// died silently found by the keepalive.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { dial } from '@marconihub/client';
import { Inbox, LogRecorder, apiKey, routeState, useHub, waitFor } from './support/hub.js';
import { Proxy } from './support/proxy.js';

const env = useHub();

/**
 * A client whose every connection passes through its own proxy.
 * @param {string} sessionID
 * @param {Partial<import('@marconihub/client').Config>} [extra]
 */
async function agent(sessionID, extra = {}) {
  const proxy = new Proxy(env.hub.port);
  const url = await proxy.listen();
  const inbox = new Inbox();
  const client = await dial({ hubURL: url, apiKey, surface: 'claude_code', sessionID, onSignal: inbox.on, ...extra });
  return { client, proxy, inbox, close: async () => { await client.close(); await proxy.close(); } };
}

test('AC-12: sender_route_stale reconnects once; a bare recipient_route_stale does not', async (t) => {
  const a = await agent('ac12-a');
  const b = await agent('ac12-b');
  t.after(async () => { await a.close(); await b.close(); });

  // B's WebSocket dies on the hub's side only: the hub detaches B's queue
  // while B still believes it is attached.
  assert.equal(b.proxy.freezeWebSockets(), 1);
  await waitFor('the hub to detach b', async () => (await routeState(env.hub, 'ac12-b')).route_state === 'route_without_queue');

  // A, attached and healthy, sends to B: the hub reports B's route stale, and
  // only B's. A must not reconnect for B's problem.
  const toB = await a.client.send('ac12-b', 'chat', { n: 1 });
  assert.equal(toB.delivery, 'queued_offline');
  assert.equal(toB.recipientRouteStale, true);
  assert.equal(toB.senderRouteStale, false);
  assert.equal(toB.selfhealOutcome, 'attempted');
  const again = await a.client.send('ac12-b', 'chat', { n: 2 });
  assert.equal(again.recipientRouteStale, true);
  assert.deepEqual(a.client.stats(), { reconnects: 0, selfHealReconnects: 0, reregistrations: 0, droppedAtReset: 0, sendRetries: 0, failovers: 0, pingTimeouts: 0, takeovers: 0, rateLimited: 0, holderSends: 0, holderFallbacks: 0, acks: 0 });
  assert.equal((await routeState(env.hub, 'ac12-a')).route_state, 'attached');

  // B's own next send carries sender_route_stale: B reconnects, once.
  const fromB = await b.client.send('ac12-a', 'chat', { n: 1 });
  assert.equal(fromB.senderRouteStale, true);
  assert.equal(fromB.delivery, 'pushed_to_ws');
  assert.equal(b.client.stats().selfHealReconnects, 1);
  await waitFor('b to reattach', () => b.client.stats().reconnects === 1);
  await waitFor('the hub to see b attached', async () => (await routeState(env.hub, 'ac12-b')).route_state === 'attached');
  assert.equal(a.client.stats().reconnects, 0, 'a never reconnected');
  assert.equal(b.client.stats().selfHealReconnects, 1, 'one self-heal reconnect for one stale connection');
});

test('a half-open connection is healed by the agent\'s own next send, and nothing sent meanwhile is lost', async (t) => {
  const a = await agent('half-a');
  const b = await agent('half-b');
  t.after(async () => { await a.close(); await b.close(); });

  await a.client.send('half-b', 'chat', { n: 1 });
  await waitFor('b to get 1 live', () => b.inbox.signals.length === 1);

  b.proxy.freezeWebSockets();
  await waitFor('the hub to detach b', async () => (await routeState(env.hub, 'half-b')).route_state === 'route_without_queue');
  for (const n of [2, 3]) assert.equal((await a.client.send('half-b', 'chat', { n })).delivery, 'queued_offline');

  // Many concurrent sends that all report sender_route_stale cause one reconnect.
  const answers = await Promise.all([1, 2, 3].map((n) => b.client.send('half-a', 'reply', { n })));
  assert.ok(answers.some((r) => r.senderRouteStale), 'the hub reported b\'s own route stale');
  await waitFor('b to reattach and receive 2..3', () => b.inbox.signals.length === 3);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3]);
  await waitFor('b to reattach', () => b.client.stats().reconnects === 1);
  await waitFor('the hub to see b attached', async () => (await routeState(env.hub, 'half-b')).route_state === 'attached');
  assert.equal(b.client.stats().selfHealReconnects, 1);

  // Healed: the next send to b is pushed live again.
  assert.equal((await a.client.send('half-b', 'chat', { n: 4 })).delivery, 'pushed_to_ws');
  await waitFor('b to get 4 live', () => b.inbox.signals.length === 4);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3, 4]);
  await waitFor('a to get b\'s three replies', () => a.inbox.signals.length === 3);
});

const fastPings = { pingIntervalMs: 50, pingTimeoutMs: 1000, reconnectBaseDelayMs: 5, reconnectMaxDelayMs: 50 };

test('a path that died silently is found by the keepalive: no pong, a reconnect, nothing lost', async (t) => {
  const a = await agent('ka-a');
  const b = await agent('ka-b', fastPings);
  t.after(async () => { await a.close(); await b.close(); });

  await a.client.send('ka-b', 'chat', { n: 1 });
  await waitFor('b to get 1 live', () => b.inbox.signals.length === 1);

  // The path carries nothing any more, and neither end is told: the hub
  // still sees b attached, and b's socket just stays quiet.
  assert.equal(b.proxy.stallWebSockets(), 1);
  assert.equal((await a.client.send('ka-b', 'chat', { n: 2 })).delivery, 'pushed_to_ws', 'the hub cannot tell yet');
  await waitFor('b to find the path dead and reattach', () => b.client.stats().pingTimeouts >= 1 && b.client.stats().reconnects >= 1);
  await a.client.send('ka-b', 'chat', { n: 3 });
  await waitFor('b to get 2 (replayed) and 3', () => b.inbox.signals.length === 3);
  assert.deepEqual(b.inbox.ns(), [1, 2, 3]);
  assert.equal(b.client.stats().selfHealReconnects, 0, 'b never sent: the keepalive alone repaired the route');
});

test('a busy onSignal that holds the socket paused is no ping timeout', async (t) => {
  /** @type {() => void} */
  let release = () => {};
  const gate = new Promise((r) => (release = () => r(undefined)));
  const logs = new LogRecorder();
  let handled = 0;
  const a = await agent('busy-a');
  const b = await agent('busy-b', {
    ...fastPings, pingIntervalMs: 5, pingTimeoutMs: 1000, logger: logs,
    onSignal: async () => { await gate; handled++; },
  });
  t.after(async () => { release(); await a.close(); await b.close(); });

  // One signal in onSignal, 64 queued: the socket is paused past that.
  const n = 70;
  for (let i = 1; i <= n; i++) await a.client.send('busy-b', 'chat', { n: i });
  await waitFor('a ping to go unanswered behind the busy handler', () =>
    logs.find('marconi: ping unanswered while onSignal held the socket paused; not judged').length > 0);
  release();
  await waitFor('b to handle every signal', () => handled === n);
  assert.equal(b.client.stats().pingTimeouts, 0, 'a busy handler was taken for a dead path');
  assert.equal(b.client.stats().reconnects, 0);
});
