// Agents that come back and agents that are told: the token kept in a file
// across a restart, the 'fatal' event when the client stops for good, and a
// fleet on one API key that meets the registration quota and still comes up.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { MarconiError, ReplacedError, dial, fileTokenStore } from '@marconihub/client';
import { Inbox, LogRecorder, apiKey, startHub, useHub, waitFor } from './support/hub.js';
import { Proxy } from './support/proxy.js';

const env = useHub();

/** A fresh directory, removed after the test. */
async function tempDir(/** @type {import('node:test').TestContext} */ t) {
  const dir = await mkdtemp(path.join(tmpdir(), 'marconi-node-keep-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

test('fileTokenStore: nothing kept is null; a save makes the directory 0700 and the file 0600, whole, with the project; an older file loads; a tenant or project not a string is dropped; a bad file is an error', async (t) => {
  const dir = path.join(await tempDir(t), 'state', 'agent');
  const file = path.join(dir, 'token.json');
  const store = fileTokenStore(file);
  assert.equal(await store.load(), null);
  await Promise.all([store.save({ sessionID: 'alice', token: 't-1' }), store.save({ sessionID: 'alice', token: 't-2' })]);
  assert.deepEqual(await store.load(), { sessionID: 'alice', token: 't-2' });
  assert.equal((await stat(dir)).mode & 0o777, 0o700);
  assert.equal((await stat(file)).mode & 0o777, 0o600);
  assert.deepEqual(await readdir(dir), ['token.json']);
  await store.save({ sessionID: 'alice', token: 't-3', tenantID: 'acme', projectID: 'team-a' });
  assert.deepEqual(await store.load(), { sessionID: 'alice', token: 't-3', tenantID: 'acme', projectID: 'team-a' });
  assert.deepEqual(JSON.parse(await readFile(file, 'utf8')), { session_id: 'alice', token: 't-3', tenant_id: 'acme', project_id: 'team-a' });
  await writeFile(file, '{"session_id":"alice","token":"t-4"}'); // an older client's file, without the project
  assert.deepEqual(await store.load(), { sessionID: 'alice', token: 't-4' });
  // A tenant or project of another JSON type costs both hints, not the token.
  for (const hintBad of [
    { json: '{"session_id":"alice","token":"t-5","tenant_id":5,"project_id":"team-a"}', dropped: 'tenant_id' },
    { json: '{"session_id":"alice","token":"t-5","tenant_id":"acme","project_id":7}', dropped: 'project_id' },
    { json: '{"session_id":"alice","token":"t-5","tenant_id":true}', dropped: 'tenant_id' },
  ]) {
    await writeFile(file, hintBad.json);
    assert.deepEqual(await store.load(), { sessionID: 'alice', token: 't-5', dropped: hintBad.dropped }, hintBad.json);
  }
  await writeFile(file, '{"session_id":"alice","token":"t-5","tenant_id":null,"project_id":null}'); // null reads as absent, as in Go
  assert.deepEqual(await store.load(), { sessionID: 'alice', token: 't-5' });
  for (const bad of ['not json', '{"session_id":"alice"}', '{"session_id":5,"token":"t-6"}', '{"session_id":"alice","token":6}']) {
    await writeFile(file, bad);
    await assert.rejects(store.load(), /not a kept session token/);
  }
});

test('an agent restarted with its token file resumes its session and gets what was sent meanwhile; without it, 403', async (t) => {
  const tokenFile = path.join(await tempDir(t), 'kept', 'token.json');
  const sender = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'keep-sender' });
  t.after(() => sender.close());
  const first = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'keep-agent', tokenFile });
  const kept1 = await fileTokenStore(tokenFile).load();
  assert.equal(kept1?.sessionID, 'keep-agent');
  await first.close(); // the process ends; the session lives until its TTL
  await sender.send('keep-agent', 'chat', { n: 1 });
  await sender.send('keep-agent', 'chat', { n: 2 });

  // The hub's message names a header and a field; the error also names the client's own settings.
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'keep-agent' }),
    { status: 403, code: 'forbidden', message: /set tokenFile \(or tokenStore\).*takeover: true/ });

  const inbox = new Inbox();
  /** @type {unknown[]} */
  const resets = [];
  const second = await dial({
    hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'keep-agent', tokenFile,
    onSignal: inbox.on, onAffinityReset: (r) => { resets.push(r); },
  });
  t.after(() => second.close());
  await waitFor('the restarted agent to get 1..2', () => inbox.signals.length === 2);
  assert.deepEqual(inbox.ns(), [1, 2]);
  const kept2 = await fileTokenStore(tokenFile).load();
  assert.equal(kept2?.sessionID, 'keep-agent');
  assert.notEqual(kept2?.token, kept1?.token, 'a resume rotates the token, and the new one is kept');
  assert.deepEqual(resets, []);
  assert.equal(second.stats().reregistrations, 0);

  // A file still holding the token the resume replaced: the error says so.
  const staleFile = path.join(await tempDir(t), 'stale.json');
  await fileTokenStore(staleFile).save({ sessionID: 'keep-agent', token: kept1?.token ?? '' });
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'keep-agent', tokenFile: staleFile }),
    { status: 403, code: 'forbidden', message: /the kept token is no longer current.*takeover: true/ });
});

