// Real hubs for the tests: built from this repository once per test file,
// run as child processes on loopback ports, stopped after.

import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** The repository's root (clients/node/test/support → four levels up). */
export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');

export const apiKey = `node-test-key-${randomBytes(8).toString('hex')}`;
export const adminToken = `node-test-admin-${randomBytes(8).toString('hex')}`;

/**
 * Builds Go packages of this repository into a fresh directory. Returns the
 * paths of the binaries and a cleanup. The hub (./cmd/marconi) is taken from
 * MARCONI_TEST_BIN when set: a binary built from this tree already.
 * @param {Record<string, string>} pkgs name → package path (e.g. {marconi: './cmd/marconi'})
 */
export async function buildGo(pkgs) {
  const dir = await mkdtemp(path.join(tmpdir(), 'marconi-node-test-'));
  /** @type {Record<string, string>} */
  const bins = {};
  for (const [name, pkg] of Object.entries(pkgs)) {
    if (pkg === './cmd/marconi' && process.env.MARCONI_TEST_BIN) {
      bins[name] = process.env.MARCONI_TEST_BIN; // built once from this tree (.ci/run)
      continue;
    }
    bins[name] = path.join(dir, name);
    await run('go', ['build', '-o', bins[name], pkg], { cwd: repoRoot, maxBuffer: 16 << 20 });
  }
  return { bins, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

/**
 * Builds the hub (and extra Go programs) before the file's tests and starts
 * one hub on the memory store; stops and removes them after. The returned
 * object is filled in by the before hook.
 * @param {Record<string, string>} [extra] more Go programs to build, name → package
 */
export function useHub(extra = {}) {
  const ctx = {
    /** @type {Record<string, string>} */
    bins: {},
    /** @type {Hub} */
    hub: /** @type {any} */ (null),
    /** @type {() => Promise<void>} */
    cleanup: async () => {},
  };
  before(async () => {
    const built = await buildGo({ marconi: './cmd/marconi', ...extra });
    ctx.bins = built.bins;
    ctx.cleanup = built.cleanup;
    ctx.hub = await startHub(built.bins.marconi);
  });
  after(async () => {
    await ctx.hub?.stop();
    await ctx.cleanup();
  });
  return ctx;
}

/** A free loopback port (for an instance whose public URL must be known before it starts). */
export async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(undefined)));
  const port = /** @type {net.AddressInfo} */ (srv.address()).port;
  await new Promise((resolve) => srv.close(() => resolve(undefined)));
  return port;
}

/**
 * @typedef {object} Hub
 * @property {string} url
 * @property {number} port
 * @property {() => string} output what the hub printed so far
 * @property {(signal?: NodeJS.Signals) => Promise<void>} stop ends the process (SIGTERM: graceful) and waits for it
 */

/**
 * Starts a hub on 127.0.0.1:port (default: a free one) and resolves once
 * /readyz says ready.
 * @param {string} bin
 * @param {{port?: number, env?: Record<string, string>}} [o]
 * @returns {Promise<Hub>}
 */
export async function startHub(bin, o = {}) {
  const port = o.port ?? (await freePort());
  const url = `http://127.0.0.1:${port}`;
  const env = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '',
    MARCONI_ADDR: `127.0.0.1:${port}`,
    MARCONI_MODE: 'development',
    MARCONI_API_KEYS: `${apiKey}=t1/p1`,
    MARCONI_ADMIN_TOKEN: adminToken,
    MARCONI_LOG_LEVEL: 'warn',
    ...o.env,
  };
  const child = spawn(bin, ['serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (d) => (out += d));
  child.stderr.setEncoding('utf8').on('data', (d) => (out += d));
  const exited = new Promise((resolve) => child.once('exit', (code, sig) => resolve({ code, sig })));
  await waitFor(`the hub on ${url} to be ready`, async () => (await fetch(`${url}/readyz`).catch(() => null))?.ok, {
    timeoutMs: 20000,
    fail: () => (child.exitCode !== null ? `hub exited ${child.exitCode}: ${out}` : null),
  });
  return {
    url,
    port,
    output: () => out,
    stop: async (signal = 'SIGTERM') => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited;
    },
  };
}

