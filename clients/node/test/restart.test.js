// An agent process killed with -9 and started again under its name: with its
// token kept in a file it resumes; with takeover it reclaims the id. Either
// way it gets the signals sent while it was gone. The agents are child
// processes running the client, as a user's agent would.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { dial } from '@marconihub/client';
import { apiKey, useHub, waitFor } from './support/hub.js';

const env = useHub();
const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

// The agent: dials with the options in argv, then prints one JSON line per
// event (up, reset, signal) until it is killed.
const agentSource = `
import { dial } from '@marconihub/client';
const [hubURL, apiKey, sessionID, tokenFile, takeover] = process.argv.slice(1);
const out = (o) => process.stdout.write(JSON.stringify(o) + '\\n');
const c = await dial({
  hubURL, apiKey, sessionID, surface: 'claude_code', tokenFile: tokenFile || undefined, takeover: takeover === '1',
  onSignal: (s) => out({ signal: s.payload }),
  onAffinityReset: (r) => out({ reset: r.reason }),
});
out({ up: c.stats() });
`;

/**
 * Starts an agent process; its output lines are collected as objects.
 * @param {import('node:test').TestContext} t
 * @param {string} sessionID
 * @param {{tokenFile?: string, takeover?: boolean}} o
 */
function startAgent(t, sessionID, o) {
  const child = spawn(process.execPath, ['--input-type=module', '-e', agentSource, env.hub.url, apiKey, sessionID, o.tokenFile ?? '', o.takeover ? '1' : '0'], {
    cwd: pkgDir, stdio: ['ignore', 'pipe', 'pipe'],
  });
  /** @type {any[]} */
  const lines = [];
  let err = '';
  let buf = '';
  child.stdout.setEncoding('utf8').on('data', (d) => {
    buf += d;
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      lines.push(JSON.parse(buf.slice(0, i)));
      buf = buf.slice(i + 1);
    }
  });
  child.stderr.setEncoding('utf8').on('data', (d) => (err += d));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  };
  t.after(kill);
  return {
    lines,
    kill,
    /** @param {string} what @param {(l: any) => boolean} pred */
    waitLine: (what, pred) => waitFor(what, () => lines.find(pred), {
      timeoutMs: 20000,
      fail: () => (child.exitCode !== null ? `the agent exited ${child.exitCode}: ${err}` : null),
    }),
  };
}

test('an agent killed with -9 and started again with its token file resumes and gets what was sent meanwhile', async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), 'marconi-node-restart-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const tokenFile = path.join(dir, 'donna', 'token.json');
  const sender = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'restart-sender' });
  t.after(() => sender.close());

  const first = startAgent(t, 'donna', { tokenFile });
  await first.waitLine('the first agent up', (l) => l.up);
  await first.kill();
  await sender.send('donna', 'chat', { n: 1 });
  await sender.send('donna', 'chat', { n: 2 });

  const again = startAgent(t, 'donna', { tokenFile });
  const up = await again.waitLine('the restarted agent up', (l) => l.up);
  assert.equal(up.up.takeovers, 0);
  assert.equal(up.up.reregistrations, 0);
  await again.waitLine('the restarted agent to get 2', (l) => l.signal?.n === 2);
  assert.deepEqual(again.lines.filter((l) => l.signal).map((l) => l.signal.n), [1, 2]);
  assert.deepEqual(again.lines.filter((l) => l.reset), []);
});

test('an agent killed with -9 that kept no token comes back under its name with takeover, told its state is gone', async (t) => {
  const sender = await dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'takeover-sender' });
  t.after(() => sender.close());
  const first = startAgent(t, 'lafonda', {});
  await first.waitLine('the first agent up', (l) => l.up);
  await first.kill();
  await sender.send('lafonda', 'chat', { n: 1 });
  await sender.send('lafonda', 'chat', { n: 2 });

  await assert.rejects(dial({ hubURL: env.hub.url, apiKey, surface: 'claude_code', sessionID: 'lafonda' }), { status: 403 });
  const again = startAgent(t, 'lafonda', { takeover: true });
  const up = await again.waitLine('the agent up again', (l) => l.up);
  assert.equal(up.up.takeovers, 1);
  await again.waitLine('the agent to get 2', (l) => l.signal?.n === 2);
  const events = again.lines.filter((l) => !l.up);
  assert.deepEqual(events, [{ reset: 'taken_over' }, { signal: { n: 1 } }, { signal: { n: 2 } }]);
});
