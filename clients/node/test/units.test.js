// The client's pure parts: backoff, the sequencer, the delivery loop, the hub
// URLs' failover, the error decoder, linked signals, the holder hints.

import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { test } from 'node:test';
import { Backoff } from '../src/backoff.js';
import { projectRoute } from '../src/codes.js';
import { settle } from '../src/config.js';
import { Dispatcher } from '../src/delivery.js';
import { decodeError, permanent } from '../src/errors.js';
import { TransportError } from '../src/http.js';
import { Holders, notProcessed, tokenURL } from '../src/holders.js';
import { Hubs } from '../src/hubs.js';
import { newIdempotencyKey } from '../src/keys.js';
import { Sequencer } from '../src/sequencer.js';
import { linked } from '../src/signals.js';

test('backoff ceilings double from the base and stop at the cap', () => {
  const b = new Backoff(250, 15000);
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6, 7, 50].map((n) => b.ceiling(n)), [250, 500, 1000, 2000, 4000, 8000, 15000, 15000, 15000]);
});

test('a capped backoff keeps its base and random source, and only lowers the cap', () => {
  const b = new Backoff(250, 15000, () => 0.5);
  const r = b.capped(4000);
  assert.deepEqual([0, 1, 4, 5, 50].map((n) => r.ceiling(n)), [250, 500, 4000, 4000, 4000]);
  assert.equal(r.delay(10), 2000);
  assert.equal(b.ceiling(50), 15000, 'capped is a copy');
  assert.equal(b.capped(60000).ceiling(50), 15000, 'a cap above the max changes nothing');
});

test('settle: the restart cap defaults to 4000, is raised to the base, never above the max', () => {
  const base = { hubURL: 'http://h', apiKey: 'k', surface: 'codex' };
  assert.equal(settle(base).cfg.reconnectRestartMaxDelayMs, 4000);
  assert.equal(settle({ ...base, reconnectBaseDelayMs: 60000 }).cfg.reconnectRestartMaxDelayMs, 60000);
  assert.equal(settle({ ...base, reconnectMaxDelayMs: 1000 }).cfg.reconnectRestartMaxDelayMs, 1000);
  assert.throws(() => settle({ ...base, reconnectRestartMaxDelayMs: -1 }), TypeError);
});

test('backoff is full jitter: uniform from zero up to (not including) the ceiling', () => {
  assert.equal(new Backoff(250, 15000, () => 0).delay(3), 0);
  assert.equal(new Backoff(250, 15000, () => 0.5).delay(3), 1000);
  assert.equal(new Backoff(250, 15000, () => 0.999999).delay(3), 1999);
  const real = new Backoff(100, 1000);
  for (let i = 0; i < 200; i++) {
    const d = real.delay(2);
    assert.ok(d >= 0 && d < 400, `delay ${d} outside [0, 400)`);
  }
});

test('the sequencer delivers each id once, in seq order, and starts afresh with a new registration', () => {
  const s = new Sequencer(3);
  const sig = (/** @type {string} */ id, /** @type {number} */ seq) => ({ id, seq });
  assert.equal(s.accept(1, sig('a', 1)), true);
  assert.equal(s.accept(1, sig('a', 1)), false, 'the same signal again');
  assert.equal(s.accept(1, sig('c', 3)), true);
  assert.equal(s.accept(1, sig('b', 2)), false, 'below the highest delivered');
  assert.equal(s.accept(2, sig('x', 1)), true, 'a new registration numbers afresh');
  assert.equal(s.accept(1, sig('d', 4)), false, 'a signal of a registration that is gone');
  assert.equal(s.accept(2, sig('a', 2)), false, 'an id seen under the former registration');
  // Bounded: past capacity the oldest ids are forgotten.
  s.accept(2, sig('y', 3));
  s.accept(2, sig('z', 4));
  assert.equal(s.seen.size, 3);
  assert.equal(s.seen.has('a'), false);
});