/**
 * Polls fn until it returns a truthy value, and returns that value. Fails
 * after timeoutMs, naming what it waited for.
 * @template T
 * @param {string} what
 * @param {() => T | Promise<T>} fn
 * @param {{timeoutMs?: number, everyMs?: number, fail?: () => string | null}} [o]
 * @returns {Promise<NonNullable<T>>}
 */
export async function waitFor(what, fn, o = {}) {
  const deadline = Date.now() + (o.timeoutMs ?? 10000);
  for (;;) {
    const v = await fn();
    if (v) return /** @type {NonNullable<T>} */ (v);
    const why = o.fail?.();
    if (why) throw new Error(`waiting for ${what}: ${why}`);
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, o.everyMs ?? 25));
  }
}

/**
 * The hub's operator view of one session (GET /v1/ops/route_state/...).
 * @param {Hub} hub
 * @param {string} sessionID
 * @returns {Promise<any>}
 */
export async function routeState(hub, sessionID) {
  const res = await fetch(`${hub.url}/v1/ops/route_state/t1/p1/${encodeURIComponent(sessionID)}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  });
  if (!res.ok) throw new Error(`route_state ${sessionID}: ${res.status} ${await res.text()}`);
  return res.json();
}

/** Collects what a client's onSignal receives. */
export class Inbox {
  /** @type {import('@marconihub/client').Signal[]} */
  signals = [];
  on = (/** @type {import('@marconihub/client').Signal} */ s) => {
    this.signals.push(s);
  };
  /** The payloads' "n" fields, in arrival order. */
  ns() {
    return this.signals.map((s) => /** @type {{n: number}} */ (s.payload).n);
  }
}

/** A logger that keeps every line, for tests that assert what the client said. */
export class LogRecorder {
  /** @type {{level: string, msg: string, fields: any}[]} */
  lines = [];
  debug = (/** @type {string} */ msg, /** @type {object} */ fields) => this.lines.push({ level: 'debug', msg, fields });
  info = (/** @type {string} */ msg, /** @type {object} */ fields) => this.lines.push({ level: 'info', msg, fields });
  warn = (/** @type {string} */ msg, /** @type {object} */ fields) => this.lines.push({ level: 'warn', msg, fields });
  error = (/** @type {string} */ msg, /** @type {object} */ fields) => this.lines.push({ level: 'error', msg, fields });
  /** @param {string} msg */
  find(msg) {
    return this.lines.filter((l) => l.msg === msg);
  }
}

/**
 * A fresh schema in the Postgres named by MARCONI_TEST_DATABASE_URL, made with
 * psql; returns the hub's database URL with search_path set, and a cleanup.
 * Returns null when the variable is not set (the caller skips, unless
 * MARCONI_TEST_REQUIRE_POSTGRES=1, where it fails).
 */
export async function postgresSchema() {
  const base = process.env.MARCONI_TEST_DATABASE_URL;
  if (!base) {
    if (process.env.MARCONI_TEST_REQUIRE_POSTGRES === '1') {
      throw new Error('MARCONI_TEST_DATABASE_URL is not set and MARCONI_TEST_REQUIRE_POSTGRES=1: Postgres tests must run');
    }
    return null;
  }
  const schema = `node_${randomBytes(6).toString('hex')}`;
  await run('psql', [base, '-v', 'ON_ERROR_STOP=1', '-qc', `CREATE SCHEMA ${schema}`]);
  const u = new URL(base);
  u.searchParams.set('search_path', schema);
  return {
    url: u.toString(),
    cleanup: () => run('psql', [base, '-qc', `DROP SCHEMA IF EXISTS ${schema} CASCADE`]).then(() => undefined),
  };
}
