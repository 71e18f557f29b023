// Two hub instances on one Postgres schema: a sticky session follows
// wrong_instance to its instance and, when that instance dies, is taken over
// (affinity_reset reaches the application); a client given both URLs fails
// over when one dies; sends follow the hub's hint to the instance holding
// the recipient's queue. Needs MARCONI_TEST_DATABASE_URL (skips without it,
// fails without it when MARCONI_TEST_REQUIRE_POSTGRES=1).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { dial } from '@marconihub/client';
import { Inbox, LogRecorder, apiKey, buildGo, freePort, postgresSchema, routeState, startHub, waitFor } from './support/hub.js';

const pg = await postgresSchema();
const skip = pg ? false : 'MARCONI_TEST_DATABASE_URL is not set';

/** @type {{bins: Record<string, string>, cleanup: () => Promise<void>}} */
let build;
/** @type {Map<string, import('./support/hub.js').Hub>} */
const hubs = new Map();

before(async () => {
  if (!pg) return;
  build = await buildGo({ marconi: './cmd/marconi' });
  // One at a time: the first applies the migrations.
  for (const id of ['hub-a', 'hub-b']) hubs.set(id, await instance(id));
}, { timeout: 120000 });
after(async () => {
  for (const h of hubs.values()) await h.stop();
  await build?.cleanup();
  await pg?.cleanup();
});

/**
 * An instance on the shared schema, quick to be declared dead.
 * @param {string} id
 * @param {string} [publicURL] what it advertises; default its own URL
 */
async function instance(id, publicURL = '') {
  if (!pg) throw new Error('no Postgres');
  const port = await freePort();
  return startHub(build.bins.marconi, {
    port,
    env: {
      MARCONI_DATABASE_URL: pg.url,
      MARCONI_INSTANCE_ID: id,
      MARCONI_PUBLIC_URL: publicURL || `http://127.0.0.1:${port}`,
      MARCONI_INSTANCE_HEARTBEAT_SECONDS: '1',
      MARCONI_INSTANCE_DEAD_AFTER_SECONDS: '3',
    },
  });
}

/** @param {string} id */
function hub(id) {
  const h = hubs.get(id);
  if (!h) throw new Error(`no instance ${id}`);
  return h;
}

const fast = { reconnectBaseDelayMs: 50, reconnectMaxDelayMs: 500 };

test('sticky: wrong_instance is followed; when the instance dies the survivor takes over and the app is told', { skip }, async (t) => {
  const b = hub('hub-b');
  // Ties go home: the sender is placed on hub-b, the recipient on the emptier hub-a.
  const sender = await dial({ hubURL: b.url, apiKey, surface: 'claude_code', sessionID: 'pg-sender', runtimeMode: 'sticky', ...fast });
  const log = new LogRecorder();
  const inbox = new Inbox();
  /** @type {import('@marconihub/client').AffinityReset[]} */
  const resets = [];
  const r = await dial({
    hubURL: b.url, apiKey, surface: 'claude_code', sessionID: 'pg-recipient', runtimeMode: 'sticky', ...fast,
    onSignal: inbox.on, onAffinityReset: (x) => { resets.push(x); }, logger: log,
  });
  t.after(async () => { await sender.close(); await r.close(); });

  const follows = log.find('marconi: following wrong_instance');
  assert.equal(follows.length, 1);
  assert.equal(follows[0].fields.instance_url, hub('hub-a').url);
  const rs = await routeState(b, 'pg-recipient');
  assert.equal(rs.store.runtime_mode, 'sticky');
  assert.equal(rs.queue.instance_id, 'hub-a');

  for (const n of [1, 2]) assert.equal((await sender.send('pg-recipient', 'chat', { n })).delivery, 'pushed_to_ws');
  await waitFor('1..2 live through hub-a', () => inbox.signals.length === 2);

  // hub-a dies without a goodbye; 3 is sent meanwhile. hub-b takes the
  // session over once hub-a's heartbeat ages out; the welcome says
  // affinity_reset and the retained 3 is replayed.
  await hub('hub-a').stop('SIGKILL');
  hubs.delete('hub-a');
  await sender.send('pg-recipient', 'chat', { n: 3 });
  await waitFor('the takeover by hub-b', async () => (await routeState(b, 'pg-recipient')).queue.instance_id === 'hub-b', { timeoutMs: 20000 });
  await waitFor('the application to be told', () => resets.length > 0);
  await waitFor('3 to arrive', () => inbox.signals.length === 3);
  assert.deepEqual(inbox.ns(), [1, 2, 3]);
  assert.deepEqual(resets, [{ reason: 'affinity_reset', dropped: 0 }]);
  assert.equal(r.stats().reregistrations, 0, 'the same session, resumed');
  const attached = log.find('marconi: attached').filter((l) => l.fields.affinity_reset);
  assert.equal(attached.length, 1);
  assert.equal(attached[0].fields.instance_id, 'hub-b');
});