test('an agent restarted with its token file names its kept project from its first request; an older file, a bad project, another project', async (t) => {
  const tokenFile = path.join(await tempDir(t), 'token.json');
  const store = fileTokenStore(tokenFile);
  /** Dials 'restarted' with the token file through a fresh recording proxy, closes it (the session stays live), and returns the requests it made. */
  const restart = async (/** @type {LogRecorder | undefined} */ logger) => {
    const proxy = new Proxy(env.hub.port);
    const url = await proxy.listen();
    t.after(() => proxy.close());
    const c = await dial({ hubURL: url, apiKey, surface: 'claude_code', sessionID: 'restarted', tokenFile, logger });
    await c.close();
    return { heads: proxy.requests(), stats: c.stats() };
  };
  await restart(undefined); // the first run registers, naming no project, and keeps the hub's
  const kept = await store.load();
  assert.equal(kept?.tenantID, 't1');
  assert.equal(kept?.projectID, 'p1');

  const followed = 'marconi: the hub names another project than the kept token\'s; following the hub\'s';
  const warning = 'marconi: the kept token\'s tenant or project is not an id of the contract; resuming without naming the project to the balancer until the hub answers';
  for (const c of [
    { name: 'kept project', fields: { tenant_id: 't1', project_id: 'p1' }, resume: 't1/p1', warned: false },
    { name: 'file of an older client', fields: {}, resume: undefined, warned: false },
    { name: 'line break in the project', fields: { tenant_id: 't1', project_id: 'p1\r\nx-evil: 1' }, resume: undefined, warned: true },
    { name: 'slash in the tenant', fields: { tenant_id: 't1/p1', project_id: 'p1' }, resume: undefined, warned: true },
    { name: 'tenant without a project', fields: { tenant_id: 't1' }, resume: undefined, warned: true },
    { name: 'number as the tenant', fields: { tenant_id: 5, project_id: 'p1' }, resume: undefined, warned: true },
    { name: 'object as the project', fields: { tenant_id: 't1', project_id: { id: 'p1' } }, resume: undefined, warned: true },
    { name: 'another project than the hub\'s', fields: { tenant_id: 't9', project_id: 'p9' }, resume: 't9/p9', warned: false, followed: true },
  ]) {
    const before = await store.load();
    await writeFile(tokenFile, JSON.stringify({ session_id: 'restarted', token: before?.token, ...c.fields }));
    const logs = new LogRecorder();
    const { heads, stats } = await restart(logs);
    const [first, ...rest] = heads;
    assert.equal(`${first.method} ${first.path}`, 'POST /v1/sessions', `${c.name}: the first request is the resume`);
    assert.equal(first.headers['x-marconi-project'], c.resume, `${c.name}: the resume's project`);
    assert.ok(rest.some((h) => h.method === 'GET' && h.path.startsWith('/v1/ws')), `${c.name}: the attach passed the proxy`);
    for (const h of rest) assert.equal(h.headers['x-marconi-project'], 't1/p1', `${c.name}: ${h.method} ${h.path} after the resume`);
    assert.equal(stats.reregistrations + stats.takeovers, 0, `${c.name}: a plain resume with the kept token`);
    const after = await store.load();
    assert.notEqual(after?.token, before?.token, `${c.name}: the resume's new token is kept`);
    assert.deepEqual([after?.tenantID, after?.projectID], ['t1', 'p1'], `${c.name}: the hub's project is kept`);
    assert.equal(logs.find(warning).length, c.warned ? 1 : 0, `${c.name}: an unusable kept project is logged`);
    for (const w of logs.find(warning)) assert.ok(!JSON.stringify(w).includes(before?.token ?? '-'), `${c.name}: the warning holds no token`);
    assert.equal(logs.find(followed).length, c.followed ? 1 : 0, `${c.name}: the hub's other project is logged as followed`);
  }
});

test('a token store the application provides is loaded at dial and saved on every new token', async (t) => {
  /** @type {import('@marconihub/client').SessionToken[]} */
  const saved = [];
  const store = { load: async () => saved.at(-1) ?? null, save: async (/** @type {any} */ tk) => { saved.push(tk); } };
  const a = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'own-store', tokenStore: store });
  await a.close();
  const b = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'own-store', tokenStore: store });
  t.after(() => b.close());
  assert.equal(saved.length, 2);
  assert.notEqual(saved[0].token, saved[1].token);
  await assert.rejects(
    dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', tokenStore: { load: async () => { throw new Error('disk gone'); }, save: async () => {} } }),
    /load the kept session token: disk gone/,
  );
  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', tokenFile: '/x', tokenStore: store }), TypeError);
});

