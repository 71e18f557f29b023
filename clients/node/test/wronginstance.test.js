// A 409 wrong_instance whose instance_url the session token may not go to is
// not followed, against a fake hub over https (Go's
// TestFakeWrongInstanceNotFollowedWhereTheTokenMayNotGo): the attach fails
// with the hub's error, and the named URL is never asked.

import assert from 'node:assert/strict';
import http from 'node:http';
import https from 'node:https';
import { test } from 'node:test';
import { MarconiError, dial } from '@marconihub/client';
import { LogRecorder } from './support/hub.js';
import { selfSigned } from './support/tls.js';

// The fake hub's certificate is self-signed: this file's process (node --test
// runs each file in its own) does not verify it. Node 20 has no API to trust
// one certificate at run time.
process.env.NODE_TLS_REJECT_UNAUTHORIZED = '0';

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
  const srv = https.createServer(selfSigned(), (req, res) => {
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

    const log = new LogRecorder();
    const err = await dial({ hubURL: hub.url, apiKey: 'key', surface: 'claude_code', sessionID: 'wi-a', onSignal: () => {}, logger: log })
      .then(async (c) => { await c.close(); return null; }, (e) => e);
    assert.ok(err instanceof MarconiError, `dial: ${err}, want the hub's MarconiError`);
    assert.equal(err.status, 409);
    assert.equal(err.code, 'wrong_instance');
    assert.equal(err.instanceURL, instanceURL);
    assert.ok(hub.paths.some((p) => p.startsWith('GET /v1/ws')), `the hub was asked to attach: ${hub.paths}`);
    assert.deepEqual(asked, [], 'the named instance was asked');
    assert.equal(log.find('marconi: not following wrong_instance to an instance_url the session token may not go to (publish https:// instance URLs on an https fleet: docs/operations.md)').length, 1);
  });
}