test('the sequencer delivers signals whose seqs the hub gave again after its store lost the last ones', () => {
  const s = new Sequencer(4);
  const sig = (/** @type {string} */ id, /** @type {number} */ seq) => ({ id, seq });
  for (const [id, seq] of /** @type {const} */ ([['a', 1], ['b', 2], ['c', 3]])) assert.equal(s.accept(1, sig(id, seq)), true);
  // b and c were lost by the hub's store (an asynchronous standby promoted): x and y take their seqs.
  assert.equal(s.accept(1, sig('x', 2)), true, 'a new id at a seq delivered before');
  assert.equal(s.rewound, true);
  assert.equal(s.accept(1, sig('y', 3)), true);
  assert.equal(s.rewound, false);
  assert.equal(s.accept(1, sig('x', 2)), false, 'the same signal written again');
  assert.equal(s.accept(1, sig('z', 4)), true);
  // Past what is remembered, a lower seq is passed over as before.
  for (const [id, seq] of /** @type {const} */ ([['e', 5], ['f', 6], ['g', 7], ['h', 8]])) s.accept(1, sig(id, seq));
  assert.equal(s.accept(1, sig('w', 2)), false, 'a seq older than those remembered');
  assert.equal(s.bySeq.size, 4);
});

test('decodeError keeps the hub\'s code and survives bodies that are not the hub\'s', () => {
  const wrong = decodeError(409, '{"error":{"code":"wrong_instance","message":"elsewhere","instance_id":"b","instance_url":"http://b:8080"}}');
  assert.equal(wrong.code, 'wrong_instance');
  assert.equal(wrong.hubMessage, 'elsewhere');
  assert.equal(wrong.instanceURL, 'http://b:8080');
  const quota = decodeError(429, '{"error":{"code":"quota_exceeded","message":"sessions per project"}}', '7');
  assert.equal(quota.retryAfterSeconds, 7);
  for (const [status, body, msg] of /** @type {const} */ ([
    [502, '<html>Bad Gateway</html>', '<html>Bad Gateway</html>'],
    [503, '', 'HTTP 503'],
    [500, '{"error":{}}', '{"error":{}}'],
    [500, 'x'.repeat(500), 'x'.repeat(200)],
  ])) {
    const e = decodeError(status, body);
    assert.equal(e.code, 'unexpected_response');
    assert.equal(e.status, status);
    assert.equal(e.hubMessage, msg);
  }
  assert.equal(decodeError(429, '', 'soon').retryAfterSeconds, undefined);
  assert.equal(decodeError(429, '', '-3').retryAfterSeconds, undefined);
  assert.equal(decodeError(429, '', '0').retryAfterSeconds, undefined);
  assert.equal(decodeError(429, '', '99999999').retryAfterSeconds, undefined);
  const at = decodeError(429, '', new Date(Date.now() + 30000).toUTCString()).retryAfterSeconds ?? 0;
  assert.ok(at > 25 && at <= 30, `an HTTP date 30 s ahead reads as ${at} s`);
  assert.equal(permanent(decodeError(403, '{"error":{"code":"forbidden","message":""}}')), true);
  assert.equal(permanent(decodeError(503, '{"error":{"code":"draining","message":""}}')), false);
  assert.equal(permanent(new Error('x')), false);
});

test('linked signals follow their sources and leave nothing on them once done', async () => {
  const close = new AbortController();
  const caller = new AbortController();
  const a = linked([close.signal, caller.signal, undefined]);
  assert.equal(getEventListeners(close.signal, 'abort').length, 1);
  caller.abort(new Error('caller gave up'));
  assert.equal(a.signal.aborted, true);
  assert.equal(a.signal.reason.message, 'caller gave up');
  a.done();
  assert.equal(getEventListeners(close.signal, 'abort').length, 0, 'the long-lived signal keeps nothing of the call');

  const b = linked([close.signal], 5);
  await new Promise((resolve) => b.signal.addEventListener('abort', resolve, { once: true }));
  assert.equal(b.signal.reason.name, 'TimeoutError');
  b.done();

  const c = linked([close.signal]);
  c.done();
  close.abort();
  assert.equal(c.signal.aborted, false, 'unlinked: a later close no longer reaches it');
  assert.equal(linked([close.signal]).signal.aborted, true, 'an aborted source aborts at once');
});