test('an agent whose kept token names a session the hub lost (a memory-store hub restarted meanwhile) registers its id anew, and is told', async (t) => {
  const tokenFile = path.join(await tempDir(t), 'token.json');
  const hub = await startHub(env.bins.marconi);
  let current = hub;
  t.after(() => current.stop());
  const first = await dial({ hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: 'lost-n', tokenFile });
  await first.close();
  await hub.stop();
  current = await startHub(env.bins.marconi, { port: hub.port });

  const logs = new LogRecorder();
  /** @type {string[]} */
  const resets = [];
  const again = await dial({
    hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: 'lost-n', tokenFile, logger: logs,
    onAffinityReset: ({ reason }) => { resets.push(reason); },
  });
  t.after(() => again.close());
  await waitFor('onAffinityReset', () => resets.length > 0);
  assert.deepEqual(resets, ['reregistered']);
  assert.equal(again.stats().reregistrations, 1);
  const gone = logs.find('marconi: the kept token\'s session is gone (expired, deregistered, or a hub on the in-memory store restarted); registered the id anew, and what was sent to the old session is not delivered');
  assert.deepEqual(gone.map((l) => l.level), ['warn']);
});

test('a development hub restarted with a new API key: the client emits fatal once with the hub\'s 401 unauthorized', async (t) => {
  const hub = await startHub(env.bins.marconi);
  let current = hub;
  t.after(() => current.stop());
  /** @type {unknown[]} */
  const told = [];
  /** @type {unknown[]} */
  const events = [];
  const a = await dial({
    hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: 'fatal-a',
    reconnectBaseDelayMs: 20, reconnectMaxDelayMs: 200, onFatal: (err) => { told.push(err); },
  });
  t.after(() => a.close());
  a.on('fatal', (err) => events.push(err));

  await hub.stop();
  current = await startHub(env.bins.marconi, { port: hub.port, env: { MARCONI_API_KEYS: 'another-key-entirely=t1/p1' } });
  await waitFor('the fatal event', () => events.length > 0, { timeoutMs: 20000 });
  assert.equal(told.length, 1);
  assert.equal(events.length, 1);
  assert.equal(told[0], events[0]);
  const err = /** @type {MarconiError} */ (events[0]);
  assert.ok(err instanceof MarconiError);
  assert.equal(err.status, 401);
  assert.equal(err.code, 'unauthorized');
});

test('a newer connection with the kept token replaces the client: fatal with ReplacedError', async (t) => {
  const tokenFile = path.join(await tempDir(t), 'token.json');
  /** @type {unknown[]} */
  const events = [];
  const first = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'replaced-n', tokenFile });
  t.after(() => first.close());
  first.on('fatal', (err) => events.push(err));
  const second = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'replaced-n', tokenFile });
  t.after(() => second.close());
  await waitFor('the first client\'s fatal event', () => events.length > 0);
  assert.ok(events[0] instanceof ReplacedError);
  assert.equal(/** @type {ReplacedError} */ (events[0]).code, 'replaced');
});

// 150 rather than 100: the default quota's burst (twice 50 a second) would
// let 100 through without one 429.
test('150 agents started at once on one API key all come up (the hub\'s default registration quota)', async (t) => {
  const hub = await startHub(env.bins.marconi);
  t.after(() => hub.stop());
  const clients = await Promise.all(Array.from({ length: 150 }, (_, i) => dial({
    hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: `node-fleet-${i}`, pingIntervalMs: 0,
  }, { signal: AbortSignal.timeout(60000) })));
  t.after(() => Promise.all(clients.map((c) => c.close())));
  assert.equal(new Set(clients.map((c) => c.sessionID)).size, 150);
  const limited = clients.reduce((n, c) => n + c.stats().rateLimited, 0);
  assert.ok(limited > 0, 'the fleet met the quota this test is about');
});

test('a project at its live-session quota gets 429 quota_exceeded with no Retry-After: returned at once, not waited for', async (t) => {
  const hub = await startHub(env.bins.marconi, { env: { MARCONI_QUOTA_SESSIONS_PER_PROJECT: '1' } });
  t.after(() => hub.stop());
  const first = await dial({ hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: 'quota-first' });
  t.after(() => first.close());
  const logs = new LogRecorder();
  await assert.rejects(dial({ hubURL: hub.url, apiKey, surface: 'claude_code', sessionID: 'quota-second', logger: logs }), (err) => {
    assert.ok(err instanceof MarconiError);
    assert.equal(err.code, 'quota_exceeded');
    assert.equal(err.retryAfterSeconds, undefined);
    return true;
  });
  assert.deepEqual(logs.find('marconi: hub asks to wait (429); retrying after it'), []);
});
