// The store's history, against a fake hub (Go's TestFakeDrainFollowsTheHistory
// and TestFakeAckUnderAnOldHistoryIsDroppedAndTheSignalsComeAgain): a client
// that drains while its WebSocket is down names the history its seqs came
// under; an ack refused history_changed (the store failed over meanwhile)
// is no warning, and the next drain, answered from the acknowledged seq
// under the new history, delivers the signals that took the lost seqs.

import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { WebSocketServer } from 'ws';
import { dial } from '@marconihub/client';
import { LogRecorder, waitFor } from './support/hub.js';

const sig = (/** @type {string} */ id, /** @type {number} */ seq) => ({
  id, seq, from_session: 'peer', to_session: 's1', kind: 'k', payload: null, created_at: '2030-01-01T00:00:00Z',
});
// History A holds a1..a3; B, the promoted standby, lost a3 and gave its seq
// to b3, then b4 came.
const histories = {
  A: [sig('a1', 1), sig('a2', 2), sig('a3', 3)],
  B: [sig('a1', 1), sig('a2', 2), sig('b3', 3), sig('b4', 4)],
};

/**
 * A fake hub: one WebSocket attach (welcomed under A, then cut), every later
 * attach refused 503, so the client drains; its store fails over from A to B
 * as the first HTTP ack arrives, which it then refuses.
 */
function fakeHub() {
  /** @type {'A' | 'B'} */
  let current = 'A';
  let attaches = 0;
  /** @type {{drains: string[], acks: string[]}} */
  const seen = { drains: [], acks: [] };
  const json = (/** @type {http.ServerResponse} */ res, /** @type {number} */ status, /** @type {any} */ body) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  const wss = new WebSocketServer({ noServer: true });
  const srv = http.createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    let body = '';
    for await (const chunk of req) body += chunk;
    if (req.method === 'POST' && url.pathname === '/v1/sessions') {
      return json(res, 201, { session_id: 's1', token: 'tok-s1', tenant_id: 't', project_id: 'p', surface: 'claude_code',
        runtime_mode: 'stateless', runtime_mode_source: 'default', heartbeat_interval_seconds: 3600 });
    }
    if (req.method === 'GET' && url.pathname === '/v1/signals') {
      const after = Number(url.searchParams.get('after_seq') ?? '0');
      const history = url.searchParams.get('history') ?? '';
      seen.drains.push(`${after}@${history}`);
      const changed = history !== '' && history !== current;
      const from = changed ? 0 : after;
      const signals = histories[current].filter((s) => s.seq > from);
      return json(res, 200, { signals, next_after_seq: signals.length ? signals[signals.length - 1].seq : from,
        history: current, ...(changed ? { history_changed: true } : {}) });
    }
    if (req.method === 'POST' && url.pathname === '/v1/signals/ack') {
      const a = JSON.parse(body);
      seen.acks.push(`${a.up_to_seq}@${a.history ?? ''}`);
      current = 'B'; // the store fails over as the first ack is on its way
      if (a.history && a.history !== current) {
        return json(res, 409, { error: { code: 'history_changed', message: 'another history' } });
      }
      return json(res, 200, { acked: 1 });
    }
    if (req.method === 'POST' && url.pathname === '/v1/heartbeat') {
      return json(res, 200, { session_id: 's1', route_state: 'route_without_queue', pending: [] });
    }
    json(res, 503, { error: { code: 'draining', message: 'no' } });
  });
  srv.on('upgrade', (req, socket, head) => {
    if (attaches++ > 0) {
      socket.end('HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 47\r\n\r\n{"error":{"code":"draining","message":"later"}}');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.send(JSON.stringify({ type: 'welcome', session_id: 's1', instance_id: 'a', resumed: false, affinity_reset: false, replayed: 0, history: 'A' }));
      ws.close(1012, 'restarting');
    });
  });
  return { srv, seen, close: () => new Promise((r) => { wss.close(); srv.closeAllConnections(); srv.close(() => r(undefined)); }) };
}

test('a drain names the history its seqs came under; an ack refused history_changed is dropped and the next drain brings what took the seqs', async () => {
  const hub = fakeHub();
  await new Promise((r) => hub.srv.listen(0, '127.0.0.1', () => r(undefined)));
  const addr = /** @type {import('node:net').AddressInfo} */ (hub.srv.address());
  /** @type {string[]} */
  const got = [];
  const log = new LogRecorder();
  const client = await dial({
    hubURL: `http://127.0.0.1:${addr.port}`, apiKey: 'k', surface: 'claude_code', sessionID: 's1',
    onSignal: (s) => { got.push(s.id); },
    logger: log, reconnectBaseDelayMs: 5, reconnectMaxDelayMs: 20, ackIntervalMs: 1,
  });
  try {
    await waitFor('a1..a3, then b3 and b4 that took the lost seq and the next', () => got.join(',') === 'a1,a2,a3,b3,b4', {
      fail: () => (got.length > 5 ? `got ${got}` : null),
    });
    await waitFor('the ack of b4 under B', () => hub.seen.acks.includes('4@B'));
    assert.equal(hub.seen.acks[0], '3@A', 'the first ack names the history a1..a3 came under');
    const i = hub.seen.drains.indexOf('3@A');
    assert.ok(i >= 0, `a drain after 3 under A, answered from the acknowledged seq under B: ${hub.seen.drains}`);
    assert.ok(!hub.seen.drains.includes('3@B'), `never after 3 under B, which would skip b3: ${hub.seen.drains}`);
    assert.deepEqual(log.lines.filter((l) => l.level === 'warn' && l.msg === 'marconi: ack failed'), [], 'the refused ack is no warning');
  } finally {
    await client.close();
    await hub.close();
  }
});