test('the delivery loop: each signal once, a throwing handler logged, acks every 32 and when the queue empties, a bounded offer', async () => {
  const closing = new AbortController();
  /** @type {number[]} */
  const got = [];
  /** @type {[number, number][]} */
  const acks = [];
  /** @type {string[]} */
  const errors = [];
  let rooms = 0;
  const noop = () => {};
  const d = new Dispatcher({
    closing: closing.signal,
    handlers: {
      onSignal: (s) => {
        got.push(s.seq);
        if (s.seq === 2) throw new Error('poison');
      },
    },
    ack: async (epoch, upTo) => { acks.push([epoch, upTo]); },
    onRoom: () => rooms++,
    ackIntervalMs: 0, // this test is of ackEvery; the pacing has its own below
    log: { debug: noop, info: noop, warn: noop, error: (msg) => errors.push(msg) },
  });
  const sig = (/** @type {number} */ seq) => ({ id: `s${seq}`, seq, fromSession: 'a', toSession: 'b', kind: 'k', payload: null, createdAt: new Date(0) });
  for (let i = 0; i < 64; i++) d.enqueue({ signals: [sig(i < 3 ? i + 1 : 3)], epoch: 1 });
  assert.equal(d.full, true);
  d.offer({ signals: [sig(4)], epoch: 1 }); // dropped: it comes again from the hub
  const loop = d.run();
  // The loop runs until the queue is empty; then it waits.
  for (let i = 0; i < 1000 && acks.length < 2; i++) await new Promise((r) => setImmediate(r));
  assert.deepEqual(got, [1, 2, 3], 'duplicates dropped, the offer past the bound dropped, the poison signal handled');
  assert.deepEqual(errors, ['marconi: onSignal threw']);
  assert.deepEqual(acks, [[1, 3], [1, 3]], 'an ack after 32 deliveries while more were queued, and one once the queue is empty');
  assert.deepEqual(d.drainAfter(1), { seq: 3, history: '' });
  assert.deepEqual(d.drainAfter(2), { seq: 0, history: '' }, 'a new registration drains from the start');
  assert.ok(rooms > 0, 'the WebSocket is told there is room again');
  closing.abort();
  d.wake();
  await loop;
});

test('delivery: acks are paced, one per ackIntervalMs, the last covering every signal', async () => {
  const closing = new AbortController();
  /** @type {number[]} */
  const acks = [];
  /** @type {(() => void) | null} */
  let handled = null;
  const n = 100;
  /** @type {() => void} */
  let lastAcked = () => {};
  const allAcked = new Promise((r) => (lastAcked = () => r(undefined)));
  const noop = () => {};
  const d = new Dispatcher({
    closing: closing.signal,
    handlers: { onSignal: () => handled?.() },
    ack: async (_epoch, upTo) => {
      acks.push(upTo);
      if (upTo === n) lastAcked();
    },
    onRoom: noop,
    ackIntervalMs: 50,
    log: { debug: noop, info: noop, warn: noop, error: noop },
  });
  const loop = d.run();
  const started = performance.now();
  for (let seq = 1; seq <= n; seq++) { // one at a time: the queue is empty at each ack's turn
    // Resolved on the next turn of the event loop, once the dispatcher has
    // made its ack's decision with the queue empty.
    const done = new Promise((r) => (handled = () => setImmediate(r)));
    d.enqueue({ signals: [{ id: `s${seq}`, seq, fromSession: 'a', toSession: 'b', kind: 'k', payload: null, createdAt: new Date(0) }], epoch: 1 });
    await done;
  }
  const elapsed = performance.now() - started;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  const gaveUp = new Promise((r) => (timer = setTimeout(() => r('timeout'), 10000)));
  const ended = await Promise.race([allAcked, gaveUp]);
  clearTimeout(timer);
  assert.notEqual(ended, 'timeout', `the last ack never came: ${acks}`);
  assert.equal(acks[0], 1, 'the first signal after a quiet spell is acked at once');
  assert.ok(acks.length <= 2 + elapsed / 50, `${acks.length} acks for ${n} signals in ${elapsed.toFixed(0)} ms`);
  closing.abort();
  d.wake();
  await loop;
});

