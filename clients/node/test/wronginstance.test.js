// A 409 wrong_instance whose instance_url the session token may not go to is
// not followed, against a fake hub over https (Go's
// TestFakeWrongInstanceNotFollowedWhereTheTokenMayNotGo): the attach fails
// with the hub's error, and the named URL is never asked.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { selfSigned } from './support/tls.js';

// The fake hub's certificate is self-signed. The client runs in a child
// process (support/dial.js) started with NODE_EXTRA_CA_CERTS naming it: that
// process trusts this one certificate besides the usual ones, and checks
// every certificate as a user's would. Node 20 has no API to trust one
// certificate at run time, and the client takes no CA of its own.
const tls = selfSigned();
/** @type {string} */
let dir;
/** @type {string} */
let caFile;
before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'marconi-node-tls-'));
  caFile = path.join(dir, 'hub.pem');
  await writeFile(caFile, tls.cert);
});
after(() => rm(dir, { recursive: true, force: true }));

const dialChild = path.join(path.dirname(fileURLToPath(import.meta.url)), 'support', 'dial.js');

/**
 * Dials hubURL in a child process that trusts the fake hub's certificate
 * when trust is true, and no certificate of its own otherwise.
 * @param {string} hubURL
 * @param {{trust: boolean}} opts
 * @returns {Promise<{error: any, logs: {level: string, msg: string}[]}>}
 */
function dialInChild(hubURL, { trust }) {
  /** @type {NodeJS.ProcessEnv} */
  const env = { ...process.env };
  delete env.NODE_TLS_REJECT_UNAUTHORIZED;
  delete env.NODE_EXTRA_CA_CERTS;
  if (trust) env.NODE_EXTRA_CA_CERTS = caFile;
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, [dialChild], { env, timeout: 60000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${dialChild}: ${err.message}\n${stderr}`));
      else resolve(JSON.parse(stdout));
    });
    child.stdin?.end(JSON.stringify({ hubURL, sessionID: 'wi-a' }));
  });
}

/**
 * @param {import('node:net').Server} srv
 * @returns {Promise<number>} the loopback port it listens on
 */
async function listen(srv) {
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(undefined)));
  const addr = srv.address();
  assert.ok(addr && typeof addr === 'object');
  return addr.port;
}

/**
 * A hub over https that registers any session and answers every attach 409
 * wrong_instance naming instanceURL. paths lists what it was asked.
 * @param {string} instanceURL
 */
async function fakeHub(instanceURL) {
  /** @type {string[]} */
  const paths = [];
  const srv = https.createServer(tls, (req, res) => {
    paths.push(`${req.method} ${req.url}`);
    req.resume();
    if (req.method === 'POST' && req.url === '/v1/sessions') {
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ session_id: 'wi-a', token: 'tok-secret', heartbeat_interval_seconds: 3600 }));
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { code: 'not_found', message: 'not found' } }));
  });
  srv.on('upgrade', (req, socket) => {
    paths.push(`${req.method} ${req.url} (upgrade)`);
    const body = JSON.stringify({ error: { code: 'wrong_instance', message: 'elsewhere', instance_id: 'b', instance_url: instanceURL } });
    socket.end(`HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  });
  const port = await listen(srv);
  return { url: `https://127.0.0.1:${port}`, paths, close: () => new Promise((resolve) => { srv.closeAllConnections(); srv.close(resolve); }) };
}

for (const [name, scheme] of [['plain http named by a hub reached over https', 'http'], ['not an http(s) URL', 'ftp']]) {
  test(`wrong_instance to ${name} is not followed: the attach fails with the hub's error, the token never goes there`, async (t) => {
    // The instance the hub names: a plain http server that records every
    // request and every token presented to it.
    /** @type {string[]} */
    const asked = [];
    const named = http.createServer((req, res) => {
      asked.push(`${req.method} ${req.url} ${req.headers.authorization ?? ''} ${req.headers['x-marconi-session-token'] ?? ''}`);
      res.writeHead(500);
      res.end();
    });
    named.on('upgrade', (req, socket) => {
      asked.push(`${req.method} ${req.url} (upgrade) ${req.headers.authorization ?? ''}`);
      socket.destroy();
    });
    const instanceURL = `${scheme}://127.0.0.1:${await listen(named)}`;
    const hub = await fakeHub(instanceURL);
    t.after(async () => { await hub.close(); named.closeAllConnections(); await new Promise((resolve) => named.close(resolve)); });

    const { error: err, logs } = await dialInChild(hub.url, { trust: true });
    assert.ok(err?.marconiError, `dial: ${JSON.stringify(err)}, want the hub's MarconiError`);
    assert.equal(err.status, 409);
    assert.equal(err.code, 'wrong_instance');
    assert.equal(err.instanceURL, instanceURL);
    assert.ok(hub.paths.some((p) => p.startsWith('GET /v1/ws')), `the hub was asked to attach: ${hub.paths}`);
    assert.deepEqual(asked, [], 'the named instance was asked');
    assert.equal(logs.filter((l) => l.msg === 'marconi: not following wrong_instance to an instance_url the session token may not go to (publish https:// instance URLs on an https fleet: docs/operations.md)').length, 1);
  });
}

test('the client checks the fake hub\'s certificate: without it trusted, the dial fails before the hub is asked anything', async (t) => {
  const hub = await fakeHub('https://127.0.0.1:1');
  t.after(() => hub.close());
  const { error: err } = await dialInChild(hub.url, { trust: false });
  assert.equal(err?.name, 'TransportError', `dial: ${JSON.stringify(err)}, want a TransportError`);
  assert.match(`${err.message} ${err.cause}`, /certificate/i);
  assert.deepEqual(hub.paths, [], 'the hub was asked over a connection whose certificate was not checked');
});
