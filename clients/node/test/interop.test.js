// The "done when" of issue 15: a Node agent written from the README exchanges
// signals with a Go agent (bootstrap-client) through one hub. The Node agent
// is the README's own code block, run as it stands (only the hub URL
// replaced); the Go agent is test/goagent, which echoes what it receives.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { apiKey, repoRoot, useHub, waitFor } from './support/hub.js';

const packageDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const env = useHub({ goagent: './clients/node/test/goagent' });

/** The first js code block of the README's "Agents in Node" section. */
async function readmeAgent() {
  const readme = await readFile(path.join(repoRoot, 'README.md'), 'utf8');
  const section = readme.split(/^## /m).find((s) => s.startsWith('Agents in Node'));
  assert.ok(section, 'README has an "Agents in Node" section');
  const code = /```js\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(code, 'the section has a js code block');
  assert.ok(code.split('\n').filter((l) => l.trim() !== '').length <= 12, 'the README agent stays about ten lines');
  return code;
}

/**
 * Runs a program, collecting its standard output; kill() ends it.
 * @param {string} cmd
 * @param {string[]} args
 * @param {{cwd?: string}} [o]
 */
function child(cmd, args, o = {}) {
  const p = spawn(cmd, args, { cwd: o.cwd, env: { ...process.env, MARCONI_API_KEY: apiKey }, stdio: ['pipe', 'pipe', 'pipe'] });
  const out = { text: '', err: '' };
  p.stdout.setEncoding('utf8').on('data', (d) => (out.text += d));
  p.stderr.setEncoding('utf8').on('data', (d) => (out.err += d));
  const exited = new Promise((resolve) => p.once('exit', resolve));
  return {
    out,
    lines: () => out.text.split('\n').filter(Boolean),
    failed: () => (p.exitCode !== null && p.exitCode !== 0 ? `${cmd} exited ${p.exitCode}: ${out.err}` : null),
    stop: async () => {
      p.stdin.end(); // the Go agent's cue to close
      if (p.exitCode === null) p.kill('SIGTERM');
      await exited;
    },
  };
}

test('a Node agent written from the README exchanges signals with a Go agent through one hub', async (t) => {
  const goAgent = child(env.bins.goagent, ['-hub', env.hub.url, '-session', 'go-agent']);
  t.after(() => goAgent.stop());
  await waitFor('the Go agent to attach', () => goAgent.lines().includes('ready'), { fail: goAgent.failed });

  const code = (await readmeAgent()).replace('http://127.0.0.1:8080', env.hub.url);
  // Inside the package, so that '@marconihub/client' resolves to it.
  const file = path.join(packageDir, `.readme-agent-${randomBytes(4).toString('hex')}.mjs`);
  await writeFile(file, code);
  t.after(() => rm(file, { force: true }));
  const nodeAgent = child(process.execPath, [file], { cwd: packageDir });
  t.after(() => nodeAgent.stop());

  // Node → Go: the README's send, pushed live to the attached Go agent.
  await waitFor('the Node agent\'s send to be answered', () => nodeAgent.lines().includes('pushed_to_ws'), { fail: nodeAgent.failed });
  const got = await waitFor('the Go agent to receive it', () => goAgent.lines().find((l) => l.startsWith('{')));
  assert.deepEqual(JSON.parse(got), { from: 'node-agent', kind: 'review_request', seq: 1, payload: { pr: 42 } });
  // Go → Node: the echo reaches the README's onSignal.
  await waitFor('the Node agent to receive the echo', () => nodeAgent.lines().includes('go-agent: echo {"pr":42}'), { fail: nodeAgent.failed });
  assert.equal(nodeAgent.out.err, '');
});