test('delivery: a page under another store history is adopted, deduplicated by id, and drained on from its through', async () => {
  const closing = new AbortController();
  /** @type {string[]} */
  const got = [];
  /** @type {string[]} */
  const acks = [];
  const noop = () => {};
  const d = new Dispatcher({
    closing: closing.signal,
    handlers: { onSignal: (s) => { got.push(s.id); } },
    ack: async (_epoch, upTo, history) => {
      if (upTo > 0) acks.push(`${upTo}@${history}`); // as the client's: an ack of nothing is not sent
    },
    onRoom: noop,
    ackIntervalMs: 0,
    log: { debug: noop, info: noop, warn: noop, error: noop },
  });
  const sig = (/** @type {string} */ id, /** @type {number} */ seq) => ({ id, seq, fromSession: 'a', toSession: 'b', kind: 'k', payload: null, createdAt: new Date(0) });
  const settled = async (/** @type {number} */ n) => {
    for (let i = 0; i < 1000 && acks.length < n; i++) await new Promise((r) => setImmediate(r));
  };
  const loop = d.run();
  // Drained under history A.
  d.enqueue({ signals: [sig('a1', 1), sig('a2', 2), sig('a3', 3)], epoch: 1, history: 'A', page: true, through: 3 });
  await settled(1);
  assert.deepEqual(d.drainAfter(1), { seq: 3, history: 'A' });
  // The store failed over: B lost a3 and gave seq 3 to b3. A drain under A is
  // answered from the acknowledged seq under B, a page holding only a1 and a2.
  d.enqueue({ signals: [sig('a1', 1), sig('a2', 2)], epoch: 1, history: 'B', page: true, through: 2 });
  for (let i = 0; i < 100; i++) await new Promise((r) => setImmediate(r));
  assert.deepEqual(d.drainAfter(1), { seq: 2, history: 'B' }, 'drain on after the page, under B: never after 3, which would skip b3');
  d.enqueue({ signals: [sig('b3', 3), sig('b4', 4)], epoch: 1, history: 'B', page: true, through: 4 });
  await settled(2);
  assert.deepEqual(got, ['a1', 'a2', 'a3', 'b3', 'b4'], 'each id once; b3 delivered at a seq delivered before');
  assert.deepEqual(acks, ['3@A', '4@B'], 'each ack names the history its seqs came under');
  assert.deepEqual(d.drainAfter(1), { seq: 4, history: 'B' });
  closing.abort();
  d.wake();
  await loop;
});

test('hub URLs: a failover moves round the list once per failed URL', () => {
  /** @type {string[]} */
  const moves = [];
  const hubs = new Hubs(['http://a', 'http://b'], {
    close: new AbortController().signal, timeoutMs: 1000, onFailover: (from, to) => moves.push(`${from}>${to}`),
  });
  assert.equal(hubs.base, 'http://a');
  hubs.failover('http://a', new TransportError('refused'));
  hubs.failover('http://a', new TransportError('refused')); // a second call that failed on a: moved already
  assert.equal(hubs.base, 'http://b');
  hubs.failover('http://b', new TransportError('refused'));
  assert.equal(hubs.base, 'http://a');
  assert.deepEqual(moves, ['http://a>http://b', 'http://b>http://a']);
});

test('holder hints: learned, forgotten with an answer that has none, bounded, and an unreachable URL left alone for a while', () => {
  let now = 1000;
  const h = new Holders(2, 500, ['http://hub'], () => now);
  assert.equal(h.route('r1'), '', 'nothing learned yet');
  h.learn('r1', 'http://i1/');
  assert.equal(h.route('r1'), 'http://i1', 'trailing slash trimmed');
  h.learn('r1', undefined);
  assert.equal(h.route('r1'), '', 'an answer without a hint forgets it');
  h.learn('r1', 'http://i1');
  h.learn('r2', 'http://i2');
  h.learn('r3', 'http://i3');
  assert.equal(h.size, 2, 'bounded');
  assert.equal(h.route('r1'), '', 'the first learned went');
  assert.equal(h.route('r3'), 'http://i3');

  h.unreachable('r3', 'http://i3');
  assert.equal(h.route('r3'), '', 'the hint is dropped');
  h.learn('r3', 'http://i3'); // the hub names it again
  assert.equal(h.route('r3'), '', 'left alone while retryAfter runs');
  h.learn('r3', 'http://i3');
  now += 500;
  assert.equal(h.route('r3'), 'http://i3', 'tried again once it ran out');
  h.forget('r3');
  assert.equal(h.route('r3'), '');
});