test('several hub URLs: when the first dies the client fails over to the next, and sends go on', { skip }, async (t) => {
  const c = await instance('hub-c');
  hubs.set('hub-c', c);
  const b = hub('hub-b');
  const inbox = new Inbox();
  const recipient = await dial({ hubURL: c.url, hubURLs: [b.url], apiKey, surface: 'claude_code', sessionID: 'pg-multi', onSignal: inbox.on, ...fast });
  const sender = await dial({ hubURL: b.url, apiKey, surface: 'claude_code', sessionID: 'pg-multi-sender', ...fast });
  t.after(async () => { await recipient.close(); await sender.close(); });
  assert.equal((await routeState(b, 'pg-multi')).queue.instance_id, 'hub-c');

  await c.stop('SIGKILL');
  hubs.delete('hub-c');
  await sender.send('pg-multi', 'chat', { n: 1 });
  await waitFor('the recipient to fail over to hub-b', async () => (await routeState(b, 'pg-multi')).queue.instance_id === 'hub-b', { timeoutMs: 20000 });
  assert.ok(recipient.stats().failovers >= 1);
  await waitFor('1 to arrive', () => inbox.signals.length === 1);
  // The recipient's own sends now go to hub-b as well.
  assert.equal((await recipient.send('pg-multi-sender', 'chat', { n: 1 })).delivery, 'pushed_to_ws');
  assert.deepEqual(inbox.ns(), [1]);
});

/**
 * Signals the hub stored on a send it answered (marconi_signals_sent_total, all deliveries).
 * @param {import('./support/hub.js').Hub} h
 */
async function stored(h) {
  const text = await (await fetch(`${h.url}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^marconi_signals_sent_total\{[^}]*\} (\S+)$/gm)) n += Number(m[1]);
  return n;
}

test('holder routing: sends follow the hint to the recipient\'s instance; a hint to a closed port falls back once; off, none', { skip }, async (t) => {
  const b = hub('hub-b');
  // hub-e advertises a port nobody listens on: a hint to it cannot be dialed.
  const e = await instance('hub-e', `http://127.0.0.1:${await freePort()}`);
  hubs.set('hub-e', e);
  const inB = new Inbox();
  const inE = new Inbox();
  const log = new LogRecorder();
  const onB = await dial({ hubURL: b.url, apiKey, surface: 'claude_code', sessionID: 'pg-holder-b', onSignal: inB.on, ...fast });
  const onE = await dial({ hubURL: e.url, apiKey, surface: 'claude_code', sessionID: 'pg-holder-e', onSignal: inE.on, ...fast });
  const viaE = await dial({ hubURL: e.url, apiKey, surface: 'claude_code', sessionID: 'pg-holder-s1', ...fast });
  const viaB = await dial({ hubURL: b.url, apiKey, surface: 'claude_code', sessionID: 'pg-holder-s2', logger: log, ...fast });
  const off = await dial({ hubURL: e.url, apiKey, surface: 'claude_code', sessionID: 'pg-holder-s3', noHolderRouting: true, ...fast });
  t.after(async () => { for (const c of [onB, onE, viaE, viaB, off]) await c.close(); });
  assert.equal((await routeState(b, 'pg-holder-b')).queue.instance_id, 'hub-b');
  assert.equal((await routeState(b, 'pg-holder-e')).queue.instance_id, 'hub-e');

  // Sent through hub-e, to a recipient held by hub-b: once hub-e knows
  // hub-b's URL (its next membership read) the answer names it, and the
  // next sends go to hub-b itself.
  let n = 0;
  await waitFor('a send to reach hub-b on the hint', async () => {
    await viaE.send('pg-holder-b', 'chat', { n: ++n });
    return viaE.stats().holderSends > 0;
  }, { timeoutMs: 10000 });
  let [atB, atE] = [await stored(b), await stored(e)];
  for (let i = 0; i < 5; i++) await viaE.send('pg-holder-b', 'chat', { n: ++n });
  assert.equal(await stored(b) - atB, 5, 'all five appended on the holder');
  assert.equal(await stored(e) - atE, 0, 'none through hub-e');
  assert.equal(viaE.stats().holderSends, 6);
  assert.equal(viaE.stats().holderFallbacks, 0);

  // The switch off: the same hub, the same recipient, no routing.
  [atB, atE] = [await stored(b), await stored(e)];
  for (let i = 0; i < 3; i++) await off.send('pg-holder-b', 'chat', { n: ++n });
  assert.equal(await stored(e) - atE, 3, 'all three through hub-e');
  assert.equal(await stored(b) - atB, 0);
  assert.equal(off.stats().holderSends, 0);
  const want = Array.from({ length: n }, (_, i) => i + 1);
  await waitFor(`1..${n} at the recipient on hub-b`, () => inB.signals.length >= n);
  assert.deepEqual(inB.ns(), want, 'each once, in order');

  // Through hub-b to the recipient on hub-e, whose advertised port is
  // closed: the send on the hint is not dialable, so it goes through the
  // hub URL at once; that URL is then left alone (holderRetryAfterMs)
  // though hub-b's answers keep naming it: one failed dial, not one per send.
  let m = 0;
  [atB, atE] = [await stored(b), await stored(e)];
  await waitFor('a send on the closed port\'s hint to fall back', async () => {
    await viaB.send('pg-holder-e', 'chat', { n: ++m });
    return viaB.stats().holderFallbacks > 0;
  }, { timeoutMs: 10000 });
  for (let i = 0; i < 5; i++) await viaB.send('pg-holder-e', 'chat', { n: ++m });
  const st = viaB.stats();
  assert.deepEqual([st.holderFallbacks, st.holderSends, st.sendRetries], [1, 0, 0], 'one fallback, no retry');
  assert.equal(log.find('marconi: the recipient\'s instance is unreachable; sending through the hub URL').length, 1);
  assert.equal(await stored(b) - atB, m, 'each stored once, through hub-b');
  assert.equal(await stored(e) - atE, 0);
  await waitFor(`1..${m} at the recipient on hub-e`, () => inE.signals.length >= m);
  assert.deepEqual(inE.ns(), Array.from({ length: m }, (_, i) => i + 1), 'none lost, none twice, in order');
});
