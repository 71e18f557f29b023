// marconi mcp driven by @modelcontextprotocol/sdk's client (the TypeScript
// SDK Claude Code is built on) over stdio, against a real hub built from this
// repository: the tools are listed, and two agents exchange a signal.

import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { promisify } from 'node:util';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const apiKey = `mcp-node-test-${randomBytes(8).toString('hex')}`;
const adminToken = `mcp-node-admin-${randomBytes(8).toString('hex')}`;

let dir = '';
let bin = '';
/** @type {import('node:child_process').ChildProcess | null} */
let hub = null;
let hubURL = '';
let hubOutput = '';

async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(undefined)));
  const { port } = /** @type {net.AddressInfo} */ (srv.address());
  await new Promise((resolve) => srv.close(() => resolve(undefined)));
  return port;
}

async function waitReady(url) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      const res = await fetch(`${url}/readyz`);
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`hub not ready within a minute:\n${hubOutput}`);
    await new Promise((r) => setTimeout(r, 50)); // polling readiness, with a deadline
  }
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'marconi-mcp-node-'));
  // MARCONI_TEST_BIN: a marconi binary built from this tree already (.ci/run builds one for
  // both Node suites); otherwise it is built here.
  bin = process.env.MARCONI_TEST_BIN || path.join(dir, 'marconi');
  if (!process.env.MARCONI_TEST_BIN) {
    await promisify(execFile)('go', ['build', '-o', bin, './cmd/marconi'], { cwd: repoRoot, maxBuffer: 16 << 20 });
  }
  const port = await freePort();
  hubURL = `http://127.0.0.1:${port}`;
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('MARCONI_')));
  hub = spawn(bin, ['serve'], {
    env: {
      ...env,
      MARCONI_ADDR: `127.0.0.1:${port}`,
      MARCONI_API_KEYS: `${apiKey}=t1/p1`,
      MARCONI_ADMIN_TOKEN: adminToken,
      MARCONI_LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  hub.stdout?.on('data', (d) => { hubOutput += d; });
  hub.stderr?.on('data', (d) => { hubOutput += d; });
  await waitReady(hubURL);
});

after(async () => {
  if (hub && hub.exitCode === null) {
    const exited = new Promise((resolve) => hub?.once('exit', resolve));
    hub.kill('SIGTERM');
    await exited;
  }
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Starts `marconi mcp` for one agent and connects the SDK's client to it. */
async function agent(name) {
  const stateDir = await mkdtemp(path.join(dir, `state-${name}-`));
  const transport = new StdioClientTransport({
    command: bin,
    args: ['mcp', '--hub', hubURL, '--api-key', apiKey, '--session', name, '--state-dir', stateDir],
    stderr: 'pipe',
  });
  const client = new Client({ name: `node-test-${name}`, version: '0' });
  await client.connect(transport);
  return client;
}

/** The structured content of a successful tool call. */
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.notEqual(res.isError, true, `${name} failed: ${JSON.stringify(res.content)}`);
  return /** @type {any} */ (res.structuredContent);
}

test('the TypeScript SDK lists the tools and two agents exchange a signal', async () => {
  const alice = await agent('alice');
  const bob = await agent('bob');
  try {
    const { tools } = await alice.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ['read_signals', 'send_signal', 'whoami']);
    for (const t of tools) {
      assert.ok(t.description && t.description.length > 40, `${t.name} has a description`);
      assert.equal(t.inputSchema.type, 'object');
      assert.ok(t.outputSchema, `${t.name} has an output schema`);
    }
    const me = await call(alice, 'whoami', {});
    assert.equal(me.session_id, 'alice');
    assert.equal(me.route_state, 'attached');

    const sent = await call(alice, 'send_signal', { to: 'bob', text: 'hello from node', kind: 'greeting' });
    assert.equal(sent.seq, 1);
    assert.equal(sent.delivery, 'pushed_to_ws');

    const read = await call(bob, 'read_signals', { wait_seconds: 30 });
    assert.equal(read.signals.length, 1);
    assert.equal(read.signals[0].from, 'alice');
    assert.equal(read.signals[0].kind, 'greeting');
    assert.deepEqual(read.signals[0].payload, { text: 'hello from node' });
    const again = await call(bob, 'read_signals', {});
    assert.equal(again.signals.length, 0, 'a signal returned twice');

    const bad = await alice.callTool({ name: 'send_signal', arguments: { to: 'nobody', text: 'x' } });
    assert.equal(bad.isError, true);
    assert.equal(JSON.parse(/** @type {any} */ (bad.content)[0].text).error.code, 'recipient_not_registered');
  } finally {
    await alice.close();
    await bob.close();
  }
});