test('holder hints: a token goes only to an http(s) URL of the hub\'s answer, never downgraded from https', () => {
  const h = new Holders(8, 1000, ['https://hub.example', 'https://hub2.example']);
  for (const bad of ['', 'ftp://i', 'not a url', 'https://user:pw@i', 'https://i/?x=1', 'https://i/#f', 'http://i', 'https://hub.example/', ' https://i', 42, null]) {
    assert.equal(h.usable(bad), '', JSON.stringify(bad));
  }
  assert.equal(h.usable('https://lb.example/i/hub-b/'), 'https://lb.example/i/hub-b');
  assert.equal(new Holders(8, 1000, ['http://hub']).usable('http://10.0.0.2:8080'), 'http://10.0.0.2:8080');
});

test('holder hints: a loopback hint is followed only by a client that reaches a hub on loopback', () => {
  const remote = new Holders(8, 1000, ['http://lb.example:8080']);
  for (const local of ['http://127.0.0.1:8081', 'http://localhost:8081', 'http://api.localhost:8081', 'http://[::1]:8081',
    'http://0.0.0.0:8081', 'http://127.0.0.2:8081']) {
    assert.equal(remote.usable(local), '', local);
  }
  const onMachine = new Holders(8, 1000, ['http://127.0.0.1:8080']);
  assert.equal(onMachine.usable('http://127.0.0.1:8081'), 'http://127.0.0.1:8081');
  assert.equal(onMachine.usable('http://localhost:8081/i/hub-2'), 'http://localhost:8081/i/hub-2');
});

test('notProcessed: only a connection never made, or a balancer\'s own 502/503, is certain', () => {
  const sys = (/** @type {string} */ code, syscall = 'connect') => Object.assign(new Error(code), { code, syscall });
  const fetchFailed = (/** @type {Error} */ cause) => new TransportError('marconi: POST x: fetch failed', new TypeError('fetch failed', { cause }));
  assert.ok(notProcessed(fetchFailed(sys('ECONNREFUSED'))));
  assert.ok(notProcessed(fetchFailed(sys('ENOTFOUND', 'getaddrinfo'))));
  assert.ok(notProcessed(fetchFailed(sys('EHOSTUNREACH'))));
  assert.ok(notProcessed(fetchFailed(Object.assign(new AggregateError([sys('ECONNREFUSED'), sys('ENETUNREACH')]), { code: 'ECONNREFUSED' }))));
  assert.ok(notProcessed(decodeError(503, '<html>503 Service Unavailable: no server is available</html>')));
  assert.ok(notProcessed(decodeError(502, '')));
  assert.ok(!notProcessed(fetchFailed(sys('ECONNRESET', 'read'))), 'reset: it may have been stored');
  assert.ok(!notProcessed(fetchFailed(Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }))));
  assert.ok(!notProcessed(new TransportError('marconi: timed out', new DOMException('timeout', 'TimeoutError'))));
  assert.ok(!notProcessed(decodeError(503, '{"error":{"code":"draining","message":"m"}}')), 'the hub\'s own 503');
  assert.ok(!notProcessed(decodeError(504, '')), 'a gateway timeout may have been stored');
  assert.ok(!notProcessed(new Error('x')));
});

test('settle: holder routing options are checked and defaulted', () => {
  const base = { hubURL: 'http://h', apiKey: 'k', surface: 'codex' };
  const { cfg } = settle(base);
  assert.equal(cfg.holderHints, 1024);
  assert.equal(cfg.holderRetryAfterMs, 30000);
  assert.throws(() => settle({ ...base, holderHints: 0 }), TypeError);
  assert.throws(() => settle({ ...base, holderHints: 1.5 }), TypeError);
  assert.throws(() => settle({ ...base, holderRetryAfterMs: -1 }), TypeError);
  assert.throws(() => settle({ ...base, noHolderRouting: /** @type {any} */ ('yes') }), TypeError);
  assert.equal(cfg.ackIntervalMs, 500);
  assert.throws(() => settle({ ...base, ackIntervalMs: 0 }), TypeError);
});

