// The Node client under load, shaped like cmd/marconi-bench so the two
// clients compare in one run: N agents on one hub, each sending `rate`
// signals a second to the next agent for `duration` seconds. Prints the
// achieved rate and the p50/p99 of the send's answer and of send → onSignal.
//
//   MARCONI_BENCH_API_KEY=... node bench/load.js --hub http://127.0.0.1:18080 --agents 50 --rate 5 --duration 10
//
// Loopback hubs only: it is a measurement, not a load generator for shared hosts.

import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { dial } from '@marconihub/client';

const { values } = parseArgs({
  options: {
    hub: { type: 'string', default: 'http://127.0.0.1:8080' },
    agents: { type: 'string', default: '50' },
    rate: { type: 'string', default: '5' },
    duration: { type: 'string', default: '10' },
  },
});
const hubURL = values.hub;
const agents = Number(values.agents);
const rate = Number(values.rate);
const seconds = Number(values.duration);
const host = new URL(hubURL).hostname;
if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(host)) throw new Error(`--hub ${hubURL}: loopback only`);
if (!(agents >= 2 && agents <= 2000) || !(rate > 0 && rate <= 100) || !(seconds > 0 && seconds <= 300)) {
  throw new Error('--agents 2..2000, --rate (0, 100], --duration (0, 300] seconds');
}
const apiKey = process.env.MARCONI_BENCH_API_KEY;
if (!apiKey) throw new Error('MARCONI_BENCH_API_KEY is required');

const run = `nb${Date.now().toString(36)}`;
/** @type {number[]} */
const answers = [];
/** @type {number[]} */
const deliveries = [];
let failed = 0;

const clients = [];
for (let i = 0; i < agents; i++) {
  clients.push(await dial({
    hubURL, apiKey, surface: 'claude_code', sessionID: `${run}-${i}`,
    onSignal: (s) => {
      const sentAt = /** @type {{t: number}} */ (s.payload).t;
      deliveries.push(performance.now() - sentAt);
    },
  }));
}

const start = performance.now();
const end = start + seconds * 1000;
await Promise.all(clients.map(async (c, i) => {
  const to = `${run}-${(i + 1) % agents}`;
  const every = 1000 / rate;
  let next = start + Math.random() * every;
  /** @type {Promise<void>[]} */
  const inFlight = [];
  while (next < end) {
    const wait = next - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const t = performance.now();
    inFlight.push(c.send(to, 'bench', { t }).then(() => { answers.push(performance.now() - t); }, () => { failed++; }));
    next += every;
  }
  await Promise.all(inFlight);
}));
const elapsed = (performance.now() - start) / 1000;
const deadline = performance.now() + 5000;
while (deliveries.length < answers.length && performance.now() < deadline) await new Promise((r) => setTimeout(r, 20));
await Promise.all(clients.map((c) => c.close()));

/** @param {number[]} xs @param {number} q */
const pct = (xs, q) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))] ?? NaN;
const ms = (/** @type {number} */ x) => `${x.toFixed(2)} ms`;
console.log(`agents ${agents}, offered ${agents * rate}/s for ${seconds}s: achieved ${(answers.length / elapsed).toFixed(0)}/s, ${failed} failed, ${deliveries.length} delivered`);
console.log(`send answer p50 ${ms(pct(answers, 0.5))} p90 ${ms(pct(answers, 0.9))} p99 ${ms(pct(answers, 0.99))} max ${ms(pct(answers, 1))}`);
console.log(`send → onSignal p50 ${ms(pct(deliveries, 0.5))} p90 ${ms(pct(deliveries, 0.9))} p99 ${ms(pct(deliveries, 0.99))} max ${ms(pct(deliveries, 1))}`);