test('idempotency keys: UUIDv7, never the same twice, each sorting after the one before', () => {
  const form = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
  const seen = new Set();
  let last = '';
  const before = Date.now();
  for (let i = 0; i < 10000; i++) { // more than 4096 in one millisecond, on a fast machine
    const k = newIdempotencyKey();
    assert.match(k, form);
    assert.ok(!seen.has(k), `key ${k} made twice`);
    assert.ok(k > last, `key ${k} made after ${last} sorts before it`);
    seen.add(k);
    last = k;
  }
  const ms = parseInt(last.slice(0, 8) + last.slice(9, 13), 16);
  assert.ok(ms >= before, `the last key's time ${ms} is before the first was made (${before})`);
});

test('tokenURL: a session token goes to an http(s) URL the hub named only when it is no downgrade from https and no loopback named to a remote client', () => {
  const cases = [
    [['https://hub.example'], 'https://i1.example/', 'https://i1.example'],
    [['https://hub.example'], 'http://i1.example', ''],
    [['http://hub.example'], 'http://i1.example', 'http://i1.example'],
    [['https://hub.example'], 'https://127.0.0.1:8080', ''],
    [['http://127.0.0.1:9000'], 'http://127.0.0.1:8080', 'http://127.0.0.1:8080'],
    [['https://hub.example'], 'https://u:p@i1.example', ''],
    [['https://hub.example'], 'https://i1.example/?x=1', ''],
    [['https://hub.example'], 'wss://i1.example', ''],
    [['https://hub.example'], '', ''],
    [['https://hub.example'], 42, ''],
  ];
  for (const [hubs, raw, want] of cases) {
    assert.equal(tokenURL(/** @type {string[]} */ (hubs), raw), want, `tokenURL(${JSON.stringify(hubs)}, ${JSON.stringify(raw)})`);
  }
});

test('delivery: flush sends at once the ack that ackIntervalMs holds back, and nothing when none waits', async () => {
  const closing = new AbortController();
  /** @type {number[]} */
  const acks = [];
  /** @type {(() => void) | null} */
  let handled = null;
  const noop = () => {};
  const d = new Dispatcher({
    closing: closing.signal,
    handlers: { onSignal: () => handled?.() },
    ack: async (_epoch, upTo) => { acks.push(upTo); },
    onRoom: noop,
    ackIntervalMs: 3600000, // the second signal's ack would wait an hour
    log: { debug: noop, info: noop, warn: noop, error: noop },
  });
  const loop = d.run();
  for (let seq = 1; seq <= 2; seq++) {
    const done = new Promise((r) => (handled = () => setImmediate(r)));
    d.enqueue({ signals: [{ id: `s${seq}`, seq, fromSession: 'a', toSession: 'b', kind: 'k', payload: null, createdAt: new Date(0) }], epoch: 1 });
    await done;
  }
  assert.deepEqual(acks, [1], 'the first acked at once, the second held back');
  await d.flush();
  assert.deepEqual(acks, [1, 2], 'flush sent the held-back ack');
  await d.flush();
  assert.deepEqual(acks, [1, 2], 'a second flush has nothing to send');
  closing.abort();
  d.wake();
  await loop;
});

test('projectRoute names two ids of the contract, and nothing else', () => {
  assert.equal(projectRoute('t1', 'p1'), 't1/p1');
  assert.equal(projectRoute('acme.corp', 'team_a-1'), 'acme.corp/team_a-1');
  for (const [tenant, project] of [['', 'p1'], ['t1', ''], ['t/1', 'p1'], ['t1', 'p 1'], ['t1', 'p1\r\nx-admin: yes'], ['t1', 'p'.repeat(129)], [undefined, 'p1'], ['t1', 7]]) {
    assert.equal(projectRoute(tenant, project), '', `${String(tenant)}/${String(project)}`);
  }
});
